"""How long building and simulating one training step takes.

Workload: Llama-3-70B on 1024 H100 (128 DGX nodes), TP 8 x PP 8 x DP 16, 1F1B, global batch 256
sequences of 8192 tokens, micro-batch 1, so 16 micro-batches per pipeline. Reports the median
of several runs of ``build_step`` and of ``simulate`` (wall and CPU time: on a shared machine
the wall time includes waiting for a core), the op count, the simulated step time and which
cost model was used (``ccoverlap.cost.CostModel`` if importable, else a toy roofline).

    python benchmarks/bench_simulate.py [--runs N] [--sp] [--schedule 1f1b|interleaved|...]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ccoverlap.graph import AttentionSpec, CollectiveSpec, GemmSpec, MemorySpec, P2PSpec  # noqa: E402
from ccoverlap.hardware import get_cluster  # noqa: E402
from ccoverlap.models import get_model  # noqa: E402
from ccoverlap.parallel import BatchConfig, OverlapKnobs, ParallelConfig, build_step  # noqa: E402
from ccoverlap.sim import simulate  # noqa: E402
from ccoverlap.timeline import step_time_s  # noqa: E402


class ToyCost:
    """flops / 800 TFLOP/s, bytes / 3 TB/s, collectives bytes / 50 GB/s (no contention)."""

    def duration_s(self, spec, concurrent):
        """Seconds of ``spec`` (``concurrent`` ignored)."""
        if isinstance(spec, (CollectiveSpec, P2PSpec)):
            return spec.bytes / 50e9
        if isinstance(spec, (GemmSpec, AttentionSpec)):
            return spec.flops / 800e12
        if isinstance(spec, MemorySpec):
            return spec.bytes / 3e12
        return 0.0


def cost_model(cluster):
    """The real cost model when importable, else the toy one; with a label saying which."""
    try:
        from ccoverlap.cost import CostModel
    except ImportError:
        return ToyCost(), "toy roofline (ccoverlap.cost not importable)"
    return CostModel(cluster), "ccoverlap.cost.CostModel (default parameters)"


def main(argv=None) -> int:
    """Run the benchmark and print medians (seconds)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sp", action="store_true", help="sequence parallelism (more TP collectives per layer)")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--toy", action="store_true", help="use the toy cost model even if the real one imports")
    args = ap.parse_args(argv)

    model = get_model("Llama-3-70B")
    cluster = get_cluster("dgx-h100", nodes=128)
    parallel = ParallelConfig(tp=8, pp=8, dp=16, sequence_parallel=args.sp, pp_schedule=args.schedule,
                              virtual_stages=2 if args.schedule == "interleaved" else 1)
    batch = BatchConfig(global_batch=256, micro_batch=1, seq_len=8192)
    knobs = OverlapKnobs()
    build_wall, build_cpu, sim_wall, sim_cpu, total_wall = [], [], [], [], []
    label = ""
    for _ in range(args.runs):
        cost, label = (ToyCost(), "toy roofline (--toy)") if args.toy else cost_model(cluster)
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        step = build_step(model, parallel, batch, cluster, knobs)
        w1, c1 = time.perf_counter(), time.process_time()
        tl = simulate(step.graph, cost)
        w2, c2 = time.perf_counter(), time.process_time()
        build_wall.append(w1 - w0)
        build_cpu.append(c1 - c0)
        sim_wall.append(w2 - w1)
        sim_cpu.append(c2 - c1)
        total_wall.append(w2 - w0)
        n_ops = len(step.graph)
        t_step = step_time_s(tl)
        del step, tl

    med = statistics.median
    print(f"workload : {model.name}, {cluster.world_size} x {cluster.gpu.name}, TP{parallel.tp} x PP{parallel.pp} x "
          f"DP{parallel.dp}, {parallel.pp_schedule}, SP={parallel.sequence_parallel}, "
          f"{batch.microbatches(parallel.dp)} micro-batches of {batch.micro_batch} x {batch.seq_len} tokens")
    print(f"cost     : {label}")
    print(f"graph    : {n_ops} ops on {parallel.pp} simulated ranks")
    print(f"runs     : {args.runs} (median; wall / CPU seconds)")
    print(f"build    : {med(build_wall):.3f} s / {med(build_cpu):.3f} s")
    print(f"simulate : {med(sim_wall):.3f} s / {med(sim_cpu):.3f} s")
    print(f"total    : {med(total_wall):.3f} s wall (min {min(total_wall):.3f} s)")
    print(f"step     : {t_step:.3f} s simulated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
