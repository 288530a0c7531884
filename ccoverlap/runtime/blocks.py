"""Rank blocks of a sequence-sharded tensor, and GEMMs that read and write them where they lie.

A tensor gathered (or to be reduce-scattered) along a dim ``d`` has one block of rows per
rank: rank ``j``'s block is ``t.narrow(d, j*m, m)``. For ``d == 0`` the blocks follow each
other in memory (the *rank-major* layout the collectives use); for a batch-first
``[b, s, h]`` tensor sharded along the sequence (``d == 1``) each block is ``b`` strided
pieces (the *natural* layout the model uses). :func:`rank_blocks` views either as
``[P, B, R, C]``: block ``j`` is ``[B, R, C]`` (``B`` = product of the dims before ``d``,
``R`` = the block's rows per batch entry, ``C`` the last dim), with batch stride and row
stride ``C`` - a shape every batched GEMM takes without a copy.

:func:`mm_into` and :func:`mm_blocks` multiply such blocks by a ``[C, n]`` matrix straight
into a block of the other layout (``torch.bmm`` with ``out=``: BLAS reads and writes strided
batches), so the overlapped ops never permute an activation between the collective's
layout and the model's. :func:`weight_grad` forms ``dy.T @ x`` over every row when the two
lie in different layouts: per batch entry and summed when the weight is small, else by
re-laying the narrower one (one copy of the smaller tensor).
Where a batched GEMM would copy strided operands itself (CPU in 16-bit types: oneDNN makes
them contiguous first) :func:`mm_into` multiplies contiguous rows and copies the result
instead, as an unbatched GEMM must.
"""

from __future__ import annotations

import math

import torch

__all__ = ["gathered_shape", "rank_blocks", "strided_bmm", "gemm_operand", "mm_into", "mm_blocks", "weight_grad"]


def gathered_shape(shard_shape: torch.Size, dim: int, p: int, n: int) -> tuple[int, ...]:
    """The shape of the all-gather of a ``shard_shape`` shard along ``dim`` over ``p`` ranks, with last dim ``n``."""
    return (*shard_shape[:dim], p * shard_shape[dim], *shard_shape[dim + 1 : -1], n)


def rank_blocks(t: torch.Tensor, dim: int, p: int) -> torch.Tensor:
    """``[P, B, R, C]`` view of ``t`` (contiguous; ``t.shape[dim]`` divisible by ``p``): index ``j`` is rank j's block.

    ``B = prod(t.shape[:dim])``, ``R = t.shape[dim] // p * prod(t.shape[dim+1:-1])``,
    ``C = t.shape[-1]``. The view is contiguous (rank-major) when ``B == 1``, e.g. ``dim == 0``.
    """
    shape = t.shape
    outer = math.prod(shape[:dim])
    rows = shape[dim] // p * math.prod(shape[dim + 1 : -1])
    return t.view(outer, p, rows, shape[-1]).transpose(0, 1)


def strided_bmm(t: torch.Tensor) -> bool:
    """Whether ``torch.bmm`` on ``t``'s device and dtype reads and writes strided batches without copying them.

    CUDA (cuBLAS strided-batched GEMM) and CPU float32/float64 (BLAS) do; CPU bfloat16/float16
    go through oneDNN or a reference kernel that first makes strided operands contiguous.
    """
    if t.device.type == "cuda":
        return True
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)


def gemm_operand(t4: torch.Tensor) -> torch.Tensor:
    """``[P, B, R, C]`` blocks an op multiplies more than once, as it should hold them: as they lie where batched
    GEMMs read strided blocks (:func:`strided_bmm`), else one rank-major copy made up front (each GEMM would
    otherwise copy its block again, and a weight gradient re-lay another operand)."""
    return t4 if strided_bmm(t4) else t4.contiguous()


