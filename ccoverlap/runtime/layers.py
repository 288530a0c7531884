"""Internal: process-group tensor-parallel layers on the overlapped ops (Megatron-style TP + SP).

The public layer API is :mod:`ccoverlap.runtime.tp` (torch's tensor-parallel styles for
``parallelize_module``, on a DeviceMesh). This module is the DTensor-free reference next to
it: plain ``nn.Module`` layers on a process group that call the same ops
(:func:`~ccoverlap.runtime.ops.all_gather_matmul`, :func:`~ccoverlap.runtime.ops.matmul_reduce_scatter`)
with the same cross-rank checks and the same ``schedule=`` check
(:func:`~ccoverlap.runtime.ops.check_schedule`); the tests compare a parallel block built of
them with one process. Its names are not re-exported by :mod:`ccoverlap.runtime` any more
(importing them from there still works, with a ``DeprecationWarning``).

Activations outside the TP region are sequence-parallel: dim 0 (the sequence) is sharded
over the group. :class:`ColumnParallelLinear` all-gathers them and multiplies by its slice of
output features (:func:`~ccoverlap.runtime.ops.all_gather_matmul`);
:class:`RowParallelLinear` multiplies by its slice of input features and reduce-scatters the
sum back to sequence shards (:func:`~ccoverlap.runtime.ops.matmul_reduce_scatter`). Both
take ``schedule=`` (any of :data:`~ccoverlap.runtime.ops.ALL_SCHEDULES`).

Parameters that are replicated on every rank but only see this rank's sequence shard
(LayerNorm weights, the row-parallel bias) get partial gradients; they are flagged with
``param.sequence_parallel = True`` and :func:`allreduce_sequence_parallel_grads` sums their
gradients over the group (call it after ``backward()``, before the optimizer step).
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ccoverlap.errors import ConfigError
from ccoverlap.runtime import comm
from ccoverlap.runtime.ops import all_gather_matmul, check_schedule, matmul_reduce_scatter

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TransformerBlock",
    "ParallelTransformerBlock",
    "allreduce_sequence_parallel_grads",
]


def _divide(total: int, p: int, what: str) -> int:
    if total % p:
        raise ConfigError(f"{what}={total} is not divisible by the tensor-parallel size {p}")
    return total // p


class ColumnParallelLinear(nn.Module):
    """``y = AllGather_0(x_shard) @ W_r.T + b_r``: sequence-parallel input, output features split.

    ``in_features``/``out_features`` are the full (unsharded) sizes; this rank holds
    ``W_r = W[r*N/P:(r+1)*N/P]`` (``out_features`` must divide by P). Input
    ``[s/P, ..., in_features]``, output ``[s, ..., out_features/P]``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group: ProcessGroup | None = None,
        *,
        bias: bool = True,
        schedule: str = "auto",
        comm_engine: str = "sm",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.schedule = schedule
        check_schedule(schedule)
        self.group = group
        self.world_size = comm.group_size(group)
        self.rank = comm.group_rank(group)
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = _divide(out_features, self.world_size, "out_features")
        self.comm_engine = comm_engine
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(self.out_per_rank, device=device, dtype=dtype)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    @torch.no_grad()
    def load_full(self, weight: torch.Tensor, bias: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> None:
        """Copy this rank's slice of a full ``[out_features, in_features]`` weight (and bias).

        ``rows`` (optional index tensor) picks the rows instead of the contiguous slice.
        """
        if rows is None:
            rows = torch.arange(self.rank * self.out_per_rank, (self.rank + 1) * self.out_per_rank)
        self.weight.copy_(weight[rows])
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias[rows])

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        """``[s/P, ..., in] -> [s, ..., out/P]``: all-gather + GEMM under ``self.schedule``, plus the bias slice."""
        y = all_gather_matmul(x_shard, self.weight, self.group, schedule=self.schedule, comm_engine=self.comm_engine)
        return y + self.bias if self.bias is not None else y


