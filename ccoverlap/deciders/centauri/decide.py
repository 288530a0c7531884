"""Centauri on the simulator: partition the step's collectives and schedule them in three tiers.

Centauri (Chen et al., "Enabling Efficient Scheduling for Communication-Computation Overlap in
Large Model Training via Communication Partitioning", ASPLOS '24) searches a partition space
(§3.1: primitive substitution, group partition, workload partition) in that order and
schedules the result at three levels (§3.2: operation, layer, model). Here, for a workload:

1. **Centauri's runtime, primitive and group partition** (§4, §3.1.1, §3.1.2), expressed with
   the builders' knobs: the scheduling Centauri's reducer, optimizer and layer encapsulation
   implement (gradients reduced as produced, sharded parameters gathered under the next
   forward, FSDP weights gathered per layer one unit ahead:
   :func:`~ccoverlap.deciders.centauri.tiers.centauri_scheduling`); DDP's all-reduce and
   HSDP's replica all-reduce may become reduce-scatter + all-gather (Table 2's scalable
   substitution, ``distributed_optimizer``); a data-parallel group (``dp``, HSDP's ``dp_rep``)
   spanning nodes with several members per node may run hierarchically on intra-/inter-node
   sub-groups (``algorithm="hierarchical"``).
2. **Operation level** (§3.2.1, Algorithm 1) on the FSDP forward weight all-gathers: chunk
   count, and for a group spanning nodes inter- or intra-node first, with the dependent forward
   partitioned to match (:mod:`ccoverlap.deciders.centauri.partition`, a rewrite of the built graph).
3. **Layer level** (§3.2.2, eq. 1): activation-gradient-first T1 or weight-gradient-first T2
   in every backward layer.
4. **Model level** (§3.2.3, eq. 2): with an interleaved pipeline, how many micro-batches of a
   model chunk are launched together (``pp_group``: ``pp`` is Megatron-LM's, up to all of
   them, Fig. 7) to hide each chunk's data-parallel collectives under the others; without a
   pipeline, how many micro-batches to launch together in forward (L1) and backward (L2) to
   hide the data-parallel all-gather / reduce-scatter under the memory limit (applied as a
   breadth-first reordering of the micro-batches, DDP with sharded optimizer); for FSDP, the
   last reduce-scatters of a micro-batch deferred behind the next one's first all-gathers.

Each rule is computed from cost-model numbers (:mod:`ccoverlap.deciders.centauri.rules`) and
every choice is checked in the simulator: within a tier, the alternatives the rule weighs are
simulated too and the fastest kept ("the partition and scheduling scheme with minimal overhead
is selected", §3.2), so the result never loses to not partitioning. The note of the planner
strategy ``centauri`` says what was chosen, what the rule said, and the §5.4 bound.

This module simulates and chooses; the candidates of each tier, the §5.4 ratio and the graph
rewrite are in :mod:`ccoverlap.deciders.centauri.tiers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ccoverlap.deciders.centauri import rules
from ccoverlap.deciders.centauri.tiers import (
    centauri_graph,
    centauri_scheduling,
    comm_ratio,
    knob_candidates,
    layer_costs,
    model_level_choice,
    operation_candidates,
    pipeline_group_choice,
)
from ccoverlap.predict.strategy import FunctionStrategy, Planner, planner_workload, with_microbatches
from ccoverlap.sim.graph import OpGraph
from ccoverlap.sim.timeline import Timeline, step_time_s

if TYPE_CHECKING:
    from ccoverlap.parallel.step import StepGraph
    from ccoverlap.predict.evaluate import StepMetrics, StrategyResult
    from ccoverlap.predict.workload import Workload
    from ccoverlap.sim.graph import Op

    OpPlan = Callable[[Op], rules.OperationPlan]

__all__ = ["CentauriDecision", "decide", "comm_ratio", "centauri_strategy", "centauri_graph", "layer_costs",
           "centauri_scheduling", "knob_candidates", "pipeline_group_choice"]


@dataclass
class CentauriDecision:
    """What Centauri chose for a workload and the simulations behind it (times in seconds).

    ``baseline_s``: the workload as given (its own scheduling, no partition); ``step_s``: the
    chosen plan; ``scheduling``: "Centauri's" when the knobs of Centauri's runtime were kept
    (:func:`~ccoverlap.deciders.centauri.tiers.centauri_scheduling`), else "as given";
    ``tried``: ``(tier, label, step time)`` of every simulated alternative; ``alpha``: the
    communication share of the chosen plan's serial time on its critical rank (§5.4);
    ``extra_memory_bytes``: activations added by launching micro-batches together (eq. 2).
    """

    workload: Workload
    step: StepGraph
    graph: OpGraph
    timeline: Timeline
    baseline_s: float
    step_s: float
    scheduling: str = "as given"
    primitive: str = "as given"
    group: str = "flat"
    operation: str = "none"
    operation_rule: str = ""
    layer: str = "T1"
    layer_rule: tuple[float, ...] = ()
    model: tuple[int, int] = (1, 1)
    model_rule: str = ""
    alpha: float = 0.0
    bound: float = 1.0
    extra_memory_bytes: float = 0.0
    defer_units: int = 0
    #: micro-batches the interleaved pipeline launches together (eq. 2 with PP); 0: not chosen
    pipeline_group: int = 0
    tried: list[tuple[str, str, float]] = field(default_factory=list)
    baseline_workload: Workload | None = None
    operation_index: int | None = None
    microbatches_judged: int = 0
    screened_microbatches: int = 0
    #: the full step's metrics when they were extrapolated from two short steps (then ``graph``
    #: and ``timeline`` are the screened step's, and the Alg. 1 counts in the labels too)
    metrics: StepMetrics | None = None

    @property
    def speedup(self) -> float:
        """Baseline (no partition) step time / chosen plan's step time."""
        return self.baseline_s / self.step_s if self.step_s > 0 else 1.0

    def note(self) -> str:
        """One paragraph for the planner table: the choice per tier, why, and the bound."""
        if not self.operation_rule:
            op = f"operation: {self.operation}"
        elif self.operation == self.operation_rule.split(" — ")[0]:
            op = f"operation: {self.operation_rule}"
        else:
            op = f"operation: {self.operation} (simulated best; {self.operation_rule})"
        parts = [f"scheduling: {self.scheduling}", f"primitive: {self.primitive}", f"group: {self.group}", op,
                 f"layer: {self.layer}" + (f" (eq.1 T1={self.layer_rule[0] * 1e3:.1f} ms, "
                                            f"T2={self.layer_rule[1] * 1e3:.1f} ms per layer)"
                                            if self.layer_rule else ""),
                 (f"model: pipeline group L={self.pipeline_group}" if self.pipeline_group else
                  f"model: L1={self.model[0]}, L2={self.model[1]}")
                 + (f" ({self.model_rule})" if self.model_rule else "")]
        if self.screened_microbatches and self.metrics is not None and self.metrics.extrapolated_from:
            m1, m2 = self.metrics.extrapolated_from
            parts.append(f"chosen on {self.screened_microbatches} micro-batches (the Alg.1 counts are that step's), "
                         f"full step extrapolated from {m1} and {m2}")
        elif self.screened_microbatches:
            parts.append(f"chosen on {self.screened_microbatches} micro-batches, simulated in full")
        return (f"Centauri — {'; '.join(parts)}. Predicted {self.speedup:.3f}x vs as given "
                f"({self.baseline_s * 1e3:.1f} -> {self.step_s * 1e3:.1f} ms); alpha={self.alpha:.2f}, "
                f"overlap bound min(1/a,1/(1-a))={self.bound:.2f}x (§5.4).")


