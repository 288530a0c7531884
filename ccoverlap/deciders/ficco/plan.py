"""The planner strategy ``ficco``: FiCCO schedules for a step's tensor-parallel collective + GEMM pairs.

For a workload with tensor parallelism and sequence parallelism, every forward all-gather +
GEMM (QKV, fc1, LM head) and GEMM + reduce-scatter (out-projection, fc2) pair of the built
step is replaced by the FiCCO schedule the §V-C heuristic picks for its shape
(:func:`ccoverlap.deciders.ficco.schedules.heuristic_pick`): the ops of
:func:`ccoverlap.deciders.ficco.schedules.schedule_graph` are spliced into the step graph in place of
the pair (transfers on the TP stream, GEMM pieces on the compute stream, gather/scatter copies
on two extra streams), and the step is simulated. The note lists each pair's pick, the
estimator's best schedule for the pair alone, and the estimated gain of the pick over serial.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ccoverlap.deciders.ficco import schedules as ficco
from ccoverlap.deciders.ficco.accuracy import CaseVerdict, judge
from ccoverlap.predict.strategy import FunctionStrategy, Planner
from ccoverlap.sim.graph import OpGraph, gc_paused
from ccoverlap.sim.rewrite import GraphRewrite, Piece
from ccoverlap.specs import CollectiveSpec, GemmSpec, P2PSpec

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.parallel.step import StepGraph
    from ccoverlap.predict.evaluate import StrategyResult
    from ccoverlap.predict.workload import Workload
    from ccoverlap.sim.graph import Op

    #: pieces of one side of a spliced pair, each with the (0 = collective | 1 = GEMM, piece
    #: index) pieces of the other side it waits for (None: none)
    Template = list[tuple[Piece, tuple[tuple[int, int], ...] | None]]
    #: per (pattern, m, n, k): the FiCCO case of that shape and its verdict
    Judged = dict[tuple[str, int, int, int], tuple[ficco.FiccoCase, CaseVerdict]]

__all__ = ["tp_pairs", "splice_schedule", "ficco_strategy"]

_STREAMS = {"compute": "compute", "gather": "ficco_gather", "scatter": "ficco_scatter"}


def tp_pairs(graph: OpGraph) -> list[tuple[str, int, int]]:
    """Forward TP+SP pairs of a step graph: ``(pattern, collective op id, GEMM op id)`` with
    pattern ``ag-gemm`` (``<w>_ag`` all-gather feeding GEMM ``<w>``) or ``gemm-rs`` (GEMM ``<w>``
    feeding ``<w>_rs``), found by the builders' names (:mod:`ccoverlap.parallel.tp`)."""
    dependents: dict[int, list[int]] = {}
    for op in graph.ops:
        for d in op.deps:
            dependents.setdefault(d, []).append(op.op_id)
    out = []
    for op in graph.ops:
        if op.phase != "fwd" or not isinstance(op.spec, CollectiveSpec) or op.spec.group.name != "tp":
            continue
        if op.spec.collective == "all_gather" and op.name.endswith("_ag"):
            gem = [i for i in dependents.get(op.op_id, []) if graph.ops[i].name == op.name[:-3]
                   and isinstance(graph.ops[i].spec, GemmSpec)]
            if gem:
                out.append(("ag-gemm", op.op_id, gem[0]))
        elif op.spec.collective == "reduce_scatter" and op.name.endswith("_rs"):
            gem = [d for d in op.deps if graph.ops[d].name == op.name[:-3] and isinstance(graph.ops[d].spec, GemmSpec)]
            if gem:
                out.append(("gemm-rs", op.op_id, gem[0]))
    return out


