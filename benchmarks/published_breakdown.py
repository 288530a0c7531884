"""Where a published run's predicted step time goes, and which term could carry its error.

Per run of the shipped published set (``ccoverlap validate published``, or the runs file
``--runs``) whose name starts with ``--prefix``: the measured and predicted step, the predicted
time of one simulated rank's ops each alone, by term (GEMMs, memory-bound kernels, fused
attention kernels, the tensor-parallel all-reduces inside a node,
every other collective or send/recv; ``batched`` is the part of the GEMMs' time in
batched GEMMs, an unfused attention's), the rest of the step (pipeline bubble, waits), and two
checks of the terms against measurements:

* **communication floor**: the step with every tensor-parallel all-reduce at the highest bus
  bandwidth any single-node all-reduce of the run's GPU reaches in the collective corpus (a
  bound no message of the run's sizes beats). A run still slower than measured at this floor
  is slow in another term than its all-reduces.
* **kernel corpus near the GEMMs**: the model's mean signed error (predicted / measured - 1) on
  the corpus GEMM rows of the run's GPU whose m, n and k are each within a factor 1.5 of one of
  the run's GEMMs (batch 1), weighted by that GEMM's predicted time, and the share of GEMM
  time that has such neighbours.

Seconds are one step; error = predicted / measured - 1. ``--nccl-2021`` prints instead the
message size below which the tuner of NCCL v2.8.4-1 / v2.9.6-1 (the releases of early 2021)
rates a ring all-reduce on one 8 x A100 NVSwitch node faster with LL128 than with Simple, for
2, 4 and 8 GPUs, from that source's constants (:data:`NCCL_2021_A100`).

Usage::

    python benchmarks/published_breakdown.py [--prefix ptdp] [--runs FILE] [--nccl-2021]
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass

from ccoverlap.catalog.hardware import get_gpu
from ccoverlap.corpus.tables import load_kind
from ccoverlap.cost import CostModel
from ccoverlap.predict.evaluate import build_workload_step
from ccoverlap.specs import AttentionSpec, CollectiveSpec, GemmSpec, MemorySpec
from ccoverlap.validation.kernels import judge_table
from ccoverlap.validation.predict import cost_params_for, predict_run, workload_for
from ccoverlap.validation.reader import PUBLISHED, RunSpec, load_runs


@dataclass(frozen=True)
class NcclRingRating:
    """The constants an NCCL tuner rates a one-node NVLink ring all-reduce with."""

    graph_bytes_per_s: float  # the ring graph's channels x their rated speed
    cap_bytes_per_s: float  # the tuner's cap on that bus bandwidth
    ll128_fraction: float  # LL128's share of it
    ll128_cap_bytes_per_s: float  # ll128MaxBwPerCh x the graph's channels
    base_latency_us: tuple[float, float]  # (Simple, LL128)
    nvlink_step_us: tuple[float, float]  # (Simple, LL128)

    def crossover_bytes(self, n: int) -> float:
        """Bytes below which an ``n``-GPU ring all-reduce is rated faster with LL128 than with
        Simple (time = latency + size / (bus x n / steps), steps = 2(n - 1))."""
        simple = min(self.graph_bytes_per_s, self.cap_bytes_per_s)
        ll128 = min(self.ll128_fraction * simple, self.ll128_cap_bytes_per_s)
        steps = 2 * (n - 1)
        lat = [(b + steps * s) * 1e-6 for b, s in zip(self.base_latency_us, self.nvlink_step_us)]
        return (lat[0] - lat[1]) / (steps / (n * ll128) - steps / (n * simple))


#: NVIDIA/nccl v2.8.4-1 and v2.9.6-1 (identical here) on one A100 NVSwitch node: the ring graph
#: has 12 channels of SM80_NVLINK_WIDTH = 21 GB/s (src/graph/topo.h; 6 rings at 42 GB/s doubled
#: in ncclTopoCompute, src/graph/search.cc); src/graph/tuning.cc caps its bus bandwidth at
#: 235 GB/s for compute capability 8.0, rates LL128 at min(0.92 x that, ll128MaxBwPerCh
#: [AllReduce] = 16.9 GB/s x 12 channels), and takes baseLat (ring) and hwLat (NVLink, ring) per
#: protocol, microseconds.
NCCL_2021_A100 = NcclRingRating(graph_bytes_per_s=12 * 21.0e9, cap_bytes_per_s=235.0e9, ll128_fraction=0.92,
                                ll128_cap_bytes_per_s=16.9e9 * 12, base_latency_us=(8.4, 10.0),
                                nvlink_step_us=(3.4, 1.9))


#: a corpus GEMM row is a neighbour of a run's GEMM when each of m, n, k is within this factor
NEIGHBOUR_FACTOR = 1.5


@dataclass
class Breakdown:
    """One run's predicted step split by term (seconds, one simulated rank, ops alone)."""

    measured_s: float
    predicted_s: float
    gemm_s: float = 0.0
    batched_gemm_s: float = 0.0  # the part of gemm_s in GEMMs of batch > 1 (unfused attention)
    memory_s: float = 0.0
    attention_s: float = 0.0  # fused (flash) attention kernels
    tp_s: float = 0.0
    other_comm_s: float = 0.0
    tp_floor_s: float = 0.0
    near_weight_s: float = 0.0
    near_error_s: float = 0.0

    @property
    def rest_s(self) -> float:
        """The step beyond its ops' own times: pipeline bubble and waits."""
        return self.predicted_s - self.gemm_s - self.memory_s - self.attention_s - self.tp_s - self.other_comm_s

    @property
    def floor_s(self) -> float:
        """The predicted step with the tensor-parallel all-reduces at the floor."""
        return self.predicted_s - self.tp_s + self.tp_floor_s