# ----------------------------------------------------------------------------- helpers


def _time(planner: Planner, graph: OpGraph) -> tuple[float, Timeline]:
    tl = planner.simulate_graph(graph)
    return step_time_s(tl), tl


def _times(planner: Planner, make_graph: Callable[[int], OpGraph], n: int
           ) -> tuple[list[float], dict[int, tuple[float, OpGraph, Timeline]]]:
    """Step times of the independent graphs ``make_graph(0..n-1)`` (in worker processes where
    the planner has more than one CPU); ``kept`` maps an index to its (graph, timeline) when it
    was simulated in this process (so the winner need not be simulated twice)."""
    kept: dict[int, tuple[float, OpGraph, Timeline]] = {}

    def one(j: int) -> float:
        g = make_graph(j)
        t, tl = _time(planner, g)
        if not kept or t < min(v[0] for v in kept.values()):
            kept.clear()
            kept[j] = (t, g, tl)
        return t

    return planner.map(one, n), kept


def _graph_of(planner: Planner, kept: dict[int, tuple[float, OpGraph, Timeline]], j: int,
              make_graph: Callable[[int], OpGraph]) -> tuple[float, OpGraph, Timeline]:
    if j in kept:
        return kept[j]
    g = make_graph(j)
    t, tl = _time(planner, g)
    return t, g, tl


