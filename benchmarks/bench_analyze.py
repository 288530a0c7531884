"""Time and peak memory of ``ccoverlap analyze`` vs HolisticTraceAnalysis on the same traces.

Both run in fresh subprocesses, one after the other, on the same files:

* ours: ``ccoverlap.trace.analyze.analyze(dir)`` - every metric (per rank, per step,
  collectives, cross-rank, contention, verdict);
* HTA: ``TraceAnalysis(trace_dir=dir)`` (parse + align + filter) and ``get_comm_comp_overlap()``.

Reported per tool: wall seconds, CPU seconds (user+sys of the process and its children: HTA
and ours both parse ranks in parallel processes), peak RSS of the main process and of the
largest child (``resource.getrusage``), the process tree's summed PSS (sampled), and the overlap ratio
each found (they must agree).

The job: by default a real trace (``nccl_parser_config/nccl_data.json.gz`` from
``--shared``, A100 + NCCL, 40k events, 3 profiler steps) replicated ``--replicas`` times in
time (correlation ids, External ids and step numbers renumbered) for ``--ranks`` ranks - a
long real profile of a multi-rank job; ``--dir`` benchmarks existing traces instead.

    .venv/bin/python benchmarks/bench_analyze.py                       # 4 ranks x 10 replicas
    .venv/bin/python benchmarks/bench_analyze.py --ranks 2 --replicas 3
    .venv/bin/python benchmarks/bench_analyze.py --dir path/to/traces

``hta`` is pip's ``traceinsight`` - for this script only, never a dependency of ccoverlap.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the shared real traces sit beside the checkout or one folder further up
DEFAULT_SHARED = next((p / "shared" / "traces" for p in ROOT.parents[:2] if (p / "shared" / "traces").is_dir()),
                      ROOT.parent / "shared" / "traces")
SOURCE = "nccl_parser_config/nccl_data.json.gz"


# ----------------------------------------------------------------------------- job

def make_job(src: Path, out: Path, ranks: int, replicas: int) -> list[Path]:
    """Write ``ranks`` gzip traces, each ``replicas`` time-shifted copies of ``src``'s events."""
    with gzip.open(src, "rb") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - t0 + 1000.0
    steps = sorted({int(e["name"].split("#")[1]) for e in timed if str(e.get("name", "")).startswith("ProfilerStep#")})
    nsteps = max(steps) - min(steps) + 1 if steps else 1
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(ranks):
        path = out / f"rank-{rank}.pt.trace.json.gz"
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        meta["distributedInfo"] = dict(meta.get("distributedInfo") or {}, rank=rank, world_size=ranks)
        with gzip.open(path, "wt", compresslevel=1) as fh:
            head = json.dumps(meta)[:-1]
            fh.write(head + ', "traceEvents": [\n')
            first = True
            for rep in range(replicas):
                shift = rep * span + rank * 7.0    # a few µs of skew between ranks
                off = rep * 10_000_000
                for e in events:
                    if e.get("ph") == "M":
                        if rep:
                            continue
                        e2 = e
                    else:
                        e2 = dict(e)
                        if isinstance(e2.get("ts"), (int, float)):
                            e2["ts"] = round(e2["ts"] + shift, 3)
                        if isinstance(e2.get("id"), int):
                            e2["id"] += off
                        a = e2.get("args")
                        if isinstance(a, dict) and ("correlation" in a or "External id" in a):
                            a = dict(a)
                            for k in ("correlation", "External id"):
                                if isinstance(a.get(k), int):
                                    a[k] += off
                            e2["args"] = a
                        name = e2.get("name")
                        if isinstance(name, str) and name.startswith("ProfilerStep#"):
                            e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + rep * nsteps}"
                    fh.write(("" if first else ",\n") + json.dumps(e2))
                    first = False
            fh.write("\n]}\n")
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- workers

def _usage() -> dict:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
            "maxrss_mb": me.ru_maxrss / 1024, "child_maxrss_mb": kids.ru_maxrss / 1024}


def worker_ours(trace_dir: str) -> dict:
    sys.path.insert(0, str(ROOT))
    t = time.perf_counter()
    from ccoverlap.trace.analyze import analyze

    t_import = time.perf_counter() - t
    a = analyze([trace_dir])
    a.to_dict()
    out = {"wall_s": time.perf_counter() - t, "import_s": t_import,
           "overlap_pct": {m.rank: 100 * m.overlap_ratio for m in a.metrics}}
    out.update(_usage())
    return out


def worker_hta(trace_dir: str) -> dict:
    import logging

    logging.disable(logging.WARNING)
    t = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    t_import = time.perf_counter() - t
    ta = TraceAnalysis(trace_dir=trace_dir)
    df = ta.get_comm_comp_overlap(visualize=False)
    out = {"wall_s": time.perf_counter() - t, "import_s": t_import,
           "overlap_pct": {int(r): float(p) for r, p in zip(df["rank"], df["comp_comm_overlap_pctg"])}}
    out.update(_usage())
    return out


