"""Where the predicted step of a published run goes: compute-stream busy time by kind, the
largest ops, and how much host dispatch the eager profile charges.

For each run of a runs file (default: the shipped published set) whose name contains one of
the given substrings, simulate the step with default parameters and print, for the first
simulated rank: the step time; the busy time of the compute stream split into GEMMs,
attention kernels and memory-bound kernels; the largest ops (summed over layers and
micro-batches, with their count); and the host-dispatch total ``host_kernels x
eager_host_overhead_s`` with the time of the ops that sit at that floor (host-bound ops). Nothing
here is timed: the numbers are model outputs, identical on any machine::

    .venv/bin/python benchmarks/run_breakdown.py mcore-gpt-1.7b torchtitan-llama3.1-8b-fsdp-h100x8
    .venv/bin/python benchmarks/run_breakdown.py --runs my_runs.yaml my-run
    .venv/bin/python benchmarks/run_breakdown.py torchtitan-llama3.1-8b-fsdp-h100x8 --framework torchtitan-fused-rmsnorm
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path


def breakdown(run) -> dict:
    """Model outputs for one run (seconds): step, busy time by kind, per-op totals and counts,
    host-dispatch total and the time of host-bound ops."""
    from ccoverlap.cost import CostModel
    from ccoverlap.predict.evaluate import build_workload_step
    from ccoverlap.sim.simulator import simulate
    from ccoverlap.sim.timeline import step_time_s
    from ccoverlap.specs import AttentionSpec, GemmSpec, MemorySpec
    from ccoverlap.validation.predict import cost_params_for, workload_for

    w, _ = workload_for(run)
    step = build_workload_step(w)
    p = cost_params_for(run)
    tl = simulate(step.graph, CostModel(w.cluster, p))
    r0 = step.graph.ops[0].rank
    kinds: Counter = Counter()
    ops: Counter = Counter()
    count: Counter = Counter()
    host = host_bound = 0.0
    for o in step.graph.ops:
        if o.rank != r0 or o.stream != "compute" or o.spec is None:
            continue
        d = float(tl.end_s[o.op_id] - tl.start_s[o.op_id])
        kind = ("GEMM" if isinstance(o.spec, GemmSpec) else "attention" if isinstance(o.spec, AttentionSpec)
                else "memory-bound" if isinstance(o.spec, MemorySpec) else "other")
        kinds[kind] += d
        name = o.name.rstrip("0123456789_")
        ops[name] += d
        count[name] += 1
        floor = (getattr(o.spec, "host_kernels", 0) or 0) * p.eager_host_overhead_s
        host += floor
        if floor and abs(d - floor) < 1e-12:
            host_bound += d
    return {"step": step_time_s(tl), "kinds": kinds, "ops": ops, "count": count, "host": host,
            "host_bound": host_bound, "per_kernel": p.eager_host_overhead_s}


def main(argv=None) -> int:
    from ccoverlap.validation.reader import load_runs

    default = Path(__file__).resolve().parent.parent / "ccoverlap" / "data" / "runs" / "published.yaml"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="substrings of run names")
    ap.add_argument("--runs", default=str(default), help="runs file (default: the shipped published set)")
    ap.add_argument("--top", type=int, default=12, help="largest ops listed per run")
    ap.add_argument("--framework", help="simulate with this framework profile instead of the run's own")
    args = ap.parse_args(argv)
    for run in load_runs(args.runs).runs:
        if not any(n in run.name for n in args.names):
            continue
        if args.framework:
            run = replace(run, framework=args.framework)
        b = breakdown(run)
        print(f"## {run.name} (framework {run.framework or 'megatron-core'}): step {b['step']:.3f} s")
        print("   compute stream: " + ", ".join(f"{k} {v:.3f} s" for k, v in b["kinds"].most_common()))
        print("   largest ops: " + ", ".join(f"{k} {v * 1e3:.1f} ms/{b['count'][k]}"
                                            for k, v in b["ops"].most_common(args.top)))
        print(f"   host dispatch: {b['host'] * 1e3:.1f} ms at {b['per_kernel'] * 1e6:.0f} us per kernel "
              f"({100 * b['host'] / b['step']:.1f}% of the step); host-bound ops {b['host_bound'] * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
