"""DeepSpeed ZeRO-3's parameter fetching and gradient reduction (knob ``fsdp_fetch="parameter"``):
one all-gather per parameter tensor, issued by the hook of the submodule that uses it, the next
tensors prefetched up to a bucket of elements; gradients reduce-scattered in buckets.

What DeepSpeed does (v0.9.0, the release of the Centauri paper's software stack, April 2023;
``deepspeed/runtime/zero/partitioned_param_coordinator.py`` ``fetch_sub_module``,
``partition_parameters.py``, ``stage3.py`` and ``config.py``):

* at the pre-forward (pre-backward) hook of every submodule, parameterless ones included, it
  (1) all-gathers the submodule's parameters unless they are already in flight, (2) waits for
  them -- ``Work.wait()`` makes the all-gather stream wait for the NCCL kernel, then the
  compute stream for the all-gather stream; the host does not block -- and (3) once the first
  step has recorded the module order (the trace; the first step, and a step whose order
  differs, prefetch nothing), pops the next parameters of the trace and all-gathers them until
  ``stage3_prefetch_bucket_size`` elements (default ``5e7``) are newly in flight, or fewer
  when ``stage3_max_live_parameters`` (``1e9``) gathered elements are not yet released;
* the host blocks only when a third fetch event is outstanding (``__max_ongoing_fetch_events
  = 2``: it waits for an all-gather, never for the computation), when a third gradient bucket
  is in flight (``__max_param_reduce_events = 2``), after the backward
  (``independent_gradient_partition_epilogue`` synchronises the reduce stream) and in the
  optimizer step's overflow and norm checks;
* parameters below ``stage3_param_persistence_threshold`` elements (default ``1e5``: the norm
  weights) are never partitioned, so never gathered;
* each gradient, as autograd produces it, is copied into a bucket of ``reduce_bucket_size``
  elements (default ``5e8``); when the next one would overflow it, the bucket is cast to the
  communication dtype and reduce-scattered (``reduce_independent_p_g_buckets_and_remove_grads``
  / ``__reduce_and_partition_ipg_grads``), the last one after the backward;
* all-gathers and reduce-scatters go through one process group, so one NCCL communicator:
  they run one at a time in issue order (:func:`ccoverlap.sim.simulator.communicator_lanes`).

How it is expressed: with this knob the FSDP hook (:mod:`ccoverlap.parallel.fsdp`) gathers each
unit execution's tensors with one ``fsdp_ag_dp.<tensor>`` all-gather each, in the order the
unit uses them (forward: qkv, proj, fc1, fc2; backward the reverse), and reduce-scatters the
gradients in ``reduce_bucket_size`` buckets, each after the op producing the gradient that
overflows it; :func:`fetch_per_parameter` then rewires the built step: an op that uses a tensor
waits for that tensor's all-gather only, an op that uses none no longer waits, and each
all-gather is issued at the hook of the submodule whose prefetch issues it. When that hook
runs is the knob ``zero3_host_ahead``:

* False (default): each hook runs as the computation reaches it -- the all-gather waits for the
  compute op before that submodule's first use and for that submodule's own all-gather, so
  all-gather B runs beside MatMul A, as Centauri draws its baselines (Fig. 1 a, Fig. 3);
  the prefetch follows the parameter-using submodules' hooks and ``stage3_prefetch_bucket_size``;
* True: DeepSpeed's own runtime, whose hooks run on the host ahead of the GPU (its waits above
  are for communication only): an all-gather waits for no computation; the prefetch window is
  ``stage3_max_live_parameters`` (parameterless submodules' hooks prefetch too, so the window
  fills); all-gathers and reduce-scatters share one queue in the host's issue order, an
  all-gather at its hook, a reduce-scatter after the computation it follows.

Not modelled: ``stage3_max_reuse_distance`` (the last layer's parameters, reused within 1e9
elements, stay gathered from the forward into the backward), the memory passes over each
gradient bucket (copy into the bucket, cast, interleave, divide: about 26 bytes per element
with fp32 reduction) and the first step without a trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ccoverlap.parallel.units import tensor_of, unit_tensors
from ccoverlap.sim.graph import OpGraph
from ccoverlap.sim.rewrite import GraphRewrite
from ccoverlap.specs import COMPUTE

if TYPE_CHECKING:
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.parallel.config import ParallelConfig

# The ZeRO-3 defaults, as DeepSpeed's config declares them: microsoft/DeepSpeed
# deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig, read at commit 38327e07f6cd, 2025-02-21,
# Apache-2.0; the same values as in v0.9.0): stage3_prefetch_bucket_size 5e7,
# stage3_param_persistence_threshold 1e5, stage3_max_live_parameters 1e9,
# stage3_max_reuse_distance 1e9 (not modelled, see the module docstring), reduce_bucket_size 5e8.
#: ``stage3_prefetch_bucket_size`` default (elements)
PREFETCH_BUCKET_NUMEL = 50_000_000
#: ``stage3_param_persistence_threshold`` default (elements)
PERSISTENCE_THRESHOLD_NUMEL = 100_000
#: ``stage3_max_live_parameters`` default (elements)
MAX_LIVE_NUMEL = 1_000_000_000
#: ``stage3_max_reuse_distance`` default (elements); not modelled (module docstring)
MAX_REUSE_DISTANCE_NUMEL = 1_000_000_000
#: ``reduce_bucket_size`` default (elements) (stage3.py fills it
#: with whole gradients as they are produced and reduce-scatters it when the next would overflow it)
REDUCE_BUCKET_NUMEL = 500_000_000

GATHER_PREFIX = "fsdp_ag_dp."  # the per-tensor all-gathers: fsdp_ag_dp.<tensor>


def gathered_tensors(model: ModelSpec, parallel: ParallelConfig, unit: str) -> list[tuple[str, int]]:
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


def _fetches(graph: OpGraph, rank: int, dependents: list[list[int]], seq: list[int],
             pos: dict[int, int]) -> list[dict[str, Any]]:
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
        first: dict[str, int] = {}
        for oid in chain:
            t = tensor_of(graph.ops[oid].name, known)
            if t is not None:
                first.setdefault(t, oid)
        out.append({"ags": [a.op_id for a in ags], "tensors": names, "bytes": [a.spec.bytes for a in ags],
                    "chain": chain, "first": [first.get(t, chain[0]) for t in names]})
    return out


def fetch_per_parameter(graph: OpGraph, *, bucket_numel: int = PREFETCH_BUCKET_NUMEL,
                        dtype_bytes: int = 2, host_ahead: bool = False,
                        live_numel: int = MAX_LIVE_NUMEL) -> OpGraph:
    """The step ``graph`` built with per-tensor all-gathers (``fsdp_fetch="parameter"``)
    rewired to ZeRO-3's hooks and bucket prefetch (module doc); ``dtype_bytes`` converts the
    all-gathers' bytes to elements for the bucket. ``host_ahead`` (knob ``zero3_host_ahead``):
    the hooks run on the host ahead of the GPU, so an all-gather waits for no computation and
    is queued on the communicator, with the gradient reduce-scatters, in the order the host
    issues them: at the hook of the first fetch whose ``live_numel`` window reaches it (module
    doc). Returns a new graph."""
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
        numels = [f["bytes"][i] / dtype_bytes for f, i in flat]
        trigger = _window_triggers(numels, live_numel) if host_ahead else _prefetch_triggers(numels, bucket_numel)
        issue: dict[int, tuple] = {}  # host issue order of this rank's collectives (host_ahead)
        for j, (f, i) in enumerate(flat):
            h, prefetched = trigger[j]
            hf, hi = flat[h]
            ag = f["ags"][i]
            for d in ops[ag].deps:  # the unit-level prefetch edges; data edges (HSDP replica gathers) stay
                if ops[d].stream == "compute":
                    rw.drop_dep(ag, d)
            p = pos[hf["first"][hi]]  # the submodule whose hook issues this all-gather
            if host_ahead:
                issue[ag] = (p, 0, j)  # before that submodule's computation, in trace order
                continue
            if p > 0:
                rw.add_dep(ag, seq[p - 1])
            if prefetched:  # after the hook's own parameters have arrived
                rw.add_dep(ag, hf["ags"][hi])
        for f in fetches:
            _rewire(rw, graph, f, dependents)
        if host_ahead and flat:
            _queue_in_issue_order(rw, graph, rank, ops[flat[0][0]["ags"][0]].stream, issue, pos)
    return rw.build()


def _window_triggers(numels: list[float], live: float) -> list[tuple[int, bool]]:
    """Host-ahead prefetch: for each fetch of the trace, the fetch at whose hook it is issued
    (and whether as a prefetch): the first hook ``i`` from which it lies within ``live``
    elements (``stage3_max_live_parameters``: the prefetch stops once that many gathered
    elements are not yet released; one more is let through, as DeepSpeed's loop does)."""
    out = []
    i = 0
    ahead = 0.0  # elements of fetches i..j-1
    for j, n in enumerate(numels):
        while i < j and ahead >= live:
            ahead -= numels[i]
            i += 1
        out.append((i, i < j))
        ahead += n
    return out


def _queue_in_issue_order(rw: GraphRewrite, graph: OpGraph, rank: int, stream: str, issue: dict,
                          pos: dict[int, int]) -> None:
    """Order ``rank``'s communicator stream ``stream`` (its all-gathers and the reduce-scatters
    the builder put on it) as the host issues them: an all-gather at its hook (``issue``), a
    reduce-scatter after the computation it follows; any other op keeps its place after the op
    before it."""
    mine = [op for op in graph.ops if op.rank == rank and op.stream == stream]
    keyed = []
    last = (-1, 0, 0)
    for op in mine:
        if op.op_id in issue:
            key = issue[op.op_id]
        else:
            after = [pos[d] for d in op.deps if d in pos]
            key = (max(after), 1, op.op_id) if after else (last[0], last[1], op.op_id)
        keyed.append((key, op.op_id))
        last = key
    rw.reorder(rank, stream, [oid for _, oid in sorted(keyed)])


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


def _rewire(rw: GraphRewrite, graph: OpGraph, f: dict[str, Any], dependents: list[list[int]]) -> None:
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
