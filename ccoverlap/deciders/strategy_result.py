"""A planner :class:`~ccoverlap.plan.StrategyResult` from a step the deciders rewrote and simulated.

:func:`ccoverlap.plan.evaluate` builds and simulates a workload itself; the Centauri and FiCCO
deciders simulate a *rewritten* graph of the built step instead, so they summarise their
Timeline here with the same definitions (MFU as PaLM / Megatron: model FLOPs per step over
world size x dense peak x step time; exposed communication and compute of the simulated rank
with the most exposed communication; overlap ratio over all ranks).
"""

from __future__ import annotations

from ccoverlap.timeline import Timeline, all_rank_metrics, step_time_s

__all__ = ["result_from_timeline"]


def result_from_timeline(name: str, w, step, tl: Timeline, *, note: str = "", extra_memory_bytes: float = 0.0,
                         keep_timeline: bool = True):
    """Summarise the simulated ``tl`` of ``step`` (a StepGraph of workload ``w``) as
    :func:`ccoverlap.plan.evaluate` does. ``extra_memory_bytes`` is added to the step's memory
    estimate (e.g. activations of micro-batches launched together) and re-checked against the
    usable memory. Times in seconds, memory in bytes."""
    from ccoverlap.plan import StrategyResult

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
