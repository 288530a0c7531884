"""torchtitan's Llama TP + SP plan with torch's styles vs ccoverlap's: the plan-level table of docs/runtime.md.

For every shape (attention-heavy, GEMM-heavy, activation-heavy; ``ccoverlap.runtime.plan_bench.SHAPES``),
workload (``block``: one block forward + backward; ``model``: embedding, ``--layers`` blocks,
head with loss parallelism, forward + backward + AdamW) and world size (gloo, one thread per
rank; NCCL with one GPU per rank when there are enough GPUs), the same plan dict is applied
with torch's ``ColwiseParallel``/``RowwiseParallel``/``PrepareModuleInput`` and with
``ccoverlap.runtime.tp``'s, both from the same full weights, and timed in paired alternating
repetitions (the slowest rank per step). Printed: the Markdown table (median ms per row,
median of the per-repetition ratio ours/torch and its 95% sign-test interval), the load
average, and every row that could not run with the reason (PyTorch's async TP needs CUDA).

    python benchmarks/bench_runtime_plan.py                       # everything: 3 shapes x 2 workloads x P=2,4
    python benchmarks/bench_runtime_plan.py --worlds 2 --workloads block --reps 30
    python benchmarks/bench_runtime_plan.py --json plan.json      # keep every timing
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ccoverlap.runtime.plan_bench import SHAPES, PlanBenchConfig, bench, format_table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="all", help=f"comma-separated from {', '.join(SHAPES)} (default all)")
    ap.add_argument("--workloads", default="block,model", help="block, model or both (default both)")
    ap.add_argument("--worlds", default="2,4", help="ranks per run, comma-separated (default 2,4)")
    ap.add_argument("--reps", type=int, default=20, help="paired repetitions per run (default 20)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per row after the first (default 2)")
    ap.add_argument("--layers", type=int, default=4, help="blocks of the model (default 4)")
    ap.add_argument("--schedule", default="auto", help="ccoverlap styles' schedule (default auto)")
    ap.add_argument("--rows", default="torch,ccoverlap,async-tp",
                    help="rows: torch, ccoverlap, ccoverlap:<schedule>, async-tp (default torch,ccoverlap,async-tp)")
    ap.add_argument("--json", metavar="PATH", help="also write every result (all timings) to PATH")
    args = ap.parse_args(argv)
    shapes = list(SHAPES) if args.shapes == "all" else [s.strip() for s in args.shapes.split(",")]
    results = []
    for world in (int(w) for w in args.worlds.split(",")):
        for workload in (w.strip() for w in args.workloads.split(",")):
            for shape in shapes:
                cfg = PlanBenchConfig(shape=shape, workload=workload, reps=args.reps, warmup=args.warmup,
                                      layers=args.layers, schedule=args.schedule, rows=tuple(args.rows.split(",")))
                res = bench(cfg, world)
                results.append(res)
                print(format_table([res]), flush=True)
                print(f"  load average {res['loadavg_1m_before_after'][0]:.1f} -> "
                      f"{res['loadavg_1m_before_after'][1]:.1f}; auto ran: "
                      + ("; ".join(res["auto_decisions"]) or "-"), flush=True)
    print()
    print(f"torch {results[0]['torch']}, {results[0]['device']}, {results[0]['backend']}, "
          f"{results[0]['threads_per_rank']} thread(s) per rank, {args.reps} paired repetitions; "
          f"load average (1 min) {os.getloadavg()[0]:.1f} at the end")
    print(format_table(results, markdown=True))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
