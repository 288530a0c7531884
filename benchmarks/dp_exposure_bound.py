"""How much data-parallel communication a Megatron-Core step can hide, per published run.

For each run of a runs file that uses the distributed optimizer with overlap (default: the
Megatron-Core rows of the published set), prints the lower bound on the step that Megatron-Core's
own schedule allows (megatron/core/distributed and pipeline_parallel/schedules.py at f2e5db402c):

* the fp32 gradient reduce-scatter can overlap only the backward of the last micro-batch
  (``no_sync`` for the others; ``register_grad_ready`` only when ``is_last_microbatch``);
* the bf16 parameter all-gather can overlap only the forward of the first micro-batch of the
  next step (``overlap_param_gather``: dispatched after the optimizer step, waited for in the
  forward pre-hooks);

so ``step >= compute + max(0, RS - W_bwd) + max(0, AG - W_fwd)`` with RS / AG the two
collectives alone at the cost model's NCCL bandwidth (about 46 GB/s per 400G NIC, NVIDIA's
figure in NVIDIA/nccl-tests#290) and W the compute busy time of those micro-batches on the simulated timeline of that run.
Model outputs, not measurements; ``--micro-batch N`` re-runs with another micro-batch size.

    .venv/bin/python benchmarks/dp_exposure_bound.py [RUNS_FILE] [--run NAME] [--micro-batch N]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path


def _busy(tl, comp, phase: str, mb: int) -> float:
    """Seconds the ops in ``comp`` ((index, op) pairs) of ``phase`` and micro-batch ``mb``
    compute (their durations summed: waits for communication are not a window)."""
    idx = [i for i, o in comp if o.phase == phase and o.microbatch == mb]
    return float((tl.end_s[idx] - tl.start_s[idx]).sum()) if idx else 0.0


def main(argv=None) -> int:
    """Print the bound table (Markdown) for the runs asked for; returns the exit status."""
    from ccoverlap.cost import CostModel
    from ccoverlap.cost.comm import collective_time_s
    from ccoverlap.predict.evaluate import build_workload_step, summarize
    from ccoverlap.sim.simulator import simulate
    from ccoverlap.validation.predict import cost_params_for, workload_for
    from ccoverlap.validation.reader import PUBLISHED, load_runs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_file", nargs="?", default=str(PUBLISHED))
    ap.add_argument("--run", action="append", help="only this run (repeatable)")
    ap.add_argument("--micro-batch", type=int, default=None, help="simulate with this micro-batch size instead")
    args = ap.parse_args(argv)
    runs = [r for r in load_runs(Path(args.runs_file)).runs
            if r.parallel.get("distributed_optimizer") and r.knobs.get("overlap", True)
            and (not args.run or r.name in args.run)]
    print("| run | micro-batch | M | compute (s) | RS fp32 alone (s) | last-mb bwd (s) | AG bf16 alone (s) | "
          "first-mb fwd (s) | bound (s) | predicted (s) | measured (s) |")
    print("| :-- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |")
    for run in runs:
        if args.micro_batch:
            run = replace(run, batch={**run.batch, "micro_batch": args.micro_batch})
        w, _ = workload_for(run)
        step = build_workload_step(w)
        params = cost_params_for(run)
        tl = simulate(step.graph, CostModel(w.cluster, params))
        res = summarize("x", w, step, tl, keep_timeline=False)
        ops = step.graph.ops
        rank0 = [o for o in ops if o.rank == 0]
        rs = [o.spec for o in rank0 if o.name == "grad_rs_dp"]
        ag = [o.spec for o in rank0 if o.name == "param_ag"]
        t_rs = sum(collective_time_s(s, w.cluster, params) for s in rs)
        t_ag = sum(collective_time_s(s, w.cluster, params) for s in ag)
        # windows on the simulated rank-0 compute stream (timeline rows are in op-id order)
        M = step.microbatches
        comp = [(i, o) for i, o in enumerate(ops) if o.rank == 0 and o.stream == "compute"]
        w_bwd, w_fwd = _busy(tl, comp, "bwd", M - 1), _busy(tl, comp, "fwd", 0)
        bound = res.compute_s + max(0.0, t_rs - w_bwd) + max(0.0, t_ag - w_fwd)
        print(f"| {run.name} | {run.batch['micro_batch']} | {M} | {res.compute_s:.3f} | {t_rs:.3f} | {w_bwd:.3f} | "
              f"{t_ag:.3f} | {w_fwd:.3f} | {bound:.3f} | {res.step_time_s:.3f} | {run.measured_step_time_s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
