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

import torch
import torch.nn.functional as F
from torch import nn

from ccoverlap.runtime.llama import Llama


def TinyLlama() -> Llama:  # noqa: N802 (a model constructor)
    """The Llama-style model of this example: vocab 64, width 32, 4 heads, SwiGLU 64, 2 blocks.

    Any ``nn.Module`` works the same way; this one is torchtitan's Llama block structure
    (``attention.wq/wk/wv/wo``, ``feed_forward.w1/w2/w3``, RMSNorms), so the plan below is
    torchtitan's.
    """
    return Llama(vocab=64, dim=32, heads=4, ffn_hidden=64, layers=2)


def tp_plan(model: Llama, styles: str) -> dict:
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