def splice_schedule(rw: GraphRewrite, pattern: str, coll_id: int, gemm_id: int, sched: OpGraph,
                    templates: dict[tuple, tuple[Template, Template]] | None = None) -> None:
    """Replace the pair (``coll_id``, ``gemm_id`` in ``rw.src``) by the ops of the FiCCO schedule
    graph ``sched``: its transfers become pieces of the collective op (on that op's stream, with
    its CommConfig), its GEMM / copy / reduction ops pieces of the GEMM op; the schedule's
    internal dependencies are kept and the pair's outside dependencies carried over.
    ``templates``: a dict the caller keeps across pairs, so the pieces of a schedule are worked
    out once per (schedule, names, streams, configuration) and only their references to the
    pair's op ids are filled in per pair."""
    src = rw.src
    coll, gemm = src.ops[coll_id], src.ops[gemm_id]
    assert isinstance(coll.spec, CollectiveSpec)  # the pair's communication is a collective (tp_pairs)
    input_side = pattern != "gemm-rs"
    tkey = (id(sched), pattern, coll.name, gemm.name, coll.stream, gemm.stream, coll.spec.config)
    tpl = templates.get(tkey) if templates is not None else None
    if tpl is None:
        tpl = _splice_template(sched, input_side, coll, gemm)
        if templates is not None:
            templates[tkey] = tpl
    comm_tpl, comp_tpl = tpl
    ids = (coll_id, gemm_id)
    comm_pieces = [p if refs is None else Piece(name=p.name, spec=p.spec, stream=p.stream, inherit_deps=p.inherit_deps,
                                                after=p.after, on=tuple((ids[w], i) for w, i in refs))
                   for p, refs in comm_tpl]
    comp_pieces = [p if refs is None else Piece(name=p.name, spec=p.spec, stream=p.stream, inherit_deps=p.inherit_deps,
                                                after=p.after, on=tuple((ids[w], i) for w, i in refs))
                   for p, refs in comp_tpl]
    if input_side:
        rw.drop_dep(gemm_id, coll_id)
        for d in coll.deps:  # the local shard is the collective's input
            rw.add_dep(gemm_id, d)
    rw.replace(coll_id, comm_pieces)
    rw.replace(gemm_id, comp_pieces)


def _splice_template(sched: OpGraph, input_side: bool, coll: Op, gemm: Op) -> tuple[Template, Template]:
    """The pieces :func:`splice_schedule` makes of ``sched`` for a pair like (``coll``, ``gemm``):
    two lists of ``(piece, refs)``, ``refs`` None when the piece waits for nothing of the other
    op, else ``(0 = the collective | 1 = the GEMM, piece index)`` pairs to put in its ``on``."""
    # which schedule ops become pieces of the collective op: its transfers and, on the output
    # side, whatever waits for a transfer (the reductions of DMA reduce-scatters, the ring's adds)
    comm_idx: dict[int, int] = {}
    comp_idx: dict[int, int] = {}
    for op in sched.ops:
        with_coll = isinstance(op.spec, (CollectiveSpec, P2PSpec)) or \
            (not input_side and any(d in comm_idx for d in op.deps))
        if with_coll:
            comm_idx[op.op_id] = len(comm_idx)
        else:
            comp_idx[op.op_id] = len(comp_idx)
    assert isinstance(coll.spec, CollectiveSpec)  # the pair's communication is a collective (tp_pairs)
    comm_tpl: Template = []
    comp_tpl: Template = []
    for op in sched.ops:
        is_comm = op.op_id in comm_idx
        spec = op.spec
        if isinstance(spec, CollectiveSpec):
            spec = replace(spec, config=coll.spec.config)
        after: list[int] = []
        refs: list[tuple[int, int]] = []
        for d in op.deps:
            same = (d in comm_idx) == is_comm
            if same:
                after.append(comm_idx[d] if is_comm else comp_idx[d])
            else:
                refs.append((0, comm_idx[d]) if d in comm_idx else (1, comp_idx[d]))
        stream = coll.stream if op.stream == "comm" else _STREAMS.get(op.stream, gemm.stream)
        if is_comm:
            # input side: transfers inherit the collective's inputs; output side: they wait for
            # their GEMM pieces only (the whole GEMM is no longer a dependency)
            comm_tpl.append((Piece(name=f"{coll.name}.{op.name}", spec=spec, stream=stream,
                                   inherit_deps=input_side, after=tuple(after)), tuple(refs) or None))
        else:
            comp_tpl.append((Piece(name=f"{gemm.name}.{op.name}", spec=spec, stream=stream,
                                   inherit_deps=True, after=tuple(after)), tuple(refs) or None))
    return comm_tpl, comp_tpl


