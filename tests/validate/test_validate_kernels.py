"""`validate kernels` and the compute model paths it judges: each path with a hand-checkable case."""

import json
import math
import subprocess
import sys

import pytest

from ccoverlap.catalog.hardware import get_gpu
from ccoverlap.cost.compute import gemm_time_s, is_misaligned, memory_time_s
from ccoverlap.cost.params import CostParams
from ccoverlap.errors import ConfigError
from ccoverlap.sim.graph import GemmSpec, MemorySpec
from ccoverlap.validate.kernels import attention_spec, judge_corpus, report, summarize

H100 = get_gpu("H100-SXM")
P = CostParams()


def test_gemv_path_streams_the_operands_once():
    # m = 1: the weight is read once; bytes / achievable bandwidth + launch, no tile padding
    spec = GemmSpec(m=1, n=8192, k=8192)
    bw = H100.hbm_bytes_per_s * P.mem_bw_fraction
    assert gemm_time_s(spec, H100, P) == pytest.approx(spec.bytes / bw + P.kernel_launch_overhead_s, rel=1e-9)


def test_batched_tiny_matrices_are_not_padded_to_tiles():
    spec = GemmSpec(m=8, n=8, k=8, batch=100_000)
    bw = H100.hbm_bytes_per_s * P.mem_bw_fraction
    assert gemm_time_s(spec, H100, P) == pytest.approx(spec.bytes / bw + P.kernel_launch_overhead_s, rel=1e-9)


def test_split_k_speeds_up_a_skinny_long_k_gemm():
    # 256 x 256 output (4-8 tiles of 132 SMs) with K = 65536: splitting K fills the GPU
    spec = GemmSpec(m=256, n=256, k=65536)
    one = gemm_time_s(spec, H100, P.with_overrides(gemm_max_split_k=1))
    split = gemm_time_s(spec, H100, P)
    assert split < one / 4


def test_misaligned_shape_falls_back_to_a_slower_kernel():
    aligned, odd = GemmSpec(m=4096, n=4096, k=4096), GemmSpec(m=4096, n=4096, k=4095)
    assert not is_misaligned(aligned) and is_misaligned(odd) and not is_misaligned(GemmSpec(m=1, n=8, k=8))
    ratio = gemm_time_s(odd, H100, P) / gemm_time_s(aligned, H100, P)
    assert ratio > 0.8 / P.gemm_misaligned_efficiency * 0.5  # compute-bound: ~1/efficiency slower


def test_rowwise_bytes_move_at_their_share_of_the_bandwidth():
    bw = H100.hbm_bytes_per_s * P.mem_bw_fraction * P.mem_elementwise_efficiency
    spec = MemorySpec(bytes=2e9, rowwise_bytes=1e9)
    expect = 1e9 / bw + 1e9 / (bw * P.mem_rowwise_efficiency) + P.kernel_launch_overhead_s
    assert memory_time_s(spec, H100, P) == pytest.approx(expect, rel=1e-9)
    with pytest.raises(ConfigError, match="rowwise_bytes"):
        MemorySpec(bytes=1.0, rowwise_bytes=2.0)


def test_attention_row_flops_are_counted_as_flash_counts_them():
    row = {"backend": "cudnn", "direction": "fwd", "causal": 1, "batch": 2, "heads": 16, "kv_heads": 16,
           "seq": 1024, "head_dim": 128}
    spec = attention_spec(row)
    assert spec.flops == 4.0 * 2 * 1024 * 1024 * 16 * 128 / 2 and spec.causal_len == 1024
    assert attention_spec(dict(row, direction="bwd")).flops == 2.5 * spec.flops


def test_corpus_halves_are_disjoint_and_judged_per_gpu_and_class():
    held, fit = judge_corpus("held-out"), judge_corpus("fit")
    assert held and fit and {r.split for r in held} == {"held-out"} and {r.split for r in fit} == {"fit"}
    groups = summarize(held)
    assert ("H100-SXM", "gemm") in groups and ("A100-80GB-SXM", "memory") in groups
    g = groups[("H100-SXM", "gemm")]
    errs = [abs(r.error) for r in held if r.gpu == "H100-SXM" and r.kind == "gemm"]
    assert g.n == len(errs) and g.mean_abs == pytest.approx(sum(errs) / len(errs))
    assert all(math.isfinite(r.predicted_s) and r.predicted_s > 0 for r in held)


def test_report_rejects_an_unknown_split():
    with pytest.raises(ConfigError, match="--split"):
        report("most")


def test_cli_validate_kernels_json():
    out = subprocess.run([sys.executable, "-m", "ccoverlap", "validate", "kernels", "--split", "fit", "--json"],
                         capture_output=True, text=True, check=True).stdout
    rep = json.loads(out)
    assert rep["split"] == "fit" and {c["class"] for c in rep["classes"]} >= {"gemm", "memory", "attention"}
    bad = subprocess.run([sys.executable, "-m", "ccoverlap", "validate", "kernels", "--split", "x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
