"""``plan --search``: which layout to train a model with on a cluster, for a global batch.

1. **Enumerate** the legal layouts: TP (dividing a node and the attention / KV heads; sequence
   parallelism on whenever TP > 1, as Megatron-LM recommends), PP (dividing the layers), CP
   (when ``ParallelConfig`` has a ``cp`` field, see :func:`cp_degrees`), DP filling the rest of
   the cluster, FSDP vs DDP, HSDP (FSDP with ``dp_replicate`` > 1 dividing ``dp``: shard
   groups of ``dp·cp / dp_replicate`` ranks, laid out inside a node first by ``Layout``),
   expert parallelism for mixture-of-experts models (``ep`` dividing the experts and ``dp``),
   micro-batch, recomputation (none / selective / full) and PP schedule (1F1B, interleaved
   with 2 virtual stages, GPipe, DualPipe). Illegal combinations are dropped by the same checks as ``plan``
   (:func:`ccoverlap.parallel.config.config_problems`).
2. **Memory**: keep only layouts whose per-GPU estimate fits
   (:func:`ccoverlap.parallel.memory.estimate_memory` through :func:`ccoverlap.parallel.step.step_totals`,
   with the default knobs and the workload's framework profile).
3. **Screen**: an analytical estimate of each layout's step from the cost model's isolated
   times of one transformer layer's ops (forward, backward, recomputation; TP collectives
   included since they block the layer; for MoE layers the router, the expert GEMMs and the
   EP all-to-alls), times layers per stage, times micro-batches plus the pipeline bubble
   ``(pp − 1) / v`` (Narayanan et al. 2021, §2.2; ``pp/2 − 1`` for DualPipe). It leaves out data-parallel
   communication, the embedding / head and any contention, so under the simulator's own
   assumptions it should not exceed the simulated time; every simulated layout is checked and
   exceptions are counted (``bound_violations``).
4. **Simulate** layouts in increasing estimate (branch and bound): stop once the next estimate
   exceeds the best simulated step time (nothing later can win if the estimate is a lower
   bound), or after ``max_simulations``. Each is simulated with overlap on and default knobs;
   the ``top`` best then get the planner's best-knobs search (one round of coordinate descent,
   :func:`ccoverlap.planning.strategies.search_best_knobs`) and are ranked by that.

Times in seconds, memory in bytes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Protocol

from ccoverlap.config import Count, Count0, check_keys, check_value, field_names
from ccoverlap.errors import ConfigError
from ccoverlap.outputs import save_figure
from ccoverlap.parallel import ep as epm
from ccoverlap.parallel import layer as lay
from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig, config_problems
from ccoverlap.parallel.context import LayerCtx
from ccoverlap.parallel.flash import flash_fwd_spec
from ccoverlap.parallel.layout import Layout
from ccoverlap.parallel.step import step_totals
from ccoverlap.planning.strategies import search_best_knobs
from ccoverlap.predict.evaluate import cost_model_for
from ccoverlap.predict.strategy import Planner
from ccoverlap.types import ProgressFn

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.cost.model import CostModel
    from ccoverlap.parallel.segment import Segment
    from ccoverlap.predict.evaluate import StrategyResult
    from ccoverlap.predict.workload import Workload

#: one layout to simulate: (workload, cost model, label, planner processes: None = default, 1 on a worker)
Job = tuple["Workload", "CostModel", str, "int | None"]
#: :func:`_numbers`: step time (s), tokens/s, MFU, exposed communication (s), fits in memory
Numbers = tuple[float, float, float, float, bool]


class Engine(Protocol):
    """Where layouts are simulated (the engines of :mod:`ccoverlap.workers.pool`): ``map(fn,
    items)`` yields ``fn(item)`` per item, in order; an optional ``jobs`` attribute is how many
    run at once."""

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterable[Any]: ...


@dataclass
class Candidate:
    """One layout: its configuration, memory, screening estimate and (if simulated) results."""

    parallel: ParallelConfig
    batch: BatchConfig
    label: str
    memory_bytes: float
    fits: bool
    estimate_s: float = float("nan")
    step_time_s: float | None = None   # simulated, default knobs
    best_time_s: float | None = None   # simulated, best knobs (top layouts only)
    best_knobs: dict[str, Any] | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    exposed_comm_s: float | None = None

    @property
    def predicted_s(self) -> float | None:
        """The best simulated step time of this layout (best knobs if searched), else None."""
        return self.best_time_s if self.best_time_s is not None else self.step_time_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"label": self.label, "parallel": self.parallel.to_dict(), "batch": self.batch.to_dict(),
                "memory_bytes": self.memory_bytes, "fits": self.fits, "estimate_s": self.estimate_s,
                "step_time_s": self.step_time_s, "best_knobs_step_time_s": self.best_time_s,
                "best_knobs": self.best_knobs, "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
                "exposed_comm_s": self.exposed_comm_s}


@dataclass
class SearchResult:
    """Every enumerated layout, what was kept, simulated and ranked."""

    workload: Workload
    candidates: list[Candidate]
    enumerated: int
    fitting: int
    simulated: int
    pruned_by_bound: int
    bound_violations: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def ranked(self) -> list[Candidate]:
        """Simulated layouts, fastest first."""
        return sorted((c for c in self.candidates if c.predicted_s is not None), key=_simulated_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ranked layouts first, then the others that fit)."""
        ranked = self.ranked
        rest = sorted((c for c in self.candidates if c.fits and c.predicted_s is None), key=lambda c: c.estimate_s)
        w = self.workload
        what = (f"{w.model.name} on {w.cluster.nodes}x{w.cluster.gpus_per_node} {w.cluster.gpu.name}, global batch "
                f"{w.batch.global_batch} x {w.batch.seq_len} tokens")
        return {"workload": what, "enumerated": self.enumerated, "fitting": self.fitting,
                "simulated": self.simulated, "pruned_by_bound": self.pruned_by_bound,
                "bound_violations": self.bound_violations, "seconds": self.seconds, "notes": self.notes,
                "ranked": [c.to_dict() for c in ranked], "not_simulated": [c.to_dict() for c in rest]}