def _judged_pairs(planner: Planner, step: StepGraph, cluster: ClusterSpec, pairs: list[tuple[str, int, int]],
                  tp: int, engine: str) -> Judged:
    """``{(pattern, m, n, k): (FiccoCase, verdict)}`` for the distinct shapes of ``pairs`` (the
    estimator's verdicts, :func:`ccoverlap.deciders.ficco.accuracy.judge`; the shapes are per
    micro-batch, so the same on every step length), made once per planner."""
    g = step.graph
    out: Judged = {}
    for pattern, cid, gid in pairs:
        gm = g.ops[gid].spec
        assert isinstance(gm, GemmSpec)  # the pair's GEMM (tp_pairs)
        key = (pattern, gm.m, gm.n, gm.k)
        if key in out:
            continue

        def make(pattern: str = pattern, gm: GemmSpec = gm,
                 name: str = g.ops[gid].name) -> tuple[ficco.FiccoCase, CaseVerdict]:
            case = ficco.FiccoCase(m=gm.m, n=gm.n, k=gm.k, world=tp, cluster=cluster, pattern=pattern, engine=engine,
                                   dtype_bytes=gm.dtype_bytes, name=name)
            return case, judge(case, planner.cost)

        out[key] = planner.memo(("ficco-judge", engine, key, gm.dtype_bytes, g.ops[gid].name), make)
    return out


def _schedule(v: CaseVerdict, use: str) -> str:
    return v.pick if use == "heuristic" else v.best_overall


def _spliced_graph(planner: Planner, step: StepGraph, cluster: ClusterSpec, tp: int, engine: str,
                   use: str) -> OpGraph:
    """``step``'s graph with every forward TP+SP pair replaced by its FiCCO schedule: ``use`` =
    "heuristic" (the §V-C pick) or "estimator" (the estimator's fastest for the pair alone)."""
    g = step.graph
    pairs = tp_pairs(g)
    judged = _judged_pairs(planner, step, cluster, pairs, tp, engine)
    rw = GraphRewrite(g)
    graphs: dict[tuple, OpGraph] = {}  # one schedule graph per shape (splice_schedule only reads it)
    templates: dict[tuple, tuple[Template, Template]] = {}
    with gc_paused():
        _splice_all(rw, g, pairs, judged, use, graphs, templates)
    return rw.build()


def _splice_all(rw: GraphRewrite, g: OpGraph, pairs: list[tuple[str, int, int]], judged: Judged, use: str,
                graphs: dict[tuple, OpGraph], templates: dict[tuple, tuple[Template, Template]]) -> None:
    """Splice the schedule ``use`` picks for each pair's shape into ``rw`` (see :func:`_spliced_graph`)."""
    for pattern, cid, gid in pairs:
        gm = g.ops[gid].spec
        assert isinstance(gm, GemmSpec)  # the pair's GEMM (tp_pairs)
        key = (pattern, gm.m, gm.n, gm.k)
        case, v = judged[key]
        sched = _schedule(v, use)
        if sched != "serial":
            if key not in graphs:
                graphs[key] = ficco.schedule_graph(case, sched)
            splice_schedule(rw, pattern, cid, gid, graphs[key], templates)


