"""benchmarks/gpu_layer_trace.py on CPU: the layer computes a Llama decoder layer (checked
against a plain float64 reference with grouped-query attention written out), its trace holds
the profiler steps and every layer.* label, and bad arguments are one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from bench_scripts import BENCH, load_script

torch = pytest.importorskip("torch")
lt = load_script("gpu_layer_trace")
DIMS = {"hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 96}


def reference(x, w, d):
    """The layer, written out: RMSNorm, QKV, causal softmax attention with each KV head repeated
    for its query heads, output projection, RMSNorm, SwiGLU MLP, two residuals."""
    def norm(t, g):
        return t / torch.sqrt((t * t).mean(-1, keepdim=True) + 1e-5) * g

    b, s, _ = x.shape
    nh, nkv, hd = d["heads"], d["kv_heads"], d["head_dim"]
    qkv = norm(x, w["attn_norm"]) @ w["wqkv"].T
    q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q = q.view(b, s, nh, hd).transpose(1, 2)
    k = k.view(b, s, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, dim=1)
    v = v.view(b, s, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, nh * hd)
    h = x + o @ w["wo"].T
    gate, up = (norm(h, w["mlp_norm"]) @ w["w13"].T).chunk(2, dim=-1)
    return h + (torch.nn.functional.silu(gate) * up) @ w["w2"].T


def test_the_layer_is_a_llama_decoder_layer():
    w = lt.build_layer(torch, DIMS, torch.device("cpu"), torch.float64)
    for name in ("attn_norm", "mlp_norm"):  # norms away from 1, so that their weights count
        w[name].data.uniform_(0.5, 1.5)
    x = torch.randn(2, 12, DIMS["hidden"], dtype=torch.float64)
    got = lt.layer_forward(torch, x, w, DIMS)
    # the layer takes its norms in fp32 (as Llama does): agreement to fp32 rounding
    assert torch.allclose(got, reference(x, {k: t.detach() for k, t in w.items()}, DIMS), rtol=1e-5, atol=1e-5)


def test_trace_holds_the_steps_and_every_label(tmp_path):
    assert lt.main(["--out", str(tmp_path), "--device", "cpu", "--small", "--steps", "2"]) == 0
    events = json.loads((tmp_path / "trace" / "rank-0.json").read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= names
    assert {f"layer.{op}" for op in ("attn_norm", "qkv", "attention", "out_proj", "mlp_norm", "gate_up",
                                     "down")} <= names
    meta = json.loads((tmp_path / "layer.json").read_text())
    assert meta["layer"] == "small" and meta["steps"] == 2 and len(meta["step_wall_s"]) == 2


@pytest.mark.parametrize("args", [["--steps", "0"], ["--seq", "-1"]])
def test_bad_arguments_are_one_line(tmp_path, args):
    r = subprocess.run([sys.executable, str(BENCH / "gpu_layer_trace.py"), "--out", str(tmp_path), "--device", "cpu",
                        "--small", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
