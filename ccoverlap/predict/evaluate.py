"""Simulate a workload and summarize it as a :class:`StrategyResult` — shared by the planner
and the deciders, so every strategy is measured with the same definitions.

Definitions: MFU = model FLOPs per step / (world size × dense peak FLOP/s × step time), the
PaLM / Megatron definition (recomputation not counted); exposed communication, compute and
communication are those of the simulated rank with the most exposed communication (the
critical one); the overlap ratio is taken over all simulated ranks' communication.

A summary is made from a simulated timeline (:func:`summarize`) or from :class:`StepMetrics`,
which may be extrapolated from two shorter steps in a pipeline's steady state
(:func:`extrapolate_metrics`, used by :class:`ccoverlap.predict.strategy.Planner`; docs/planner.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from ccoverlap.cost import CostModel, CostParams
from ccoverlap.cost.params import default_params
from ccoverlap.parallel import build_step
from ccoverlap.parallel.memory import MemoryEstimate
from ccoverlap.parallel.step import step_totals as totals_of
from ccoverlap.sim.simulator import SupportsDuration, simulate
from ccoverlap.sim.timeline import (
    RankMetrics,
    Timeline,
    all_rank_metrics,
    compute_comm_ratio,
    job_overlap_ratio,
    overlap_ratio,
    step_time_s,
)
from ccoverlap.types import ProgressFn

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig
    from ccoverlap.parallel.step import StepGraph


class WorkloadParts(Protocol):
    """What this module reads from a workload (a :class:`ccoverlap.predict.workload.Workload`,
    which it does not import: the two modules are independent in the import order)."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def cluster(self) -> ClusterSpec: ...
    @property
    def parallel(self) -> ParallelConfig: ...
    @property
    def batch(self) -> BatchConfig: ...
    @property
    def knobs(self) -> OverlapKnobs: ...
    @property
    def framework(self) -> str | None: ...
    @property
    def calibration(self) -> str | None: ...


@dataclass
class StrategyResult:
    """One simulated strategy; times in seconds, memory in bytes. ``knobs``: the framework
    knobs it ran with; ``decision``: what a decider chose beyond the knobs, as plain data
    (``comm_plan``: a :class:`~ccoverlap.nccl.plan.CommPlan` as a mapping;
    ``parallel``: layout fields changed; ``rewrites``: step rewrites no knob expresses;
    ``tp_schedules``: a TP overlap schedule per collective + GEMM pair), read by
    :mod:`ccoverlap.planning.emit`."""

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
    decision: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The result as plain data (every field but the timeline)."""
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
            "decision": self.decision,
        }


def cost_model_for_cluster(cluster: ClusterSpec, calibration: str | None = None) -> CostModel:
    """The cost model of ``cluster``: the GPU's default parameters, overridden by the
    calibration file ``calibration`` (written by ``ccoverlap calibrate``) if given. The one
    place a :class:`~ccoverlap.cost.CostModel` is built from a cluster."""

    params = default_params(cluster.gpu)
    if calibration:
        params = CostParams.load(calibration, base=params, for_gpu=cluster.gpu.name)
    return CostModel(cluster, params)


def cost_model_for(w: WorkloadParts) -> CostModel:
    """The cost model of the workload's cluster, with its calibration file applied if given."""
    return cost_model_for_cluster(w.cluster, w.calibration)


def build_workload_step(w: WorkloadParts) -> StepGraph:
    """The :class:`~ccoverlap.parallel.StepGraph` of workload ``w`` (its framework profile passed
    on when the workload has one): the one place a workload's step is built."""

    return build_step(w.model, w.parallel, w.batch, w.cluster, w.knobs, framework=w.framework)


def simulate_workload(w: WorkloadParts, *, cost: SupportsDuration | None = None,
                      progress: ProgressFn | None = None) -> tuple[StepGraph, Timeline]:
    """Build and simulate one training step of ``w``; returns (StepGraph, Timeline)."""

    step = build_workload_step(w)
    tl = simulate(step.graph, cost if cost is not None else cost_model_for(w), progress=progress)
    return step, tl


@dataclass(frozen=True)
class StepMetrics:
    """What a summary reads from a simulated step: the step time (first start to last end over
    all ranks, seconds), every simulated rank's :class:`~ccoverlap.sim.timeline.RankMetrics` and the
    number of micro-batches per pipeline the step ran. Made from a timeline (:meth:`of`) or
    extrapolated from two shorter steps (:func:`extrapolate_metrics`)."""

    step_time_s: float
    ranks: tuple[RankMetrics, ...]
    microbatches: int
    extrapolated_from: tuple[int, int] | None = None

    @classmethod
    def of(cls, tl: Timeline, microbatches: int) -> StepMetrics:
        """The metrics of the simulated timeline ``tl`` of a step of ``microbatches`` micro-batches."""
        return cls(step_time_s(tl), tuple(all_rank_metrics(tl)), int(microbatches))


#: RankMetrics fields that are sums of time over the step (affine in the micro-batch count in a
#: pipeline's steady state); the ratios are recomputed from them
_AFFINE_FIELDS = ("step_time_s", "compute_s", "comm_s", "memcpy_s", "overlap_s", "exposed_comm_s",
                  "compute_only_s", "idle_s", "bubble_s", "flops", "comm_bytes")


