"""Data parallelism with replicated weights: bucketed gradient all-reduce overlapped with backward.

As PyTorch DDP (Li et al., VLDB 2020, "PyTorch Distributed"): parameters are assigned to
buckets in *reverse* registration order (the order backward produces gradients), a new
bucket starting once the current one holds at least ``bucket_cap_mb`` MiB of gradients (the
first bucket of a model is 1 MiB, ``dist._DEFAULT_FIRST_BUCKET_BYTES``). A bucket's all-reduce
is issued as soon as the last of its gradients is ready, on the DP communication stream, so
it runs during the rest of the backward; the optimizer waits for every bucket. With gradient
accumulation (several micro-batches) gradients are synchronised on the last micro-batch only
(``no_sync`` / Megatron-LM's ``overlap_grad_reduce``). With ``overlap=False`` every bucket is
reduced after the whole backward, blocking the compute stream. Each pipeline model chunk has its own
buckets, and routed-expert gradients have their own, reduced over the expert-data-parallel group.

With ``distributed_optimizer`` (Megatron-LM; ZeRO-1) a bucket is reduce-scattered instead,
and parameters are all-gathered bucket by bucket after the optimizer step: with ``overlap`` and
the knob ``overlap_param_gather`` at the start of the (next, steady-state) step, each layer's
first forward waiting for its buckets; without, blocking after the optimizer.

With the knob ``overlap_grad_reduce`` off, no bucket is reduced during the backward: every
bucket is reduced after the rank's whole backward (all its model chunks), on the compute
stream, as Megatron-LM did before ``--overlap-grad-reduce`` (``reduce_model_grads`` after
``forward_backward_func``, at ``e6d7e09``).

Gradients are reduced in fp32 (``ddp_reduce_dtype: fp32``: Megatron-Core's fp32 main grads,
forced with ``--bf16``) or in the parameter dtype (``param``: Megatron-LM 2021's default,
``--accumulate-allreduce-grads-in-fp32`` off). With ``ddp_coalesce_copies`` (Megatron-LM
2021 without ``--use-contiguous-buffers-in-ddp``, its default) the gradients are flattened into
one buffer before the all-reduce and copied back after it, on the compute stream
(``_flatten_dense_tensors`` / ``_unflatten_dense_tensors`` in ``allreduce_gradients``).

How gradients are bucketed follows the profile's ``ddp_buckets``: ``pytorch`` as above;
``megatron`` (Megatron-Core ``DistributedDataParallel`` at ``f2e5db402c``): no smaller first
bucket, ``bucket_cap_mb`` buckets on pipeline rank 0's first model chunk only, one bucket on
every other pipeline rank ("data-parallel communication on these stages is not on the
critical path") and model chunk (``disable_bucketing=(model_chunk_idx > 0)`` in
``megatron/training/training.py``); ``single``: one bucket per model chunk (Megatron-LM 2021
all-reduces each contiguous gradient buffer whole).

Before a bucket's collective, frameworks whose profile says so run memory-bound kernels over
the bucket's gradients on the compute stream (the collective waits for them):
``ddp_grad_nan_check`` reads it once (Megatron-Core ``Bucket.start_grad_sync``:
``grad_data.norm(p=2)`` when ``check_for_nan_in_grad``, on by default through
``--check-for-nan-in-loss-and-grad``), ``ddp_grad_prescale`` reads and writes it
(``grad_data *= gradient_scaling_factor`` = 1/dp unless ``average_in_collective``;
Megatron-LM 2021 ``buffer_.data /= dp``). Megatron-LM at ``f2e5db402c``,
``megatron/core/distributed/param_and_grad_buffer.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ccoverlap.parallel.context import GRAD_BYTES
from ccoverlap.parallel.units import unit_tensors
from ccoverlap.specs import MemorySpec

if TYPE_CHECKING:  # annotations only (the step builder imports this module)
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.parallel.config import ParallelConfig
    from ccoverlap.parallel.context import StepEmitter
    from ccoverlap.specs import Collective, CollectiveSpec

MiB = 1 << 20
FIRST_BUCKET_BYTES = 1 * MiB


@dataclass
class Bucket:
    """Gradients reduced together: ``tensors`` = [(unit, name)], ``numel`` local elements."""

    group: str
    chunk: int
    tensors: list[tuple[str, str]] = field(default_factory=list)
    numel: int = 0


def plan_buckets(model: ModelSpec, parallel: ParallelConfig, units: list[str], chunk: int, cap_mb: float,
                 first_bucket_bytes: float = FIRST_BUCKET_BYTES, grad_bytes: int = GRAD_BYTES) -> list[Bucket]:
    """Buckets of one model chunk (``units`` in forward order), in the order they fill: each
    closes once it holds ``cap_mb`` MiB of gradients (``grad_bytes`` each), the first one already at
    ``first_bucket_bytes`` (PyTorch DDP's 1 MiB; 0 = no smaller first bucket). ``cap_mb`` =
    ``inf`` gives one bucket per gradient group."""
    cap = cap_mb * MiB
    out: list[Bucket] = []
    current: dict[str, Bucket] = {}
    first = {"dp": first_bucket_bytes > 0, "edp": first_bucket_bytes > 0}
    for unit in reversed(units):
        for t in reversed(unit_tensors(model, parallel, unit)):
            if t.numel == 0:
                continue
            b = current.get(t.group)
            if b is None:
                b = current[t.group] = Bucket(group=t.group, chunk=chunk)
                out.append(b)
            b.tensors.append((t.unit, t.name))
            b.numel += t.numel
            limit = first_bucket_bytes if first[t.group] else cap
            if b.numel * grad_bytes >= limit:
                first[t.group] = False
                current.pop(t.group)
    return out


class DDPHook:
    """Adds the DP gradient synchronisation of one simulated rank to the graph (see module doc)."""

    def __init__(self, em: StepEmitter, rank: int, chunks: list[tuple[int, list[str]]]) -> None:
        self.em = em
        self.rank = rank
        p = em.parallel
        self.sizes = {"dp": p.dp_cp, "edp": p.expert_dp}
        self.dist_opt = p.distributed_optimizer
        self.buckets: dict[int, list[Bucket]] = {}
        self.next: dict[int, int] = {}
        self.ready: dict[tuple, int] = {}
        self.param_ag: dict[tuple, int] = {}  # (chunk, unit) -> all-gather op its forward waits for
        rule = em.framework.ddp_buckets
        # bytes per reduced gradient element: fp32 main grads, or the parameter dtype
        self.gb = em.framework.ddp_grad_bytes(p.dtype_bytes)
        self.last_post: int | None = None  # last copy-back kernel (ddp_coalesce_copies)
        for chunk, units in chunks:
            cap: float = em.knobs.bucket_cap_mb
            first: float = FIRST_BUCKET_BYTES
            if rule != "pytorch":
                first = 0.0
                if rule == "single" or rank > 0 or chunk > 0:
                    cap = float("inf")
            bs = [b for b in plan_buckets(em.model, p, units, chunk, cap, first, self.gb)
                  if self.sizes[b.group] > 1]
            self.buckets[chunk] = bs
            self.next[chunk] = 0
        self.last_comm: int | None = None

    def _coll(self, b: Bucket, collective: Collective, dtype_bytes: int) -> CollectiveSpec:
        return self.em.ctx.coll(collective, b.numel * dtype_bytes, b.group)

    def _param_bytes(self) -> int:
        """Bytes per gathered parameter: 1 with ``fp8_param_allgather`` (Megatron-LM
        ``--fp8-param-gather``), else the compute dtype."""
        p = self.em.parallel
        return 1 if getattr(p, "fp8_param_allgather", False) else p.dtype_bytes

    def start(self) -> None:
        """Distributed optimizer with overlap: the previous step's parameter all-gathers,
        issued at step start in forward order."""
        if not (self.dist_opt and self.em.knobs.overlap and self.em.knobs.overlap_param_gather):
            return
        em = self.em
        for chunk in sorted(self.buckets):
            for b in reversed(self.buckets[chunk]):
                op = em.g.add("param_ag", self._coll(b, "all_gather", self._param_bytes()), rank=self.rank,
                              stream=em.stream("dp_comm"), phase="dp")
                for unit, _ in b.tensors:
                    self.param_ag[(chunk, unit)] = op
                self.last_comm = op

    def before_unit(self, chunk: int, unit: str, phase: str, mb: int, first_use: bool) -> int | None:
        """Dependency of a unit's first forward on its parameters' all-gather."""
        if phase == "fwd" and first_use:
            return self.param_ag.pop((chunk, unit), None)
        return None

    def unit_done(self, chunk: int, unit: str, phase: str, mb: int, end_id: int, producers: dict[str, int],
                  last_mb: bool) -> None:
        """After a unit's backward on the last micro-batch: record its gradient-producing ops
        and (with overlap) issue every bucket that is now complete."""
        if phase != "bwd" or not last_mb:
            return
        for t in unit_tensors(self.em.model, self.em.parallel, unit):
            self.ready[(unit, t.name)] = producers.get(t.name, end_id)
        if self.em.knobs.overlap and self.em.knobs.overlap_grad_reduce:
            self._issue(chunk, in_backward=True)

    def bucket_kernels(self, numel: int) -> MemorySpec | None:
        """The memory-bound work the framework runs over a bucket of ``numel`` gradients of
        ``g`` bytes before its collective (module doc), or None: bytes = ``2g·numel`` for the
        copy into a flat buffer (``ddp_coalesce_copies``) + ``g·numel`` for the NaN check's
        norm + ``2g·numel`` for the 1/dp scaling (read + write)."""
        fw = self.em.framework
        kernels = int(fw.ddp_coalesce_copies) + int(fw.ddp_grad_nan_check) + int(fw.ddp_grad_prescale)
        if not kernels:
            return None
        nbytes = numel * self.gb * (2 * int(fw.ddp_coalesce_copies) + int(fw.ddp_grad_nan_check)
                                    + 2 * int(fw.ddp_grad_prescale))
        return MemorySpec(bytes=float(nbytes), kernels=kernels, host_kernels=kernels if fw.eager else 0)

    def _issue(self, chunk: int, in_backward: bool = False) -> None:
        """Issue every complete bucket of ``chunk`` in fill order. ``in_backward``: called from
        a unit's backward, so the bucket kernels on the compute stream carry the backward's
        labels (phase, micro-batch, layer of the last gradient) and stay in it when a decider
        regroups the backward; after the backward they are labelled ``dp``."""
        bs = self.buckets.get(chunk, [])
        i = self.next.get(chunk, 0)
        em = self.em
        while i < len(bs) and all(k in self.ready for k in bs[i].tensors):
            b = bs[i]
            dep = max(self.ready[k] for k in b.tensors)
            pre = self.bucket_kernels(b.numel)
            if pre is not None:
                src = em.g.ops[dep]
                labels = dict(phase="bwd", microbatch=src.microbatch, layer=src.layer) if in_backward else \
                    dict(phase="dp")
                dep = em.g.add("grad_bucket_prep", pre, rank=self.rank, stream="compute", deps=(dep,), **labels)
            coll: Collective = "reduce_scatter" if self.dist_opt else "all_reduce"
            stream = em.stream("dp_comm") if em.knobs.overlap_grad_reduce else "compute"
            self.last_comm = em.g.add(f"grad_{'rs' if self.dist_opt else 'ar'}_{b.group}",
                                      self._coll(b, coll, self.gb), rank=self.rank,
                                      stream=stream, deps=(dep,), phase="dp")
            if em.framework.ddp_coalesce_copies:  # copy the reduced flat buffer back into the grads
                self.last_post = em.g.add("grad_bucket_copy_back", MemorySpec(
                    bytes=float(2 * b.numel * self.gb), host_kernels=1 if em.framework.eager else 0),
                    rank=self.rank, stream="compute", deps=(self.last_comm,), phase="dp")
            i += 1
        self.next[chunk] = i

    def waits(self) -> list[int]:
        """Issue what is left (everything, without overlap: after the whole backward, as
        Megatron-LM's ``finalize_model_grads`` without ``overlap_grad_reduce``); return the ops
        the optimizer step must wait for."""
        for chunk in sorted(self.buckets):
            self._issue(chunk)
        return [op for op in (self.last_comm, self.last_post) if op is not None]

    def after_optimizer(self, opt_id: int) -> None:
        """Distributed optimizer without overlap (or ``overlap_param_gather``): blocking parameter
        all-gathers after the step."""
        if not self.dist_opt or (self.em.knobs.overlap and self.em.knobs.overlap_param_gather):
            return
        em = self.em
        prev = opt_id
        for chunk in sorted(self.buckets):
            for b in reversed(self.buckets[chunk]):
                prev = em.g.add("param_ag", self._coll(b, "all_gather", self._param_bytes()), rank=self.rank,
                                stream="compute", deps=(prev,), phase="opt")