def ficco_strategy(planner: Planner, w: Workload) -> StrategyResult | None:
    """Planner strategy ``ficco`` (see the module docstring): the §V-C heuristic's schedule for
    every forward TP+SP pair, with SM-driven and (if the GPU has copy engines) DMA transfers,
    the faster kept; the note also gives the step time with the estimator's best schedule per
    pair. None without TP + SP. Times in seconds.

    The engine is chosen on the planner's screened step (fewer micro-batches unless the planner
    is exact; the schedules per pair do not depend on the micro-batch count); the two reported
    steps (heuristic, estimator) go through :meth:`Planner.rewritten_metrics`, i.e. they are
    extrapolated from two short steps where the pipeline schedule allows it (the first is the
    screened step, already simulated), else simulated in full."""
    p = w.parallel
    if p.tp <= 1 or not p.sequence_parallel or not w.knobs.overlap:
        return None

    wf = replace(w, knobs=replace(w.knobs, tp_overlap="none", comm_transport="sm"))
    ws = planner.screened(wf)
    judge_step = planner.step(ws)
    pairs = tp_pairs(judge_step.graph)
    if not pairs or p.tp > wf.cluster.gpus_per_node:
        return None
    engines = ("sm", "dma") if wf.cluster.gpu.copy_engines > 0 else ("sm",)

    def rewrite(engine: str, use: str) -> Callable[[StepGraph], OpGraph]:
        return lambda st: _spliced_graph(planner, st, wf.cluster, p.tp, engine, use)

    engine = engines[0]
    if len(engines) > 1:
        best_t = None
        for e in engines:
            t = planner.rewritten_metrics(ws, rewrite(e, "heuristic"), key=("ficco", e, "heuristic")).step_time_s
            if best_t is None or t < best_t:
                best_t, engine = t, e
    metrics = planner.rewritten_metrics(wf, rewrite(engine, "heuristic"), key=("ficco", engine, "heuristic"))
    judged = _judged_pairs(planner, judge_step, wf.cluster, pairs, p.tp, engine)
    if all(v.best_overall == v.pick for _, v in judged.values()):
        metrics_e = metrics  # the heuristic picked the estimator's best everywhere: the same graph
    else:
        metrics_e = planner.rewritten_metrics(wf, rewrite(engine, "estimator"), key=("ficco", engine, "estimator"))
    parts = []
    for case, v in judged.values():
        sched = v.pick
        by = {e.schedule: e for e in v.estimates}
        parts.append(f"{case.name} {case.pattern} ({case.m},{case.n},{case.k}): {sched} {by[sched].speedup:.2f}x"
                     + ("" if v.best_overall == sched else f" (estimator: {v.best_overall} "
                        f"{by[v.best_overall].speedup:.2f}x)"))
    how = ""
    if metrics.extrapolated_from:
        how = (f" (transfer engine chosen on {metrics.extrapolated_from[0]} micro-batches; steps extrapolated from "
               f"{metrics.extrapolated_from[0]} and {metrics.extrapolated_from[1]})")
    note = (f"FiCCO §V-C picks, {engine} transfers — " + "; ".join(parts) +
            f". With the estimator's best schedule per pair the step would take {metrics_e.step_time_s * 1e3:.1f} ms"
            + how + ".")
    res = planner.summarize_metrics("ficco", wf, metrics, note=note)
    # the schedule per pair, as ccoverlap.runtime.tp's styles take it (ccoverlap.planning.emit)
    res.decision = {"tp_schedules": {case.name: {"pattern": case.pattern, "schedule": v.pick, "engine": engine}
                                     for case, v in judged.values()}}
    return res


# planner strategy (registered by ccoverlap.planning.strategies.default_registry); ``weight``: a scheduling
# hint only (CPU seconds on the README's 70B plan, docs/planner.md)
FICCO = FunctionStrategy("ficco", ficco_strategy,
                         "FiCCO (§V-C heuristic): finer-grain schedules for every forward TP+SP all-gather/reduce-scatter + GEMM pair",
                         weight=2.8)
