"""Compose one training step (TP × PP × DP or FSDP, with EP for MoE) into an op graph.

Ranks with identical roles are simulated once: one simulated rank per pipeline rank, standing
for its ``tp × dp`` peers (all TP and DP peers run the same ops at the same time). Collectives
on TP / DP / EP groups are single ops on that rank with the group's GroupSpec (size, and
members per node from :mod:`ccoverlap.parallel.layout`).

Streams (real frameworks use separate CUDA streams / NCCL communicators, and NCCL
serialises the kernels of one communicator): ``compute``; ``tp_comm`` (TP / SP collectives);
``ep_comm`` (expert all-to-all); ``dp_comm`` (DDP buckets, distributed-optimizer gathers,
tied-embedding all-reduce); ``fsdp_ag`` and ``fsdp_rs`` (FSDP's all-gather and
reduce-scatter streams); ``pp_send`` / ``pp_recv`` (pipeline point-to-point). With
``overlap=False`` every collective and transfer goes on ``compute`` (blocking); with
``pp_p2p_overlap=False`` only the pipeline transfers do.

Per rank the step is: the schedule's forward/backward tasks (each a chain of layer templates
from :mod:`~ccoverlap.parallel.layer` / :mod:`~ccoverlap.parallel.ep`, with receive before and
send after), the DP hooks (:mod:`~ccoverlap.parallel.ddp`, :mod:`~ccoverlap.parallel.fsdp`),
then the tied-embedding gradient all-reduce (first and last stage, pp > 1), gradient-norm
(read every local gradient, all-reduce one float: gradient clipping; the framework profile's
``grad_clip_bytes_per_param``, 4 by default, 12 where ``clip_grad_norm_`` also rescales every
gradient) and the Adam step (memory-bound: the profile's ``optimizer_bytes_per_param``; 30 by
default: fp32 master weight, gradient and both moments read, master and moments written,
bf16 copy written; 80 for PyTorch's foreach AdamW, one pass per ``torch._foreach_*`` op).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from ccoverlap.catalog.frameworks import check_framework, get_framework
from ccoverlap.errors import ConfigError
from ccoverlap.parallel import ep as epm
from ccoverlap.parallel import layer as lay
from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig, check_step_size, validate
from ccoverlap.parallel.context import GRAD_BYTES, LayerCtx
from ccoverlap.parallel.ddp import DDPHook
from ccoverlap.parallel.fsdp import FSDPHook
from ccoverlap.parallel.layout import Layout
from ccoverlap.parallel.memory import MemoryEstimate, estimate_memory
from ccoverlap.parallel.pp import Schedule, make_schedule
from ccoverlap.parallel.segment import IN, Segment
from ccoverlap.parallel.units import layer_index, stage_units, unit_tensors
from ccoverlap.parallel.zero3 import fetch_per_parameter
from ccoverlap.sim.graph import Op, OpGraph, gc_paused
from ccoverlap.specs import MemorySpec, P2PSpec

if TYPE_CHECKING:
    from ccoverlap.catalog.frameworks import FrameworkProfile
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.catalog.models import ModelSpec

#: a framework profile: a built-in name, a profile file, or the profile itself (None: the default)
Framework: TypeAlias = "str | os.PathLike[str] | FrameworkProfile | None"

new_op = tuple.__new__  # an Op record from a tuple of its fields, without keyword handling


@dataclass
class StepGraph:
    """A built step. ``simulated_ranks``: (sim rank, description, real ranks it stands for);
    ``tokens_per_step`` and ``model_flops_per_step`` are global (for throughput and MFU: divide
    by step time × world size × peak). Op labels in ``graph``: ``layer`` is the transformer
    layer (-1 for the embedding, ``model.layers`` for final norm / LM head / loss, -1 for the
    optimizer and gradient-sync ops), ``microbatch`` the micro-batch (-1 outside them), ``phase``
    ``fwd`` | ``bwd`` | ``dp`` (DDP bucket collectives) | ``opt``."""

    graph: OpGraph
    world_size: int
    tokens_per_step: int
    model_flops_per_step: float
    simulated_ranks: list[tuple[int, str, int]]
    memory: MemoryEstimate
    microbatches: int
    schedule: Schedule
    meta: dict[str, Any] = field(default_factory=dict)


class CompiledOp(NamedTuple):
    """One op of a compiled template, ready to stamp: ``local`` = indices of earlier ops of
    the same segment it waits for (sorted, no repeats); ``use_in`` = it also waits for the
    segment's input; ``sdeps`` = export keys of other segments it waits for; ``stream`` is the
    real stream; ``tensor`` / ``export`` as in :class:`~ccoverlap.parallel.segment.TOp`."""

    name: str
    spec: object
    stream: str
    local: tuple
    use_in: bool
    sdeps: tuple
    tensor: str
    export: str

    @property
    def plain(self) -> bool:
        """Waits only for ops of its own segment (its deps are known once the segment's first id is)."""
        return not self.use_in and not self.sdeps


class _Compiled:
    """A Segment flattened for fast stamping: its ops as :class:`CompiledOp` records."""

    __slots__ = ("ops", "out", "last_compute", "first_compute", "unit", "comm_only", "recompute", "fixed",
                 "special", "input_only", "other_special", "tensors", "exports")

    def __init__(self, seg: Segment, stream_of: Callable[[str], str], recompute: bool = False) -> None:
        self.ops: list[CompiledOp] = []
        for o in seg.ops:
            local = tuple(sorted({d for d in o.deps if isinstance(d, int) and d != IN}))
            self.ops.append(CompiledOp(o.name, o.spec, stream_of(o.stream), local, IN in o.deps,
                                       tuple(d for d in o.deps if isinstance(d, str)), o.tensor, o.export))
        self.out = seg.out if seg.out >= 0 else len(self.ops) + seg.out  # an index from the end
        comp = [i for i, o in enumerate(self.ops) if o.stream == "compute"]
        self.last_compute = comp[-1] if comp else self.out
        self.first_compute = comp[0] if comp else 0
        self.unit = seg.unit
        self.comm_only = seg.comm_only
        self.recompute = recompute
        # stamping tables: (index, name, spec, stream, local deps) of every op; the ops whose
        # deps need more than the segment's own ids (input, exports, the hook's extra edge);
        # the ops that finish a tensor's gradient or export their id
        # (a one-dependency op's local deps as the bare index: stamped as a 1-tuple directly)
        self.fixed = [(i, c.name, c.spec, c.stream, c.local[0] if len(c.local) == 1 else c.local)
                      for i, c in enumerate(self.ops)]
        self.special = [i for i, c in enumerate(self.ops) if not c.plain]
        # the special ops that wait for the segment's input only (the usual first op)
        self.input_only = [(i, c.name, c.spec, c.stream) for i, c in enumerate(self.ops)
                           if c.use_in and not c.local and not c.sdeps]
        self.other_special = [i for i in self.special if not (self.ops[i].use_in and not self.ops[i].local
                                                              and not self.ops[i].sdeps)]
        self.tensors = [(i, c.tensor) for i, c in enumerate(self.ops) if c.tensor]
        self.exports = [(i, c.export) for i, c in enumerate(self.ops) if c.export]


class _Emitter:
    def __init__(self, model: ModelSpec, parallel: ParallelConfig, batch: BatchConfig, cluster: ClusterSpec,
                 knobs: OverlapKnobs, grad_clip: bool = True, framework: Framework = None) -> None:
        self.grad_clip = grad_clip
        self.framework = get_framework(framework)
        check_framework(self.framework, model, parallel)
        self.model, self.parallel, self.batch, self.cluster, self.knobs = model, parallel, batch, cluster, knobs
        self.M = batch.microbatches(parallel.dp)
        self.layout = Layout.build(parallel, cluster.gpus_per_node)
        self.sched = make_schedule(parallel.pp_schedule, parallel.pp, self.M, parallel.virtual_stages,
                                   parallel.pp_group)
        self.ctx = LayerCtx(model, parallel, batch.micro_batch, batch.seq_len, self.layout, knobs,
                                framework=self.framework)
        self.two_batch = knobs.overlap and knobs.ep_overlap and model.is_moe and parallel.ep > 1
        self.half_ctx = (LayerCtx(model, parallel, batch.micro_batch, batch.seq_len, self.layout, knobs, 0.5,
                                      framework=self.framework)
                         if self.two_batch else None)
        ov, k = knobs.overlap, knobs
        self._streams = {
            "compute": "compute",
            "tp": "tp_comm" if ov else "compute",
            "ep": "ep_comm" if ov else "compute",
            "cp": "cp_comm" if ov else "compute",
            "dp_comm": "dp_comm" if ov else "compute",
            "fsdp_ag": "fsdp_ag" if ov else "compute",
            "fsdp_rs": "fsdp_rs" if ov else "compute",
            "pp_send": "pp_send" if ov and k.pp_p2p_overlap else "compute",
            "pp_recv": "pp_recv" if ov and k.pp_p2p_overlap else "compute",
        }
        self.g = OpGraph()
        self._cache: dict = {}
        self._layer_of: dict = {}
        self._chains: dict = {}
        self._p2p_specs: dict = {}
        self.stage_units = [stage_units(model, self.sched.stages, s) for s in range(self.sched.stages)]
        tok = batch.micro_batch * batch.seq_len // parallel.cp
        self.p2p_bytes = tok * model.hidden * parallel.dtype_bytes // (parallel.tp if self.ctx.sp else 1)

    # ------------------------------------------------------------------ helpers
    def stream(self, name: str) -> str:
        """The real stream for a logical one (everything is ``compute`` without overlap)."""
        return self._streams[name]

    def layer_of(self, unit: str) -> int:
        """Layer label of a unit's ops: the layer index, -1 for the embedding, ``layers`` for the head."""
        v = self._layer_of.get(unit)
        if v is None:
            v = self._layer_of[unit] = self.model.layers if unit == "head" else layer_index(unit)
        return v

    def _chain(self, stage: int, phase: str, half: bool) -> tuple[list[tuple[str, _Compiled, int]], dict[str, int],
                                                                  list[tuple[str, int, list[_Compiled]]]]:
        """(unit, compiled segment, layer label) in execution order for one task of ``stage``,
        how many segments of each unit the task stamps, and the same chain grouped by unit as
        (unit, layer label, its segments) (cached)."""
        key = (stage, phase, half)
        c = self._chains.get(key)
        if c is None:
            units = self.stage_units[stage]
            order = units if phase == "fwd" else units[::-1]
            chain = [(u, cs, self.layer_of(u)) for u in order for cs in self._segs(u, phase, half)]
            halves = 2 if half else 1
            count: dict[str, int] = {}
            for u, _, _ in chain:
                count[u] = count.get(u, 0) + halves
            by_unit = [(u, self.layer_of(u), self._segs(u, phase, half)) for u in order
                       if self._segs(u, phase, half)]
            c = self._chains[key] = (chain, count, by_unit)
        return c

    def _segs(self, unit: str, phase: str, half: bool) -> list[_Compiled]:
        """Compiled templates of a unit (cached per unit kind, phase and half)."""
        li = layer_index(unit)
        kind = unit if li < 0 else ("moe" if self.model.is_moe_layer(li) else "dense")
        key = (kind, phase, half)
        c = self._cache.get(key)
        if c is None:
            ctx = self.half_ctx if half else self.ctx
            assert ctx is not None  # a half micro-batch is asked for only with two-batch overlap, which sets it
            if kind == "emb":
                f, b = [lay.embedding_fwd(ctx)], [lay.embedding_bwd(ctx)]
            elif kind == "head":
                f, b = [lay.head_fwd(ctx)], [lay.head_bwd(ctx)]
            elif kind == "moe":
                f, b = epm.moe_layer(ctx, "")
            else:
                f, b = lay.dense_layer(ctx, "")
            st = self._streams.__getitem__
            self._cache[(kind, "fwd", half)] = [_Compiled(s, st) for s in f]
            bwd = [_Compiled(s, st) for s in b]
            if self.parallel.recompute == "full" and li >= 0:
                bwd = [_Compiled(s.renamed("recompute_"), st, recompute=True) for s in f] + bwd
            self._cache[(kind, "bwd", half)] = bwd
            c = self._cache[key]
        return c

    def _emit(self, cs: _Compiled, rank: int, in_id: int | None, extra: int | None, layer: int, mb: int, phase: str,
              exports: dict[str, int], producers: dict[str, int] | None) -> tuple[int, int]:
        """Stamp one compiled segment; returns (output op id, last compute op id). The
        segment's ops get consecutive ids from ``base``, so local deps are ``base + j``."""
        ops = self.g.ops
        base = len(ops)
        add = base.__add__
        new = [new_op(Op, (base + i, name, rank, stream, spec,
                           (base + local,) if local.__class__ is int else (tuple(map(add, local)) if local else ()),
                           None, layer, mb, phase))
               for i, name, spec, stream, local in cs.fixed]
        if extra is None:
            dep_in = () if in_id is None else (in_id,)
            for i, name, spec, stream in cs.input_only:
                new[i] = new_op(Op, (base + i, name, rank, stream, spec, dep_in, None, layer, mb, phase))
            special = cs.other_special
        else:
            special = sorted({*cs.special, 0, cs.first_compute})
        for i in special:
            c = cs.ops[i]
            dl = [base + j for j in c.local]
            if c.use_in and in_id is not None:
                dl.append(in_id)
            for key in c.sdeps:
                v = exports.get(key)
                if v is not None:
                    dl.append(v)
            if extra is not None and (i == 0 or i == cs.first_compute):
                dl.append(extra)
            new[i] = new_op(Op, (base + i, c.name, rank, c.stream, c.spec, tuple(sorted(set(dl))), None, layer, mb,
                                 phase))
        ops.extend(new)
        if producers is not None:
            for i, tensor in cs.tensors:
                producers[tensor] = base + i
        for i, key in cs.exports:
            exports[key] = base + i
        return base + cs.out, base + cs.last_compute

    def _p2p(self, inter_node: bool) -> P2PSpec:
        """The pipeline transfer spec (one object per direction kind, shared by every transfer)."""
        spec = self._p2p_specs.get(inter_node)
        if spec is None:
            spec = self._p2p_specs[inter_node] = P2PSpec(
                bytes=self.p2p_bytes, inter_node=inter_node, config=self.knobs.config_for("pp"),
                transport=self.knobs.comm_transport)
        return spec

    # ------------------------------------------------------------------ tasks
    def _task(self, rank: int, task: tuple[str, int, int], hook: DDPHook | FSDPHook, first_f: set[tuple[int, int]],
              last_b: set[tuple[int, int]], fwd_out: dict[tuple[int, int], list[int]],
              bwd_out: dict[tuple[int, int], list[int]]) -> None:
        kind, mb, chunk = task
        sched, S = self.sched, self.sched.stages
        stage = sched.stage_of(rank, chunk)
        units = self.stage_units[stage]
        phase = "fwd" if kind == "F" else "bwd"
        g = self.g
        in_id = None
        inter = self.layout.pp_inter_node
        if kind == "F" and stage > 0:
            in_id = g.add("recv_fwd", self._p2p(inter),
                          rank=rank, stream=self.stream("pp_recv"), deps=fwd_out[(mb, stage - 1)], microbatch=mb,
                          phase=phase)
        elif kind == "B" and stage < S - 1:
            in_id = g.add("recv_bwd", self._p2p(inter),
                          rank=rank, stream=self.stream("pp_recv"), deps=bwd_out[(mb, stage + 1)], microbatch=mb,
                          phase=phase)
        order = units if kind == "F" else units[::-1]
        halves = 2 if self.two_batch else 1
        chain, count, by_unit = self._chain(stage, phase, halves == 2)
        started: set = set()
        ends: dict[str, int] = {}
        prods: dict[str, dict] = {u: {} for u in order} if kind == "B" else {}
        first_use = (chunk, mb) in first_f
        last_mb = (chunk, mb) in last_b
        if halves == 1:  # each unit's segments one after the other: its hooks around them
            cur1 = in_id
            exports1: dict = {}
            emit = self._emit
            for u, layer, segs in by_unit:
                extra = hook.before_unit(chunk, u, phase, mb, first_use)
                prod = prods.get(u)
                end_u = -1
                for cs in segs:
                    out, lc = emit(cs, rank, cur1, extra, layer, mb, phase, exports1, prod)
                    extra = None
                    if not cs.recompute:
                        cur1 = out
                    if lc > end_u:
                        end_u = lc
                hook.unit_done(chunk, u, phase, mb, end_u, prods.get(u, {}), last_mb)
            cur = [cur1]
        else:
            remaining = dict(count)
            cut = epm.two_batch_groups([cs for _, cs, _ in chain])
            groups: list[list[list[tuple[str, _Compiled, int]]]] = []
            i = 0
            for piece in cut:
                groups.append([chain[i:i + len(piece)]] * 2)
                i += len(piece)
            cur = [in_id] * halves
            exports: list[dict[str, int]] = [{} for _ in range(halves)]
            for grp in groups:
                for h in range(halves):
                    for u, cs, layer in grp[h]:
                        extra = None
                        if u not in started:
                            started.add(u)
                            extra = hook.before_unit(chunk, u, phase, mb, first_use)
                        out, lc = self._emit(cs, rank, cur[h], extra, layer, mb, phase, exports[h], prods.get(u))
                        if not cs.recompute:
                            cur[h] = out
                        ends[u] = max(ends.get(u, lc), lc)
                        remaining[u] -= 1
                        if remaining[u] == 0:
                            hook.unit_done(chunk, u, phase, mb, ends[u], prods.get(u, {}), last_mb)
        outs = [c for c in cur if c is not None]
        if kind == "F" and stage < S - 1:
            fwd_out[(mb, stage)] = outs
            g.add("send_fwd", self._p2p(inter),
                  rank=rank, stream=self.stream("pp_send"), deps=outs, microbatch=mb, phase=phase)
        elif kind == "B" and stage > 0:
            bwd_out[(mb, stage)] = outs
            g.add("send_bwd", self._p2p(inter),
                  rank=rank, stream=self.stream("pp_send"), deps=outs, microbatch=mb, phase=phase)

    def build(self) -> OpGraph:
        """Play every rank's schedule into the graph (tasks emitted as soon as their input is),
        then each rank's gradient sync tail and optimizer step."""
        sched, p, P = self.sched, self.parallel, self.parallel.pp
        hooks = []
        for r in range(P):
            chunks = [(c, self.stage_units[sched.stage_of(r, c)]) for c in range(len(sched.chunk_stage[r]))]
            hook = (FSDPHook if p.data_parallel == "fsdp" else DDPHook)(self, r, chunks)
            hook.start()
            hooks.append(hook)
        first_f, last_b = [], []
        for r in range(P):
            ff: dict[int, int] = {}
            lb: dict[int, int] = {}
            for kind, mb, c in sched.orders[r]:
                if kind == "F":
                    ff.setdefault(c, mb)
                else:
                    lb[c] = mb
            first_f.append({(c, m) for c, m in ff.items()})
            last_b.append({(c, m) for c, m in lb.items()})
        fwd_out: dict = {}
        bwd_out: dict = {}
        ptr = [0] * P
        total = sum(len(o) for o in sched.orders)
        done = 0
        S = sched.stages
        while done < total:
            progressed = False
            for r in range(P):
                order = sched.orders[r]
                while ptr[r] < len(order):
                    kind, mb, c = order[ptr[r]]
                    st = sched.stage_of(r, c)
                    if kind == "F" and st > 0 and (mb, st - 1) not in fwd_out:
                        break
                    if kind == "B" and st < S - 1 and (mb, st + 1) not in bwd_out:
                        break
                    self._task(r, order[ptr[r]], hooks[r], first_f[r], last_b[r], fwd_out, bwd_out)
                    ptr[r] += 1
                    done += 1
                    progressed = True
            if not progressed:
                raise ConfigError(f"pipeline schedule {sched.name!r} deadlocks (internal error)")
        for r in range(P):
            self._finish_rank(r, hooks[r])
        return self.g

    def _finish_rank(self, r: int, hook: DDPHook | FSDPHook) -> None:
        g, p, m = self.g, self.parallel, self.model
        ctx = self.ctx
        waits = list(hook.waits())
        stages = [self.sched.stage_of(r, c) for c in range(len(self.sched.chunk_stage[r]))]
        if m.tied_embeddings and p.pp > 1 and (0 in stages or self.sched.stages - 1 in stages):
            n = m.vocab * m.hidden // p.tp
            waits.append(g.add("embedding_grad_ar", ctx.coll("all_reduce", n * GRAD_BYTES, "embd"), rank=r,
                               stream=self.stream("dp_comm"), deps=waits, phase="opt"))
        dense = expert = 0
        for s in stages:
            for u in self.stage_units[s]:
                for t in unit_tensors(m, p, u):
                    if t.group == "edp":
                        expert += t.numel
                    else:
                        dense += t.numel
        sharded = p.data_parallel == "fsdp" or p.distributed_optimizer
        # HSDP with ZeRO-1/2 replicas (distributed_optimizer): each replica updates 1/r of the shard
        shard = p.dp_shard if p.data_parallel == "fsdp" and not p.distributed_optimizer else p.dp_cp
        local = dense // shard + expert // p.expert_dp if sharded else dense + expert
        if self.grad_clip:
            clip_bytes = local * self.framework.grad_clip_bytes_per_param
            norm = g.add("grad_norm", MemorySpec(bytes=float(clip_bytes)), rank=r, deps=waits, phase="opt")
            waits = [g.add("grad_norm_ar", ctx.coll("all_reduce", 4, "world" if sharded else "mp"), rank=r,
                           deps=(norm,), phase="opt")]
        opt_bytes = local * self.framework.optimizer_bytes_per_param
        opt = g.add("optimizer_step", MemorySpec(bytes=float(opt_bytes)), rank=r, deps=waits, phase="opt")
        hook.after_optimizer(opt)

    def describe_ranks(self) -> list[tuple[int, str, int]]:
        """(simulated rank, what it holds, how many real ranks it stands for)."""
        out = []
        sched = self.sched
        for r in range(self.parallel.pp):
            parts = []
            for c in range(len(sched.chunk_stage[r])):
                units = self.stage_units[sched.stage_of(r, c)]
                layers = [layer_index(u) for u in units if layer_index(u) >= 0]
                extra = "".join(f" + {u}" for u in units if layer_index(u) < 0)
                parts.append(f"layers {layers[0]}-{layers[-1]}{extra}")
            out.append((r, f"pipeline rank {r}: " + "; ".join(parts),
                        self.parallel.tp * self.parallel.cp * self.parallel.dp))
        return out


def build_step(model: ModelSpec, parallel: ParallelConfig, batch: BatchConfig, cluster: ClusterSpec,
               knobs: OverlapKnobs | None = None, *, grad_clip: bool = True, framework: Framework = None) -> StepGraph:
    """Build the op graph of one training step of ``model`` under ``parallel`` on ``cluster``.

    Validates everything first (ConfigError lists every problem). Returns a :class:`StepGraph`
    whose ``graph`` :func:`ccoverlap.sim.simulator.simulate` plays; one simulated rank per pipeline rank.
    ``grad_clip``: compute the global gradient norm (read every local gradient, all-reduce one
    float) before the optimizer step, as gradient clipping does.
    Model FLOPs follow PaLM's MFU definition (:meth:`ModelSpec.flops_per_token`).
    ``framework``: a framework profile name, file or :class:`FrameworkProfile` (default
    ``megatron-core``) that decides which kernels a layer runs (docs/model.md).
    """
    knobs = OverlapKnobs() if knobs is None else knobs
    validate(model, parallel, batch, cluster, knobs)
    check_step_size(model.layers, parallel, batch, knobs)  # before anything is built
    em = _Emitter(model, parallel, batch, cluster, knobs, grad_clip, framework)
    zero3 = knobs.fsdp_fetch == "parameter" and parallel.fsdp_enabled and knobs.overlap  # (blocking either way)
    if zero3:
        _check_zero3(em)
    with gc_paused():
        graph = em.build()
        if zero3:
            graph = fetch_per_parameter(graph, dtype_bytes=1 if parallel.fp8_param_allgather else parallel.dtype_bytes,
                                        host_ahead=knobs.zero3_host_ahead)
    graph.meta.update({
        "model": model.name, "parallel": parallel.to_dict(), "batch": batch.to_dict(),
        "knobs": knobs.to_dict(), "microbatches": em.M, "schedule": em.sched.name,
        "framework": em.framework.name,
        "rank_weights": {r: n for r, _, n in em.describe_ranks()},
    })
    tokens, flops, memory = step_totals(model, parallel, batch, cluster, knobs, em.framework)
    return StepGraph(
        graph=graph,
        world_size=parallel.world_size,
        tokens_per_step=tokens,
        model_flops_per_step=flops,
        simulated_ranks=em.describe_ranks(),
        memory=memory,
        microbatches=em.M,
        schedule=em.sched,
    )


def _check_zero3(em: _Emitter) -> None:
    """Configurations the ZeRO-3 per-parameter fetch (:mod:`ccoverlap.parallel.zero3`) does not
    model: one ConfigError naming what is wrong."""
    fw, p = em.framework, em.parallel
    why = []
    if fw.fsdp_copies or fw.fsdp_flat_param:
        how = "FSDP2 copies" if fw.fsdp_copies else "FSDP1 flat parameters"
        why.append(f"framework {fw.name!r} gathers FSDP units with {how}")
    if em.model.is_moe:
        why.append("expert parameters are not fetched per tensor")
    if p.pp > 1 and fw.fsdp_pp_deferred_sync:
        why.append("parameters stay gathered across micro-batches with fsdp_pp_deferred_sync")
    if why:
        raise ConfigError("fsdp_fetch='parameter' (DeepSpeed ZeRO-3 fetching) is not modelled here: " + "; ".join(why))


def step_totals(model: ModelSpec, parallel: ParallelConfig, batch: BatchConfig, cluster: ClusterSpec,
                knobs: OverlapKnobs | None = None, framework: Framework = None) -> tuple[int, float, MemoryEstimate]:
    """What a step's :class:`StepGraph` carries besides its graph, without building the graph:
    global tokens per step, model FLOPs per step (PaLM's MFU definition,
    :meth:`ModelSpec.flops_per_token`) and the per-GPU memory estimate (bytes)."""
    tokens = batch.global_batch * batch.seq_len
    fw = get_framework(framework)
    memory = estimate_memory(model, parallel, batch, cluster, knobs or OverlapKnobs(),
                             framework=fw)
    return tokens, model.flops_per_token(batch.seq_len) * tokens, memory
