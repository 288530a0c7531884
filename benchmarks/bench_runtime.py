"""Run ``ccoverlap bench`` over a fixed set of shapes and print the results as Markdown.

Usage (from the repository root; needs torch)::

    python benchmarks/bench_runtime.py --out ccoverlap-out/bench-runtime [--quick]

Each configuration is one ``python -m ccoverlap bench ... --json`` run (self-spawned
ranks: gloo on CPU, NCCL with one GPU per rank); the JSON of every run is kept in
``--out`` and the tables printed here are made from those files only. On a shared machine
``--max-load`` waits (up to ``--wait-s`` seconds) for the 1-minute load average to drop
before each run; the load is printed with every table either way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = [
    # (name, ranks, bench arguments)
    ("ag-comm-heavy", 2, "--m 8192 --n 128 --k 1024"),
    ("ag-comm-heavy", 4, "--m 8192 --n 128 --k 1024"),
    ("ag-compute-heavy", 2, "--m 4096 --n 1024 --k 1024"),
    ("ag-m-below-k", 2, "--m 1024 --n 1024 --k 4096"),
    ("rs", 2, "--op matmul_reduce_scatter --m 8192 --n 1024 --k 128"),
    ("rs", 4, "--op matmul_reduce_scatter --m 8192 --n 1024 --k 128"),
    ("ag-fwd-bwd", 2, "--m 4096 --n 256 --k 1024 --backward"),
    ("a2a", 2, "--op all_to_all_matmul --m 4096 --n 1024 --k 1024"),
    ("a2a", 4, "--op all_to_all_matmul --m 4096 --n 1024 --k 1024"),
]


def _wait_for_load(max_load: float, wait_s: float) -> float:
    if not hasattr(os, "getloadavg"):
        return float("nan")
    t0 = time.monotonic()
    while os.getloadavg()[0] > max_load and time.monotonic() - t0 < wait_s:
        time.sleep(10)
    return os.getloadavg()[0]


def _table(res: dict) -> str:
    lines = ["| schedule | runs | median ms | min ms | speedup vs serial |", "|---|---|---:|---:|---:|"]
    for r in res["results"]:
        sp = r["speedup_vs_serial"]
        lines.append(f"| {r['schedule']} | {r['runs']} | {r['median_s'] * 1e3:.1f} | {r['min_s'] * 1e3:.1f} "
                     f"| {'-' if sp is None else f'{sp:.2f}x'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the configurations (or ``--only NAME``) and print one Markdown table per run."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="ccoverlap-out/bench-runtime", help="directory for the JSON of each run")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="4 iterations, 1 warm-up, shapes / 4")
    ap.add_argument("--only", default=None, help="run only configurations whose name contains this")
    ap.add_argument("--max-load", type=float, default=None, help="wait for the 1-min load average to fall below")
    ap.add_argument("--wait-s", type=float, default=900.0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, ranks, extra in CONFIGS:
        if args.only and args.only not in name:
            continue
        bench_args = extra.split()
        iters, warmup = (4, 1) if args.quick else (args.iters, args.warmup)
        if args.quick:
            bench_args = [str(int(a) // 4) if a.isdigit() else a for a in bench_args]
        if args.max_load is not None:
            _wait_for_load(args.max_load, args.wait_s)
        cmd = [sys.executable, "-m", "ccoverlap", "bench", *bench_args, "--nproc", str(ranks),
               "--iters", str(iters), "--warmup", str(warmup), "--json"]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"### {name}, {ranks} ranks: FAILED\n\n```\n{proc.stderr[-2000:]}\n```\n")
            continue
        res = json.loads(proc.stdout)
        path = out / f"{name}-p{ranks}.json"
        path.write_text(json.dumps(res, indent=2))
        load = res.get("loadavg_1m_before_after")
        print(f"### {name}, {ranks} ranks ({time.monotonic() - t0:.0f} s wall)\n")
        print("`ccoverlap bench " + " ".join(cmd[4:-1]) + "`  ")
        print(f"{res['op']} M={res['m']} N={res['n']} K={res['k']} {res['dtype']}"
              f"{' fwd+bwd' if res['backward'] else ''}, {res['backend']} on {res['device']}, "
              f"{res['threads_per_rank']} thread(s)/rank, load average {load[0]:.1f} -> {load[1]:.1f}\n")
        print(_table(res) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
