"""Simulate a workload and summarise it as a :class:`StrategyResult` — shared by the planner
and the deciders, so every strategy is measured with the same definitions.

Definitions: MFU = model FLOPs per step / (world size × dense peak FLOP/s × step time), the
PaLM / Megatron definition (recomputation not counted); exposed communication, compute and
communication are those of the simulated rank with the most exposed communication (the
critical one); the overlap ratio is taken over all simulated ranks' communication.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ccoverlap.timeline import Timeline, all_rank_metrics, step_time_s


@dataclass
class StrategyResult:
    """One simulated strategy; times in seconds, memory in bytes."""

    name: str
    knobs: dict
    step_time_s: float
    tokens_per_s: float
    mfu: float
    exposed_comm_s: float
    overlap_ratio: float
    compute_s: float
    comm_s: float
    compute_comm_ratio: float
    peak_memory_bytes: float
    fits_memory: bool
    note: str = ""
    timeline: Timeline | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "knobs": self.knobs,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "exposed_comm_s": self.exposed_comm_s,
            "overlap_ratio": self.overlap_ratio,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "compute_comm_ratio": self.compute_comm_ratio,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits_memory": self.fits_memory,
            "note": self.note,
        }


def cost_model_for_cluster(cluster, calibration: str | None = None):
    """The cost model of ``cluster``: the GPU's default parameters, overridden by the
    calibration file ``calibration`` (written by ``ccoverlap calibrate``) if given. The one
    place a :class:`~ccoverlap.cost.CostModel` is built from a cluster."""
    from ccoverlap.cost import CostModel, CostParams
    from ccoverlap.cost.params import default_params

    params = default_params(cluster.gpu)
    if calibration:
        params = CostParams.load(calibration, base=params)
    return CostModel(cluster, params)


def cost_model_for(w):
    """The cost model of the workload's cluster, with its calibration file applied if given."""
    return cost_model_for_cluster(w.cluster, w.calibration)


def build_workload_step(w):
    """The :class:`~ccoverlap.parallel.StepGraph` of workload ``w`` (its framework profile passed
    on when the workload has one): the one place a workload's step is built."""
    from ccoverlap.parallel import build_step

    kw = {"framework": w.framework} if getattr(w, "framework", None) is not None else {}
    return build_step(w.model, w.parallel, w.batch, w.cluster, w.knobs, **kw)


def simulate_workload(w, *, cost=None, progress=None):
    """Build and simulate one training step of ``w``; returns (StepGraph, Timeline)."""
    from ccoverlap.sim import simulate

    step = build_workload_step(w)
    tl = simulate(step.graph, cost if cost is not None else cost_model_for(w), progress=progress)
    return step, tl


def summarize(name: str, w, step, tl: Timeline, *, note: str = "", extra_memory_bytes: float = 0.0,
              keep_timeline: bool = True) -> StrategyResult:
    """Summarise the simulated timeline ``tl`` of ``step`` (the StepGraph of workload ``w``, maybe
    rewritten by a decider). ``extra_memory_bytes`` is added to the step's memory estimate (e.g.
    activations of micro-batches launched together) and re-checked against the usable memory."""
    t = step_time_s(tl)
    ranks = all_rank_metrics(tl)
    worst = max(ranks, key=lambda m: m.exposed_comm_s)
    comm_total = sum(m.comm_s for m in ranks)
    overlap = sum(m.overlap_s for m in ranks) / comm_total if comm_total > 0 else 0.0
    peak = w.cluster.gpu.flops_for(w.parallel.dtype_bytes) * step.world_size
    mem = step.memory
    total = float(mem.total_bytes) + float(extra_memory_bytes)
    return StrategyResult(
        name=name,
        knobs=w.knobs.to_dict(),
        step_time_s=t,
        tokens_per_s=step.tokens_per_step / t if t > 0 else 0.0,
        mfu=step.model_flops_per_step / (peak * t) if t > 0 else 0.0,
        exposed_comm_s=worst.exposed_comm_s,
        overlap_ratio=overlap,
        compute_s=worst.compute_s,
        comm_s=worst.comm_s,
        compute_comm_ratio=worst.compute_comm_ratio,
        peak_memory_bytes=total,
        fits_memory=bool(total <= mem.usable_bytes) if extra_memory_bytes else bool(mem.fits),
        note=note,
        timeline=tl if keep_timeline else None,
    )


def evaluate(w, name: str, *, cost=None, note: str = "", keep_timeline: bool = False) -> StrategyResult:
    """Simulate ``w`` and summarise it (see the module docstring for the definitions)."""
    step, tl = simulate_workload(w, cost=cost)
    return summarize(name, w, step, tl, note=note, keep_timeline=keep_timeline)