class RowParallelLinear(nn.Module):
    """``y_shard = ReduceScatter_0(x @ W_r.T) + b``: input features split, sequence-parallel output.

    This rank holds ``W_r = W[:, r*K/P:(r+1)*K/P]``. Input ``[s, ..., in_features/P]``, output
    ``[s/P, ..., out_features]``. The bias is replicated and added after the reduce-scatter
    (flagged ``sequence_parallel``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group: ProcessGroup | None = None,
        *,
        bias: bool = True,
        schedule: str = "auto",
        comm_engine: str = "sm",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.schedule = schedule
        check_schedule(schedule)
        self.group = group
        self.world_size = comm.group_size(group)
        self.rank = comm.group_rank(group)
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = _divide(in_features, self.world_size, "in_features")
        self.comm_engine = comm_engine
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        if self.bias is not None:
            _flag_sequence_parallel(self.bias)

    @torch.no_grad()
    def load_full(self, weight: torch.Tensor, bias: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> None:
        """Copy this rank's column slice of a full ``[out_features, in_features]`` weight (and the bias)."""
        if cols is None:
            cols = torch.arange(self.rank * self.in_per_rank, (self.rank + 1) * self.in_per_rank)
        self.weight.copy_(weight[:, cols])
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[s, ..., in/P] -> [s/P, ..., out]``: GEMM + reduce-scatter under ``self.schedule``, plus the bias."""
        y = matmul_reduce_scatter(x, self.weight, self.group, schedule=self.schedule, comm_engine=self.comm_engine)
        return y + self.bias if self.bias is not None else y


class TransformerBlock(nn.Module):
    """Single-process pre-LayerNorm transformer block (causal attention + GELU MLP), ``[s, b, h]``.

    The reference :class:`ParallelTransformerBlock` is checked against.
    """

    def __init__(
        self, hidden: int, heads: int, ffn_hidden: int, *, device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if hidden % heads:
            raise ConfigError(f"hidden={hidden} is not divisible by heads={heads}")
        self.hidden, self.heads, self.ffn_hidden = hidden, heads, ffn_hidden
        self.ln1 = nn.LayerNorm(hidden, device=device, dtype=dtype)
        self.qkv = nn.Linear(hidden, 3 * hidden, device=device, dtype=dtype)  # rows: [q (all heads); k; v]
        self.proj = nn.Linear(hidden, hidden, device=device, dtype=dtype)
        self.ln2 = nn.LayerNorm(hidden, device=device, dtype=dtype)
        self.fc1 = nn.Linear(hidden, ffn_hidden, device=device, dtype=dtype)
        self.fc2 = nn.Linear(ffn_hidden, hidden, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[s, b, h] -> [s, b, h]``: x + attn(ln1(x)), then + mlp(ln2(.))."""
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.proj(_attention(q, k, v, self.heads))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Causal multi-head attention on ``[s, b, heads*d]`` tensors; returns ``[s, b, heads*d]``."""
    s, b, hd = q.shape
    d = hd // heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(s, b, heads, d).permute(1, 2, 0, 3)  # [b, heads, s, d]

    o = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    return o.permute(2, 0, 1, 3).reshape(s, b, hd)


class ParallelTransformerBlock(nn.Module):
    """:class:`TransformerBlock` with tensor + sequence parallelism over ``group``.

    Input and output are sequence shards ``[s/P, b, h]``. Attention heads and the MLP hidden
    units are split over the ranks: QKV and fc1 are :class:`ColumnParallelLinear` (all-gather
    + GEMM), proj and fc2 are :class:`RowParallelLinear` (GEMM + reduce-scatter).
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        ffn_hidden: int,
        group: ProcessGroup | None = None,
        *,
        schedule: str = "auto",
        comm_engine: str = "sm",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_schedule(schedule)
        p = comm.group_size(group)
        if hidden % heads:
            raise ConfigError(f"hidden={hidden} is not divisible by heads={heads}")
        self.heads_per_rank = _divide(heads, p, "heads")
        _divide(ffn_hidden, p, "ffn_hidden")
        self.hidden, self.heads, self.ffn_hidden, self.group = hidden, heads, ffn_hidden, group
        col = partial(ColumnParallelLinear, group=group, schedule=schedule, comm_engine=comm_engine, device=device,
                      dtype=dtype)  # fmt: skip
        row = partial(RowParallelLinear, group=group, schedule=schedule, comm_engine=comm_engine, device=device,
                      dtype=dtype)  # fmt: skip
        self.ln1 = nn.LayerNorm(hidden, device=device, dtype=dtype)
        self.qkv = col(hidden, 3 * hidden)
        self.proj = row(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, device=device, dtype=dtype)
        self.fc1 = col(hidden, ffn_hidden)
        self.fc2 = row(ffn_hidden, hidden)
        for ln in (self.ln1, self.ln2):
            for prm in ln.parameters():
                _flag_sequence_parallel(prm)

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        """``[s/P, b, h] -> [s/P, b, h]``; the same math as :class:`TransformerBlock` on the full sequence."""
        q, k, v = self.qkv(self.ln1(x_shard)).chunk(3, dim=-1)  # [s, b, h/P] each
        x = x_shard + self.proj(_attention(q, k, v, self.heads_per_rank))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    @classmethod
    def from_reference(
        cls, ref: TransformerBlock, group: ProcessGroup | None = None, **kwargs: str
    ) -> ParallelTransformerBlock:
        """Shard a :class:`TransformerBlock`'s weights onto this rank (same math, same init)."""
        p0 = next(ref.parameters())
        blk = cls(ref.hidden, ref.heads, ref.ffn_hidden, group, device=p0.device, dtype=p0.dtype, **kwargs)
        r, h = comm.group_rank(group), ref.hidden
        per = h // comm.group_size(group)
        heads_rows = torch.arange(r * per, (r + 1) * per)
        qkv_rows = torch.cat([heads_rows, heads_rows + h, heads_rows + 2 * h])  # this rank's q, k, v heads
        with torch.no_grad():
            blk.ln1.load_state_dict(ref.ln1.state_dict())
            blk.ln2.load_state_dict(ref.ln2.state_dict())
        blk.qkv.load_full(ref.qkv.weight, ref.qkv.bias, rows=qkv_rows)
        blk.proj.load_full(ref.proj.weight, ref.proj.bias, cols=heads_rows)
        blk.fc1.load_full(ref.fc1.weight, ref.fc1.bias)
        blk.fc2.load_full(ref.fc2.weight, ref.fc2.bias)
        return blk


def _flag_sequence_parallel(param: nn.Parameter) -> None:
    """Mark ``param`` as replicated but fed only this rank's sequence shard (summed by the function below)."""
    setattr(param, "sequence_parallel", True)  # noqa: B010 - a flag on torch's Parameter, which declares no such field


def allreduce_sequence_parallel_grads(module: nn.Module, group: ProcessGroup | None = None) -> int:
    """Sum the gradients of parameters flagged ``sequence_parallel`` over ``group`` (in place).

    Such parameters are replicated but each rank only back-propagated its sequence shard
    (Megatron SP). Returns the number of parameters reduced. Collective: call on every rank.
    """
    grads = [p.grad for p in module.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not grads or comm.group_size(group) == 1:
        return len(grads)
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat, group=group, async_op=False)
    off = 0
    for g in grads:
        g.copy_(flat[off : off + g.numel()].view_as(g))
        off += g.numel()
    return len(grads)
