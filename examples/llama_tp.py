"""A small Llama-style model parallelized with torch's tensor parallelism, then with ccoverlap's.

The two plans differ only in where the style classes come from::

    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, PrepareModuleInput
    # becomes
    from ccoverlap.runtime.tp import ColwiseParallel, RowwiseParallel, PrepareModuleInput

Run (gloo on CPU, no torchrun needed; prints the losses of both and of one process)::

    python examples/llama_tp.py --nproc 2 --steps 10

Both runs start from the same full weights (a single-process model built with one seed,
loaded with ``load_full_state_dict``), train 10 SGD steps on the same tokens, and must
report the same losses as each other and as the single-process model.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Llama), written with plain ops so DTensor can shard it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal multi-head attention; the head count per rank follows from the sharded wq."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (self.wq(x), self.wk(x), self.wv(x)))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama(nn.Module):
    """Embedding, ``layers`` blocks, final norm, output head; input tokens ``[b, s]``, logits ``[b, s, vocab]``."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, heads, hidden) for _ in range(layers)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[1]))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def tp_plan(model: TinyLlama, styles: str) -> dict:
    """torch's sequence-parallel TP plan (as in torchtitan); ``styles`` picks torch's or ccoverlap's classes."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import SequenceParallel

    if styles == "torch":
        from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel
    else:
        from ccoverlap.runtime.tp import ColwiseParallel, PrepareModuleInput, RowwiseParallel
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(len(model.layers)):
        p = f"layers.{i}."
        plan.update({
            p + "attention_norm": SequenceParallel(),
            p + "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            p + "attention.wq": ColwiseParallel(),
            p + "attention.wk": ColwiseParallel(),
            p + "attention.wv": ColwiseParallel(),
            p + "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            p + "ffn_norm": SequenceParallel(),
            p + "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            p + "feed_forward.w1": ColwiseParallel(),
            p + "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            p + "feed_forward.w3": ColwiseParallel(),
        })  # fmt: skip
    return plan


def data(steps: int, batch: int = 2, seq: int = 16, vocab: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed (input, target) token batches ``[b, s]`` for ``steps`` steps."""
    g = torch.Generator().manual_seed(123)
    out = []
    for _ in range(steps):
        t = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        out.append((t[:, :-1], t[:, 1:]))
    return out


def train(model: nn.Module, steps: int, lr: float = 0.1) -> list[float]:
    """``steps`` SGD steps of next-token cross-entropy; returns the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for tokens, target in data(steps):
        opt.zero_grad()
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses


def reference(steps: int) -> list[float]:
    """Losses of the single-process model (seed 0)."""
    torch.manual_seed(0)
    return train(TinyLlama(), steps)


def run_rank(rank: int, world: int, steps: int, styles_list=("torch", "ccoverlap"), schedule: str = "auto") -> dict:
    """On one rank: parallelize the seed-0 model with each style set, train, return losses (+ state checks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from ccoverlap.runtime.tp import full_state_dict, load_full_state_dict

    torch.manual_seed(0)
    full = TinyLlama().state_dict()
    mesh = init_device_mesh("cpu", (world,))
    out: dict = {}
    models = {}
    for styles in styles_list:
        torch.manual_seed(1)  # different init on purpose: the full state_dict must overwrite it
        model = TinyLlama()
        plan = tp_plan(model, styles)
        if styles == "ccoverlap" and schedule != "auto":
            for style in plan.values():
                if hasattr(style, "schedule"):
                    style.schedule = schedule
        parallelize_module(model, mesh, plan)
        load_full_state_dict(model, full)
        models[styles] = model
        out[styles] = train(model, steps)
    if "torch" in models and "ccoverlap" in models:
        # the overlapped model's state_dict is torch TP's: it loads straight into the torch model
        sd = models["ccoverlap"].state_dict()
        models["torch"].load_state_dict(sd)
        got = full_state_dict(models["torch"])
        want = full_state_dict(models["ccoverlap"])
        out["state_dict_roundtrip_max_err"] = max(float((got[k] - want[k]).abs().max()) for k in want)
        out["state_dict_keys_equal"] = sorted(sd) == sorted(models["torch"].state_dict())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    from ccoverlap.runtime.launch import spawn

    res = spawn(run_rank, args.nproc, (args.steps,), backend="gloo", timeout_s=600, threads=1)[0]
    ref = reference(args.steps)
    print(f"{'step':>4} {'single process':>15} {'torch TP':>12} {'ccoverlap TP':>13}")
    for i, (r, t, c) in enumerate(zip(ref, res["torch"], res["ccoverlap"])):
        print(f"{i:>4} {r:>15.6f} {t:>12.6f} {c:>13.6f}")
    worst = max(abs(t - c) for t, c in zip(res["torch"], res["ccoverlap"]))
    print(f"max |torch TP - ccoverlap TP| loss difference: {worst:.2e}; state_dict round trip max error "
          f"{res['state_dict_roundtrip_max_err']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
