"""Profile one Llama-style decoder layer, forward and backward, on one device, and write the
torch.profiler (Kineto) trace that ``ccoverlap analyze`` and ``ccoverlap replay`` read.

The layer is Llama-3-8B's (hidden 4096, 32 query heads, 8 key/value heads of 128, SwiGLU MLP of
14336, RMSNorm) in bf16, written with plain torch ops so every GEMM is one ``aten::mm`` /
``aten::linear`` whose shapes the trace records (``record_shapes``). Each sub-step runs under a
``record_function`` label (``layer.attn_norm``, ``layer.qkv``, ``layer.attention``,
``layer.out_proj``, ``layer.mlp_norm``, ``layer.gate_up``, ``layer.down``) so a kernel can be
attributed to the layer op that launched it; ``benchmarks/layer_vs_sim.py`` compares the
kernels with the cost model's prediction of the same ops.

    python benchmarks/gpu_layer_trace.py --out DIR                     # CUDA: seq 4096, batch 1
    python benchmarks/gpu_layer_trace.py --out DIR --device cpu --small  # any machine, tiny layer

Writes DIR/trace/rank-0.json (the trace, ``ProfilerStep#N`` per step) and DIR/layer.json (the
layer's dimensions, device, dtype, torch version and the measured step times).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

LLAMA3_8B = {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "ffn": 14336}
SMALL = {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 512}


def build_layer(torch, dims: dict, device, dtype):
    """The layer's weights (nn.Linear layout: [out, in]) as leaf tensors that need gradients."""
    g = torch.Generator(device="cpu").manual_seed(0)
    h, hd = dims["hidden"], dims["head_dim"]
    q_out, kv_out = dims["heads"] * hd, dims["kv_heads"] * hd

    def weight(out_f: int, in_f: int):
        w = torch.randn(out_f, in_f, generator=g) * (in_f ** -0.5)
        return w.to(device=device, dtype=dtype).requires_grad_(True)

    return {"wqkv": weight(q_out + 2 * kv_out, h), "wo": weight(h, q_out),
            "w13": weight(2 * dims["ffn"], h), "w2": weight(h, dims["ffn"]),
            "attn_norm": torch.ones(h, device=device, dtype=dtype, requires_grad=True),
            "mlp_norm": torch.ones(h, device=device, dtype=dtype, requires_grad=True)}


def rms_norm(torch, x, weight, eps: float = 1e-5):
    """RMSNorm in fp32, as Llama's reference does."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def layer_forward(torch, x, w: dict, dims: dict):
    """One pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(.)). ``x`` is [B, S, H]."""
    from torch.nn import functional as F
    from torch.profiler import record_function

    b, s, _ = x.shape
    hd, nh, nkv = dims["head_dim"], dims["heads"], dims["kv_heads"]
    with record_function("layer.attn_norm"):
        hn = rms_norm(torch, x, w["attn_norm"])
    with record_function("layer.qkv"):
        qkv = F.linear(hn, w["wqkv"])
    with record_function("layer.attention"):
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(b, s, nh, hd).transpose(1, 2)
        k = k.view(b, s, nkv, hd).transpose(1, 2)
        v = v.view(b, s, nkv, hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o = o.transpose(1, 2).reshape(b, s, nh * hd)
    with record_function("layer.out_proj"):
        x = x + F.linear(o, w["wo"])
    with record_function("layer.mlp_norm"):
        hn = rms_norm(torch, x, w["mlp_norm"])
    with record_function("layer.gate_up"):
        gate, up = F.linear(hn, w["w13"]).chunk(2, dim=-1)
        act = F.silu(gate) * up
    with record_function("layer.down"):
        return x + F.linear(act, w["w2"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for trace/rank-0.json and layer.json")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--small", action="store_true", help="a tiny layer (hidden 256) for a dry run")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 4096; 128 with --small)")
    ap.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps after warm-up (default 3)")
    a = ap.parse_args(argv)
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_layer_trace: --device cuda needs a CUDA build of torch and a GPU (use --device cpu --small)",
              file=sys.stderr)
        return 2
    if a.steps < 1 or a.batch < 1 or (a.seq is not None and a.seq < 1):
        print("gpu_layer_trace: --steps, --batch and --seq must be at least 1", file=sys.stderr)
        return 2
    dims = SMALL if a.small else LLAMA3_8B
    seq = a.seq or (128 if a.small else 4096)
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    w = build_layer(torch, dims, dev, dtype)
    x = torch.randn(a.batch, seq, dims["hidden"], device=dev, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step() -> None:
        y = layer_forward(torch, x, w, dims)
        y.backward(dy)
        for t in (x, *w.values()):
            t.grad = None

    for _ in range(3):  # warm-up: kernel selection, allocator
        step()
    sync()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    out = Path(a.out)
    (out / "trace").mkdir(parents=True, exist_ok=True)
    times = []
    sched = torch.profiler.schedule(wait=0, warmup=1, active=a.steps, repeat=1)
    with torch.profiler.profile(activities=acts, schedule=sched, record_shapes=True) as prof:
        for _ in range(1 + a.steps):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
            prof.step()
    prof.export_chrome_trace(str(out / "trace" / "rank-0.json"))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    meta = {"layer": "llama-3-8b" if not a.small else "small", **dims, "seq": seq, "batch": a.batch,
            "dtype": str(dtype).removeprefix("torch."), "device": name, "torch": torch.__version__,
            "steps": a.steps, "step_wall_s": times[1:]}
    (out / "layer.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out / 'trace' / 'rank-0.json'}: {a.steps} steps of a {meta['layer']} layer on {name}, "
          f"median wall {sorted(times[1:])[len(times[1:]) // 2] * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
