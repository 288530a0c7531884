"""Centauri on the simulator: partition the step's collectives and schedule them in three tiers.

Centauri (Chen et al., "Enabling Efficient Scheduling for Communication-Computation Overlap in
Large Model Training via Communication Partitioning", ASPLOS '24) searches a partition space
(§3.1: primitive substitution, group partition, workload partition) in that order and
schedules the result at three levels (§3.2: operation, layer, model). Here, for a workload:

1. **Primitive and group partition of the gradient collectives** (§3.1.1, §3.1.2), expressed
   with the builders' knobs: DDP's all-reduce may become reduce-scatter + all-gather (Table 2's
   scalable substitution; the all-gather then runs at the start of the next step, overlapping
   the forward — ``distributed_optimizer``), and a data-parallel group spanning nodes may run
   its collectives hierarchically on intra-/inter-node sub-groups (``algorithm="hierarchical"``).
2. **Operation level** (§3.2.1, Algorithm 1) on the FSDP forward weight all-gathers: chunk
   count, and for a group spanning nodes inter- or intra-node first, with the dependent forward
   partitioned to match (:mod:`ccoverlap.deciders.partition`, a rewrite of the built graph).
3. **Layer level** (§3.2.2, eq. 1): activation-gradient-first T1 or weight-gradient-first T2
   in every backward layer.
4. **Model level** (§3.2.3, eq. 2): how many micro-batches to launch together in forward (L1)
   and backward (L2) to hide the data-parallel all-gather / reduce-scatter under the memory
   limit (applied as a breadth-first reordering of the micro-batches, DDP with sharded optimizer).

Each rule is computed from cost-model numbers (:mod:`ccoverlap.deciders.centauri_rules`) and
every choice is checked in the simulator: within a tier, the alternatives the rule weighs are
simulated too and the fastest kept ("the partition and scheduling scheme with minimal overhead
is selected", §3.2), so the result never loses to not partitioning. The note of the planner
strategy ``centauri`` says what was chosen, what the rule said, and the §5.4 bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ccoverlap.deciders import centauri_rules as rules
from ccoverlap.deciders import partition as part
from ccoverlap.deciders.rewrite import GraphRewrite
from ccoverlap.graph import COMM, COMPUTE, CollectiveSpec, GemmSpec, Op, OpGraph
from ccoverlap.planner import FunctionStrategy
from ccoverlap.timeline import Timeline, step_time_s

__all__ = ["CentauriDecision", "decide", "comm_ratio", "centauri_strategy", "centauri_graph"]


@dataclass
class CentauriDecision:
    """What Centauri chose for a workload and the simulations behind it (times in seconds).

    ``baseline_s``: the workload as given (no partition); ``step_s``: the chosen plan;
    ``tried``: ``(tier, label, step time)`` of every simulated alternative; ``alpha``: the
    communication share of the chosen plan's serial time on its critical rank (§5.4);
    ``extra_memory_bytes``: activations added by launching micro-batches together (eq. 2).
    """

    workload: object
    step: object
    graph: OpGraph
    timeline: Timeline
    baseline_s: float
    step_s: float
    primitive: str = "as given"
    group: str = "flat"
    operation: str = "none"
    operation_rule: str = ""
    layer: str = "T1"
    layer_rule: tuple = ()
    model: tuple = (1, 1)
    model_rule: str = ""
    alpha: float = 0.0
    bound: float = 1.0
    extra_memory_bytes: float = 0.0
    defer_units: int = 0
    tried: list = field(default_factory=list)
    baseline_workload: object = None
    operation_index: int | None = None
    microbatches_judged: int = 0
    screened_microbatches: int = 0

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
        parts = [f"primitive: {self.primitive}", f"group: {self.group}", op,
                 f"layer: {self.layer}" + (f" (eq.1 T1={self.layer_rule[0] * 1e3:.1f} ms, "
                                            f"T2={self.layer_rule[1] * 1e3:.1f} ms per layer)"
                                            if self.layer_rule else ""),
                 f"model: L1={self.model[0]}, L2={self.model[1]}" + (f" ({self.model_rule})" if self.model_rule else "")]
        if self.screened_microbatches:
            parts.append(f"chosen on {self.screened_microbatches} micro-batches, simulated in full")
        return (f"Centauri — {'; '.join(parts)}. Predicted {self.speedup:.3f}x vs no partition "
                f"({self.baseline_s * 1e3:.1f} -> {self.step_s * 1e3:.1f} ms); alpha={self.alpha:.2f}, "
                f"overlap bound min(1/a,1/(1-a))={self.bound:.2f}x (§5.4).")


# ----------------------------------------------------------------------------- measures


def _iso(cost, op: Op) -> float:
    if op.duration_s is not None:
        return op.duration_s
    return 0.0 if op.spec is None else float(cost.duration_s(op.spec, ()))


def comm_ratio(graph: OpGraph, cost, rank: int | None = None) -> tuple[float, float, float]:
    """``(alpha, comm_s, compute_s)`` of a step graph on one rank (the busiest by default):
    ``comm_s`` and ``compute_s`` are the isolated (uncontended) durations summed over its
    communication and computation ops, i.e. the two parts of the serial execution, and
    ``alpha = comm / (comm + compute)`` — the communication cost ratio of Centauri §5.4."""
    per: dict[int, list[float]] = {}
    for op in graph.ops:
        acc = per.setdefault(op.rank, [0.0, 0.0])
        acc[0 if op.kind == COMM else 1] += _iso(cost, op)
    if not per:
        return 0.0, 0.0, 0.0
    r = rank if rank is not None else max(per, key=lambda k: sum(per[k]))
    comm, comp = per[r]
    return (comm / (comm + comp) if comm + comp > 0 else 0.0), comm, comp


# ----------------------------------------------------------------------------- helpers


def _time(planner, graph: OpGraph) -> tuple[float, Timeline]:
    tl = planner.simulate_graph(graph)
    return step_time_s(tl), tl


def _times(planner, make_graph: Callable[[int], OpGraph], n: int) -> tuple[list[float], dict]:
    """Step times of the independent graphs ``make_graph(0..n-1)`` (in worker processes where
    the planner has more than one CPU); ``kept`` maps an index to its (graph, timeline) when it
    was simulated in this process (so the winner need not be simulated twice)."""
    kept: dict[int, tuple] = {}

    def one(j: int) -> float:
        g = make_graph(j)
        t, tl = _time(planner, g)
        if not kept or t < min(v[0] for v in kept.values()):
            kept.clear()
            kept[j] = (t, g, tl)
        return t

    return planner.map(one, n), kept


def _graph_of(planner, kept: dict, j: int, make_graph) -> tuple[float, OpGraph, Timeline]:
    if j in kept:
        return kept[j]
    g = make_graph(j)
    t, tl = _time(planner, g)
    return t, g, tl


def _with_dp_algorithm(w, algorithm: str):
    cfg = replace(w.knobs.config_for("dp"), algorithm=algorithm)
    ov = dict(w.knobs.comm_config_overrides)
    ov["dp"] = cfg
    return replace(w, knobs=replace(w.knobs, comm_config_overrides=tuple(sorted(ov.items()))))


def _dp_group(w):
    from ccoverlap.parallel.layout import Layout

    return Layout.build(w.parallel, w.cluster.gpus_per_node).dp


# ----------------------------------------------------------------------------- tier 1: knobs


def _knob_candidates(w) -> list[tuple[str, str, object]]:
    """(primitive label, group label, workload) alternatives of §3.1.1-§3.1.2 expressible with knobs."""
    p = w.parallel
    prims = [("as given", w)]
    if p.ddp_enabled and not p.distributed_optimizer:
        prims.append(("all-reduce -> reduce-scatter + all-gather (next forward)",
                      replace(w, parallel=replace(p, distributed_optimizer=True))))
    out = []
    grp = _dp_group(w) if p.dp_enabled else None
    for plabel, pw in prims:
        out.append((plabel, "flat", pw))
        if grp is not None and grp.nodes > 1 and grp.local_size > 1:
            out.append((plabel, f"hierarchical dp ({grp.nodes} nodes x {grp.local_size})",
                        _with_dp_algorithm(pw, "hierarchical")))
    return out


# ----------------------------------------------------------------------------- tier 2: operation


def _unit_compute(graph: OpGraph, cost) -> dict[tuple, float]:  # (emb and head share layer -1)
    """Isolated compute seconds per (rank, layer, micro-batch, phase) on the compute stream."""
    out: dict[tuple, float] = {}
    for op in graph.ops:
        if op.kind == COMPUTE and op.stream == "compute":
            k = (op.rank, op.layer, op.microbatch, op.phase)
            out[k] = out.get(k, 0.0) + _iso(cost, op)
    return out


def _compute_runs(graph: OpGraph, cost) -> tuple[dict, dict]:
    """Unit executions on the compute stream as contiguous runs of equal (layer, micro-batch,
    phase) labels: ``runs[(rank, mb, phase)] = [isolated seconds per run, in order]`` and
    ``run_of[op id] = (rank, mb, phase, run index)``."""
    runs: dict[tuple, list[float]] = {}
    run_of: dict[int, tuple] = {}
    prev: dict[int, tuple] = {}
    for op in graph.ops:
        if op.stream != "compute" or op.kind != COMPUTE:
            continue
        key = (op.rank, op.microbatch, op.phase)
        lab = (op.layer, op.microbatch, op.phase)
        lst = runs.setdefault(key, [])
        if prev.get(op.rank) != lab:
            lst.append(0.0)
            prev[op.rank] = lab
        lst[-1] += _iso(cost, op)
        run_of[op.op_id] = (*key, len(lst) - 1)
    return runs, run_of


def _alg1_planner(step, cost, *, group_partitioned: bool, prefetch: int) -> Callable[[Op], rules.OperationPlan]:
    """Algorithm 1 for each FSDP forward all-gather, fed from the cost model: comm = the
    all-gather, comp = its unit's forward (the consumer chain), in = the forward of the
    ``prefetch`` units before it (the independent work FSDP's prefetch lets it overlap),
    inter/intra = its inter-first sub-collectives."""
    g = step.graph
    runs, run_of = _compute_runs(g, cost)
    dependents = part._dependents(g)
    seqs = part._stream_seqs(g)
    cache: dict = {}

    def plan(op: Op) -> rules.OperationPlan:
        """Algorithm 1's plan for the all-gather ``op``."""
        if op.op_id in cache:
            return cache[op.op_id]
        spec: CollectiveSpec = op.spec
        comm = float(cost.duration_s(spec, ()))
        grp = spec.group
        inter, intra = rules.sub_groups(grp)
        d = float(spec.bytes)
        c_inter = float(cost.duration_s(replace(spec, bytes=d * grp.nodes / grp.size, group=inter), ())) \
            if grp.nodes > 1 else 0.0
        c_intra = float(cost.duration_s(replace(spec, bytes=d, group=intra), ())) if grp.local_size > 1 else 0.0
        chain = part.consumer_chain(g, op.op_id, dependents, seqs)
        mine = sum(_iso(cost, g.ops[i]) for i in chain if g.ops[i].kind == COMPUTE)
        in_cost = 0.0
        if chain and chain[0] in run_of and prefetch > 0:
            r, mb, ph, i = run_of[chain[0]]
            in_cost = sum(runs[(r, mb, ph)][max(0, i - prefetch):i])
        res = rules.operation_level(comp_cost=mine, comm_cost=comm, cost_inter=c_inter, cost_intra=c_intra,
                                    inter_size=grp.nodes, intra_size=grp.local_size, in_cost=in_cost,
                                    group_partitioned=group_partitioned)
        cache[op.op_id] = res
        return res

    return plan


def _fixed(plan: rules.OperationPlan) -> Callable[[Op], rules.OperationPlan]:
    return lambda op: plan


def _operation_candidates(step, w, cost) -> list[tuple[str, Callable | None, str]]:
    """(label, plan function or None for no partition, Algorithm 1's reason) to simulate."""
    if not w.parallel.fsdp_enabled:
        return []
    ags = part.fsdp_forward_allgathers(step.graph)
    if not ags:
        return []
    grp = step.graph.ops[ags[0]].spec.group
    prefetch = w.knobs.fsdp_prefetch if w.knobs.overlap else 0
    g = step.graph
    first_mb = min(g.ops[a].microbatch for a in ags)
    layered = [a for a in ags if g.ops[a].layer >= 0 and g.ops[a].microbatch == first_mb] or ags
    mid = g.ops[layered[len(layered) // 2]]  # a representative transformer layer
    out: list[tuple[str, Callable | None, str]] = [("none", None, "")]
    grouped = grp.nodes > 1 and grp.local_size > 1
    for gp in ((False, True) if grouped else (False,)):
        alg = _alg1_planner(step, cost, group_partitioned=gp, prefetch=prefetch)
        plans = [alg(g.ops[a]) for a in ags]
        counts: dict[str, int] = {}
        for p in plans:
            counts[_label(p)] = counts.get(_label(p), 0) + 1
        summary = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        rep = alg(mid)
        out.append((f"Alg.1{' with group partition' if gp else ''} per all-gather: {summary}", alg,
                    f"layer {mid.layer}: {rep.reason}"))
    for k in (2, 4, rules.MAX_CHUNKS):
        out.append((f"{k} even chunks", _fixed(rules.OperationPlan(k, tuple([1.0 / k] * k), "even", "")), ""))
    if grouped:
        n, N, lo = grp.size, grp.nodes, grp.local_size
        for order, gran in (("inter-first", (N / n, 1 - N / n)), ("intra-first", (lo / n, 1 - lo / n)),
                            ("intra-first-fine", (lo / n, (N - 1) / n, 1 - (lo + N - 1) / n))):
            out.append((f"group {order}", _fixed(rules.OperationPlan(len(gran), gran, order, "")), ""))
    return out


def _label(p: rules.OperationPlan) -> str:
    if p.order == "none":
        return "no partition"
    if p.order == "even":
        return f"{p.num_chunks} even chunks"
    return f"{p.order} [{', '.join(f'{g:.3g}' for g in p.granularity)}]"


# ----------------------------------------------------------------------------- tier 3: layer


def layer_costs(graph: OpGraph, cost, rank: int, layer: int, mb: int) -> rules.LayerCosts:
    """The terms of eq. 1 for one backward layer execution, from isolated cost-model times:
    weight gradients = ``*_wgrad`` GEMMs; activation gradients = the other compute except the
    norm backwards (``others``); TP/SP all-gathers and reduce-scatters of the layer's backward;
    the FSDP all-gather and reduce-scatter of its weights."""
    c = dict(w_ag=0.0, g_act=0.0, act_ag=0.0, g_w=0.0, act_rs=0.0, g_w_rs=0.0, others=0.0)
    for op in graph.ops:
        if (op.rank, op.layer, op.microbatch, op.phase) != (rank, layer, mb, "bwd"):
            continue
        t = _iso(cost, op)
        n = op.name
        if op.kind == COMM:
            if n.startswith("fsdp_ag"):
                c["w_ag"] += t
            elif n.startswith("fsdp_rs"):
                c["g_w_rs"] += t
            elif isinstance(op.spec, CollectiveSpec) and op.spec.collective == "all_gather":
                c["act_ag"] += t
            else:
                c["act_rs"] += t
        elif isinstance(op.spec, GemmSpec) and n.endswith("_wgrad"):
            c["g_w"] += t
        elif n.endswith("norm_bwd"):
            c["others"] += t
        else:
            c["g_act"] += t
    return rules.LayerCosts(**c)


# ----------------------------------------------------------------------------- tier 4: model


def _model_level(step, w, cost) -> tuple[int, int, str, float]:
    """eq. 2 from the cost model for DDP with a sharded optimizer: C_AG / C_RS the step's
    parameter all-gathers / gradient reduce-scatters, C_fw / C_bw one micro-batch's forward /
    backward compute, m its activations, M the memory left for activations. Returns
    (L1, L2, reason, extra activation bytes)."""
    p = w.parallel
    M = step.microbatches
    if not (p.ddp_enabled and p.distributed_optimizer and not p.pp_enabled):
        return 1, 1, "eq.2 not applied: it schedules the once-per-step DP all-gather/reduce-scatter (DDP with sharded optimizer, no PP)", 0.0
    g = step.graph
    c_ag = sum(_iso(cost, o) for o in g.ops if o.name == "param_ag")
    c_rs = sum(_iso(cost, o) for o in g.ops if o.name.startswith("grad_rs"))
    comp = _unit_compute(g, cost)
    c_fw = sum(t for (r, _l, mb, ph), t in comp.items() if r == 0 and mb == 0 and ph == "fwd")
    c_bw = sum(t for (r, _l, mb, ph), t in comp.items() if r == 0 and mb == 0 and ph == "bwd")
    mem = step.memory
    m = mem.activations_bytes / max(1, mem.inflight_microbatches)
    free = mem.usable_bytes - (mem.total_bytes - mem.activations_bytes)
    if m > free:
        return 1, 1, "one micro-batch already exceeds memory", 0.0
    l1, l2, t = rules.model_level(c_ag=c_ag, c_rs=c_rs, c_fw=c_fw, c_bw=c_bw, act_bytes=m, free_bytes=free,
                                  microbatches=M)
    extra = max(0, max(l1, l2) - mem.inflight_microbatches) * m
    why = (f"eq.2: C_AG={c_ag * 1e3:.1f} C_RS={c_rs * 1e3:.1f} C_fw={c_fw * 1e3:.1f} C_bw={c_bw * 1e3:.1f} ms, "
           f"{M} micro-batches, room for {int(free // m) if m > 0 else M}; exposed {t * 1e3:.1f} ms")
    return l1, l2, why, extra


def _group_microbatches(rw: GraphRewrite, l1: int, l2: int, M: int) -> None:
    """eq. 2 schedule on the compute stream: the first ``l1`` micro-batches' forwards run
    breadth-first (layer by layer across them), the last ``l2`` micro-batches' backwards too;
    the others stay depth-first (forward then backward)."""
    g = rw.src
    runs: dict[tuple[int, str, int], list[list[int]]] = {}  # (rank, phase, mb) -> unit runs
    tail: dict[int, list[int]] = {}
    seqs: dict[int, list[int]] = {}
    for op in g.ops:
        if op.stream == "compute":
            seqs.setdefault(op.rank, []).append(op.op_id)
    for rank, seq in seqs.items():
        prev = None
        for oid in seq:
            op = g.ops[oid]
            if op.phase not in ("fwd", "bwd"):
                tail.setdefault(rank, []).append(oid)
                prev = None
                continue
            key = (rank, op.phase, op.microbatch)
            lab = (op.phase, op.microbatch, op.layer)
            lst = runs.setdefault(key, [])
            if lab != prev:
                lst.append([])
            lst[-1].append(oid)
            prev = lab
        first = list(range(min(l1, M)))
        last = list(range(max(M - l2, 0), M))
        mid = [mb for mb in range(M) if mb not in first and mb not in last]

        def flat(phase, mb):
            """One micro-batch's phase, unit after unit (depth-first)."""
            return [o for run in runs.get((rank, phase, mb), []) for o in run]

        def breadth(phase, mbs):
            """Several micro-batches' phase, unit by unit across them (breadth-first)."""
            out, per = [], [runs.get((rank, phase, mb), []) for mb in mbs]
            for i in range(max((len(p) for p in per), default=0)):
                for p in per:
                    if i < len(p):
                        out.extend(p[i])
            return out

        order = breadth("fwd", first)
        for mb in first:
            if mb not in last:
                order += flat("bwd", mb)
        for mb in mid:
            order += flat("fwd", mb) + flat("bwd", mb)
        for mb in last:
            if mb not in first:
                order += flat("fwd", mb)
        order += breadth("bwd", [mb for mb in last])
        order += tail.get(rank, [])
        if sorted(order) == sorted(seq):
            rw.reorder(rank, "compute", order)


# ----------------------------------------------------------------------------- decide


def centauri_graph(step, *, op_plan: Callable | None = None, layer: str = "T1",
                   model: tuple[int, int] = (1, 1), defer_units: int = 0) -> OpGraph:
    """The step graph of ``step`` with Centauri's operation-level partition (``op_plan`` for the
    FSDP forward all-gathers), layer-level order (``"T1"`` as built, ``"T2"`` weight gradients
    first), model-level micro-batch grouping ``(L1, L2)`` and, for FSDP, the gradient
    reduce-scatters of the last ``defer_units`` backward units deferred behind the next
    micro-batch's first all-gathers (cross-phase overlap, §3.2.3)."""
    rw = GraphRewrite(step.graph)
    if op_plan is not None:
        part.partition_allgathers(rw, part.fsdp_forward_allgathers(step.graph), op_plan)
    if layer == "T2":
        part.backward_weight_first(rw)
    if model != (1, 1):
        _group_microbatches(rw, model[0], model[1], step.microbatches)
    if defer_units:
        part.defer_reduce_scatters(rw, defer_units)
    return rw.build()


def decide(planner, w=None) -> CentauriDecision:
    """Run Centauri's partition search and three scheduling tiers on workload ``w`` (default:
    the planner's workload; see the module docstring); every alternative is simulated with the
    planner's cost model (configurations expressible as knobs through its cache). Returns the
    :class:`CentauriDecision`."""
    w = planner.workload if w is None else w
    w = replace(w, knobs=replace(w.knobs, overlap=True))
    ws = planner.screened(w)
    d = _decide(planner, ws)
    if ws is w:
        return d
    return _replay_full(planner, d, w)


def _replay_full(planner, d: CentauriDecision, w) -> CentauriDecision:
    """The choices ``d`` made on the planner's screened step (fewer micro-batches), applied to
    the full workload ``w`` and simulated there: the knobs of tier 1, tier 2's candidate (its
    Algorithm 1 plans recomputed on the full step), the layer order, the micro-batch grouping
    and the deferred reduce-scatters. ``step_s``, ``baseline_s``, the graph, timeline and alpha
    become the full step's; ``tried`` keeps the screened step times the choices were made on."""
    cost = planner.cost
    cw = planner.restore(d.workload, w)
    step = planner.step(cw)
    op_fn = None
    if d.operation_index is not None:
        cands = _operation_candidates(step, cw, cost)
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
    d.baseline_s = planner.evaluate(planner.restore(d.baseline_workload, w), "centauri").step_time_s
    d.alpha, _, _ = comm_ratio(d.graph, cost)
    d.bound = rules.speedup_bound(d.alpha)
    d.screened_microbatches = d.microbatches_judged
    return d


def _decide(planner, w) -> CentauriDecision:
    """:func:`decide`'s tiers on ``w`` as it is (every candidate simulated on its step)."""
    cost = planner.cost
    tried: list = []
    # tier 1: primitive substitution and group partition of gradient collectives (knobs)
    best = None
    for plabel, glabel, cw in _knob_candidates(w):
        st, tl = planner.simulate(cw)
        t = step_time_s(tl)
        tried.append(("partition", f"{plabel}; {glabel}", t))
        if best is None:
            baseline = (t, st, tl)
            baseline_w = cw
        if st.memory.fits or not baseline[1].memory.fits:
            if best is None or t < best[0] * (1 - 1e-9):
                best = (t, st, tl, plabel, glabel, cw)
    t_best, step, tl_best, plabel, glabel, w_best = best
    d = CentauriDecision(workload=w_best, step=step, graph=step.graph, timeline=tl_best, baseline_s=baseline[0],
                         step_s=t_best, primitive=plabel, group=glabel, tried=tried, baseline_workload=baseline_w,
                         microbatches_judged=step.microbatches)
    # tier 2: operation level (Algorithm 1) on FSDP forward all-gathers
    op_best = None
    cands = _operation_candidates(step, w_best, cost)
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
            tried.append(("operation", label, t))
        if label.startswith("Alg.1") and not d.operation_rule:
            d.operation_rule = f"{label} — {reason}"
        if op_best is None or t < op_best[0] * (1 - 1e-9):
            op_best = (t, label, fn, i)
    op_fn = None
    if op_best is not None:
        d.step_s, d.operation, op_fn, d.operation_index = op_best
        if op_fn is not None:
            j = next(j for j, i in enumerate(parts) if cands[i][1] is op_fn)
            d.step_s, d.graph, d.timeline = _graph_of(planner, kept, j, op_graph)
    # tier 3: layer level (eq. 1), checked in simulation
    bwd = [o for o in step.graph.ops if o.phase == "bwd" and o.layer >= 0 and o.stream == "compute"]
    if bwd:
        mid_layer = sorted({o.layer for o in bwd})[len({o.layer for o in bwd}) // 2]
        choice, t1, t2 = rules.layer_level(layer_costs(step.graph, cost, bwd[0].rank, mid_layer, bwd[0].microbatch))
        d.layer_rule = (t1, t2)
        g2 = centauri_graph(step, op_plan=op_fn, layer="T2")
        t, tl = _time(planner, g2)
        tried.append(("layer", "T2 (weight gradients first)", t))
        sim_choice = "T2" if t < d.step_s * (1 - 1e-9) else "T1"
        if sim_choice == "T2":
            d.step_s, d.graph, d.timeline = t, g2, tl
        d.layer = sim_choice + ("" if sim_choice == choice else f" (eq.1 preferred {choice})")
    # tier 4: model level (eq. 2)
    l1, l2, why, extra = _model_level(step, w_best, cost)
    d.model_rule = why
    if (l1, l2) != (1, 1):
        layer = "T2" if d.layer.startswith("T2") else "T1"
        gm = centauri_graph(step, op_plan=op_fn, layer=layer, model=(l1, l2))
        t, tl = _time(planner, gm)
        tried.append(("model", f"L1={l1}, L2={l2}", t))
        if t < d.step_s * (1 - 1e-9):
            d.step_s, d.graph, d.timeline, d.model, d.extra_memory_bytes = t, gm, tl, (l1, l2), extra
        else:
            d.model_rule += "; not faster in simulation, kept L1=L2=1"
    # tier 4b (FSDP): cross-phase overlap at micro-batch boundaries, checked in simulation
    if w_best.parallel.data_parallel == "fsdp" and step.microbatches > 1:
        layer = "T2" if d.layer.startswith("T2") else "T1"
        ks = (1, 2, 4)

        def defer_graph(j: int) -> OpGraph:
            return centauri_graph(step, op_plan=op_fn, layer=layer, model=d.model, defer_units=ks[j])

        times, kept = _times(planner, defer_graph, len(ks))
        best_j = None
        for j, (k, t) in enumerate(zip(ks, times)):
            tried.append(("model", f"defer last {k} reduce-scatters behind next forward's all-gathers", t))
            if t < d.step_s * (1 - 1e-9):
                d.step_s, best_j = t, j
        if best_j is not None:
            d.step_s, d.graph, d.timeline = _graph_of(planner, kept, best_j, defer_graph)
            d.defer_units = ks[best_j]
        if d.defer_units:
            d.model_rule = (f"gradient reduce-scatters of the last {d.defer_units} backward units wait for the next "
                            f"micro-batch's first {d.defer_units} all-gathers; " + d.model_rule)
    d.alpha, _, _ = comm_ratio(d.graph, cost)
    d.bound = rules.speedup_bound(d.alpha)
    return d


def centauri_strategy(planner, start):
    """Planner strategy ``centauri`` (in this module's ``STRATEGIES``):
    :func:`decide` on the workload, summarised as a :class:`~ccoverlap.plan.StrategyResult`
    with the same definitions as :func:`ccoverlap.plan.evaluate` (MFU, exposed communication
    and compute of the critical rank). None when there is no data-parallel communication to
    partition (dp == 1)."""
    if start.parallel.dp <= 1:
        return None
    d = decide(planner, start)
    return planner.summarize("centauri", d.workload, d.step, d.timeline, note=d.note(),
                                extra_memory_bytes=d.extra_memory_bytes)


# planner strategy (registered by ccoverlap.plan.default_registry)
CENTAURI = FunctionStrategy("centauri", centauri_strategy,
                            "Centauri: partition of collectives (§3.1) and operation / layer / model scheduling tiers")