# ----------------------------------------------------------------------------- decide


def decide(planner: Planner, w: Workload | None = None) -> CentauriDecision:
    """Run Centauri's partition search and three scheduling tiers on workload ``w`` (default:
    the planner's workload; see the module docstring); every alternative is simulated with the
    planner's cost model (configurations expressible as knobs through its cache). Returns the
    :class:`CentauriDecision`."""
    w = planner_workload("centauri.decide", planner, w)
    w = replace(w, knobs=replace(w.knobs, overlap=True))
    ws = planner.screened(w)
    d = _decide(planner, ws)
    if ws is w:
        return d
    return _replay_full(planner, d, w)


def _replay_full(planner: Planner, d: CentauriDecision, w: Workload) -> CentauriDecision:
    """The choices ``d`` made on the planner's screened step (fewer micro-batches), applied to
    the full workload ``w`` and simulated there: the knobs of tier 1, tier 2's candidate (its
    Algorithm 1 plans recomputed on the full step), the layer order, the micro-batch grouping
    and the deferred reduce-scatters. ``step_s``, ``baseline_s``, the graph, timeline and alpha
    become the full step's; ``tried`` keeps the screened step times the choices were made on."""
    cost = planner.cost
    cw = planner.restore(d.workload, w)
    if planner.steady_state(cw) is not None and d.model == (1, 1):
        return _extrapolate_full(planner, d, cw, w)
    step = planner.step(cw)
    op_fn: OpPlan | None = None
    if d.operation_index is not None:
        cands = operation_candidates(step, cw, cost)
        d.operation, op_fn, _ = cands[d.operation_index]
        algs = [(label, reason) for label, fn, reason in cands if label.startswith("Alg.1")]
        if algs:
            d.operation_rule = f"{algs[0][0]} — {algs[0][1]}"
    layer = "T2" if d.layer.startswith("T2") else "T1"
    if op_fn is None and layer == "T1" and d.model == (1, 1) and not d.defer_units:
        step, tl = planner.simulate(cw)  # nothing rewritten: the (cached) knob configuration
        graph = step.graph
    else:
        graph = centauri_graph(step, op_plan=op_fn, layer=layer, model=d.model, defer_units=d.defer_units)
        tl = planner.simulate_graph(graph)
    d.workload, d.step, d.graph, d.timeline, d.step_s = cw, step, graph, tl, step_time_s(tl)
    assert d.baseline_workload is not None  # set by _partition_tier
    d.baseline_s = planner.evaluate(planner.restore(d.baseline_workload, w), "centauri").step_time_s
    d.alpha, _, _ = comm_ratio(d.graph, cost)
    d.bound = rules.speedup_bound(d.alpha)
    d.screened_microbatches = d.microbatches_judged
    return d