def _simulated_s(c: Candidate) -> float:
    """The predicted step time (s) of a layout that was simulated."""
    t = c.predicted_s
    assert t is not None, c.label  # only simulated layouts are ranked or drawn as such
    return t


def _default_knobs_s(c: Candidate) -> float:
    """The step time (s) with default knobs of a layout that was simulated."""
    t = c.step_time_s
    assert t is not None, c.label
    return t


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def cp_degrees(model: ModelSpec, batch: BatchConfig, cluster: ClusterSpec) -> list[int]:
    """Context-parallel degrees to try. Extension point: ``[1]`` until ``ParallelConfig`` has a
    ``cp`` field; then the powers of two up to a node that divide the sequence length."""

    if "cp" not in {f.name for f in fields(ParallelConfig)}:
        return [1]
    return [c for c in (1, 2, 4, 8) if c <= cluster.gpus_per_node and batch.seq_len % (2 * c) == 0]


def label(p: ParallelConfig, b: BatchConfig) -> str:
    """A short name of a layout, e.g. ``TP8 PP2(1f1b) DP4 FSDP mb1 rc=none``; HSDP shows
    replicas x shard-group size (``DP32 HSDP(2x16)``), expert parallelism ``EP8``."""
    parts = [f"TP{p.tp}{'+SP' if p.sp_enabled else ''}"]
    if p.cp > 1:
        parts.append(f"CP{p.cp}")
    if p.pp > 1:
        parts.append(f"PP{p.pp}({p.pp_schedule}{'x' + str(p.virtual_stages) if p.virtual_stages > 1 else ''})")
    if p.dp > 1 and p.data_parallel == "fsdp" and p.dp_replicate > 1:
        parts.append(f"DP{p.dp} HSDP({p.dp_replicate}x{p.dp_shard})")
    else:
        parts.append(f"DP{p.dp}{' ' + p.data_parallel.upper() if p.dp > 1 else ''}")
    if p.ep > 1:
        parts.append(f"EP{p.ep}")
    parts.append(f"mb{b.micro_batch}")
    parts.append(f"rc={p.recompute}")
    return " ".join(parts)


