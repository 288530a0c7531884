"""Centauri's tiers from cost-model numbers, and the step graph that applies a choice.

The parts of :mod:`ccoverlap.deciders.centauri.decide` that look at one step graph (no simulation):
the candidates of each tier — tier 1's knob alternatives (§3.1.1 primitive substitution,
§3.1.2 group partition), tier 2's Algorithm 1 plans for the FSDP forward all-gathers (§3.2.1),
tier 3's eq. 1 terms (§3.2.2), tier 4's eq. 2 micro-batch grouping (§3.2.3) — the
communication cost ratio of §5.4, and :func:`centauri_graph`, the rewrite of a built step
graph with the chosen partition and schedule. :mod:`ccoverlap.deciders.centauri.decide` simulates
the candidates and keeps the fastest. The rules themselves are in
:mod:`ccoverlap.deciders.centauri.rules`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ccoverlap.deciders.centauri import partition as part
from ccoverlap.deciders.centauri import rules
from ccoverlap.parallel.layout import Layout
from ccoverlap.sim.graph import Op, OpGraph
from ccoverlap.sim.rewrite import GraphRewrite
from ccoverlap.specs import COMM, COMPUTE, CollectiveSpec, GemmSpec

if TYPE_CHECKING:
    from ccoverlap.parallel.step import StepGraph
    from ccoverlap.predict.workload import Workload
    from ccoverlap.sim.simulator import SupportsDuration

__all__ = ["comm_ratio", "knob_candidates", "centauri_scheduling", "operation_candidates", "layer_costs",
           "model_level_choice", "pipeline_group_choice", "centauri_graph"]


# ----------------------------------------------------------------------------- measures


def _iso(cost: SupportsDuration, op: Op) -> float:
    if op.duration_s is not None:
        return op.duration_s
    return 0.0 if op.spec is None else float(cost.duration_s(op.spec, ()))


def comm_ratio(graph: OpGraph, cost: SupportsDuration, rank: int | None = None) -> tuple[float, float, float]:
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


# ----------------------------------------------------------------------------- tier 1: knobs


def _with_algorithm(w: Workload, group: str, algorithm: str) -> Workload:
    cfg = replace(w.knobs.config_for(group), algorithm=algorithm)
    ov = dict(w.knobs.comm_config_overrides)
    ov[group] = cfg
    return replace(w, knobs=replace(w.knobs, comm_config_overrides=tuple(sorted(ov.items()))))


def _groups(w: Workload) -> Layout:

    return Layout.build(w.parallel, w.cluster.gpus_per_node)


def centauri_scheduling(w: Workload) -> Workload:
    """``w`` with the scheduling Centauri's runtime implements (§4: "a new distributed reducer,
    optimizer, and pipeline scheduler"; the transformer layer encapsulated with its partition
    and scheduling strategies): overlap on, data-parallel gradients reduced as they are
    produced (``overlap_grad_reduce``), sharded parameters gathered under the next forward
    (``overlap_param_gather``, §3.2.3: "allgather is overlapped with the forward phase"), FSDP
    weights gathered per layer unit and issued under the independent computation before their
    consumer (Algorithm 1's ``in_cost``: at least one unit ahead, ``fsdp_fetch="unit"``)."""
    k = w.knobs
    prefetch = max(1, k.fsdp_prefetch) if k.fsdp_fetch == "unit" else 1
    nk = replace(k, overlap=True, overlap_grad_reduce=True, overlap_param_gather=True, fsdp_fetch="unit",
                 fsdp_prefetch=prefetch, zero3_host_ahead=False)
    return w if nk == k else replace(w, knobs=nk)


def _primitives(w: Workload) -> list[tuple[str, Workload]]:
    """§3.1.1 (Table 2's scalable substitution) on the data-parallel gradient collectives:
    DDP's all-reduce, and HSDP's replica all-reduce, become reduce-scatter + all-gather, the
    all-gather running in the next forward (``distributed_optimizer``)."""
    p = w.parallel
    out = [("as given", w)]
    if p.ddp_enabled and not p.distributed_optimizer:
        out.append(("all-reduce -> reduce-scatter + all-gather (next forward)",
                    replace(w, parallel=replace(p, distributed_optimizer=True))))
    if p.fsdp_enabled and p.dp_replicate > 1 and not p.distributed_optimizer:
        out.append(("replica all-reduce -> reduce-scatter + all-gather (next forward)",
                    replace(w, parallel=replace(p, distributed_optimizer=True))))
    return out


def _group_partitions(w: Workload) -> list[tuple[str, Workload]]:
    """§3.1.2 on the data-parallel groups that span nodes with several members per node
    (balanced sub-groups only): the shard / DP group ``dp`` and the HSDP replica group
    ``dp_rep``, each alone or both, as hierarchical (intra-node + inter-node) collectives."""
    lay = _groups(w)
    split = [(name, g) for name, g in (("dp", lay.dp), ("dp_rep", lay.dp_rep))
             if g.size > 1 and g.nodes > 1 and g.local_size > 1]
    out = [("flat", w)]
    for name, g in split:
        out.append((f"hierarchical {name} ({g.nodes} nodes x {g.local_size})",
                    _with_algorithm(w, name, "hierarchical")))
    if len(split) == 2:
        both = w
        for name, _ in split:
            both = _with_algorithm(both, name, "hierarchical")
        out.append(("hierarchical dp and dp_rep", both))
    return out


def knob_candidates(w: Workload) -> list[tuple[str, str, str, Workload]]:
    """(scheduling, primitive, group partition, workload) alternatives expressible with knobs:
    the workload as given first, then with Centauri's scheduling (:func:`centauri_scheduling`)
    under each primitive substitution (§3.1.1) and group partition (§3.1.2)."""
    out = [("as given", "as given", "flat", w)]
    sched = centauri_scheduling(w)
    slabel = "as given" if sched is w else "Centauri's"
    for plabel, pw in _primitives(sched):
        for glabel, gw in _group_partitions(pw):
            if gw is not w:
                out.append((slabel, plabel, glabel, gw))
    return out


# ----------------------------------------------------------------------------- tier 2: operation


def _unit_compute(graph: OpGraph, cost: SupportsDuration) -> dict[tuple, float]:  # (emb and head share layer -1)
    """Isolated compute seconds per (rank, layer, micro-batch, phase) on the compute stream."""
    out: dict[tuple, float] = {}
    for op in graph.ops:
        if op.kind == COMPUTE and op.stream == "compute":
            k = (op.rank, op.layer, op.microbatch, op.phase)
            out[k] = out.get(k, 0.0) + _iso(cost, op)
    return out


def _compute_runs(graph: OpGraph, cost: SupportsDuration) -> tuple[dict[tuple, list[float]], dict[int, tuple]]:
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


def _alg1_planner(step: StepGraph, cost: SupportsDuration, *, group_partitioned: bool,
                  prefetch: int) -> Callable[[Op], rules.OperationPlan]:
    """Algorithm 1 for each FSDP forward all-gather, fed from the cost model: comm = the
    all-gather, comp = its unit's forward (the consumer chain), in = the forward of the
    ``prefetch`` units before it (the independent work FSDP's prefetch lets it overlap),
    inter/intra = its inter-first sub-collectives."""
    g = step.graph
    runs, run_of = _compute_runs(g, cost)
    dependents = part.dependents_of(g)
    seqs = part.stream_sequences(g)
    cache: dict[int, rules.OperationPlan] = {}

    def plan(op: Op) -> rules.OperationPlan:
        """Algorithm 1's plan for the all-gather ``op``."""
        if op.op_id in cache:
            return cache[op.op_id]
        spec = op.spec
        assert isinstance(spec, CollectiveSpec)  # planned for all-gathers only
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


def operation_candidates(step: StepGraph, w: Workload, cost: SupportsDuration
                         ) -> list[tuple[str, Callable[[Op], rules.OperationPlan] | None, str]]:
    """(label, plan function or None for no partition, Algorithm 1's reason) to simulate."""
    if not w.parallel.fsdp_enabled:
        return []
    ags = part.fsdp_forward_allgathers(step.graph)
    if not ags:
        return []
    first_ag = step.graph.ops[ags[0]].spec
    assert isinstance(first_ag, CollectiveSpec)  # fsdp_forward_allgathers keeps collectives only
    grp = first_ag.group
    prefetch = w.knobs.fsdp_prefetch if w.knobs.overlap else 0
    g = step.graph
    first_mb = min(g.ops[a].microbatch for a in ags)
    layered = [a for a in ags if g.ops[a].layer >= 0 and g.ops[a].microbatch == first_mb] or ags
    mid = g.ops[layered[len(layered) // 2]]  # a representative transformer layer
    out: list[tuple[str, Callable[[Op], rules.OperationPlan] | None, str]] = [("none", None, "")]
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


def layer_costs(graph: OpGraph, cost: SupportsDuration, rank: int, layer: int, mb: int) -> rules.LayerCosts:
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


def model_level_choice(step: StepGraph, w: Workload, cost: SupportsDuration) -> tuple[int, int, str, float]:
    """eq. 2 from the cost model for DDP with a sharded optimizer: C_AG / C_RS the step's
    parameter all-gathers / gradient reduce-scatters, C_fw / C_bw one micro-batch's forward /
    backward compute, m its activations, M the memory left for activations. Returns
    (L1, L2, reason, extra activation bytes)."""
    p = w.parallel
    M = step.microbatches
    if not (p.ddp_enabled and p.distributed_optimizer and not p.pp_enabled):
        return 1, 1, ("eq.2 not applied: it schedules the once-per-step DP all-gather/reduce-scatter (DDP with "
                      "sharded optimizer, no PP)"), 0.0
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


def pipeline_group_choice(step: StepGraph, w: Workload, cost: SupportsDuration) -> tuple[list[int], int, str]:
    """eq. 2 (§3.2.3) with pipeline parallelism, from the cost model: how many micro-batches
    of a model chunk the interleaved schedule launches together (``pp_group``; ``pp`` is
    Megatron-LM's "direct overlapping with interleaved 1F1B", §5.2). The data-parallel
    collectives of a model chunk (``C_AG`` its parameter all-gathers, ``C_RS`` its gradient
    reduce-scatters or all-reduces) overlap the ``L`` micro-batches of another chunk launched
    with them (``L·C_fw`` forward, ``L·C_bw`` backward, one micro-batch of one chunk each), so
    ``T(L) = max(C_AG − L·C_fw, 0) + max(C_RS − L·C_bw, 0)`` with ``L1 = L2 = L`` (one group
    size, as the paper's scheduler launches "a PP depth size of micro-batches" or 6), over
    the ``L`` between ``pp`` and the micro-batches that divide them and whose in-flight
    activations fit (``L·m ≤ M``); ties go to the smallest ``L`` (least memory, Fig. 7 d).
    Returns (the feasible ``L``, the choice, the reason); no feasible ``L`` beyond ``pp`` means
    nothing to choose."""
    p = w.parallel
    M, P, V = step.microbatches, p.pp, p.virtual_stages
    if not (p.pp_enabled and p.dp_enabled and p.pp_schedule == "interleaved" and V > 1):
        return [], 0, "eq.2 with PP not applied: it groups the micro-batches of the interleaved schedule's model chunks"
    g = step.graph
    rank0 = [o for o in g.ops if o.rank == 0]
    c_ag = sum(_iso(cost, o) for o in rank0 if o.name == "param_ag") / V
    c_rs = sum(_iso(cost, o) for o in rank0 if o.name.startswith(("grad_rs", "grad_ar"))) / V
    comp = _unit_compute(g, cost)
    c_fw = sum(t for (r, _l, mb, ph), t in comp.items() if r == 0 and mb == 0 and ph == "fwd") / V
    c_bw = sum(t for (r, _l, mb, ph), t in comp.items() if r == 0 and mb == 0 and ph == "bwd") / V
    mem = step.memory
    m = mem.activations_bytes / max(1, mem.inflight_microbatches)  # one micro-batch of one chunk
    free = mem.usable_bytes - (mem.total_bytes - mem.activations_bytes)
    feasible = []
    for L in range(P, M + 1):
        if M % L:
            continue
        inflight = min(2 * (P - 1) + (V - 1) * L + 1, M * V)  # rank 0's warm-up + 1 (pp.py)
        if inflight * m <= free or L == P:
            feasible.append(L)
    best = min(feasible, key=lambda L: (max(c_ag - L * c_fw, 0.0) + max(c_rs - L * c_bw, 0.0), L))
    t = max(c_ag - best * c_fw, 0.0) + max(c_rs - best * c_bw, 0.0)
    why = (f"eq.2 (PP): per model chunk C_AG={c_ag * 1e3:.1f} C_RS={c_rs * 1e3:.1f} C_fw={c_fw * 1e3:.1f} "
           f"C_bw={c_bw * 1e3:.1f} ms, {M} micro-batches, groups {feasible} fit; L={best} leaves {t * 1e3:.1f} ms")
    return feasible, best, why


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

        def flat(phase: str, mb: int) -> list[int]:
            """One micro-batch's phase, unit after unit (depth-first)."""
            return [o for run in runs.get((rank, phase, mb), []) for o in run]

        def breadth(phase: str, mbs: list[int]) -> list[int]:
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


# ----------------------------------------------------------------------------- the rewritten graph


def centauri_graph(step: StepGraph, *, op_plan: Callable[[Op], rules.OperationPlan] | None = None, layer: str = "T1",
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
