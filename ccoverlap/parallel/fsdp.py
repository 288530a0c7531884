"""Fully sharded data parallelism (ZeRO-3; PyTorch FSDP, Zhao et al., VLDB 2023): per-unit
parameter all-gather before use, gradient reduce-scatter after each unit's backward.

Model of one simulated rank (units = embedding, each layer, head):

* A unit *execution* is one forward or backward of the unit for one micro-batch. Every
  forward needs the unit's parameters gathered; a backward needs them again only with
  ``fsdp_reshard_after_forward`` (otherwise they were kept since the forward).
* All-gathers run in execution order on their own stream (``fsdp_ag``; FSDP's unshard / all-gather
  stream), reduce-scatters on another (``fsdp_rs``), as FSDP1 and FSDP2 do.
* Prefetch depth ``d`` = ``fsdp_prefetch``: the all-gather for gathering-execution ``j`` is issued
  when execution ``j−d`` starts, i.e. it depends on the end of execution ``j−d−1``
  (``d = 0``: it waits for the previous unit to finish, so the unit's compute waits for the
  whole all-gather — no overlap).
* Limit ``L`` = ``fsdp_limit_all_gathers``: at most ``L`` gathered units alive; the
  all-gather for execution ``j`` also waits until execution ``j−L`` has finished and freed its
  buffer (FSDP1's ``limit_all_gathers`` rate limiter; FSDP2's buffer reuse).
* The reduce-scatter of a unit's gradients (fp32, the full local gradient as nccl size) is
  issued after the unit's backward, every micro-batch (FSDP without ``no_sync``).
* Routed-expert weights are sharded over the expert-data-parallel group (dp/ep) with their own
  all-gather / reduce-scatter; with ``dp == 1`` (or ``dp/ep == 1``) nothing is sharded.
* Parameters are sharded over the ``dp × cp`` ranks (torchtitan's ``dp_shard_cp`` mesh).
  HSDP (``dp_replicate = r > 1``): they are sharded over one shard group of ``dp·cp / r``
  ranks only; after each reduce-scatter the unit's gradient *shard* (fp32, ``numel / shard``
  elements) is all-reduced across the ``r`` replicas (group ``dp_rep``) on the same stream,
  as FSDP2's HSDP and FSDP1's ``HYBRID_SHARD`` do. With ``distributed_optimizer`` the
  replicas are ZeRO-1/2 instead (the "Zero1+2+3" of Centauri §5.2, and its primitive
  substitution, Table 2): the shard is reduce-scattered across the replicas (``hsdp_rs``,
  same stream), each replica updates ``1/r`` of it, and the updated shard is all-gathered
  across the replicas (``hsdp_param_ag``, compute dtype) — at the start of the next step on
  the ``dp_comm`` stream, the unit's first all-gather of the step waiting for it, with the
  knob ``overlap_param_gather``; else blocking after the optimizer step.
* Frameworks whose profile has ``fsdp_copies`` (FSDP2, torchtitan) copy the gathered buffer
  out into the parameters on the compute stream before the unit runs (read + write the
  unsharded unit) and pack the gradients into the reduce-scatter input, cast to fp32, on the
  reduce-scatter stream (read bf16, write fp32): FSDP2's ``foreach_all_gather_copy_out`` and
  ``foreach_reduce`` copy-in. FSDP1's flat parameters use views in forward (no copy-out);
  their backward copies (below).
* Pipeline parallelism through ``torch.distributed.pipelining`` (profile
  ``fsdp_pp_deferred_sync``, pp > 1): ``PipelineStage.backward_maybe_with_nosync`` runs every
  micro-batch's backward with ``set_requires_gradient_sync(False)`` and
  ``set_reshard_after_backward(False)``, and after the stage's last backward calls
  ``post_backward()`` of every FSDP state of the stage (``run_post_backward``). So the
  unsharded gradient is accumulated in the reduce dtype on the compute stream after each
  micro-batch's backward (FSDP2 ``to_accumulated_grad_if_needed`` /
  ``accumulate_unsharded_grad_if_needed``: cast d -> reduce bytes the first time, read both and
  write the accumulator after), every unit of the stage is reduce-scattered, in module order,
  only after the stage's last backward has finished, and parameters not resharded after
  forward (torchtitan with PP: ``reshard_after_forward = False``) are gathered once per step.
* ``fp8_param_allgather``: parameters are cast to FP8 on the shard and all-gathered at one byte
  per element (torchao ``enable_fsdp_float8_all_gather``).
* Gradients are reduced in the profile's ``fsdp_reduce_dtype`` (FSDP2 in torchtitan: fp32,
  ``mixed_precision_reduce = "float32"``; fms-fsdp's FSDP1 ``bfSixteen`` policy: bf16).
* FSDP1 with flat parameters (profile ``fsdp_flat_param``; ``torch/distributed/fsdp`` with
  ``use_orig_params=False``): the fp32 shard is cast to the bf16 ``_mp_shard`` before the
  all-gather (``_use_low_precision_shard``: 4 + 2 bytes per shard element, all-gather stream);
  the gathered flat parameter is used through views (no copy-out); in backward autograd
  concatenates the unit's gradients into the flat gradient (``split``'s backward: read + write
  the unit's bf16 gradients, compute stream); on the post-backward (reduce-scatter) stream
  the unsharded gradient is divided by the pre-divide factor before the reduce-scatter, the
  shard by the post-divide factor after it, and the shard is cast to the fp32 flat
  parameter's dtype (``_post_backward_hook`` / ``default_hooks.reduce_scatter_hook`` /
  ``_cast_grad_to_param_dtype`` in ``torch/distributed/fsdp/_runtime_utils.py``, read at
  pytorch/pytorch ``00ae0bc9``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ccoverlap.parallel.context import GRAD_BYTES
from ccoverlap.parallel.units import unit_tensors
from ccoverlap.parallel.zero3 import GATHER_PREFIX, REDUCE_BUCKET_NUMEL, gathered_tensors

if TYPE_CHECKING:  # annotations only (the step builder imports this module)
    from ccoverlap.parallel.context import StepEmitter
    from ccoverlap.specs import Collective


class FSDPHook:
    """Adds FSDP's collectives for one simulated rank (see module doc)."""

    def __init__(self, em: StepEmitter, rank: int, chunks: list[tuple[int, list[str]]]) -> None:
        self.em = em
        self.rank = rank
        p = em.parallel
        self.sizes = {"dp": p.dp_shard, "edp": p.expert_dp}
        self.replicas = p.dp_replicate
        self.ag_bytes = 1 if p.fp8_param_allgather else p.dtype_bytes
        self.copies = em.framework.fsdp_copies
        self.flat = em.framework.fsdp_flat_param
        self.rb = em.framework.fsdp_reduce_bytes  # bytes per reduced gradient element
        self.bytes: dict[str, dict[str, int]] = {}
        # DeepSpeed ZeRO-3 fetching (knob fsdp_fetch="parameter", ccoverlap.parallel.zero3): the
        # gathered tensors of each unit; tensors under the persistence threshold stay gathered
        self.per_tensor = em.knobs.fsdp_fetch == "parameter" and em.knobs.overlap  # without overlap all block
        self.tensors: dict[str, list[tuple[str, int]]] = {}
        # ZeRO-3's gradient bucket of each backward (chunk, micro-batch): (elements, producer op) of the
        # gradients added since the last reduce-scatter (ccoverlap.parallel.zero3, REDUCE_BUCKET_NUMEL)
        self.grad_bucket: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for _, units in chunks:
            for u in units:
                if self.per_tensor:
                    self.tensors[u] = gathered_tensors(em.model, p, u)
                per = {"dp": 0, "edp": 0}
                for t in unit_tensors(em.model, p, u):
                    per[t.group] += t.numel
                self.bytes[u] = {g: n for g, n in per.items() if n and self.sizes[g] > 1}
        self.ends: list[int | None] = []  # end op of each gathering execution, in order
        self.pending: dict[tuple, int] = {}  # (chunk, unit, mb, phase) -> index into ends
        self.last_rs: int | None = None
        # torch.distributed.pipelining with FSDP (profile ``fsdp_pp_deferred_sync``, pp > 1):
        # gradients accumulate unsharded over the micro-batches and every unit of a stage is
        # reduce-scattered after the stage's last backward; parameters stay gathered between
        # micro-batches (gathered once when they are not resharded after forward)
        self.deferred = em.framework.fsdp_pp_deferred_sync and p.pp > 1
        self.chunk_units = {c: list(units) for c, units in chunks}
        self.gathered: set = set()  # (chunk, unit) kept unsharded (deferred mode)
        self.last_bwd: dict[int, dict[str, tuple]] = {}  # chunk -> unit -> (end op, mb) of its last backward
        # HSDP with ZeRO-1/2 across the replicas (distributed_optimizer): the replica all-gather
        # of each unit's updated shard, and whether it overlaps the next step's forward
        self.zero_replicas = self.replicas > 1 and p.distributed_optimizer
        self.replica_ag: dict[tuple, int] = {}  # (chunk, unit) -> hsdp_param_ag its first gather waits for
        k = em.knobs
        self.replica_ag_early = self.zero_replicas and k.overlap and k.overlap_param_gather

    def start(self) -> None:
        """HSDP with ZeRO-1/2 replicas and ``overlap_param_gather``: the previous step's replica
        all-gathers of the updated shards, issued at step start in forward order."""
        if not self.replica_ag_early:
            return
        em = self.em
        for chunk, units in self.chunk_units.items():
            for u in units:
                numel = self.bytes.get(u, {}).get("dp", 0)
                if numel:
                    shard = -(-numel // self.sizes["dp"])
                    self.replica_ag[(chunk, u)] = em.g.add(
                        "hsdp_param_ag", em.ctx.coll("all_gather", shard * em.parallel.dtype_bytes, "dp_rep"),
                        rank=self.rank, stream=em.stream("dp_comm"), phase="dp")

    def before_unit(self, chunk: int, unit: str, phase: str, mb: int, first_use: bool) -> int | None:
        """Emit the unit's all-gather(s) for this execution; return the op its compute waits for."""
        em, k = self.em, self.em.knobs
        if phase == "bwd" and not k.fsdp_reshard_after_forward:
            return None
        sizes = self.bytes.get(unit)
        if not sizes:
            return None
        if self.deferred and not k.fsdp_reshard_after_forward:
            if (chunk, unit) in self.gathered:
                return None  # still unsharded from an earlier micro-batch
            self.gathered.add((chunk, unit))
        j = len(self.ends)
        deps: list[int | None] = []
        if (chunk, unit) in self.replica_ag:  # the updated shard must be back from the replicas
            deps.append(self.replica_ag.pop((chunk, unit)))
        if j - k.fsdp_prefetch - 1 >= 0:
            deps.append(self.ends[j - k.fsdp_prefetch - 1])
        if j - k.fsdp_limit_all_gathers >= 0:
            deps.append(self.ends[j - k.fsdp_limit_all_gathers])
        op = None
        for group, numel in sizes.items():
            if group == "dp" and self.per_tensor:  # DeepSpeed ZeRO-3: one all-gather per tensor, in use order
                tensors = self.tensors[unit] if phase == "fwd" else self.tensors[unit][::-1]
                for name, n in tensors:
                    op = em.g.add(f"{GATHER_PREFIX}{name}", em.ctx.coll("all_gather", n * self.ag_bytes, group),
                                  rank=self.rank, stream=em.stream("fsdp_ag"), deps=deps, microbatch=mb,
                                  phase=phase, layer=em.layer_of(unit))
                continue
            ag_deps = deps
            if self.flat:  # FSDP1 mixed precision: cast the fp32 shard to the bf16 all-gather input
                shard = -(-numel // self.sizes[group])
                ag_deps = [em.g.add("fsdp_shard_cast", em.ctx.mem(shard * (GRAD_BYTES + self.ag_bytes)),
                                    rank=self.rank, stream=em.stream("fsdp_ag"), deps=deps, microbatch=mb,
                                    phase=phase, layer=em.layer_of(unit))]
            op = em.g.add(f"fsdp_ag_{group}", em.ctx.coll("all_gather", numel * self.ag_bytes, group),
                          rank=self.rank, stream=em.stream("fsdp_ag"), deps=ag_deps, microbatch=mb,
                          phase=phase, layer=em.layer_of(unit))
        if self.copies:  # FSDP2: unpack the gathered buffer into the parameters, on the compute stream
            op = em.g.add("fsdp_copy_out", em.ctx.mem(2.0 * sum(sizes.values()) * self.ag_bytes), rank=self.rank,
                          stream=em.stream("compute"), deps=(op,), microbatch=mb, phase=phase,
                          layer=em.layer_of(unit))
        self.pending[(chunk, unit, mb, phase)] = j
        self.ends.append(None)
        return op

    def unit_done(self, chunk: int, unit: str, phase: str, mb: int, end_id: int, producers: dict[str, int],
                  last_mb: bool) -> None:
        """Record the end of a gathering execution; after a backward, reduce-scatter the grads."""
        j = self.pending.pop((chunk, unit, mb, phase), None)
        if j is not None:
            self.ends[j] = end_id
        if phase != "bwd":
            return
        if self.per_tensor:
            self._bucket_gradients(chunk, unit, mb, end_id, producers)
            return
        if not self.deferred:
            self._reduce(unit, mb, end_id)
            return
        em = self.em
        d, rb, layer = em.parallel.dtype_bytes, self.rb, em.layer_of(unit)
        numel = sum(self.bytes.get(unit, {}).values())
        if numel:  # FSDP2 post-backward without gradient sync: accumulate the unsharded gradient in
            # the reduce dtype (first micro-batch: cast d -> rb; later: read both, write rb; compute stream)
            first = unit not in self.last_bwd.get(chunk, {})  # this unit's first backward of the step
            if rb != d:
                nbytes = numel * ((d + rb) if first else (d + 2 * rb))
            else:  # autograd accumulates into .grad in the parameter dtype
                nbytes = 0 if first else 3 * d * numel
            if nbytes:
                end_id = em.g.add("fsdp_grad_accumulate", em.ctx.mem(nbytes), rank=self.rank,
                                  stream=em.stream("compute"), deps=(end_id,), microbatch=mb, phase="bwd", layer=layer)
        self.last_bwd.setdefault(chunk, {})[unit] = (end_id, mb)
        if not last_mb:
            return
        done = self.last_bwd[chunk]
        stage = self.chunk_units.get(chunk, [])
        if any(u not in done or done[u][1] != mb for u in stage if self.bytes.get(u)):
            return
        # the stage's last backward is over: reduce-scatter every unit, in module (forward) order,
        # after all of it (pipelining's run_post_backward)
        last = max(done[u][0] for u in stage if u in done)
        for u in stage:
            if self.bytes.get(u):
                self._reduce(u, mb, last)

    def _bucket_gradients(self, chunk: int, unit: str, mb: int, end_id: int, producers: dict[str, int]) -> None:
        """DeepSpeed ZeRO-3's gradient buckets (``reduce_bucket_size``, stage3.py
        ``reduce_independent_p_g_buckets_and_remove_grads``): each gradient joins the bucket as it
        is produced (``producers``: tensor -> the op computing its gradient; the unit's end for
        the others); when the next one would overflow the bucket, the bucket is reduce-scattered
        from that gradient's hook, so after the op producing it; the last bucket after the
        backward (``independent_gradient_partition_epilogue``)."""
        key = (chunk, mb)
        bucket = self.grad_bucket.setdefault(key, [])
        layer = self.em.layer_of(unit)
        grads = sorted((producers.get(t.name, end_id), t.numel) for t in unit_tensors(self.em.model, self.em.parallel,
                                                                                       unit) if t.group == "dp")
        if self.sizes["dp"] > 1:
            for op, numel in grads:
                if bucket and sum(n for n, _ in bucket) + numel > REDUCE_BUCKET_NUMEL:
                    self._reduce_bucket(sum(n for n, _ in bucket), mb, op, layer)
                    bucket.clear()
                bucket.append((numel, op))
        if unit == self.chunk_units.get(chunk, [unit])[0] and bucket:  # the backward's last unit: flush
            self._reduce_bucket(sum(n for n, _ in bucket), mb, end_id, layer)
            bucket.clear()

    def _reduce_bucket(self, numel: int, mb: int, dep: int, layer: int) -> None:
        """Reduce-scatter a ZeRO-3 gradient bucket of ``numel`` elements (reduce dtype) after op
        ``dep``; with ZeRO-1/2 replicas, then reduce-scatter its shard across them."""
        em = self.em
        # with the hooks ahead on the host, the all-gathers' queue on the communicator holds the
        # reduce-scatters too, in issue order (ccoverlap.parallel.zero3)
        stream = em.stream("fsdp_ag" if em.knobs.zero3_host_ahead else "fsdp_rs")
        self.last_rs = em.g.add("fsdp_rs_dp", em.ctx.coll("reduce_scatter", numel * self.rb, "dp"), rank=self.rank,
                                stream=stream, deps=(dep,), microbatch=mb, phase="bwd", layer=layer)
        if self.replicas > 1:
            shard = -(-numel // self.sizes["dp"])
            coll: Collective
            name, coll = ("hsdp_rs", "reduce_scatter") if self.zero_replicas else ("hsdp_ar", "all_reduce")
            self.last_rs = em.g.add(name, em.ctx.coll(coll, shard * self.rb, "dp_rep"), rank=self.rank,
                                    stream=em.stream("fsdp_rs"), deps=(self.last_rs,), microbatch=mb, phase="bwd",
                                    layer=layer)

    def _reduce(self, unit: str, mb: int, end_id: int) -> None:
        """Reduce-scatter ``unit``'s gradients after op ``end_id`` (and the HSDP all-reduce, the
        framework's copies and FSDP1 passes around it)."""
        em = self.em
        d, rb, layer = em.parallel.dtype_bytes, self.rb, em.layer_of(unit)
        for group, numel in self.bytes.get(unit, {}).items():
            dep = end_id
            shard = -(-numel // self.sizes[group])
            if self.copies:  # FSDP2: gradients packed (and cast to the reduce dtype) into the reduce-scatter input
                dep = em.g.add("fsdp_rs_copy_in", em.ctx.mem(numel * (d + rb)),
                               rank=self.rank, stream=em.stream("fsdp_rs"), deps=(end_id,), microbatch=mb,
                               phase="bwd", layer=layer)
            if self.flat:  # FSDP1: autograd cats the unit's gradients into the flat gradient (compute
                # stream), then the post-backward stream casts to the reduce dtype and pre-divides
                dep = em.g.add("fsdp_flat_grad_cat", em.ctx.mem(2.0 * numel * d), rank=self.rank,
                               stream=em.stream("compute"), deps=(end_id,), microbatch=mb, phase="bwd", layer=layer)
                cast = (d + rb) if d != rb else 0  # ``flat_param.grad.to(reduce_dtype)`` when they differ
                dep = em.g.add("fsdp_grad_predivide", em.ctx.mem(numel * (cast + 2 * rb)), rank=self.rank,
                               stream=em.stream("fsdp_rs"), deps=(dep,), microbatch=mb, phase="bwd", layer=layer)
            self.last_rs = em.g.add(f"fsdp_rs_{group}", em.ctx.coll("reduce_scatter", numel * rb, group),
                                    rank=self.rank, stream=em.stream("fsdp_rs"), deps=(dep,), microbatch=mb,
                                    phase="bwd", layer=layer)
            if self.replicas > 1 and group == "dp":
                coll: Collective
                name, coll = ("hsdp_rs", "reduce_scatter") if self.zero_replicas else ("hsdp_ar", "all_reduce")
                self.last_rs = em.g.add(name, em.ctx.coll(coll, shard * rb, "dp_rep"),
                                        rank=self.rank, stream=em.stream("fsdp_rs"), deps=(self.last_rs,),
                                        microbatch=mb, phase="bwd", layer=layer)
            if self.flat:  # FSDP1: post-divide the shard (read + write), cast it to the fp32 flat
                # parameter's dtype when it was reduced in another
                cast = (rb + GRAD_BYTES) if rb != GRAD_BYTES else 0
                self.last_rs = em.g.add("fsdp_grad_postdivide", em.ctx.mem(shard * (2 * rb + cast)),
                                        rank=self.rank, stream=em.stream("fsdp_rs"), deps=(self.last_rs,),
                                        microbatch=mb, phase="bwd", layer=layer)

    def waits(self) -> list[int]:
        """Ops the optimizer step must wait for (the last reduce-scatter; the stream is FIFO)."""
        return [] if self.last_rs is None else [self.last_rs]

    def after_optimizer(self, opt_id: int) -> None:
        """Sharded parameters are updated in place; HSDP with ZeRO-1/2 replicas and without
        ``overlap_param_gather`` all-gathers each unit's updated shard across the replicas,
        blocking, after the step."""
        if not self.zero_replicas or self.replica_ag_early:
            return
        em, prev = self.em, opt_id
        for _, units in sorted(self.chunk_units.items()):
            for u in units:
                numel = self.bytes.get(u, {}).get("dp", 0)
                if numel:
                    shard = -(-numel // self.sizes["dp"])
                    prev = em.g.add("hsdp_param_ag", em.ctx.coll("all_gather", shard * em.parallel.dtype_bytes,
                                                                 "dp_rep"),
                                    rank=self.rank, stream="compute", deps=(prev,), phase="opt")