def run_worker(kind: str, trace_dir: Path, python: str | None = None) -> dict:
    """Run one tool in a fresh interpreter; also samples the whole process tree's memory every 50 ms
    (both tools use worker processes): the sum of the processes' PSS, which counts a page shared
    by forked processes once in all (:func:`bench_analyze_vs_hta.tree_memory`)."""
    import threading

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_analyze_vs_hta import tree_memory

    t = time.perf_counter()
    proc = subprocess.Popen([python or sys.executable, __file__, "--worker", kind, str(trace_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    peak = [0.0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_memory(proc.pid)[1] / 2**20)
            done.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    done.set()
    th.join()
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res["outer_wall_s"] = time.perf_counter() - t
    res["tree_peak_mb"] = peak[0]
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", nargs=2, metavar=("KIND", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, help="benchmark these traces instead of a generated job")
    p.add_argument("--shared", type=Path, default=DEFAULT_SHARED, help="where the real traces are")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--replicas", type=int, default=10)
    p.add_argument("--keep", type=Path, help="write the generated job here (default: a temporary dir)")
    p.add_argument("--skip-hta", action="store_true")
    p.add_argument("--hta-python", default=None,
                   help="interpreter with HTA installed (a separate venv: python -m venv .venv-hta && "
                        ".venv-hta/bin/pip install traceinsight); default: this one")
    p.add_argument("--runs", type=int, default=1, help="runs per tool, interleaved (medians are printed)")
    args = p.parse_args(argv)
    if args.worker:
        kind, d = args.worker
        print(json.dumps(worker_ours(d) if kind == "ours" else worker_hta(d)))
        return 0
    tmp = None
    if args.dir:
        trace_dir = args.dir
    else:
        src = args.shared / SOURCE
        if not src.is_file():
            raise SystemExit(f"{src} not found: pass --shared DIR or --dir TRACES")
        trace_dir = args.keep or Path(tmp := tempfile.mkdtemp(prefix="ccoverlap-bench-"))
        t = time.perf_counter()
        make_job(src, trace_dir, args.ranks, args.replicas)
        print(f"generated {args.ranks} ranks x {args.replicas} replicas of {SOURCE} in {time.perf_counter() - t:.1f} s")
    files = sorted(f for f in Path(trace_dir).iterdir() if f.name.endswith((".json", ".json.gz")))
    size = sum(f.stat().st_size for f in files)
    print(f"traces: {trace_dir} ({len(files)} files, {size / 2**20:.1f} MiB on disk); CPUs: {os.cpu_count()}")
    runs: dict[str, list[dict]] = {"ours": []}
    if not args.skip_hta:
        runs["hta"] = []
    for _ in range(args.runs):                   # interleaved, so load drifts hit both tools alike
        runs["ours"].append(run_worker("ours", trace_dir))
        if not args.skip_hta:
            runs["hta"].append(run_worker("hta", trace_dir, args.hta_python))
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.runs} run(s) per tool; medians")
    print(f"{'tool':6} {'wall s':>8} {'CPU s':>8} {'import s':>9} {'peak RSS MiB':>13} {'largest child MiB':>18} "
          f"{'tree PSS MiB':>18}  overlap % per rank")
    results = {}
    for k, rs in runs.items():
        med = lambda key: statistics.median(r[key] for r in rs)   # noqa: E731
        r = dict(rs[0])
        for key in ("outer_wall_s", "cpu_s", "maxrss_mb", "child_maxrss_mb", "import_s", "tree_peak_mb"):
            if key in r:
                r[key] = med(key)
        results[k] = r
        ov = ", ".join(f"{float(v):.2f}" for _, v in sorted(r["overlap_pct"].items(), key=lambda kv: int(kv[0])))
        print(f"{k:6} {r['outer_wall_s']:8.2f} {r['cpu_s']:8.2f} {r.get('import_s', float('nan')):9.2f} "
              f"{r['maxrss_mb']:13.0f} {r['child_maxrss_mb']:18.0f} {r['tree_peak_mb']:18.0f}  {ov}")
        if len(rs) > 1:
            walls = ", ".join(f"{x['outer_wall_s']:.2f}" for x in rs)
            print(f"       walls: {walls}")
    if "hta" in results:
        o, h = results["ours"], results["hta"]
        mem_o = max(o["maxrss_mb"], o["child_maxrss_mb"])
        mem_h = max(h["maxrss_mb"], h["child_maxrss_mb"])
        print(f"HTA / ours: wall {h['outer_wall_s'] / o['outer_wall_s']:.1f}x, CPU {h['cpu_s'] / o['cpu_s']:.1f}x, "
              f"peak memory {mem_h / mem_o:.1f}x (largest process), "
              f"{h['tree_peak_mb'] / o['tree_peak_mb']:.1f}x (process tree's PSS, sampled every 50 ms)")
        worst = max(abs(float(o["overlap_pct"][r]) - float(h["overlap_pct"][r])) for r in h["overlap_pct"])
        print(f"overlap agreement: max |ours - HTA| = {worst:.3f} percentage points")
    if tmp:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
