"""DeepSpeed ZeRO-3's parameter fetching (knob ``fsdp_fetch="parameter"``): one all-gather per
parameter tensor, issued by the hook of the submodule that uses it, the next tensors prefetched
up to a bucket of elements.

What DeepSpeed does (v0.9.0, the release of the Centauri paper's software stack, April 2023;
``deepspeed/runtime/zero/partitioned_param_coordinator.py`` ``fetch_sub_module`` and
``deepspeed/runtime/zero/config.py``): at the pre-forward (pre-backward) hook of every
submodule it (1) all-gathers the submodule's parameters unless they are already in flight,
(2) waits for them (the compute stream waits for the all-gather stream), then (3) pops the next
parameters of the step's recorded trace and all-gathers them until
``stage3_prefetch_bucket_size`` elements (default ``5e7``) are newly in flight. All-gathers run
on their own stream (``overlap_comm``, whose default is true for stage 3: ``overlap_comm_valid``);
parameters below ``stage3_param_persistence_threshold`` elements (default ``1e5``: the norm
weights) are never partitioned, so never gathered.

How it is expressed: with this knob the FSDP hook (:mod:`ccoverlap.parallel.fsdp`) gathers each
unit execution's tensors with one ``fsdp_ag_dp.<tensor>`` all-gather each, in the order the
unit uses them (forward: qkv, proj, fc1, fc2; backward the reverse), and
:func:`fetch_per_parameter` then rewires the built step: an op that uses a tensor waits for
that tensor's all-gather only, an op that uses none no longer waits, and each all-gather is
issued at the hook of the submodule whose prefetch issues it: after the compute op before that
submodule's first use and after that submodule's own all-gather. Not modelled: the hooks of
parameterless submodules (which also prefetch), ``stage3_max_live_parameters`` and
``stage3_max_reuse_distance`` (a parameter reused soon is kept gathered), and the gradient
buckets of ``reduce_bucket_size`` elements (the reduce-scatters stay one per unit after its
backward, on their own stream).
"""

from __future__ import annotations

from ccoverlap.parallel.units import tensor_of, unit_tensors
from ccoverlap.sim.graph import COMPUTE, OpGraph
from ccoverlap.sim.rewrite import GraphRewrite

#: ``stage3_prefetch_bucket_size`` default (elements), DeepSpeed v0.9.0 zero/config.py
PREFETCH_BUCKET_NUMEL = 50_000_000
#: ``stage3_param_persistence_threshold`` default (elements), DeepSpeed v0.9.0 zero/config.py
PERSISTENCE_THRESHOLD_NUMEL = 100_000

GATHER_PREFIX = "fsdp_ag_dp."  # the per-tensor all-gathers: fsdp_ag_dp.<tensor>


def gathered_tensors(model, parallel, unit: str) -> list[tuple[str, int]]:
    """``(name, local elements)`` of the unit's tensors ZeRO-3 gathers (sharded over the ``dp``
    group, at least :data:`PERSISTENCE_THRESHOLD_NUMEL` elements), in registration order."""
    return [(t.name, t.numel) for t in unit_tensors(model, parallel, unit)
            if t.group == "dp" and t.numel >= PERSISTENCE_THRESHOLD_NUMEL]


def _chain(graph: OpGraph, users: list[int], seq: list[int], pos: dict[int, int]) -> list[int]:
    """The unit execution some all-gathers feed: the contiguous compute-stream run with the
    labels of their first compute dependent."""
    cons = [i for i in users if graph.ops[i].stream == "compute"]
    if not cons:
        return []
    first = graph.ops[min(cons, key=pos.__getitem__)]
    label = (first.layer, first.microbatch, first.phase)
    out = []
    for oid in seq[pos[first.op_id]:]:
        o = graph.ops[oid]
        if (o.layer, o.microbatch, o.phase) != label:
            break
        out.append(oid)
    return out


