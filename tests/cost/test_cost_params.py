"""CostParams: validation, JSON round-trip, calibration files, per-GPU defaults."""

import json
from dataclasses import fields

import pytest

from ccoverlap.catalog.hardware import GPUS
from ccoverlap.cost import CostParams, default_params
from ccoverlap.cost.params import _GPU_OVERRIDES
from ccoverlap.errors import ConfigError


def test_round_trip_through_dict_preserves_every_field():
    p = CostParams().with_overrides(gemm_peak_fraction=0.7, channel_bytes_per_s=12e9, gemm_tile_n=128)
    d = p.to_dict()
    assert set(d) == {f.name for f in fields(CostParams)}
    q = CostParams.from_dict(json.loads(json.dumps(d)))
    assert q == p
    assert q.gemm_tile_n == 128 and isinstance(q.gemm_tile_n, int)


def test_unknown_keys_raise_config_error_naming_them():
    with pytest.raises(ConfigError, match="gemm_peak_fractoin"):
        CostParams.from_dict({"gemm_peak_fractoin": 0.5})
    with pytest.raises(ConfigError, match="nope"):
        CostParams().with_overrides(nope=1.0)


def test_invalid_values_raise():
    with pytest.raises(ConfigError):
        CostParams(gemm_peak_fraction=1.5)
    with pytest.raises(ConfigError):
        CostParams(link_efficiency_pcie=0.0)
    with pytest.raises(ConfigError):
        CostParams(gemm_tile_m=100.5)
    with pytest.raises(ConfigError):
        CostParams.from_dict({"chunk_step_overhead_s": "fast"})


def test_load_calibration_file_over_a_base(tmp_path):
    base = default_params(GPUS["A40"])
    path = tmp_path / "calib.json"
    path.write_text(json.dumps({"params": {"gemm_peak_fraction": 0.61}, "gpu": "A40", "fit_error": 0.05}))
    p = CostParams.load(path, base=base)
    assert p.gemm_peak_fraction == 0.61
    assert p.gemm_tile_n == base.gemm_tile_n == 128  # untouched fields come from the base
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"mem_bw_fraction": 0.8}))
    assert CostParams.load(bare).mem_bw_fraction == 0.8
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"params": {"foo": 1}}))
    with pytest.raises(ConfigError, match="foo"):
        CostParams.load(bad)
    with pytest.raises(ConfigError):
        CostParams.load(tmp_path / "missing.json")


def test_save_then_load(tmp_path):
    p = default_params(GPUS["MI300X"])
    path = tmp_path / "c.json"
    p.save(path, gpu="MI300X", fit_error=0.1)
    data = json.loads(path.read_text())
    assert data["gpu"] == "MI300X" and data["fit_error"] == 0.1
    assert CostParams.load(path) == p


def test_defaults_differ_per_gpu():
    h100, a40, mi = (default_params(GPUS[n]) for n in ("H100-SXM", "A40", "MI300X"))
    # the class defaults are the H100 SXM's, less its power-limiter fit ([POWER] in params.py)
    power = _GPU_OVERRIDES["H100-SXM"]
    assert power["gemm_power_clock_fraction"] < 1.0 and CostParams().gemm_power_clock_fraction == 1.0
    assert default_params(GPUS["H100-SXM"], sustained=False) == CostParams(**power)
    assert h100 == CostParams(**power, sustained_clock_fraction=0.865)  # a training step's clock, measured
    assert a40.gemm_tile_n < h100.gemm_tile_n  # GA102 has less shared memory
    assert mi.gemm_tile_m == 256 and mi.gemm_peak_fraction < h100.gemm_peak_fraction


def test_causal_attention_factor_follows_the_fa3_paper_figure():
    """FA3 paper Fig. 5 (H100, hd 128): FA2 causal 333 TFLOP/s at 8k vs 370 non-causal; cuDNN
    529 vs ~600; log2 interpolation between the measured lengths, held at the ends."""
    import math

    from ccoverlap.cost.compute import attention_time_s
    from ccoverlap.cost.params import causal_attention_factor
    from ccoverlap.specs import AttentionSpec

    assert math.isclose(causal_attention_factor("fa2", 8192), 333 / 370)
    assert math.isclose(causal_attention_factor("native", 8192), 529 / 600)
    mid = 260 / 370 + (298 / 370 - 260 / 370) * (math.log2(1500) - 10) / 1.0
    assert math.isclose(causal_attention_factor("fa2", 1500), mid, rel_tol=1e-12)
    assert causal_attention_factor("fa2", 131072) == 335 / 370 and causal_attention_factor("fa2", 64) == 191 / 370
    assert causal_attention_factor("fa2", 0) == 1.0
    # Hopper: a causal kernel is slower by the factor; A100 is not derated (its fractions are causal already)
    spec = dict(flops=1e15, bytes=1.0, kernel="fa2")
    h100, a100 = GPUS["H100-SXM"], GPUS["A100-80GB-SXM"]
    t_nc = attention_time_s(AttentionSpec(**spec), h100, default_params(h100))
    t_c = attention_time_s(AttentionSpec(**spec, causal_len=8192), h100, default_params(h100))
    assert math.isclose(t_c / t_nc, 370 / 333, rel_tol=1e-6)
    assert attention_time_s(AttentionSpec(**spec, causal_len=8192), a100, default_params(a100)) == \
        attention_time_s(AttentionSpec(**spec), a100, default_params(a100))


def test_hash_follows_the_values_and_survives_copies():
    """The hash is cached per instance but is a function of the field values: equal parameters
    built apart, copied or pickled hash alike; a changed field is a different dict key."""
    import pickle

    p = CostParams()
    _ = hash(p)  # caches it on p
    same = CostParams.from_dict(p.to_dict())
    assert same == p and hash(same) == hash(p)
    back = pickle.loads(pickle.dumps(p))
    assert back == p and hash(back) == hash(p)
    other = p.with_overrides(gemm_peak_fraction=p.gemm_peak_fraction / 2)
    assert other != p and {p: 1, other: 2}[other] == 2
    assert "_hash" not in p.to_dict()
