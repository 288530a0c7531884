"""A small Llama-style model and torchtitan's tensor + sequence parallel plan for it.

The reference workload of the plan-level benchmark (``ccoverlap bench --plan``,
``benchmarks/bench_runtime_plan.py``) and of the tests that compare ccoverlap's
ParallelStyles with torch's: one plan dict, built either with torch's style classes or with
:mod:`ccoverlap.runtime.tp`'s, applied with ``parallelize_module``.

* :class:`Block`: RMSNorm, causal attention (``wq``/``wk``/``wv``/``wo``), RMSNorm, SwiGLU
  feed-forward (``w1``/``w2``/``w3``), both residual; ``[b, s, dim]`` batch-first.
* :class:`Llama`: token embedding, ``layers`` blocks, final RMSNorm, output head.
* :func:`block_plan` / :func:`model_plan`: torchtitan's plan (``SequenceParallel`` norms,
  ``PrepareModuleInput(Shard(1) -> Replicate())`` on attention and feed-forward, colwise
  ``wq``/``wk``/``wv``/``w1``/``w3``, rowwise ``wo``/``w2`` back to ``Shard(1)``; embedding
  rowwise to ``Shard(1)``; the head colwise from ``Shard(1)`` with a DTensor output for
  loss parallelism when ``loss_parallel=True``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel.style import ParallelStyle

__all__ = ["RMSNorm", "Attention", "FeedForward", "Block", "Llama", "block_plan", "model_plan", "style_classes"]


class RMSNorm(nn.Module):
    """Root-mean-square norm (Llama), written with plain ops so that DTensor can shard it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x / rms(x) * weight`` over the last dim."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal multi-head attention; the heads per rank follow from the (sharded) ``wq`` output width."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, dim] -> [b, s, dim]``."""
        b, s = x.shape[0], x.shape[1]
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (self.wq(x), self.wk(x), self.wv(x)))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, dim] -> [b, s, dim]``."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm Llama block: ``h = x + attention(norm(x))``, ``out = h + feed_forward(norm(h))``."""

    def __init__(self, dim: int, heads: int, ffn_hidden: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, dim] -> [b, s, dim]``."""
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Embedding, ``layers`` blocks, final norm, output head: tokens ``[b, s]`` -> logits ``[b, s, vocab]``."""

    def __init__(self, vocab: int, dim: int, heads: int, ffn_hidden: int, layers: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, heads, ffn_hidden) for _ in range(layers)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[1]))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[b, s]`` int64 -> ``[b, s, vocab]``."""
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


#: A ParallelStyle class: called with the style's keyword arguments.
StyleClass = Callable[..., "ParallelStyle"]


def style_classes(styles: str) -> tuple[StyleClass, StyleClass, StyleClass]:
    """``(ColwiseParallel, RowwiseParallel, PrepareModuleInput)`` of ``"torch"`` or ``"ccoverlap"``."""
    if styles == "torch":
        from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

        return ColwiseParallel, RowwiseParallel, PrepareModuleInput
    if styles == "ccoverlap":
        from ccoverlap.runtime import tp

        return tp.ColwiseParallel, tp.RowwiseParallel, tp.PrepareModuleInput
    raise ValueError(f"styles must be 'torch' or 'ccoverlap', got {styles!r}")


def block_plan(styles: str, prefix: str = "", **style_kwargs: str) -> dict[str, ParallelStyle]:
    """torchtitan's TP + SP plan for one :class:`Block` (keys prefixed by ``prefix``).

    ``style_kwargs`` (e.g. ``schedule="serial"``) go to ccoverlap's linear styles only.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import SequenceParallel

    colwise, rowwise, prepare = style_classes(styles)
    kw = style_kwargs if styles == "ccoverlap" else {}
    return {
        prefix + "attention_norm": SequenceParallel(),
        prefix + "attention": prepare(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        prefix + "attention.wq": colwise(**kw),
        prefix + "attention.wk": colwise(**kw),
        prefix + "attention.wv": colwise(**kw),
        prefix + "attention.wo": rowwise(output_layouts=Shard(1), **kw),
        prefix + "ffn_norm": SequenceParallel(),
        prefix + "feed_forward": prepare(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        prefix + "feed_forward.w1": colwise(**kw),
        prefix + "feed_forward.w2": rowwise(output_layouts=Shard(1), **kw),
        prefix + "feed_forward.w3": colwise(**kw),
    }


def model_plan(
    model: Llama, styles: str, *, loss_parallel: bool = True, **style_kwargs: str
) -> dict[str, ParallelStyle]:
    """torchtitan's plan for :class:`Llama`: every block's plan plus embedding, final norm and head.

    With ``loss_parallel`` the head's output stays a ``Shard(-1)`` DTensor (vocab-sharded
    logits) for ``torch.distributed.tensor.parallel.loss_parallel``; otherwise it is
    replicated.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import SequenceParallel

    colwise, rowwise, _prepare = style_classes(styles)
    kw = style_kwargs if styles == "ccoverlap" else {}
    plan = {
        "tok_embeddings": rowwise(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": colwise(input_layouts=Shard(1), output_layouts=Shard(-1) if loss_parallel else Replicate(),
                          use_local_output=not loss_parallel, **kw),
    }  # fmt: skip
    for i in range(len(model.layers)):
        plan.update(block_plan(styles, f"layers.{i}.", **style_kwargs))
    return plan