def enumerate_layouts(model: ModelSpec, cluster: ClusterSpec, batch: BatchConfig, *,
                      micro_batches: Sequence[int] = (1, 2, 4),
                      recompute: Sequence[str] = ("none", "selective", "full"),
                      data_parallel: Sequence[str] = ("fsdp", "ddp"),
                      schedules: Sequence[str] = ("1f1b", "interleaved", "gpipe", "dualpipe"),
                      hsdp: bool = True, expert_parallel: bool = True) -> list[tuple[ParallelConfig, BatchConfig]]:
    """Legal ``(ParallelConfig, BatchConfig)`` pairs for ``model`` on ``cluster`` at ``batch``'s
    global batch and sequence length (see the module docstring for the axes). With FSDP,
    ``hsdp`` adds every ``dp_replicate`` > 1 dividing ``dp`` that leaves shard groups of at
    least two ranks; for a mixture-of-experts model ``expert_parallel`` adds every ``ep`` > 1
    dividing both the experts and ``dp``."""

    world = cluster.world_size
    out: list[tuple[ParallelConfig, BatchConfig]] = []
    for tp in [t for t in _divisors(cluster.gpus_per_node) if model.heads % t == 0 and model.kv_heads % t == 0]:
        for cp in cp_degrees(model, batch, cluster):
            for pp in [q for q in _divisors(model.layers) if world % (tp * cp * q) == 0]:
                dp = ParallelConfig.data_parallel_for(world, tp=tp, pp=pp, cp=cp)
                if dp is None:
                    continue
                scheds = [("1f1b", 1)] if pp == 1 else [(s, 2 if s == "interleaved" else 1) for s in schedules]
                for sched, v in scheds:
                    dp_kinds = [(t, 1) for t in (data_parallel if dp > 1 else ("ddp",))]
                    if hsdp and dp > 1 and "fsdp" in data_parallel:
                        dp_kinds += [("fsdp", r) for r in _divisors(dp) if 1 < r and dp * cp // r >= 2]
                    eps = ([e for e in _divisors(model.experts) if dp % e == 0]
                           if model.is_moe and expert_parallel else [1])
                    for dpt, rep in dp_kinds:
                        for ep in eps:
                            for mb in micro_batches:
                                if batch.global_batch % (dp * mb):
                                    continue
                                for rc in recompute:
                                    kw: dict[str, Any] = dict(  # checked by ParallelConfig
                                        tp=tp, pp=pp, dp=dp, data_parallel=dpt, sequence_parallel=tp > 1,
                                        pp_schedule=sched, virtual_stages=v, recompute=rc)
                                    for k, val in (("cp", cp), ("dp_replicate", rep), ("ep", ep)):
                                        if val > 1:
                                            kw[k] = val
                                    try:
                                        p = ParallelConfig(**kw)
                                    except ConfigError:
                                        continue
                                    b = replace(batch, micro_batch=mb)
                                    if not config_problems(p, model, cluster, b):
                                        out.append((p, b))
    return out


def _layer_work_s(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, b: BatchConfig, cost: CostModel,
                  moe: bool) -> float:
    """Isolated seconds of one layer's forward + backward + recomputation on one rank: the
    cost model's time of every op of the layer template (dense, or MoE with the router, the
    expert GEMMs and, when ep > 1, the dispatch / combine all-to-alls, which block the layer
    under the default knobs)."""

    ctx = LayerCtx(model, p, b.micro_batch, b.seq_len, Layout.build(p, cluster.gpus_per_node), OverlapKnobs())
    fwd, bwd = epm.moe_layer(ctx, "layer0") if moe else lay.dense_layer(ctx, "layer0")

    def dur(segs: Iterable[Segment]) -> float:
        return sum(float(cost.duration_s(o.spec, ())) for s in segs for o in s.ops if o.spec is not None)

    f, bw = dur(fwd), dur(bwd)
    if p.recompute == "full":
        rc = f
    elif p.recompute == "selective":
        rc = float(cost.duration_s(flash_fwd_spec(ctx), ()))
    else:
        rc = 0.0
    return f + bw + rc


def screen_estimate(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, b: BatchConfig,
                    cost: CostModel) -> float:
    """Analytical step-time estimate of a layout (seconds; see the module docstring, step 3).

    Per-rank work = (summed layer work) / pp per micro-batch (for a MoE model with leading dense
    layers, the average stage, which no rank's stage undercuts in total); times the M
    micro-batches plus the bubble in stage-times: ``(pp − 1) / v`` for 1F1B / GPipe /
    interleaved (Narayanan et al. 2021, §2.2), ``pp/2 − 1`` for DualPipe (DeepSeek-V3 report
    §3.2.1, Table 2: its bubble is (pp/2 − 1)(F&B + B − 3W); the simulator's, without the
    zero-bubble split, (pp/2 − 1)(F + 2B), at least (pp/2 − 1)(F + B))."""
    moe_layers = sum(1 for li in range(model.layers) if model.is_moe_layer(li)) if model.is_moe else 0
    total = 0.0
    if moe_layers:
        total += moe_layers * _layer_work_s(model, cluster, p, b, cost, True)
    if model.layers - moe_layers:
        total += (model.layers - moe_layers) * _layer_work_s(model, cluster, p, b, cost, False)
    # with context parallelism the layer templates hold 1/cp of the tokens (LayerCtx.tokens)
    per_stage = total / p.pp
    M = b.global_batch // (p.dp * b.micro_batch)
    if p.pp_schedule == "dualpipe":
        bubble = p.pp / 2 - 1
    else:
        bubble = (p.pp - 1) / (p.virtual_stages if p.pp_schedule == "interleaved" else 1)
    return per_stage * (M + bubble)


def _constraints(constraints: object) -> dict[str, Any]:
    """``constraints`` of :func:`search` as a dict, once it is None or a mapping of
    ParallelConfig field names; ConfigError naming an unknown field."""
    if constraints is None:
        return {}
    return check_keys(constraints, field_names(ParallelConfig), "constraints", what="ParallelConfig field")


def search(w: Workload, *, progress: ProgressFn | None = None, max_simulations: int = 24, top: int = 3,
           constraints: dict[str, Any] | None = None, engine: Engine | None = None, **enum_kw: Any) -> SearchResult:
    """Search the layouts of workload ``w``'s model on its cluster at its global batch and
    sequence length (see the module docstring). ``max_simulations`` caps step simulations with
    default knobs; ``top`` layouts get the best-knobs search; ``constraints`` (ParallelConfig
    field -> value, e.g. ``{"tp": 8}``) keeps only the layouts that have those values.
    ``engine``: where the layouts are simulated (:mod:`ccoverlap.workers.pool`, e.g. a Ray
    cluster's workers); None: in this process, each planner using forked workers for its knob
    candidates. The result does not depend on the engine. Returns a :class:`SearchResult`."""

    check_value("max_simulations", max_simulations, Count)
    check_value("top", top, Count0)
    constraints = _constraints(constraints)
    t0 = time.perf_counter()
    cost = cost_model_for(w)
    layouts = enumerate_layouts(w.model, w.cluster, w.batch, **enum_kw)
    layouts = [(p, b) for p, b in layouts if all(getattr(p, k) == v for k, v in constraints.items())]
    if not layouts:
        given = "".join(f", {k}={v}" for k, v in constraints.items())
        raise ConfigError(f"no legal layout of {w.model.name} on {w.cluster.world_size} GPUs with global batch "
                          f"{w.batch.global_batch}{given}")
    knobs0 = replace(w.knobs, overlap=True)
    cands: list[Candidate] = []
    for p, b in layouts:
        # the same estimate the simulated step carries, with the framework profile's flags
        mem = step_totals(w.model, p, b, w.cluster, knobs0, w.framework)[2]
        cands.append(Candidate(parallel=p, batch=b, label=label(p, b), memory_bytes=float(mem.total_bytes),
                               fits=bool(mem.fits)))
    fitting = [c for c in cands if c.fits]
    notes: list[str] = []
    if not fitting:
        notes.append("no layout fits in memory")
    for c in fitting:
        c.estimate_s = screen_estimate(w.model, w.cluster, c.parallel, c.batch, cost)
    fitting.sort(key=lambda c: c.estimate_s)
    # one job per layout: (workload, cost model, label, planner processes: None = default, 1 on a worker)
    jobs: list[Job] = [(replace(w, parallel=c.parallel, batch=c.batch, knobs=knobs0), cost, c.label,
             None if engine is None else 1) for c in fitting]
    planners: dict[int, tuple[Planner, StrategyResult]] = {}   # without an engine: kept for the knob search

    def simulate(batch: list[Job]) -> Iterable[Numbers]:
        if engine is not None:
            return engine.map(_simulate_layout, batch)
        out = []
        for job in batch:
            planners[id(job)] = pl_res = _planner(job)
            out.append(_numbers(pl_res[1]))
        return out

    total = min(len(fitting), max_simulations) + top
    width = max(1, int(getattr(engine, "jobs", 1))) if engine is not None else 1
    simulated, pruned, violations = _simulate_in_order(fitting, jobs, simulate, width, max_simulations, notes,
                                                       progress, total)
    ranked = sorted((c for c in fitting if c.step_time_s is not None), key=_default_knobs_s)[:top]
    if progress:
        for j, c in enumerate(ranked):
            progress(simulated + j, total, f"best knobs: {c.label}")
    tune_jobs = [jobs[fitting.index(c)] for c in ranked]
    tuned = (engine.map(_tune_layout, tune_jobs) if engine is not None
             else (_tune(planners[id(job)][0]) for job in tune_jobs))
    for c, (knobs, fits, t, tps, mfu, exposed) in zip(ranked, tuned):
        if fits and t < c.step_time_s:
            c.best_time_s, c.best_knobs = t, {k: v for k, v in knobs.items() if knobs0.to_dict().get(k) != v}
            c.tokens_per_s, c.mfu, c.exposed_comm_s = tps, mfu, exposed
        else:
            c.best_time_s, c.best_knobs = c.step_time_s, {}
    return SearchResult(workload=w, candidates=cands, enumerated=len(cands), fitting=len(fitting),
                        simulated=simulated, pruned_by_bound=pruned, bound_violations=violations,
                        seconds=time.perf_counter() - t0, notes=notes)


def _simulate_in_order(fitting: list[Candidate], jobs: list[Job], simulate: Callable[[list[Job]], Iterable[Numbers]],
                       width: int, max_simulations: int,
                       notes: list[str], progress: ProgressFn | None, total: int) -> tuple[int, int, int]:
    """Branch and bound over ``fitting`` (in increasing estimate): simulate each layout with
    default knobs until the next estimate exceeds the best simulated step time or
    ``max_simulations`` are done; fills in the candidates' results. ``simulate(jobs)`` yields
    :func:`_numbers` per job; up to ``width`` layouts that could still win are simulated together
    (on an engine's workers) and their results taken in order by the same rule - a result past
    the stop is dropped - so the outcome does not depend on ``width``. Returns ``(simulated,
    pruned by the bound, bound violations)``."""
    best_t = float("inf")
    simulated = violations = 0
    i = 0
    while i < len(fitting):
        if fitting[i].estimate_s > best_t:
            return simulated, len(fitting) - i, violations
        if simulated >= max_simulations:
            notes.append(f"stopped after {max_simulations} simulations; {len(fitting) - i} fitting layouts "
                         f"left unsimulated (their estimates are listed)")
            return simulated, 0, violations
        if progress:
            progress(simulated, total, fitting[i].label)
        batch = [j for j in range(i, min(i + width, len(fitting), i + max_simulations - simulated))
                 if fitting[j].estimate_s <= best_t]
        for j, res in zip(batch, simulate([jobs[j] for j in batch])):
            c = fitting[j]
            if c.estimate_s > best_t or simulated >= max_simulations:
                break   # the serial search stops here; the checks above say why on the next turn
            c.step_time_s, c.tokens_per_s, c.mfu, c.exposed_comm_s, fits = res
            simulated += 1
            violations += c.step_time_s < c.estimate_s * (1 - 1e-6)
            if fits:
                best_t = min(best_t, c.step_time_s)
            i = j + 1
    return simulated, 0, violations


def _planner(job: Job) -> tuple[Planner, StrategyResult]:
    """A planner for one layout job (see :func:`search`) and its default-knobs result."""

    cw, cost, name, processes = job
    pl = Planner(cw, cost=cost, keep_timelines=1, jobs=processes)
    return pl, pl.evaluate(cw, name)


def _numbers(res: StrategyResult) -> Numbers:
    """Step time, tokens/s, MFU, exposed communication (s) and whether it fits in memory."""
    return res.step_time_s, res.tokens_per_s, res.mfu, res.exposed_comm_s, res.fits_memory


def _simulate_layout(job: Job) -> Numbers:
    """:func:`_numbers` of one layout with default knobs (an engine's task)."""
    return _numbers(_planner(job)[1])


def _tune(pl: Planner) -> tuple[dict[str, Any], bool, float, float, float, float]:
    """The best-knobs search (one round) on a layout's planner: the knobs, whether they fit,
    step time, tokens/s, MFU and exposed communication."""

    bw, best, _ = search_best_knobs(pl, pl.workload, max_rounds=1)
    return (bw.knobs.to_dict(), best.fits_memory, best.step_time_s, best.tokens_per_s, best.mfu,
            best.exposed_comm_s)


def _tune_layout(job: Job) -> tuple[dict[str, Any], bool, float, float, float, float]:
    """:func:`_tune` of one layout on a planner of its own (an engine's task)."""
    return _tune(_planner(job)[0])


def save_frontier(path: str | os.PathLike[str], result: SearchResult) -> str:
    """A picture of the search: per-GPU memory against predicted step time for every simulated
    layout (screening estimates of the others in grey), the memory-time Pareto frontier joined
    by a line. Returns the file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    est = [c for c in result.candidates if c.fits and c.predicted_s is None and c.estimate_s == c.estimate_s]
    sim = result.ranked
    if est:
        ax.scatter([c.estimate_s * 1e3 for c in est], [c.memory_bytes / 2**30 for c in est], s=12, c="0.75",
                   label="not simulated: screening estimate (optimistic)")
    if sim:
        ax.scatter([_simulated_s(c) * 1e3 for c in sim], [c.memory_bytes / 2**30 for c in sim], s=28, c="tab:blue",
                   label="simulated (best knobs for the top layouts)")
        front, low = [], float("inf")
        for c in sorted(sim, key=lambda c: (_simulated_s(c), c.memory_bytes)):
            if c.memory_bytes < low:
                front.append(c)
                low = c.memory_bytes
        ax.plot([_simulated_s(c) * 1e3 for c in front], [c.memory_bytes / 2**30 for c in front], "-o", c="tab:red",
                label="frontier (no layout both faster and smaller)")
        for c in front[:6]:
            ax.annotate(c.label, (_simulated_s(c) * 1e3, c.memory_bytes / 2**30), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("step time (ms)")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_title(result.to_dict()["workload"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)
    return str(path)
