"""ccoverlap's ``auto`` against PyTorch's DTensor tensor parallelism on the same shapes.

Runs ``ccoverlap bench --json --schedules auto`` (serial, auto and the reference rows,
including ``(DTensor TP)``: an ``nn.Linear`` under ``ColwiseParallel(input_layouts=Shard(0))``,
i.e. DTensor's all-gather then one GEMM) ``--reps`` times per shape, each run timing all rows
round-robin in one process group, and prints per run and as the median over runs:
auto / DTensor TP, serial / DTensor TP and the cost of the per-call cross-rank check (as a
difference of the two medians, and paired: the median over repetitions of serial-with-check
over serial-without in the same repetition).

    python benchmarks/bench_runtime_vs_dtensor.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SHAPES = {
    "ag-comm-heavy": ["--m", "8192", "--n", "128", "--k", "1024"],
    "ag-gemm-heavy": ["--m", "4096", "--n", "1024", "--k", "1024"],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    cols = ("serial", "auto", "(DTensor TP)", "(serial, unchecked)", "(cross-rank check)")
    print(f"{'shape':<14} {'rep':>3} {'auto runs':<18} " + " ".join(f"{c[:14]:>14}" for c in cols)
          + f" {'auto/DT':>8} {'serial/DT':>9} {'check %':>8} {'paired':>8} {'load':>10}")
    for name in args.shapes.split(","):
        ratios = {"auto": [], "serial": [], "check": [], "check_p": []}
        for rep in range(args.reps):
            cmd = [sys.executable, "-m", "ccoverlap", "bench", *SHAPES[name], "--nproc", str(args.nproc),
                   "--iters", str(args.iters), "--warmup", str(args.warmup), "--schedules", "auto", "--json",
                   "--seed", str(rep)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                print(f"{name} rep {rep}: bench failed:\n{proc.stderr[-2000:]}")
                return 1
            res = json.loads(proc.stdout)
            by = {r["schedule"]: r for r in res["results"]}
            s = res["summary"]
            ratios["auto"].append(s["auto_vs_dtensor_tp"])
            ratios["serial"].append(s["serial_vs_dtensor_tp"])
            ratios["check"].append(100 * s["check_cost_in_serial"])
            ratios["check_p"].append(100 * s.get("check_cost_in_serial_paired", s["check_cost_in_serial"]))
            la = res["loadavg_1m_before_after"]
            print(f"{name:<14} {rep:>3} {by['auto']['runs']:<18} "
                  + " ".join(f"{by[c]['median_s'] * 1e3:>11.1f} ms" for c in cols)
                  + f" {s['auto_vs_dtensor_tp']:>8.3f} {s['serial_vs_dtensor_tp']:>9.3f} "
                  f"{100 * s['check_cost_in_serial']:>7.2f}% {ratios['check_p'][-1]:>7.2f}% {la[0]:>4.1f}>{la[1]:<4.1f}", flush=True)
        print(f"{name:<14} median over {args.reps} runs: auto = {statistics.median(ratios['auto']):.3f}x DTensor TP, "
              f"serial = {statistics.median(ratios['serial']):.3f}x DTensor TP, cross-rank check costs "
              f"{statistics.median(ratios['check']):.2f}% of serial (difference of medians), "
              f"{statistics.median(ratios['check_p']):.2f}% paired per repetition")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
