"""Does ``ccoverlap analyze`` stay linear? Time and peak memory per event at 1x / 4x / 16x.

One real trace (``nccl_parser_config/nccl_data.json.gz``: A100 + NCCL, 40 k events, 3 profiler
steps, communication kernels joined to their collective ops) is replicated in time
``--base`` times (the 1x job, ~200 k events by default), then 4x and 16x that (correlation
ids, External ids and step numbers renumbered, as ``bench_analyze.py`` does). Each size is
analysed ``--runs`` times in a fresh subprocess (sizes interleaved); per run we record the
wall time of ``analyze()`` + ``to_dict()`` (imports excluded), the CPU time and the peak RSS
(``getrusage``). The table shows medians, per event, and the ratio to 1x — linear time means
the per-event time stays flat (target: 16x within 1.2x of 1x).

    .venv/bin/python benchmarks/bench_analyze_scaling.py                 # base 5, 3 runs
    .venv/bin/python benchmarks/bench_analyze_scaling.py --base 2 --runs 2 --scales 1 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_analyze import DEFAULT_SHARED, SOURCE, make_job  # noqa: E402


def worker(trace_dir: str) -> dict:
    import resource

    t0 = time.perf_counter()
    from ccoverlap.trace.analyze import analyze

    t_import = time.perf_counter() - t0
    c0 = time.process_time()
    t = time.perf_counter()
    a = analyze([trace_dir], jobs=1)
    a.to_dict()
    wall = time.perf_counter() - t
    events = sum(rt.n_events for rt in a.ranks)
    return {"wall_s": wall, "cpu_s": time.process_time() - c0, "import_s": t_import, "events": events,
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "overlap": [m.overlap_ratio for m in a.metrics]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--shared", type=Path, default=DEFAULT_SHARED)
    p.add_argument("--base", type=int, default=5, help="replicas of the source trace in the 1x job")
    p.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return 0
    src = args.shared / SOURCE
    if not src.is_file():
        raise SystemExit(f"{src} not found: pass --shared DIR")
    with tempfile.TemporaryDirectory(prefix="ccoverlap-scale-") as tmp:
        dirs = {}
        for s in args.scales:
            d = Path(tmp) / f"x{s}"
            make_job(src, d, 1, args.base * s)
            dirs[s] = d
        res: dict[int, list[dict]] = {s: [] for s in args.scales}
        for _ in range(args.runs):
            for s in args.scales:                     # interleaved: load drifts hit every size alike
                out = subprocess.run([sys.executable, __file__, "--worker", str(dirs[s])], capture_output=True,
                                     text=True, check=True)
                res[s].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"source {SOURCE} x {args.base} = 1x; {args.runs} runs per size, medians; CPUs {os.cpu_count()}; "
              f"load average {os.getloadavg()[0]:.2f}")
        print(f"{'scale':>5} {'events':>10} {'MiB gz':>7} {'wall s':>8} {'CPU s':>8} {'µs/event':>9} "
              f"{'vs 1x':>6} {'peak MiB':>9} {'B/event':>8}")
        base = None
        for s in args.scales:
            r = res[s]
            ev = r[0]["events"]
            wall = statistics.median(x["wall_s"] for x in r)
            cpu = statistics.median(x["cpu_s"] for x in r)
            rss = statistics.median(x["maxrss_mb"] for x in r)
            per = cpu / ev * 1e6
            base = base or per
            size = sum(f.stat().st_size for f in dirs[s].iterdir()) / 2**20
            print(f"{s:>4}x {ev:>10} {size:>7.1f} {wall:>8.2f} {cpu:>8.2f} {per:>9.2f} {per / base:>6.2f} "
                  f"{rss:>9.0f} {rss * 2**20 / ev:>8.0f}")
        print("µs/event and 'vs 1x' use CPU time (steadier than wall under load); peak MiB includes the "
              "interpreter and imports (~35 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