def _extrapolate_full(planner: Planner, d: CentauriDecision, cw: Workload, w: Workload) -> CentauriDecision:
    """:func:`_replay_full` where the planner extrapolates the full step from two short ones
    (:meth:`~ccoverlap.predict.strategy.Planner.rewritten_metrics`): the choices ``d`` made are applied
    to each short step (tier 2's Algorithm 1 plans recomputed on it) and the step times, and
    alpha's serial communication and compute, extrapolated. Not used with a micro-batch grouping
    (L1, L2) != (1, 1), which is not the same per micro-batch."""
    cost = planner.cost
    layer = "T2" if d.layer.startswith("T2") else "T1"
    op_index = d.operation_index or 0
    partitioned = op_index != 0  # candidate 0 is "none" (no partition)
    serial: dict[int, tuple[float, float]] = {}

    def rewrite(st: StepGraph) -> OpGraph:
        op_fn = operation_candidates(st, cw, cost)[op_index][1] if partitioned else None
        if op_fn is None and layer == "T1" and not d.defer_units:
            graph = st.graph
        else:
            graph = centauri_graph(st, op_plan=op_fn, layer=layer, defer_units=d.defer_units)
        serial[st.microbatches] = comm_ratio(graph, cost)[1:]
        return graph

    if not partitioned and layer == "T1" and not d.defer_units:
        metrics = planner.metrics(cw)  # nothing rewritten: the (cached) knob configuration
        pts = planner.steady_state(cw)
        assert pts is not None  # _replay_full extrapolates only where the planner does
        for m in pts:
            rewrite(planner.step(with_microbatches(cw, m)))
    else:
        metrics = planner.rewritten_metrics(cw, rewrite)
    (m1, (comm1, comp1)), (m2, (comm2, comp2)) = sorted(serial.items())[:2]
    f = (metrics.microbatches - m1) / (m2 - m1)
    comm, comp = comm1 + f * (comm2 - comm1), comp1 + f * (comp2 - comp1)
    d.workload, d.metrics, d.step_s = cw, metrics, metrics.step_time_s
    assert d.baseline_workload is not None  # set by _partition_tier
    d.baseline_s = planner.evaluate(planner.restore(d.baseline_workload, w), "centauri").step_time_s
    d.alpha = comm / (comm + comp) if comm + comp > 0 else 0.0
    d.bound = rules.speedup_bound(d.alpha)
    d.screened_microbatches = d.microbatches_judged
    return d


def _pipeline_group(planner: Planner, d: CentauriDecision, step: StepGraph) -> StepGraph:
    """Tier 4 with pipeline parallelism (eq. 2, :func:`pipeline_group_choice`): every feasible
    group of micro-batches launched together is simulated and the fastest that fits kept
    (eq. 2's own choice is in the note). Returns the step the later tiers work on."""
    feasible, rule, why = pipeline_group_choice(step, d.workload, planner.cost)
    if not feasible:
        return step
    p = d.workload.parallel
    best: tuple[float, int, Workload, StepGraph, Timeline] | None = None
    for L in feasible:
        cw = replace(d.workload, parallel=replace(p, pp_group=0 if L == p.pp else L))
        st, tl = planner.simulate(cw)
        t = step_time_s(tl)
        d.tried.append(("model", f"pipeline group L={L}", t))
        if step.memory.fits and not st.memory.fits:
            continue
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, L, cw, st, tl)
    # L = pp (always in feasible) launches no more micro-batches together than the step as
    # given, so it fits whenever that step does
    assert best is not None
    t, L, cw, st, tl = best
    d.workload, d.step, d.graph, d.timeline, d.step_s, d.pipeline_group = cw, st, st.graph, tl, t, L
    d.model_rule = why + ("" if L == rule else f"; simulated best L={L}")
    return st


def _decide(planner: Planner, w: Workload) -> CentauriDecision:
    """:func:`decide`'s tiers on ``w`` as it is (every candidate simulated on its step)."""
    cost = planner.cost
    d = _partition_tier(planner, w)
    step = _pipeline_group(planner, d, d.step)
    w_best = d.workload
    op_fn = _operation_tier(planner, d, step, w_best)
    _layer_tier(planner, d, step, op_fn)
    _model_tier(planner, d, step, w_best, op_fn)
    if w_best.parallel.data_parallel == "fsdp" and step.microbatches > 1:
        _defer_tier(planner, d, step, op_fn)
    d.alpha, _, _ = comm_ratio(d.graph, cost)
    d.bound = rules.speedup_bound(d.alpha)
    return d


