"""Build the kernel measurement corpus (``ccoverlap/data/corpus/{gemm,attention,memory}``).

Every table is a CSV of measured kernel times beside a YAML naming its source; see
:mod:`ccoverlap.corpus.tables`. Sources read here:

* microsoft/vidur ``data/profiling/compute/{a100,a40,h100}/<org>/<model>/mlp.csv`` (MIT): per-op
  CUDA kernel time of one decoder block of an inference engine (sarathi), fp16, summed over
  the kernels each op launched (``RecordFunctionTracer``: the durations of the kernels correlated
  to the CUDA runtime calls inside the op's ``record_function`` range, median of 20 steps, ms).
  The four linear layers are one cuBLAS GEMM each (``F.linear`` of ``[tokens, k]`` by the
  ``[n, k]`` weight shard of a TP rank; no bias for these models except Phi-2's); the
  element-wise ops are one kernel each: vLLM's fused ``RMSNorm``, ``rotary_embedding`` (in place
  on Q and K), ``SiluAndMul`` (GELU for Phi-2) and the residual ``add`` (two adds for Phi-2,
  whose block has no second norm: ``attn + ffn + residual``). vLLM's norm, rotary and activation
  kernels launch one thread block per token (``pattern: rowwise``; the norm reads its row twice,
  once for the sum of squares and again to normalise it: ``rowwise-twopass``); the add is
  PyTorch's vectorised element-wise kernel (``pattern: stream``). The attention kernels
  (``attention.csv``) are not in the snapshot read (stored as large-file pointers), so vidur
  gives GEMM and memory-bound rows only. Pass the path of a git directory of vidur with
  ``--vidur``; rows are read at commit ``--vidur-commit``.
* this repository's H200 GEMM sweep ``benchmarks/data/gpu-h200/gemm_vs_model.json`` (bf16,
  CUDA-graph timed: each row includes the graph's inter-kernel gap).
* OpenXLA's published H100 matmul table ``benchmarks/data/xla_h100_bf16_matmul.csv``
  (Apache-2.0; CUPTI kernel time).
* the FlashAttention-3 paper's Fig. 5 (H100 SXM5, forward, causal, head dim 128, hidden 2048,
  batch x seqlen = 16k) and the H200 layer trace's cuDNN attention kernels.

Usage::

    python benchmarks/build_kernel_corpus.py --vidur PATH/TO/vidur.git [--out ccoverlap/data/corpus]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: token counts kept from vidur's 1-4096 grid (powers of two, the 1.5x steps between, a few
#: irregular counts)
TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 136, 192, 256, 384, 520, 512, 768, 1000, 1024,
          1536, 2048, 2056, 3072, 4096)
VIDUR_GPUS = {"a100": "A100-80GB-SXM", "a40": "A40", "h100": "H100-SXM"}
VIDUR_HW = {"a100": "A100 80GB (vidur: the same compute profile serves its DGX A100 and 4 x A100 PCIe nodes)",
            "a40": "A40 48GB (vidur: 8 x A40 pairwise-NVLink node)",
            "h100": "H100 80GB SXM (vidur: H100 DGX)"}
#: vidur's times come from profiler traces at 1 us resolution: rows under this many seconds are
#: a third or more rounding and are left out (of both halves)
MIN_TIME_S = 3e-6
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
MEM_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")


def _git(gitdir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", gitdir, *args], check=True, capture_output=True, text=True).stdout


def _vidur_files(gitdir: str, commit: str, dev: str) -> list[str]:
    out = _git(gitdir, "ls-tree", "-r", "--name-only", commit, f"data/profiling/compute/{dev}")
    return [p for p in out.split() if p.endswith("/mlp.csv")]


def _gemm_shape(op: str, r: dict) -> tuple[int, int, int]:
    """(m, n, k) of one vidur linear layer on one TP rank."""
    t, h, tp = int(r["num_tokens"]), int(r["n_embd"]), int(r["num_tensor_parallel_workers"])
    heads, kv, inter = int(r["n_head"]), int(r["n_kv_head"]), int(r["n_expanded_embd"])
    hd = h // heads
    gated = r["use_gated_mlp"].strip().lower() == "true"
    if op == "attn_pre_proj":
        return t, (heads + 2 * kv) * hd // tp, h
    if op == "attn_post_proj":
        return t, h, heads * hd // tp
    if op == "mlp_up_proj":
        return t, (2 if gated else 1) * inter // tp, h
    return t, h, inter // tp


def _mem_bytes(op: str, r: dict, model: str) -> tuple[float, int]:
    """(HBM bytes, kernels) of one vidur element-wise op, fp16 (2 bytes an element)."""
    t, h, tp = int(r["num_tokens"]), int(r["n_embd"]), int(r["num_tensor_parallel_workers"])
    heads, kv, inter = int(r["n_head"]), int(r["n_kv_head"]), int(r["n_expanded_embd"])
    hd = h // heads
    gated = r["use_gated_mlp"].strip().lower() == "true"
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 2.0 * 2 * t * h, 1  # read x, write the normed x
    if op == "attn_rope":
        return 2.0 * 2 * t * (heads + kv) * hd / tp, 1  # Q and K read and written in place
    if op == "mlp_act":
        width = inter / tp
        return (2.0 * 3 * t * width, 1) if gated else (2.0 * 2 * t * width, 1)
    if "phi" in model.lower():
        return 2.0 * 6 * t * h, 2  # attn + ffn + residual: two adds
    return 2.0 * 3 * t * h, 1


def _mem_pattern(op: str) -> str:
    """The corpus ``pattern`` of a vidur element-wise op (vLLM's kernels, PyTorch's add)."""
    if op == "add":
        return "stream"
    return "rowwise-twopass" if op.endswith("layernorm") else "rowwise"


def vidur_rows(gitdir: str, commit: str, dev: str) -> tuple[list[dict], list[dict]]:
    """GEMM and memory-bound rows of one vidur device directory."""
    gemm: dict[tuple, list] = {}
    mem: list[dict] = []
    for path in _vidur_files(gitdir, commit, dev):
        model = path.split("/")[-2]
        text = _git(gitdir, "show", f"{commit}:{path}")
        for r in csv.DictReader(io.StringIO(text)):
            if int(r["num_tokens"]) not in TOKENS:
                continue
            tp = int(r["num_tensor_parallel_workers"])
            for op in GEMM_OPS:
                v = r.get(f"time_stats.{op}.median", "")
                if not v or float(v) * 1e-3 < MIN_TIME_S:
                    continue
                m, n, k = _gemm_shape(op, r)
                gemm.setdefault((m, n, k), []).append((float(v) * 1e-3, model, tp, op))
            for op in MEM_OPS:
                v = r.get(f"time_stats.{op}.median", "")
                if not v or float(v) * 1e-3 < MIN_TIME_S:
                    continue
                nbytes, kernels = _mem_bytes(op, r, model)
                mem.append({"op": op, "model": model, "tp": tp, "tokens": int(r["num_tokens"]),
                            "bytes": int(nbytes), "kernels": kernels, "dtype_bytes": 2,
                            "pattern": _mem_pattern(op), "timing": "kernel",
                            "time_s": float(v) * 1e-3})
    rows = []
    for (m, n, k), ms in sorted(gemm.items()):
        t = statistics.median(x[0] for x in ms)
        _, model, tp, op = ms[0]
        rows.append({"op": op, "model": model, "tp": tp, "m": m, "n": n, "k": k, "batch": 1,
                     "dtype_bytes": 2, "timing": "kernel", "time_s": t})
    # one row per (op, bytes): models sharing a width share the measurement's half
    seen: dict[tuple, dict] = {}
    for r in mem:
        seen.setdefault((r["op"], r["bytes"]), r)
    return rows, list(seen.values())


def h200_gemm_rows() -> list[dict]:
    d = json.loads((ROOT / "benchmarks/data/gpu-h200/gemm_vs_model.json").read_text())
    out = []
    for r in d["rows"]:
        lab = r["labels"][0]
        out.append({"op": f"{lab['layer']}.{lab['pass']}", "model": lab["model"], "tp": lab["tp"],
                    "m": r["m"], "n": r["n"], "k": r["k"], "batch": 1, "dtype_bytes": 2, "timing": "graph",
                    "time_s": r["measured_s"]})
    return out


def xla_gemm_rows() -> list[dict]:
    text = (ROOT / "benchmarks/data/xla_h100_bf16_matmul.csv").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    out = []
    for r in csv.DictReader(lines):
        b, m, n, k = (int(r[c]) for c in "bmnk")
        out.append({"op": "matmul", "model": "", "tp": 1, "m": m, "n": n, "k": k, "batch": b, "dtype_bytes": 2,
                    "timing": "kernel", "time_s": 2.0 * b * m * n * k / (float(r["tflops"]) * 1e12)})
    return out


# FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608) Fig. 5, H100 80GB SXM5, forward,
# causal, head dim 128, hidden 2048 (16 heads), batch x seqlen = 16k; TFLOP/s as the paper
# counts them (causal: half of 4 * b * s^2 * hidden).
FA3_FIG5 = {"fa2": ((512, 191), (1024, 260), (2048, 298), (4096, 319), (8192, 333), (16384, 335)),
            "cudnn": ((512, 315), (1024, 410), (2048, 484), (4096, 518), (8192, 529), (16384, 539))}


def fa3_rows() -> list[dict]:
    out = []
    for backend, pts in FA3_FIG5.items():
        for s, tflops in pts:
            b = 16384 // s
            flops = 4.0 * b * s * s * 2048 / 2
            out.append({"backend": backend, "direction": "fwd", "causal": 1, "batch": b, "heads": 16, "kv_heads": 16,
                        "seq": s, "head_dim": 128, "timing": "kernel", "time_s": flops / (tflops * 1e12)})
    return out


# pytorch/pytorch#142132 (2024-12-05, torch 2.6.0.dev20241204+cu124, H100): tritonbench
# flash_attention (batch 1, 24 heads, seq 4608, head dim 128), TFLOP/s per backend.
PT142132 = {"fa2": 329.483, "cudnn": 631.338, "fa3": 631.827}
# pytorch/pytorch#126122 ("A100 Numbers", 2024-05): SDPA flash vs cuDNN, microseconds, by
# (batch, seq, heads, head dim).
PT126122 = {(1, 4096, 32, 64): (799.391, 836.327), (1, 4096, 16, 128): (750.131, 806.964),
            (1, 8192, 32, 64): (3211.84, 3234.41)}


# pytorch/FBGEMM#2546 (2024-04-29), H100 500W: bf16 and FP8 (row-wise scaled, GEMM only) times, ms.
FBGEMM2546 = {(8192, 8192, 8192): (1.879, 0.977), (65536, 8192, 7168): (13.383, 7.108),
              (65536, 3584, 8192): (7.044, 3.372)}


def fbgemm_rows() -> list[dict]:
    out = []
    for (m, n, k), (bf16_ms, fp8_ms) in FBGEMM2546.items():
        for dt, ms in ((2, bf16_ms), (1, fp8_ms)):
            out.append({"op": "bf16" if dt == 2 else "fp8 rowwise", "model": "", "tp": 1, "m": m, "n": n, "k": k,
                        "batch": 1, "dtype_bytes": dt, "timing": "kernel", "time_s": ms * 1e-3})
    return out


def issue_attention_rows() -> tuple[list[dict], list[dict]]:
    """(H100 rows of pytorch#142132, A100 rows of pytorch#126122); forward, non-causal (see the notes)."""
    h100 = []
    for backend, tflops in PT142132.items():
        flops = 4.0 * 1 * 4608 * 4608 * 24 * 128
        h100.append({"backend": backend, "direction": "fwd", "causal": 0, "batch": 1, "heads": 24, "kv_heads": 24,
                     "seq": 4608, "head_dim": 128, "timing": "kernel", "time_s": flops / (tflops * 1e12)})
    a100 = []
    for (b, seq, h, d), times in PT126122.items():
        for backend, us in zip(("fa2", "cudnn"), times):
            a100.append({"backend": backend, "direction": "fwd", "causal": 0, "batch": b, "heads": h, "kv_heads": h,
                         "seq": seq, "head_dim": d, "timing": "kernel", "time_s": us * 1e-6})
    return h100, a100


def h200_attention_rows() -> list[dict]:
    """The cuDNN attention kernels of the H200 layer trace (median of its steps, summed per pass)."""
    meta = json.loads((ROOT / "benchmarks/data/gpu-h200/layer/layer.json").read_text())
    d = json.load(gzip.open(ROOT / "benchmarks/data/gpu-h200/layer/trace/rank-0.json.gz"))
    ev = [e for e in d["traceEvents"] if e.get("cat") == "kernel" and "cudnn" in e["name"]]
    fwd = sorted(e["dur"] for e in ev if "fprop" in e["name"])
    bwd_main = sorted(e["dur"] for e in ev if "bprop" in e["name"])
    # the backward's helper kernels (dO.O dot, dQ conversion) run once per backward
    helpers = [e for e in ev if "fprop" not in e["name"] and "bprop" not in e["name"]]
    per_step = len(fwd)
    helper_s = sum(e["dur"] for e in helpers) / per_step
    common = {"backend": "cudnn", "causal": 1, "batch": meta["batch"], "heads": meta["heads"],
              "kv_heads": meta["kv_heads"], "seq": meta["seq"], "head_dim": meta["head_dim"], "timing": "kernel"}
    return [dict(common, direction="fwd", time_s=statistics.median(fwd) * 1e-6),
            dict(common, direction="bwd", time_s=(statistics.median(bwd_main) + helper_s) * 1e-6)]


def _write(out: Path, kind: str, name: str, rows: list[dict], meta: str) -> None:
    d = out / kind
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    (d / f"{name}.yaml").write_text(meta)
    print(f"{kind}/{name}: {len(rows)} rows")


def _vidur_meta(dev: str, what: str, commit: str, split_key: str) -> str:
    return (f"source:\n  repository: microsoft/vidur\n  path: data/profiling/compute/{dev}/<org>/<model>/mlp.csv\n"
            f"  commit: {commit}\n  licence: MIT\n  url: https://github.com/microsoft/vidur\n"
            f"hardware: '{VIDUR_HW[dev]}'\ngpu: {VIDUR_GPUS[dev]}\n"
            f"units: {{time_s: s, bytes: bytes}}\nsplit_key: {split_key}\n"
            f"notes: >-\n  {what} Per-op median of 20 steps of vidur's record_function profiling "
            f"(sum of the op's kernel durations, fp16), read at the token counts "
            f"{', '.join(map(str, TOKENS))} and TP 1, 2, 4, 8 of every model in the directory; "
            f"rows under {MIN_TIME_S * 1e6:.0f} us are left out (the traces' 1 us resolution); "
            f"built by benchmarks/build_kernel_corpus.py.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vidur", required=True, help="a git directory of microsoft/vidur")
    ap.add_argument("--vidur-commit", default="HEAD")
    ap.add_argument("--out", default=str(ROOT / "ccoverlap/data/corpus"))
    args = ap.parse_args()
    out = Path(args.out)
    commit = _git(args.vidur, "rev-parse", args.vidur_commit).strip()
    for dev in VIDUR_GPUS:
        gemm, mem = vidur_rows(args.vidur, commit, dev)
        _write(out, "gemm", f"vidur-{dev}", gemm, _vidur_meta(
            dev, "One row per GEMM shape (m = tokens, n = output features of the TP shard, k = input features; "
                 "the median over models sharing the shape) of the four linear layers (QKV, output, "
                 "up/gate, down projections), one cuBLAS kernel each.", commit, "[m, n, k]"))
        _write(out, "memory", f"vidur-{dev}", mem, _vidur_meta(
            dev, "Element-wise ops (RMSNorm, rotary embedding, SiluAndMul / GELU, residual add), bytes "
                 "= HBM bytes read + written at 2 bytes an element, one row per (op, bytes); pattern: "
                 "rowwise for vLLM's one-block-per-token kernels (rotary, activation), rowwise-twopass for its "
                 "RMSNorm (one block per token that reads its row twice: the sum of squares, then the "
                 "normalisation), stream for PyTorch's element-wise add.",
            commit, "[op, bytes]"))
    _write(out, "gemm", "h200-sweep", h200_gemm_rows(),
           "source:\n  repository: ccoverlap\n  path: benchmarks/data/gpu-h200/gemm_vs_model.json\n"
           "  commit: see the file's 'created' field (2026-11-26)\n  licence: Apache-2.0\n"
           "hardware: 1 x NVIDIA H200 SXM, torch 2.11.0+cu130, CUDA 13.0\ngpu: H200\n"
           "units: {time_s: s}\nsplit_key: [m, n, k]\n"
           "notes: >-\n  bf16 GEMMs of Llama-3 8B/70B layers at TP 1-8 and 1k-8k tokens, forward, dgrad and "
           "wgrad; median of 5 CUDA-graph replays (a row includes the graph's gap between kernels).\n")
    _write(out, "gemm", "xla-h100", xla_gemm_rows(),
           "source:\n  repository: openxla/xla\n  path: xla/service/gpu/model/matmul_interpolator_data.h\n"
           "  commit: 71feeddf7cc3c9c7878eee18ea43c983631e6e84\n  licence: Apache-2.0\n"
           "hardware: NVIDIA H100 (sm_90)\ngpu: H100-SXM\nunits: {time_s: s}\nsplit_key: [batch, m, n, k]\n"
           "notes: >-\n  bf16 x bf16 -> bf16 matmuls (entries 'sm_90'), median CUPTI kernel time of 5 runs "
           "(xla/tools/matmul_perf_table_gen), stored as TFLOP/s = 2bmnk / time; via "
           "benchmarks/data/xla_h100_bf16_matmul.csv.\n")
    _write(out, "attention", "fa3-paper-h100", fa3_rows(),
           "source:\n  repository: arXiv:2407.08608 (Shah et al., FlashAttention-3)\n  path: Fig. 5\n"
           "  commit: v1 (2024-07)\n  licence: CC BY 4.0\n  url: https://arxiv.org/abs/2407.08608\n"
           "hardware: NVIDIA H100 80GB SXM5\ngpu: H100-SXM\nunits: {time_s: s}\nsplit_key: [backend, seq]\n"
           "notes: >-\n  Forward, causal, head dim 128, hidden 2048 (16 heads), batch x seqlen = 16k; times "
           "from the figure's TFLOP/s (read from the plot, +-2%) with the paper's causal FLOP count.\n")
    _write(out, "gemm", "fbgemm-2546-h100-500w", fbgemm_rows(),
           "source:\n  repository: pytorch/FBGEMM\n  path: pull request 2546 (description)\n"
           "  commit: 2024-04-29 (the pull request's description)\n  licence: facts quoted from a public pull request\n"
           "  url: https://github.com/pytorch/FBGEMM/pull/2546\n"
           "hardware: NVIDIA H100 at 500 W\ngpu: H100-96GB-HBM2e-500W\nunits: {time_s: s}\n"
           "split_key: [m, n, k, dtype_bytes]\n"
           "notes: >-\n  bf16 GEMMs and FP8 row-wise scaled GEMMs (the 'fp8 row gemm only' lines: the GEMM "
           "without the input quantisation) of three large shapes; the catalog's 500 W H100 (Meta's Grand "
           "Teton part) is assumed.\n")
    h100_issue, a100_issue = issue_attention_rows()
    _write(out, "attention", "pytorch-142132-h100", h100_issue,
           "source:\n  repository: pytorch/pytorch\n  path: pytorch/pytorch#142132 (an issue thread's timings)\n"
           "  commit: torch 2.6.0.dev20241204+cu124 (the build the thread reports)\n  licence: facts quoted from a public thread\n"
           "  url: https://github.com/pytorch/pytorch/issues/142132\n"
           "hardware: NVIDIA H100 (tritonbench)\ngpu: H100-SXM\nunits: {time_s: s}\nsplit_key: [backend, seq]\n"
           "notes: >-\n  tritonbench flash_attention, batch 1, 24 heads, seq 4608, head dim 128: SDPA's default "
           "(the FlashAttention-2 backend) 329.5, cuDNN 631.3, FlashAttention-3 631.8 TFLOP/s; forward and "
           "non-causal (tritonbench's defaults; assumption), times from 4 b s^2 h d / TFLOP/s.\n")
    _write(out, "attention", "pytorch-126122-a100", a100_issue,
           "source:\n  repository: pytorch/pytorch\n  path: pull request 126122 ('A100 Numbers')\n"
           "  commit: 2024-05 (the pull request's description)\n  licence: facts quoted from a public pull request\n"
           "  url: https://github.com/pytorch/pytorch/pull/126122\n"
           "hardware: NVIDIA A100\ngpu: A100-80GB-SXM\nunits: {time_s: s}\nsplit_key: [backend, seq, head_dim]\n"
           "notes: >-\n  SDPA flash (FlashAttention-2) and cuDNN backends, times in microseconds as printed; the "
           "direction and mask are not stated: forward and non-causal assumed (170-180 TFLOP/s, an A100 "
           "FlashAttention-2 forward's rate; forward + backward would exceed the peak).\n")
    _write(out, "attention", "h200-layer", h200_attention_rows(),
           "source:\n  repository: ccoverlap\n  path: benchmarks/data/gpu-h200/layer/trace\n"
           "  commit: see benchmarks/data/gpu-h200/layer/layer.json\n  licence: Apache-2.0\n"
           "hardware: '1 x NVIDIA H200 SXM, torch 2.11.0+cu130 (SDPA picks cuDNN)'\ngpu: H200\n"
           "units: {time_s: s}\nsplit_key: [backend, direction, seq]\n"
           "notes: >-\n  cuDNN flash attention of one Llama-3-8B layer (32 query / 8 KV heads, head dim 128, "
           "seq 4096, causal), median over 3 steps; the backward sums the bprop kernel and its helpers.\n")


if __name__ == "__main__":
    main()