def _fetches(graph: OpGraph, rank: int, dependents, seq, pos) -> list[dict]:
    """Rank ``rank``'s per-tensor all-gathers grouped by unit execution, in issue order:
    ``ags`` (op ids), ``tensors`` (name per op), ``bytes`` (each all-gather's), ``chain``
    (the unit execution's compute ops) and ``first`` (the first op using each tensor)."""
    groups: list[list] = []
    for op in graph.ops:
        if op.rank != rank or not op.name.startswith(GATHER_PREFIX):
            continue
        key = (op.layer, op.microbatch, op.phase)
        if not groups or groups[-1][0] != key:
            groups.append([key, []])
        groups[-1][1].append(op)
    out = []
    for _, ags in groups:
        names = [a.name[len(GATHER_PREFIX):] for a in ags]
        chain = _chain(graph, [u for a in ags for u in dependents[a.op_id]], seq, pos)
        if not chain:
            continue
        known = dict.fromkeys(names, 1)
        first = {}
        for oid in chain:
            t = tensor_of(graph.ops[oid].name, known)
            if t is not None:
                first.setdefault(t, oid)
        out.append({"ags": [a.op_id for a in ags], "tensors": names, "bytes": [a.spec.bytes for a in ags],
                    "chain": chain, "first": [first.get(t, chain[0]) for t in names]})
    return out


def fetch_per_parameter(graph: OpGraph, *, bucket_numel: int = PREFETCH_BUCKET_NUMEL,
                        dtype_bytes: int = 2) -> OpGraph:
    """The step ``graph`` built with per-tensor all-gathers (``fsdp_fetch="parameter"``)
    rewired to ZeRO-3's hooks and bucket prefetch (module doc); ``dtype_bytes`` converts the
    all-gathers' bytes to elements for the bucket. Returns a new graph."""
    ops = graph.ops
    dependents: list[list[int]] = [[] for _ in ops]
    for op in ops:
        for d in op.deps:
            dependents[d].append(op.op_id)
    rw = GraphRewrite(graph)
    for rank in sorted({op.rank for op in ops}):
        seq = [op.op_id for op in ops if op.rank == rank and op.stream == "compute"]
        pos = {oid: i for i, oid in enumerate(seq)}
        fetches = _fetches(graph, rank, dependents, seq, pos)
        flat = [(f, i) for f in fetches for i in range(len(f["ags"]))]
        trigger = _prefetch_triggers([f["bytes"][i] / dtype_bytes for f, i in flat], bucket_numel)
        for j, (f, i) in enumerate(flat):
            h, prefetched = trigger[j]
            hf, hi = flat[h]
            ag = f["ags"][i]
            for d in ops[ag].deps:  # the unit-level prefetch edges; data edges (HSDP replica gathers) stay
                if ops[d].stream == "compute":
                    rw.drop_dep(ag, d)
            p = pos[hf["first"][hi]]  # the submodule whose hook issues this all-gather
            if p > 0:
                rw.add_dep(ag, seq[p - 1])
            if prefetched:  # after the hook's own parameters have arrived
                rw.add_dep(ag, hf["ags"][hi])
        for f in fetches:
            _rewire(rw, graph, f, dependents)
    return rw.build()


def _prefetch_triggers(numels: list[int], bucket: int) -> list[tuple[int, bool]]:
    """For each fetch of the trace, the fetch at whose hook it is issued and whether as a
    prefetch: at hook ``i`` the fetch ``i`` is issued if it was not yet, then the next fetches
    not yet issued until ``bucket`` elements are newly issued (DeepSpeed's prefetch loop)."""
    n = len(numels)
    out: list[tuple[int, bool] | None] = [None] * n
    nxt = 0
    for i in range(n):
        if out[i] is None:
            out[i] = (i, False)
        nxt = max(nxt, i + 1)
        new = 0
        while nxt < n and new < bucket:
            if out[nxt] is None:
                out[nxt] = (i, True)
                new += numels[nxt]
            nxt += 1
    return out  # type: ignore[return-value]


def _rewire(rw: GraphRewrite, graph: OpGraph, f: dict, dependents) -> None:
    """Make each op of fetch ``f``'s unit execution wait for the all-gather of the tensor it
    uses only (none for an op that uses no gathered tensor)."""
    by_name = dict(zip(f["tensors"], f["ags"]))
    users = {ag: set(dependents[ag]) for ag in f["ags"]}
    for oid in f["chain"]:
        op = graph.ops[oid]
        t = tensor_of(op.name, by_name) if op.kind == COMPUTE else None
        for name, ag in by_name.items():
            if name == t:
                if oid not in users[ag]:
                    rw.add_dep(oid, ag)
            elif oid in users[ag]:
                rw.drop_dep(oid, ag)