def _partition_tier(planner: Planner, w: Workload) -> CentauriDecision:
    """Tier 1: primitive substitution and group partition of gradient collectives (knobs); the fastest that fits."""
    tried: list[tuple[str, str, float]] = []
    best: tuple[float, StepGraph, Timeline, str, str, str, Workload] | None = None
    for slabel, plabel, glabel, cw in knob_candidates(w):
        st, tl = planner.simulate(cw)
        t = step_time_s(tl)
        tried.append(("partition", f"scheduling {slabel}; {plabel}; {glabel}", t))
        if best is None:
            baseline = (t, st, tl)
            baseline_w = cw
        if st.memory.fits or not baseline[1].memory.fits:
            if best is None or t < best[0] * (1 - 1e-9):
                best = (t, st, tl, slabel, plabel, glabel, cw)
    assert best is not None  # knob_candidates starts with the workload as given, always kept first
    t_best, step, tl_best, slabel, plabel, glabel, w_best = best
    return CentauriDecision(workload=w_best, step=step, graph=step.graph, timeline=tl_best, baseline_s=baseline[0],
                            step_s=t_best, scheduling=slabel, primitive=plabel, group=glabel, tried=tried,
                            baseline_workload=baseline_w, microbatches_judged=step.microbatches)


def _operation_tier(planner: Planner, d: CentauriDecision, step: StepGraph, w_best: Workload) -> OpPlan | None:
    """Tier 2: operation level (Algorithm 1) on FSDP forward all-gathers; returns the chosen op plan (or None)."""
    op_best: tuple[float, str, OpPlan | None, int] | None = None
    cands = operation_candidates(step, w_best, planner.cost)
    # the partitioned alternatives are independent: simulated in parallel where possible, the
    # winner simulated again here for its timeline
    parts = [i for i, (_, fn, _) in enumerate(cands) if fn is not None]

    def op_graph(j: int) -> OpGraph:
        return centauri_graph(step, op_plan=cands[parts[j]][1])

    part_times, kept = _times(planner, op_graph, len(parts))
    times = dict(zip(parts, part_times))
    for i, (label, fn, reason) in enumerate(cands):
        if fn is None:
            t = d.step_s
        else:
            t = times[i]
            d.tried.append(("operation", label, t))
        if label.startswith("Alg.1") and not d.operation_rule:
            d.operation_rule = f"{label} — {reason}"
        if op_best is None or t < op_best[0] * (1 - 1e-9):
            op_best = (t, label, fn, i)
    op_fn: OpPlan | None = None
    if op_best is not None:
        d.step_s, d.operation, op_fn, d.operation_index = op_best
        if op_fn is not None:
            j = next(j for j, i in enumerate(parts) if cands[i][1] is op_fn)
            d.step_s, d.graph, d.timeline = _graph_of(planner, kept, j, op_graph)
    return op_fn


