"""A 2-rank gloo training job started from an ``--emit`` directory (used by test_emit_job.py).

A small Llama-style model with torchtitan's module names is trained two ways, each from the
emitted settings: tensor-parallel with ccoverlap's ParallelStyles from ``tp_plan(DIR)``, and
FSDP2 with ``fully_shard_kwargs(DIR)`` and ``apply_fsdp_prefetch(DIR, blocks)``. Every rank
returns its losses; the test compares them with one process training the same model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, HIDDEN, LAYERS, BATCH, SEQ = 64, 32, 4, 64, 3, 4, 16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (self.wq(x), self.wk(x), self.wv(x)))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Tiny(nn.Module):
    """torchtitan's Llama names: tok_embeddings, layers.N.{attention,feed_forward}.*, norm, output."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[1]))

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def batches(steps: int):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(steps)]


def train(model, data, lr: float = 0.1, rows=slice(None)) -> list[float]:
    """SGD steps of next-token cross-entropy on ``data[rows]``; returns the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for t in data:
        t = t[rows]
        opt.zero_grad()
        logits = model(t[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), t[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def reference(steps: int) -> list[float]:
    torch.manual_seed(0)
    return train(Tiny(), batches(steps))


def run_rank(rank: int, world: int, tp_dir: str, fsdp_dir: str, steps: int) -> dict:
    """Train with the TP plan of ``tp_dir`` and with the FSDP2 settings of ``fsdp_dir``."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from ccoverlap.runtime.nccl import device_mesh_backend_override
    from ccoverlap.runtime.settings import apply_fsdp_prefetch, fully_shard_kwargs, tp_plan
    from ccoverlap.runtime.tp import load_full_state_dict

    torch.manual_seed(0)
    full = Tiny().state_dict()
    data = batches(steps)
    out: dict = {}
    tp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",),
                               backend_override=device_mesh_backend_override(tp_dir, ("tp",)))
    model = Tiny()
    plan = tp_plan(tp_dir)
    out["tp_schedules"] = {name: getattr(style, "schedule", None) for name, style in plan.items()}
    parallelize_module(model, tp_mesh, plan)
    load_full_state_dict(model, full)
    out["tp_losses"] = train(model, data)

    dp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    model = Tiny()
    model.load_state_dict(full)
    kw = fully_shard_kwargs(fsdp_dir)
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, **kw)
    fully_shard(model, mesh=dp_mesh)
    out["prefetch"] = apply_fsdp_prefetch(fsdp_dir, list(model.layers))
    out["fully_shard_kwargs"] = kw
    per = BATCH // world
    losses = train(model, data, rows=slice(rank * per, (rank + 1) * per))
    t = torch.tensor(losses)
    dist.all_reduce(t)
    out["fsdp_losses"] = (t / world).tolist()
    return out
