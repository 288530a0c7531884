"""Time ``ccoverlap replay`` against ``ccoverlap analyze`` on the same ~216k-event trace.

No trace in ``../shared/traces`` has 216k events (the largest, ``ns_resolution_trace``, has
68.7k), so the job is built the way ``benchmarks/bench_analyze.py`` builds its: HTA's
``nccl_parser_config`` trace (A100, NCCL, 40.6k events) replicated in time with ids and step
numbers renumbered (``bench_analyze.make_job``, one rank), then cut to ``--events`` events
(default 216,000; metadata events kept).

Each tool runs in a fresh subprocess (imports included), A/B interleaved, ``--runs`` times;
the table shows every run and the medians:

* ``analyze``: ``ccoverlap.trace.analyze.analyze(dir)`` + ``to_dict()`` (every metric);
* ``replay``: ``ccoverlap.replay.run.replay(dir, whatifs=["none"])`` - load, graph, replay,
  structure-only replay, measured + replayed metrics;
* ``replay+all``: the same with every default what-if (7 more replays and measurements).

    .venv/bin/python benchmarks/bench_replay.py               # 216k events, 3 runs
    .venv/bin/python benchmarks/bench_replay.py --events 100000 --runs 5
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_analyze import DEFAULT_SHARED, SOURCE, make_job  # noqa: E402


def build(src: Path, out: Path, events: int) -> Path:
    """One rank of ``src`` replicated until ``events`` events, cut there (µs times kept)."""
    with gzip.open(src, "rb") as fh:
        n_src = len([e for e in json.load(fh)["traceEvents"] if e.get("ph") != "M"])
    replicas = -(-events // n_src)
    tmp = out / "full"
    make_job(src, tmp, 1, replicas)
    full = next(tmp.iterdir())
    with gzip.open(full, "rb") as fh:
        doc = json.load(fh)
    ev = doc["traceEvents"]
    meta = [e for e in ev if e.get("ph") == "M"]
    rest = [e for e in ev if e.get("ph") != "M"][: events - len(meta)]
    doc["traceEvents"] = meta + rest
    path = out / "job" / "rank-0.pt.trace.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", compresslevel=1) as fh:
        json.dump(doc, fh)
    full.unlink()
    return path.parent


def worker(kind: str, d: str) -> dict:
    sys.path.insert(0, str(ROOT))
    t = time.perf_counter()
    if kind == "analyze":
        from ccoverlap.trace.analyze import analyze

        a = analyze([d])
        a.to_dict()
        val = a.metrics[0].step_time_s
    else:
        from ccoverlap.replay.run import replay

        r = replay([d], whatifs=["none"] if kind == "replay" else None)
        val = r.replay.step_time_s
    return {"wall_s": time.perf_counter() - t, "value": val}


def run(kind: str, d: Path) -> dict:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--worker", kind, str(d)], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{kind} failed:\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["outer_s"] = time.perf_counter() - t
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--events", type=int, default=216_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--shared", type=Path, default=DEFAULT_SHARED)
    ap.add_argument("--dir", type=Path, help="benchmark these traces instead")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return 0
    if args.dir:
        d = args.dir
    else:
        src = args.shared / SOURCE
        if not src.is_file():
            raise SystemExit(f"{src} not found: pass --shared DIR or --dir TRACES")
        d = build(src, Path(tempfile.mkdtemp(prefix="ccoverlap-bench-replay-")), args.events)
    files = sorted(d.iterdir())
    n_ev = 0
    for f in files:
        with gzip.open(f, "rb") as fh:
            n_ev += len(json.load(fh)["traceEvents"])
    print(f"traces: {d} ({len(files)} file(s), {n_ev} events); CPUs {os.cpu_count()}; load average "
          f"{os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    kinds = ("analyze", "replay", "replay+all")
    times = {k: [] for k in kinds}
    print(f"{'run':>3} " + " ".join(f"{k + ' s':>12}" for k in kinds))
    for i in range(args.runs):
        row = {k: run(k, d) for k in kinds}
        for k in kinds:
            times[k].append(row[k]["outer_s"])
        print(f"{i + 1:>3} " + " ".join(f"{row[k]['outer_s']:12.2f}" for k in kinds))
    med = {k: statistics.median(v) for k, v in times.items()}
    print("med " + " ".join(f"{med[k]:12.2f}" for k in kinds))
    print(f"replay / analyze = {med['replay'] / med['analyze']:.2f}x (target <= 2x); "
          f"replay with all what-ifs / analyze = {med['replay+all'] / med['analyze']:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