def extrapolate_metrics(a: StepMetrics, b: StepMetrics, microbatches: int) -> StepMetrics:
    """The metrics of the same step with ``microbatches`` micro-batches per pipeline, from two
    simulated steps ``a`` and ``b`` with fewer (``a.microbatches < b.microbatches``), assuming
    every time is affine in the micro-batch count: x(M) = x(a) + (M − M_a)·(x(b) − x(a))/(M_b − M_a).

    That holds once both steps are past the pipeline's warm-up: in 1F1B and interleaved 1F1B
    each further micro-batch adds one forward and one backward per stage to the steady state
    while the fill / drain and the once-per-step work (gradient synchronisation, optimizer)
    stay the same (Narayanan et al. 2021, §2.2, step time (M + p − 1)·(t_f + t_b) for 1F1B);
    without a pipeline each adds its forward and backward. The planner checks which schedules qualify
    (:meth:`ccoverlap.predict.strategy.Planner.steady_state`); ``tests/predict/test_steady_state.py`` compares
    the extrapolation with full simulations. Ratios (overlap, R) are recomputed from the
    extrapolated times; negative extrapolations are clipped to 0."""
    if not a.microbatches < b.microbatches:
        raise ValueError(f"extrapolation needs two step lengths, got {a.microbatches} and {b.microbatches}")
    if len(a.ranks) != len(b.ranks):
        raise ValueError("extrapolation needs the same simulated ranks in both steps")
    f = (microbatches - a.microbatches) / (b.microbatches - a.microbatches)

    def ex(x: float, y: float) -> float:
        return max(0.0, x + f * (y - x))

    ranks = []
    for ra, rb in zip(a.ranks, b.ranks):
        vals: dict[str, Any] = {k: ex(getattr(ra, k), getattr(rb, k)) for k in _AFFINE_FIELDS}
        comm, comp = vals["comm_s"], vals["compute_s"]
        vals["overlap_ratio"] = overlap_ratio(vals["overlap_s"], comm)
        vals["compute_comm_ratio"] = compute_comm_ratio(comp, comm)
        ranks.append(replace(ra, **vals))
    return StepMetrics(ex(a.step_time_s, b.step_time_s), tuple(ranks), int(microbatches),
                       extrapolated_from=(a.microbatches, b.microbatches))


def summarize(name: str, w: WorkloadParts, step: StepGraph, tl: Timeline, *, note: str = "",
              extra_memory_bytes: float = 0.0,
              keep_timeline: bool = True) -> StrategyResult:
    """Summarize the simulated timeline ``tl`` of ``step`` (the StepGraph of workload ``w``, maybe
    rewritten by a decider). ``extra_memory_bytes`` is added to the step's memory estimate (e.g.
    activations of micro-batches launched together) and re-checked against the usable memory."""
    res = summarize_metrics(name, w, StepMetrics.of(tl, step.microbatches), step_totals(w, step),
                            note=note, extra_memory_bytes=extra_memory_bytes)
    res.timeline = tl if keep_timeline else None
    return res


@dataclass(frozen=True)
class StepTotals:
    """What a summary reads from the workload rather than the timeline: world size, tokens and
    model FLOPs per step (PaLM's MFU definition) and the memory estimate."""

    world_size: int
    tokens_per_step: float
    model_flops_per_step: float
    memory: MemoryEstimate


def step_totals(w: WorkloadParts, step: StepGraph | None = None) -> StepTotals:
    """:class:`StepTotals` of workload ``w``: taken from its built ``step`` if given, else
    computed without building it (:func:`ccoverlap.parallel.step.step_totals`, which
    :func:`ccoverlap.parallel.build_step` uses too)."""
    if step is not None:
        return StepTotals(step.world_size, step.tokens_per_step, step.model_flops_per_step, step.memory)

    tokens, flops, mem = totals_of(w.model, w.parallel, w.batch, w.cluster, w.knobs, w.framework)
    return StepTotals(w.parallel.world_size, tokens, flops, mem)


def summarize_metrics(name: str, w: WorkloadParts, metrics: StepMetrics, totals: StepTotals, *, note: str = "",
                      extra_memory_bytes: float = 0.0) -> StrategyResult:
    """:func:`summarize` from step metrics (simulated or extrapolated, :class:`StepMetrics`) and
    the workload's :class:`StepTotals`; the definitions are the module docstring's."""
    t = metrics.step_time_s
    ranks = metrics.ranks
    worst = max(ranks, key=lambda m: m.exposed_comm_s)
    overlap = job_overlap_ratio(ranks)
    peak = w.cluster.gpu.flops_for(w.parallel.dtype_bytes) * totals.world_size
    mem = totals.memory
    total = float(mem.total_bytes) + float(extra_memory_bytes)
    return StrategyResult(
        name=name,
        knobs=w.knobs.to_dict(),
        step_time_s=t,
        tokens_per_s=totals.tokens_per_step / t if t > 0 else 0.0,
        mfu=totals.model_flops_per_step / (peak * t) if t > 0 else 0.0,
        exposed_comm_s=worst.exposed_comm_s,
        overlap_ratio=overlap,
        compute_s=worst.compute_s,
        comm_s=worst.comm_s,
        compute_comm_ratio=worst.compute_comm_ratio,
        peak_memory_bytes=total,
        fits_memory=bool(total <= mem.usable_bytes) if extra_memory_bytes else bool(mem.fits),
        note=note,
    )


def evaluate(w: WorkloadParts, name: str, *, cost: SupportsDuration | None = None, note: str = "",
             keep_timeline: bool = False) -> StrategyResult:
    """Simulate ``w`` and summarize it (see the module docstring for the definitions)."""
    step, tl = simulate_workload(w, cost=cost)
    return summarize(name, w, step, tl, note=note, keep_timeline=keep_timeline)
