"""One overlapped all-gather per sequence-sharded module input, shared by the projections that read it.

Under a sequence-parallel tensor-parallel plan (torchtitan's Llama plan) a module such as
attention or the SwiGLU feed-forward receives its input sharded along the sequence, and
``PrepareModuleInput(input_layouts=Shard(d), desired_input_layouts=Replicate())`` gathers
it once; the column-parallel projections inside (wq, wk, wv; w1, w3) all read the gathered
tensor, and in backward their input-gradient partial sums are added before one
reduce-scatter. This module does the same on plain local tensors, with the DTensor
bookkeeping torch's styles pay per operation left out, and overlaps both collectives:

* :func:`gather_input` returns what torch's ``PrepareModuleInput`` returns - a
  ``Replicate()`` DTensor whose local tensor is the whole sequence, or that local tensor
  itself with ``use_local_output=True`` - carrying a :class:`SharedGather` record. While the
  cross-rank check and then the one all-gather are in flight it multiplies this rank's own
  shard by the weights of the projections that will read the result (``consumers``: the
  column-parallel ``nn.Linear`` children of the module): those rows of their outputs need
  no remote data. The gathered tensor is complete before the module runs, so a module that
  reads it any other way (``to_local()``, a DTensor op) sees the whole sequence.
* :func:`gathered_linear` is a column-parallel linear on such an input,
  ``y = x_full @ W_r.T + b_r``: with its rows of this rank already computed it multiplies
  only the other ranks' rows (their blocks of the gather buffer); otherwise the whole input.
  Every rank's rows are multiplied straight into their place in the batch-first output
  (:mod:`ccoverlap.runtime.blocks`): no output rows are copied.
  A precomputed block is used only when the same weight object, unchanged (same version
  counter), is passed: anything else recomputes, so the result never depends on it.
* backward: each projection computes ``dW`` and ``db`` as usual and adds its
  input-gradient partial ``dy @ W_r`` into the record's accumulator (fused into the GEMM,
  ``addmm``/``baddbmm``), kept in the reduce-scatter's rank-major layout so that it is sent
  without a permuting copy; the one whose backward runs last starts the reduce-scatter and
  computes its ``dW`` while it is in flight. The backward of :func:`gather_input` finishes it, adds what
  reached the gathered tensor through ordinary autograd (a ``Partial`` DTensor gradient is
  reduce-scattered; a ``Replicate`` one, or the plain tensor's, contributes this rank's
  slice, as torch's redistribution does) and returns this rank's shard gradient.

Per module input: one all-gather in forward and one reduce-scatter in backward, torch's
count. The projections' input-gradient partials travel outside autograd, so a gradient hook
registered on the gathered tensor itself sees only the ordinary-autograd part (the shard
gradient returned to the caller is complete).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

from ccoverlap.runtime import checks, comm
from ccoverlap.runtime.blocks import gathered_shape, mm_blocks, mm_into, rank_blocks, strided_bmm
from ccoverlap.runtime.comm import Handle

__all__ = ["SharedGather", "gather_input", "gathered_linear", "shared_gather_of", "GATHER_OP"]

#: Name of the cross-rank check of the gather (decoded identically on every rank).
GATHER_OP = "sequence all-gather"
_ATTR = "_ccoverlap_shared_gather"


class SharedGather:
    """One gathered module input: layout, the gather buffer, precomputed rows, backward accumulator.

    ``full`` is the gathered tensor (natural layout); ``buf`` the rank-major gather buffer
    ``[P, *shard_shape]``; ``pre`` maps ``id(linear)`` to ``(weight, version, y)``, that
    projection's output with this rank's rows computed during the collectives; ``consumers``
    counts the projections that read ``full`` in forward, ``grad_sum`` sums their
    input-gradient partials (``[P, B, R, hidden]`` rank blocks,
    :func:`~ccoverlap.runtime.blocks.rank_blocks`) and ``pending`` is the reduce-scatter in
    flight once all of them have added theirs.
    """

    __slots__ = ("mesh", "group", "dim", "world", "rank", "shard_shape", "full", "buf", "pre", "consumers", "seen",
                 "grad_sum", "pending")  # fmt: skip

    def __init__(self, mesh: DeviceMesh, dim: int, shard_shape: torch.Size) -> None:
        self.mesh, self.group, self.dim = mesh, mesh.get_group(), dim
        self.world, self.rank = comm.group_size(self.group), comm.group_rank(self.group)
        self.shard_shape = shard_shape
        self.full: torch.Tensor | None = None
        self.buf: torch.Tensor | None = None
        self.pre: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        self.consumers = self.seen = 0
        self.grad_sum: torch.Tensor | None = None
        self.pending: tuple[Handle, torch.Tensor] | None = None

    # ------------------------------------------------------------------ forward
    def _blocks(self, t: torch.Tensor) -> torch.Tensor:
        """``[P, B, R, C]`` rank blocks of a gathered-size tensor ``t`` (:func:`~ccoverlap.runtime.blocks.rank_blocks`)."""
        return rank_blocks(t, self.dim, self.world)

    def precompute(self, linear: nn.Module, shard: torch.Tensor) -> None:
        """The output of ``linear(full)`` (no bias) with this rank's rows filled from the shard alone (``shard @ W_r.T``).

        The output is allocated in the gathered tensor's layout and this rank's rows are
        written where they lie; :meth:`assemble` fills in the other ranks' rows.
        """
        w = _weight(linear)
        local = _local_of(w)
        shape = gathered_shape(self.shard_shape, self.dim, self.world, local.shape[0])
        y = torch.empty(shape, dtype=shard.dtype, device=shard.device)
        mine = self._blocks(y)[self.rank]
        with torch.no_grad():
            mm_into(shard.reshape(mine.shape[:-1] + shard.shape[-1:]), local.t(), mine)
        self.pre[id(linear)] = (w, local._version, y)

    def take_precomputed(self, linear: nn.Module) -> torch.Tensor | None:
        """The output :meth:`precompute` began for ``linear``, if its weight is the same object, unchanged."""
        entry = self.pre.pop(id(linear), None)
        if entry is None:
            return None
        w, version, y = entry
        local = _local_of(w)
        return y if w is linear.weight and local._version == version else None

    def linear(self, pre: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``full @ weight.T + bias``: :meth:`assemble` on ``pre`` (a :meth:`precompute` output) or the whole GEMM."""
        assert self.full is not None  # set by the gather before any projection reads it
        return torch.nn.functional.linear(self.full, weight, bias) if pre is None else self.assemble(pre, weight, bias)

    def assemble(self, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``full @ weight.T + bias`` in ``y`` (this rank's rows precomputed): the other ranks' rows from their buffer blocks.

        Each rank's rows are multiplied straight into their place in ``y`` (no copy; the
        ranks before and after this one are one GEMM each when they lie contiguously).
        """
        p, r = self.world, self.rank
        y4 = self._blocks(y)
        assert self.buf is not None  # kept until every precomputed projection has run
        buf4 = self.buf.view(p, *y4.shape[1:3], self.buf.shape[-1])
        for lo, hi in ((0, r), (r + 1, p)):  # the other ranks' blocks: at most two ranges
            if hi > lo:
                mm_blocks(buf4[lo:hi], weight.t(), y4[lo:hi])
        return y.add_(bias) if bias is not None else y

    # ----------------------------------------------------------------- backward
    def add_partial(self, dy: torch.Tensor, weight: torch.Tensor) -> None:
        """``grad_sum += dy @ weight`` (``dy`` ``[..., n]`` natural layout, ``weight`` ``[n, hidden]``); the last consumer
        starts the reduce-scatter.

        The sum is kept rank-major (each rank's rows multiplied from where they lie in ``dy``),
        the layout the reduce-scatter sends, where batched GEMMs read strided rows without a
        copy (:func:`~ccoverlap.runtime.blocks.strided_bmm`); otherwise in ``dy``'s layout,
        re-laid once when the reduce-scatter starts.
        """
        dy4 = self._blocks(dy.contiguous())
        if self.grad_sum is None:
            shape = (*dy4.shape[:3], weight.shape[1])
            if dy4.is_contiguous() or strided_bmm(dy4):
                self.grad_sum = torch.empty(shape, dtype=dy.dtype, device=dy.device)
            else:
                natural = torch.empty(shape[1], shape[0], *shape[2:], dtype=dy.dtype, device=dy.device)
                self.grad_sum = natural.transpose(0, 1)
            mm_blocks(dy4, weight, self.grad_sum)
        else:
            mm_blocks(dy4, weight, self.grad_sum, accumulate=True)
        self.seen += 1
        if self.seen == self.consumers and self.pending is None:
            self.pending = self._start_reduce_scatter(self.grad_sum)
            self.grad_sum = None

    def _start_reduce_scatter(self, part4: torch.Tensor) -> tuple[Handle, torch.Tensor]:
        """Reduce-scatter ``[P, B, R, hidden]`` rank blocks of a partial sum of the gathered tensor (rank-major or natural)."""
        out = torch.empty(self.shard_shape, dtype=part4.dtype, device=part4.device)
        return comm.reduce_scatter_into(out, part4.contiguous(), group=self.group), out

    def finish(self, grad: torch.Tensor | None) -> torch.Tensor | None:
        """This rank's shard gradient: the projections' reduce-scatter plus ``grad`` (autograd's part).

        As torch's DTensor arithmetic: partial sums (the projections', a ``Partial`` gradient)
        are reduce-scattered; a ``Replicate`` DTensor gradient is added to them divided by
        the number of ranks (torch's ``Partial + Replicate``) or, without any partial sum,
        contributes this rank's slice; a plain gradient (``use_local_output=True``) its slice.
        """
        partial, replicated, direct = _split_grad(grad, self)
        if replicated is not None:
            if self.grad_sum is None and self.pending is None and partial is None:
                direct = _add(direct, _my_slice(replicated, self))
            else:
                partial = _add(partial, replicated / self.world)
        if partial is not None:
            partial = self._blocks(partial.contiguous())
            if self.pending is None:  # still one reduce-scatter: fold it into the projections' sum
                self.grad_sum = partial if self.grad_sum is None else self.grad_sum.add_(partial)
                partial = None
        if self.pending is None and self.grad_sum is not None:
            self.pending, self.grad_sum = self._start_reduce_scatter(self.grad_sum), None
        out: torch.Tensor | None = None
        if self.pending is not None:
            handle, out = self.pending
            handle.wait()
        if partial is not None:  # arrived after the projections' reduce-scatter had started
            assert out is not None  # a partial is kept apart only when the reduce-scatter was pending
            h, extra = self._start_reduce_scatter(partial)
            h.wait()
            out = out.add_(extra)
        if direct is not None:
            out = direct.clone() if out is None else out.add_(direct)
        self.grad_sum, self.pending, self.seen = None, None, 0
        self.pre.clear()  # rows of a projection that was never called
        self.buf = None
        return out


def _add(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else a + b


def _split_grad(
    grad: torch.Tensor | None, st: SharedGather
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``(partial, replicated, direct)`` local parts of autograd's gradient of the gathered tensor.

    ``partial``: a full-size partial sum (a ``Partial`` DTensor); ``replicated``: the local
    tensor of a ``Replicate`` DTensor; ``direct``: this rank's shard of a gradient that needs
    no communication (a plain tensor - torch's ``to_local()`` backward treats it as
    replicated, so its slice - or a DTensor sharded another way, redistributed).
    """
    if grad is None:
        return None, None, None
    if isinstance(grad, DTensor):
        pl = grad.placements[0]
        if pl.is_partial() and getattr(pl, "reduce_op", "sum") == "sum":
            return grad.to_local(), None, None
        if pl.is_replicate():
            return None, grad.to_local(), None
        return None, None, grad.redistribute(st.mesh, [Shard(st.dim)]).to_local()
    return None, None, _my_slice(grad, st)


def _my_slice(t: torch.Tensor, st: SharedGather) -> torch.Tensor:
    m = st.shard_shape[st.dim]
    return t.narrow(st.dim, st.rank * m, m)


class _GatherInput(torch.autograd.Function):
    """Forward: all-gather the shard into ``st.full`` (precomputing ``later`` meanwhile); backward: ``st.finish``."""

    @staticmethod
    def forward(
        ctx: Any, shard: torch.Tensor, st: SharedGather, as_dtensor: bool, later: Sequence[nn.Module]
    ) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        ctx.state = st
        d, p, shape = st.dim, st.world, st.shard_shape
        shard = shard.contiguous()
        st.buf = buf = torch.empty(p, *shape, dtype=shard.dtype, device=shard.device)
        handle = comm.all_gather_into(buf, shard, group=st.group)
        for linear in later:  # this rank's rows of the projections, while the gather is in flight
            st.precompute(linear, shard)
        handle.wait()
        full_shape = (*shape[:d], p * shape[d], *shape[d + 1 :])
        if d == 0:
            full = buf.view(full_shape)
        else:
            full = torch.empty(full_shape, dtype=shard.dtype, device=shard.device)
            full.view(*shape[:d], p, shape[d], *shape[d + 1 :]).copy_(buf.movedim(0, d))
        st.full = full
        if as_dtensor:
            spec = DTensorSpec(st.mesh, (Replicate(),), tensor_meta=TensorMeta(full.shape, full.stride(), full.dtype))
            return DTensor(full.view_as(full), spec, requires_grad=shard.requires_grad)
        return full.view_as(full)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[torch.Tensor | None, None, None, None]:
        return ctx.state.finish(grad), None, None, None


def _local_of(w: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor weight (no autograd link: a view for reading rows), else ``w``."""
    return w._local_tensor if isinstance(w, DTensor) else w


def _weight(linear: nn.Module) -> torch.Tensor:
    """``linear.weight``, which :func:`_can_precompute` has checked is a tensor."""
    w = linear.weight
    assert isinstance(w, torch.Tensor)
    return w


def _can_precompute(linear: nn.Module, shard: torch.Tensor) -> bool:
    w = getattr(linear, "weight", None)
    local = _local_of(w) if isinstance(w, torch.Tensor) else w
    return (isinstance(local, torch.Tensor) and local.dim() == 2 and local.shape[1] == shard.shape[-1]
            and local.dtype == shard.dtype and local.device == shard.device)  # fmt: skip


def gather_input(
    x: torch.Tensor, mesh: DeviceMesh, dim: int, *, use_local_output: bool = False,
    consumers: Sequence[nn.Module] = (), check_shapes: str | None = None,
) -> torch.Tensor:
    """All-gather a sequence-sharded module input once, for every projection that reads it.

    ``x``: this rank's shard (a plain tensor, or a DTensor whose placement is ``Shard(dim)``);
    ``dim``: the sharded dim (normalised here); ``consumers``: ``nn.Linear`` modules expected
    to read the result (their rows of this rank are computed while the check and the gather
    are in flight). Returns a ``Replicate()`` DTensor of the whole input
    (``use_local_output=False``, as torch's ``PrepareModuleInput``) or its local tensor,
    carrying the :class:`SharedGather` record that :func:`gathered_linear` uses. Collective;
    the shard's shape, dtype and ``dim`` are checked across ranks first (the same
    :class:`~ccoverlap.runtime.checks.ShapeMismatchError` on every rank).
    """
    local = x.to_local() if isinstance(x, DTensor) else x
    dim = dim % local.dim()
    pending = checks.agree_start(
        GATHER_OP, mesh.get_group(), {"x": local}, ints={"dim": dim},
        rules=[checks.same_int("dim", what="sequence dim"), checks.same_dtype("x"),
               checks.same_across_ranks("x", "sequence shard shape (the all-gather needs equal shards)")],
        mode=check_shapes,
    )  # fmt: skip
    st = SharedGather(mesh, dim, local.shape)
    speculate = st.world > 1 and not torch.is_autocast_enabled(local.device.type)  # autocast: torch's casts decide
    work = [c for c in consumers if _can_precompute(c, local)] if speculate else []
    if work:  # the first projection's rows hide the check ...
        st.precompute(work[0], local)
    pending.result()
    out = _GatherInput.apply(local, st, not use_local_output, work[1:])  # ... the others the gather
    setattr(out, _ATTR, st)
    return out


def shared_gather_of(x: object) -> SharedGather | None:
    """The :class:`SharedGather` record ``x`` carries when it came straight from :func:`gather_input`."""
    return getattr(x, _ATTR, None)


class _GatheredLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, st: SharedGather,
        pre: torch.Tensor | None,
    ) -> torch.Tensor:
        full = st.full
        y = st.linear(pre, weight, bias)
        st.consumers += 1
        ctx.state, ctx.has_bias = st, bias is not None
        ctx.save_for_backward(full, weight)
        return y

    @staticmethod
    def backward(
        ctx: Any, dy: torch.Tensor
    ) -> tuple[None, torch.Tensor | None, torch.Tensor | None, None, None]:
        full, weight = ctx.saved_tensors
        st = ctx.state
        n = weight.shape[0]
        dy = dy.contiguous()
        dy2 = dy.view(-1, n)
        if ctx.needs_input_grad[0]:
            st.add_partial(dy, weight)  # the last consumer starts the reduce-scatter here ...
        dw = dy2.t() @ full.reshape(-1, full.shape[-1]) if ctx.needs_input_grad[1] else None  # ... and this hides it
        db = dy2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return None, dw, db, None, None


def gathered_linear(
    x: torch.Tensor, linear: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None, st: SharedGather
) -> torch.Tensor:
    """``x_full @ weight.T + bias`` for projection ``linear`` on a gathered input ``x`` (record ``st``).

    ``weight`` ``[n, hidden]`` and ``bias`` ``[n]`` are this rank's column-parallel slices as
    local tensors (``linear``'s own parameters); the output is local. The input gradient
    goes to ``st`` (see the module doc); ``dW``/``db`` through autograd.
    """
    pre = st.take_precomputed(linear) if st.pre else None
    if not torch.is_grad_enabled():
        y = st.linear(pre, weight, bias)
    else:
        y = _GatheredLinear.apply(x, weight, bias, st, pre)
    if not st.pre:
        st.buf = None  # every precomputed projection has run: the gather buffer is no longer needed
    return y
