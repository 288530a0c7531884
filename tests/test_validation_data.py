"""The published-runs table (benchmarks/published_runs.py) is well-formed, and the validation
script predicts a positive step time for a small case."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import published_runs as pr  # noqa: E402

SMALL_CASE = "torchtitan-Llama3.1-8B H100x8"


@pytest.mark.parametrize("case", pr.CASES, ids=lambda c: c.name)
def test_case_is_well_formed(case):
    assert case.name and case.group
    assert case.source.strip().startswith("[") and len(case.source) > 40, "every case cites its source"
    assert case.measured_kind in pr.MEASURED_KINDS
    assert case.measured_value > 0 and math.isfinite(case.measured_value)
    if case.measured_kind == "tflops_per_gpu":
        assert case.flops_rule in pr.FLOPS_RULES
        assert case.flops_per_iteration() > 0
    assert case.gpus > 0
    d = case.degrees
    assert all(v >= 1 for v in d.values())
    assert d["tp"] * d["pp"] * d["dp"] == case.gpus, "parallel degrees multiply to the GPU count"
    b = case.batch
    assert b["global_batch"] > 0 and b["micro_batch"] > 0 and b["seq_len"] > 0
    assert b["global_batch"] % (d["dp"] * b["micro_batch"]) == 0
    assert case.cluster in pr.CUSTOM_CLUSTERS or case.cluster in ("dgx-h100", "dgx-a100", "hgx-h200",
                                                                  "a40-pcie", "mi300x")
    t = case.measured_step_time_s
    assert t > 0 and math.isfinite(t)
    assert isinstance(case.assumptions, tuple)


def test_case_names_unique_and_count():
    names = [c.name for c in pr.CASES]
    assert len(names) == len(set(names))
    assert 6 <= len(names) <= 16


def test_measured_time_conversions():
    # tokens/s/GPU: 16 x 8192 tokens / (8 GPUs x 5762 tokens/s) = 2.843 s
    c = pr.case_by_name(SMALL_CASE)
    assert c.measured_step_time_s == pytest.approx(16 * 8192 / (8 * 5762))
    # Megatron-Core rule for a GPT = 72 B s l h^2 (1 + s/6h + V/12lh); 1.7B row: 41% of 989 TFLOP/s
    m = pr.case_by_name("MCore-GPT-1.7B H100x48")
    B, s, l, h, V = 192, 4096, 24, 2048, 131072
    f = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert m.flops_per_iteration() == pytest.approx(f)
    assert 408.8 / 989.4 == pytest.approx(0.41, abs=0.005)
    # PTD-P eq. 3 with recomputation: 1T row, 163 TFLOP/s x 3072 GPUs = 502 PFLOP/s aggregate (table)
    t = pr.case_by_name("PTD-P-GPT-1T A100x3072")
    assert t.flops_per_iteration() / t.measured_step_time_s / 1e15 == pytest.approx(500.7, rel=1e-3)


def test_catalog_shapes_reproduce_published_parameter_counts():
    pytest.importorskip("ccoverlap.models")
    from ccoverlap.models import model_from_dict

    expect = {"MCore-GPT-1.7B H100x48": 1.7e9, "MCore-GPT-462B H100x6144": 462e9,
              "PTD-P-GPT-145B A100x1536": 145.6e9, "PTD-P-GPT-1T A100x3072": 1008.0e9}
    for name, n in expect.items():
        m = model_from_dict(pr.case_by_name(name).model)
        assert m.param_count().total == pytest.approx(n, rel=0.03), name


def test_workloads_validate():
    pytest.importorskip("ccoverlap.parallel.config")
    pytest.importorskip("ccoverlap.models")
    import validate_published as vp

    for case in pr.CASES:
        w = vp.workload_for(case)
        assert w.cluster.world_size == case.gpus
        assert w.parallel.world_size == case.gpus


def test_predict_small_case_positive():
    pytest.importorskip("ccoverlap.parallel")
    pytest.importorskip("ccoverlap.cost")
    import validate_published as vp

    t = vp.predict(pr.case_by_name(SMALL_CASE))
    assert math.isfinite(t) and t > 0


def test_sensitivity_entries_name_cases_and_sections():
    for name, label, changes in pr.SENSITIVITY:
        case = pr.case_by_name(name)
        assert label
        changed = pr.with_changes(case, changes)
        for section, kv in changes.items():
            assert section in ("parallel", "batch", "knobs")
            for k, v in kv.items():
                assert getattr(changed, section)[k] == v
        d = changed.degrees
        assert d["tp"] * d["pp"] * d["dp"] == case.gpus
