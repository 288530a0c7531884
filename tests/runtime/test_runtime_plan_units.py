"""Single-process pieces of the TP styles' support: dtype codes of the cross-rank check, the plan
benchmark's configuration and table, the Llama reference model and plan."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ccoverlap.errors import ConfigError  # noqa: E402
from ccoverlap.runtime.checks import dtype_code, dtype_name  # noqa: E402
from ccoverlap.runtime.llama import Block, Llama, block_plan, model_plan  # noqa: E402
from ccoverlap.runtime.plan_bench import SHAPES, PlanBenchConfig, PlanShape, format_table  # noqa: E402


def test_every_torch_dtype_has_its_own_code_and_name():
    dtypes = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    codes = {dtype_code(d) for d in dtypes}
    assert len(codes) == len(dtypes)  # complex, float8, bool, uint*, quantized, sub-byte: all distinct
    for d in dtypes:
        assert 0 <= dtype_code(d) < 2**31 and dtype_name(dtype_code(d)) == str(d).replace("torch.", "")
    assert dtype_code(torch.complex64) != dtype_code(torch.complex128)
    assert dtype_name(12345) == "dtype#12345"


def test_plan_config_names_what_is_wrong():
    with pytest.raises(ConfigError, match="unknown plan shape 'huge'"):
        PlanBenchConfig(shape="huge").validate(2)
    with pytest.raises(ConfigError, match="s=128 does not split over 3 ranks"):
        PlanBenchConfig(shape="activation-heavy").validate(3)
    with pytest.raises(ConfigError, match="workload"):
        PlanBenchConfig(workload="layer").validate(2)
    assert PlanBenchConfig(dims=PlanShape(1, 4, 8, 2, 8)).validate(2).s == 4
    for sh in SHAPES.values():
        assert sh.dim % sh.heads == 0


def _fake_result(ratio):
    rows = [{"row": "torch", "median_s": 0.1, "min_s": 0.09, "times_s": [0.1], "first_step_value": 1.0},
            {"row": "ccoverlap", "median_s": 0.1 * ratio, "min_s": 0.09, "times_s": [0.1 * ratio],
             "first_step_value": 1.0, "ratio_vs_torch": ratio, "ratio_interval_95": (ratio - 0.01, ratio + 0.01)}]
    return {"config": {"shape": "activation-heavy", "workload": "block", "layers": 4}, "world_size": 2, "rows": rows,
            "skipped_rows": {"async-tp": "needs CUDA and NCCL"}}


def test_plan_table_fits_80_columns_and_lists_skipped_rows():
    text = format_table([_fake_result(0.93), _fake_result(1.01)])
    lines = text.splitlines()
    assert all(len(ln) <= 80 for ln in lines if "not run" not in ln)
    assert any("0.930" in ln and "0.92-0.94" in ln for ln in lines)
    assert sum("async-tp not run (needs CUDA and NCCL)" in ln for ln in lines) == 2
    md = format_table([_fake_result(0.93)], markdown=True)
    assert md.splitlines()[0].startswith("| shape |") and "| ccoverlap | 93.0 | - | 0.930 |" in md


def test_reference_model_and_plans_cover_every_projection():
    blk = Block(16, 4, 32)
    assert blk(torch.zeros(2, 8, 16)).shape == (2, 8, 16)
    plan = block_plan("torch")
    linears = {n for n, m in blk.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linears <= set(plan) and "attention" in plan and "feed_forward" in plan
    model = Llama(32, 16, 4, 32, 2)
    assert model(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 32)
    mp = model_plan(model, "ccoverlap", schedule="serial")
    assert {"tok_embeddings", "norm", "output", "layers.1.feed_forward.w3"} <= set(mp)
    assert mp["layers.0.attention.wq"].schedule == "serial" and not mp["output"].use_local_output
    with pytest.raises(ValueError):
        block_plan("megatron")