def best_node_busbw(gpu: str) -> float:
    """Highest bus bandwidth (bytes/s) of a single-node all-reduce of ``gpu`` in the corpus."""
    best = 0.0
    for table in load_kind("collective"):
        if table.gpu != gpu:
            continue
        for row in table.rows:
            if row.get("collective") == "all_reduce" and int(row.get("nodes", 0)) == 1:
                best = max(best, float(row["busbw_gbs"]) * 1e9)
    return best


def corpus_gemm_errors(gpu: str) -> list[tuple[int, int, int, float]]:
    """(m, n, k, predicted / measured - 1) of every batch-1 corpus GEMM row of ``gpu``."""
    out = []
    for table in load_kind("gemm"):
        if get_gpu(table.gpu).name != gpu:
            continue
        for row in judge_table(table, "all"):
            batch, m, n, k = (int(x) for x in row.label.split("x"))
            if batch == 1:
                out.append((m, n, k, row.error))
    return out


def near_error(spec: GemmSpec, rows: list[tuple[int, int, int, float]]) -> float | None:
    """Mean signed model error of the corpus rows near ``spec``, None without neighbours."""
    lim = math.log(NEIGHBOUR_FACTOR)
    errs = [e for m, n, k, e in rows
            if max(abs(math.log(m / spec.m)), abs(math.log(n / spec.n)), abs(math.log(k / spec.k))) <= lim]
    return statistics.mean(errs) if errs else None


def breakdown(run: RunSpec, busbw: float, rows: list[tuple[int, int, int, float]]) -> Breakdown:
    """The terms of ``run``'s predicted step on its rank 0 (see the module docstring)."""
    work, _notes = workload_for(run)
    step = build_workload_step(work)
    cost = CostModel(work.cluster, cost_params_for(run))
    out = Breakdown(measured_s=run.measured_step_time_s, predicted_s=predict_run(run).step_time_s)
    for op in step.graph.ops:
        spec = op.spec
        if op.rank != 0 or spec is None:
            continue
        t = op.duration_s if op.duration_s is not None else cost.alone_s(spec)
        if isinstance(spec, GemmSpec):
            out.gemm_s += t
            out.batched_gemm_s += t if spec.batch > 1 else 0.0
            err = near_error(spec, rows) if spec.batch == 1 else None
            if err is not None:
                out.near_weight_s += t
                out.near_error_s += t * err
        elif isinstance(spec, MemorySpec):
            out.memory_s += t
        elif isinstance(spec, AttentionSpec):
            out.attention_s += t
        elif isinstance(spec, CollectiveSpec) and spec.group.nodes == 1 and spec.group.size > 1 \
                and spec.group.name == "tp":
            out.tp_s += t
            n = spec.group.size
            out.tp_floor_s += 2.0 * (n - 1) / n * float(spec.bytes) / busbw if spec.collective == "all_reduce" else t
        else:
            out.other_comm_s += t
    return out


def main() -> None:
    """Print the table for the runs named by ``--prefix``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", default="ptdp", help="runs whose name starts with this (default: ptdp)")
    ap.add_argument("--runs", default=str(PUBLISHED), help="runs file (default: the published set)")
    ap.add_argument("--nccl-2021", action="store_true",
                    help="print NCCL v2.8.4 / v2.9.6's LL128 / Simple crossover on an A100 node instead")
    args = ap.parse_args()
    if args.nccl_2021:
        for n in (2, 4, 8):
            m = NCCL_2021_A100.crossover_bytes(n)
            print(f"{n} GPUs: LL128 rated faster below {m / 1e6:.2f} MB ({m / 2**20:.2f} MiB), Simple above")
        return
    runs = [r for r in load_runs(args.runs).runs if r.name.startswith(args.prefix)]
    print(f"{'run':26} {'measured':>8} {'pred':>7} {'err':>6} {'gemm':>6} {'batched':>7} {'memory':>6} {'attn':>6} {'tp ar':>6} "
          f"{'other':>6} {'rest':>6} {'tp floor':>8} {'at floor':>8} {'err':>6} {'GEMM corpus':>11} {'of':>4}")
    cache: dict[str, tuple[float, list[tuple[int, int, int, float]]]] = {}
    for run in runs:
        gpu = run.cluster.gpu.name
        if gpu not in cache:
            cache[gpu] = (best_node_busbw(gpu), corpus_gemm_errors(gpu))
        busbw, rows = cache[gpu]
        b = breakdown(run, busbw, rows)
        near = b.near_error_s / b.near_weight_s if b.near_weight_s else float("nan")
        print(f"{run.name:26} {b.measured_s:8.3f} {b.predicted_s:7.3f} {100 * (b.predicted_s / b.measured_s - 1):+5.1f}% "
              f"{b.gemm_s:6.3f} {b.batched_gemm_s:7.3f} {b.memory_s:6.3f} {b.attention_s:6.3f} {b.tp_s:6.3f} {b.other_comm_s:6.3f} "
              f"{b.rest_s:6.3f} "
              f"{b.tp_floor_s:8.3f} {b.floor_s:8.3f} {100 * (b.floor_s / b.measured_s - 1):+5.1f}% "
              f"{100 * near:+10.1f}% {100 * b.near_weight_s / max(b.gemm_s, 1e-12):3.0f}%")


if __name__ == "__main__":
    main()