def mm_into(a3: torch.Tensor, b: torch.Tensor, out3: torch.Tensor, accumulate: bool = False) -> None:
    """``out3 = a3 @ b`` (``+=`` with ``accumulate``) for one rank block: ``a3`` ``[B, R, k]``, ``b`` ``[k, n]``,
    ``out3`` ``[B, R, n]`` (any batch strides).

    One ``mm`` when both blocks are contiguous, else one ``bmm``/``baddbmm`` on the strided
    batches (no copy); where the batched GEMM would copy them itself (:func:`strided_bmm`),
    the strided operand is made contiguous here (input) or the result added in (output).
    """
    k, n = a3.shape[-1], b.shape[-1]
    if a3.is_contiguous() and out3.is_contiguous():
        _gemm(a3.view(-1, k), b, out3.view(-1, n), accumulate)
    elif strided_bmm(a3):
        bb = b.expand(a3.shape[0], k, n)
        if accumulate:
            out3.baddbmm_(a3, bb)
        else:
            torch.bmm(a3, bb, out=out3)
    elif out3.is_contiguous():
        _gemm(a3.reshape(-1, k), b, out3.view(-1, n), accumulate)
    else:
        res = torch.mm(a3.reshape(-1, k), b).view(out3.shape)
        out3.add_(res) if accumulate else out3.copy_(res)


def _gemm(a2: torch.Tensor, b: torch.Tensor, out2: torch.Tensor, accumulate: bool) -> None:
    if accumulate:
        out2.addmm_(a2, b)
    else:
        torch.mm(a2, b, out=out2)


def mm_blocks(a4: torch.Tensor, b: torch.Tensor, out4: torch.Tensor, accumulate: bool = False) -> None:
    """``out4[j] = a4[j] @ b`` (``+=`` with ``accumulate``) for every block of ``[P', B, R, *]`` views.

    One GEMM over every row when both lie in one layout (both rank-major or both natural),
    else one :func:`mm_into` per block.
    """
    for lay in (_rank_major, _natural):
        if lay(a4) and lay(out4):
            _gemm(_rows(a4), b, _rows(out4), accumulate)
            return
    for j in range(a4.shape[0]):
        mm_into(a4[j], b, out4[j], accumulate)


def _rank_major(t4: torch.Tensor) -> bool:
    return t4.is_contiguous()


def _natural(t4: torch.Tensor) -> bool:
    return t4.transpose(0, 1).is_contiguous()


def _rows(t4: torch.Tensor) -> torch.Tensor:
    """Every row of a rank-major or natural ``[P, B, R, C]`` view as one ``[P*B*R, C]`` matrix (a view)."""
    c = t4.shape[-1]
    return t4.view(-1, c) if _rank_major(t4) else t4.transpose(0, 1).reshape(-1, c)


def weight_grad(dy4: torch.Tensor, x4: torch.Tensor) -> torch.Tensor:
    """``dy.T @ x`` summed over every row (``[n, k]``) for blocks ``dy4`` ``[P, B, R, n]`` and ``x4`` ``[P, B, R, k]``.

    The sum runs over the same rows of both in any order, so one GEMM serves when both lie
    in one layout. Otherwise, where batched GEMMs read strided blocks as they lie
    (:func:`strided_bmm`) and the weight is smaller than a block's rows per batch entry
    (``max(n, k) < R``), the blocks are multiplied per batch entry into ``[B, n, k]`` and
    summed (``B*n*k`` extra elements); else the narrower of the two is copied into the
    other's layout (``P*B*R*min(n, k)`` elements; anything neither rank-major nor natural
    is made rank-major first).
    """
    for lay in (_rank_major, _natural):
        if lay(dy4) and lay(x4):
            return _rows(dy4).t() @ _rows(x4)
    if strided_bmm(dy4) and max(dy4.shape[-1], x4.shape[-1]) < dy4.shape[2]:
        acc = torch.bmm(dy4[0].transpose(1, 2), x4[0])
        for j in range(1, dy4.shape[0]):
            acc.baddbmm_(dy4[j].transpose(1, 2), x4[j])
        return acc.sum(0)
    narrow_dy = dy4.shape[-1] <= x4.shape[-1]
    wide = x4 if narrow_dy else dy4
    if not (_rank_major(wide) or _natural(wide)):
        wide = wide.contiguous()
    narrow = _like(dy4 if narrow_dy else x4, wide)
    dy4, x4 = (narrow, wide) if narrow_dy else (wide, narrow)
    return _rows(dy4).t() @ _rows(x4)


def _like(t4: torch.Tensor, ref4: torch.Tensor) -> torch.Tensor:
    """``t4`` copied into ``ref4``'s layout: rank-major if ``ref4`` is, else natural."""
    if _rank_major(ref4):
        return t4.contiguous()
    return t4.transpose(0, 1).contiguous().transpose(0, 1)