def _layer_tier(planner: Planner, d: CentauriDecision, step: StepGraph, op_fn: OpPlan | None) -> None:
    """Tier 3: layer level (eq. 1), T2 (weight gradients first) kept only if faster in simulation."""
    bwd = [o for o in step.graph.ops if o.phase == "bwd" and o.layer >= 0 and o.stream == "compute"]
    if not bwd:
        return
    layers = sorted({o.layer for o in bwd if o.rank == bwd[0].rank})
    mid_layer = layers[len(layers) // 2]  # a layer the first backward's rank holds
    choice, t1, t2 = rules.layer_level(layer_costs(step.graph, planner.cost, bwd[0].rank, mid_layer,
                                                   bwd[0].microbatch))
    d.layer_rule = (t1, t2)
    g2 = centauri_graph(step, op_plan=op_fn, layer="T2")
    t, tl = _time(planner, g2)
    d.tried.append(("layer", "T2 (weight gradients first)", t))
    sim_choice = "T2" if t < d.step_s * (1 - 1e-9) else "T1"
    if sim_choice == "T2":
        d.step_s, d.graph, d.timeline = t, g2, tl
    d.layer = sim_choice + ("" if sim_choice == choice else f" (eq.1 preferred {choice})")


def _model_tier(planner: Planner, d: CentauriDecision, step: StepGraph, w_best: Workload,
                op_fn: OpPlan | None) -> None:
    """Tier 4: model level (eq. 2), the L1 / L2 group sizes kept only if faster in simulation."""
    l1, l2, why, extra = model_level_choice(step, w_best, planner.cost)
    if not d.pipeline_group:
        d.model_rule = why
    if (l1, l2) == (1, 1):
        return
    layer = "T2" if d.layer.startswith("T2") else "T1"
    gm = centauri_graph(step, op_plan=op_fn, layer=layer, model=(l1, l2))
    t, tl = _time(planner, gm)
    d.tried.append(("model", f"L1={l1}, L2={l2}", t))
    if t < d.step_s * (1 - 1e-9):
        d.step_s, d.graph, d.timeline, d.model, d.extra_memory_bytes = t, gm, tl, (l1, l2), extra
    else:
        d.model_rule += "; not faster in simulation, kept L1=L2=1"


def _defer_tier(planner: Planner, d: CentauriDecision, step: StepGraph, op_fn: OpPlan | None) -> None:
    """Tier 4b (FSDP): cross-phase overlap at micro-batch boundaries, checked in simulation."""
    layer = "T2" if d.layer.startswith("T2") else "T1"
    ks = (1, 2, 4)

    def defer_graph(j: int) -> OpGraph:
        return centauri_graph(step, op_plan=op_fn, layer=layer, model=d.model, defer_units=ks[j])

    times, kept = _times(planner, defer_graph, len(ks))
    best_j = None
    for j, (k, t) in enumerate(zip(ks, times)):
        d.tried.append(("model", f"defer last {k} reduce-scatters behind next forward's all-gathers", t))
        if t < d.step_s * (1 - 1e-9):
            d.step_s, best_j = t, j
    if best_j is not None:
        d.step_s, d.graph, d.timeline = _graph_of(planner, kept, best_j, defer_graph)
        d.defer_units = ks[best_j]
    if d.defer_units:
        d.model_rule = (f"gradient reduce-scatters of the last {d.defer_units} backward units wait for the next "
                        f"micro-batch's first {d.defer_units} all-gathers; " + d.model_rule)


def centauri_strategy(planner: Planner, start: Workload) -> StrategyResult | None:
    """Planner strategy ``centauri`` (in this module's ``STRATEGIES``):
    :func:`decide` on the workload, summarized as a :class:`~ccoverlap.predict.evaluate.StrategyResult`
    with the same definitions as :func:`ccoverlap.predict.evaluate.evaluate` (MFU, exposed communication
    and compute of the critical rank). None when there is no data-parallel communication to
    partition (dp == 1)."""
    if start.parallel.dp <= 1:
        return None
    d = decide(planner, start)
    if d.metrics is not None:
        res = planner.summarize_metrics("centauri", d.workload, d.metrics, note=d.note(),
                                        extra_memory_bytes=d.extra_memory_bytes)
    else:
        res = planner.summarize("centauri", d.workload, d.step, d.timeline, note=d.note(),
                                extra_memory_bytes=d.extra_memory_bytes)
    res.decision = _decision(planner.workload, d)
    return res


def _decision(given: Workload, d: CentauriDecision) -> dict:
    """What Centauri chose beyond the knobs, as plain data (:attr:`StrategyResult.decision`):
    layout fields changed from ``given``'s and the step rewrites of tiers 2-4."""
    was, now = given.parallel.to_dict(), d.workload.parallel.to_dict()
    rewrites = []
    if d.operation_index not in (None, 0):
        rewrites.append(f"operation level (§3.2.1, Algorithm 1): FSDP forward all-gathers partitioned, {d.operation}")
    if d.layer.startswith("T2"):
        rewrites.append("layer level (§3.2.2): weight gradients before activation gradients (T2) in backward")
    if d.model != (1, 1):
        rewrites.append(f"model level (§3.2.3): {d.model[0]} forward and {d.model[1]} backward micro-batches "
                        f"launched together")
    if d.defer_units:
        rewrites.append(f"model level: the last {d.defer_units} gradient reduce-scatters of a micro-batch wait for "
                        f"the next micro-batch's first all-gathers")
    return {"parallel": {k: v for k, v in now.items() if was.get(k) != v}, "rewrites": rewrites}


# planner strategy (registered by ccoverlap.planning.strategies.default_registry); ``weight``: a scheduling
# hint only (CPU seconds on the README's 70B plan, docs/planner.md)
CENTAURI = FunctionStrategy("centauri", centauri_strategy,
                            "Centauri: partition of collectives (§3.1) and operation / layer / model scheduling tiers",
                            weight=1.6)
