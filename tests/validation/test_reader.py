"""The runs-file reader: the shipped published set is well formed, and every kind of malformed
run ends in one ConfigError line naming the file, the run and the field. These tests build no
step, so they do not depend on which parallel features the simulator has."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from ccoverlap.errors import ConfigError
from ccoverlap.validation.measure import Measurement, flops_per_step, implied_step_time_s
from ccoverlap.validation.reader import load_runs

PUBLISHED = Path(__file__).resolve().parents[2] / "ccoverlap" / "data" / "runs" / "published.yaml"

GOOD_RUN = {
    "name": "tt-70b",
    "source": "[TT24A] torchtitan docs/performance.md @1ea476e9f, Llama 3 table, row 70B: WPS 331",
    "assumptions": ["DGX-A100-like network"],
    "model": "Llama-3-70B",
    "cluster": "dgx-a100",
    "nodes": 8,
    "parallel": {"dp": 64, "data_parallel": "fsdp", "recompute": "full"},
    "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 8192},
    "knobs": {"fsdp_prefetch": 1},
    "framework": "torchtitan",
    "measured": {"tokens_per_s_per_gpu": 331},
    "subset": "fit",
}


def write_runs(tmp_path, runs, name="runs.yaml", **top):
    p = tmp_path / name
    p.write_text(yaml.safe_dump({"runs": runs, **top}, sort_keys=False))
    return p


def bad(tmp_path, **changes):
    """GOOD_RUN with ``changes`` ("a.b" keys address nested fields; None deletes)."""
    run = copy.deepcopy(GOOD_RUN)
    for key, value in changes.items():
        parts = key.split(".")
        d = run
        for part in parts[:-1]:
            d = d[part]
        if value is None:
            d.pop(parts[-1], None)
        else:
            d[parts[-1]] = value
    return write_runs(tmp_path, [copy.deepcopy(GOOD_RUN) | {"name": "ok-run"}, run])


# ----------------------------------------------------------------------------- the shipped set
def test_published_set_size_sources_and_features():
    rf = load_runs(PUBLISHED)
    runs = rf.runs
    assert len(runs) >= 25
    ids = {re.match(r"\[(\w+)\]", r.source).group(1) for r in runs}
    assert ids <= set(rf.sources), "every run cites a source listed under 'sources'"
    assert len(ids) >= 4
    assert len({r.name for r in runs}) == len(runs)
    assert any(r.degree("cp") > 1 for r in runs), "context-parallel runs"
    assert any(r.parallel.get("fp8") for r in runs), "FP8 runs"
    assert any(r.degree("dp_replicate") > 1 for r in runs), "HSDP runs"
    assert {r.subset for r in runs} == {"fit", "held-out"}
    n_fit = sum(r.subset == "fit" for r in runs)
    assert abs(n_fit - (len(runs) - n_fit)) <= 2, "the declared split is about half / half"
    for r in runs:
        assert r.assumptions, f"{r.name}: every assumption is listed"
        t = r.measured_step_time_s
        assert 0.05 < t < 500, r.name


def test_published_conversions_reproduce_source_totals():
    rf = {r.name: r for r in load_runs(PUBLISHED).runs}
    # PTD-P 1T: 163 TFLOP/s x 3072 GPUs; the table's aggregate is 502.0 PFLOP/s (it rounds 163)
    r = rf["ptdp-gpt-1t-a100x3072"]
    f = flops_per_step("megatron-2021", r.model, r.batch)
    assert f / r.measured_step_time_s / 1e15 == pytest.approx(500.7, rel=1e-3)
    # Megatron-Core 1.7B row: 72 B s l h^2 (1 + s/6h + V/12lh) for a GPT, 408.8 TFLOP/s x 48 = 19.6 PFLOP/s
    r = rf["mcore-gpt-1.7b-h100x48"]
    B, s, l, h, V = 192, 4096, 24, 2048, 131072
    assert flops_per_step("megatron-core", r.model, r.batch) == pytest.approx(
        72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)))
    assert flops_per_step("megatron-core", r.model, r.batch) / r.measured_step_time_s / 1e15 == pytest.approx(19.6, rel=3e-3)
    # tokens/s per GPU: 16 x 8192 / (8 x 5762)
    assert rf["torchtitan-llama3.1-8b-fsdp-h100x8"].measured_step_time_s == pytest.approx(16 * 8192 / (8 * 5762))
    # the published parameter counts come out of the model shapes
    assert rf["mcore-gpt-462b-h100x6144"].model.param_count().total == pytest.approx(462e9, rel=0.01)
    assert rf["ptdp-gpt-145b-a100x1536"].model.param_count().total == pytest.approx(145.6e9, rel=0.01)


def test_measurement_kinds_hand_computed():
    class B:  # a batch of 4 sequences of 1000 tokens
        global_batch, seq_len = 4, 1000
    from ccoverlap.catalog.models import get_model

    m = get_model("Llama-2-7B")
    assert implied_step_time_s(Measurement("step_time_s", 2.5), model=m, batch=B, gpus=8) == 2.5
    assert implied_step_time_s(Measurement("tokens_per_s", 2000.0), model=m, batch=B, gpus=8) == 2.0
    assert implied_step_time_s(Measurement("tokens_per_s_per_gpu", 250.0), model=m, batch=B, gpus=8) == 2.0
    f = 6.0 * m.param_count().total * 4000
    assert flops_per_step("6n", m, B) == pytest.approx(f)
    t = implied_step_time_s(Measurement("mfu", 0.5, flop_rule="6n", peak_tflops=100.0), model=m, batch=B, gpus=8)
    assert t == pytest.approx(f / (8 * 0.5 * 100e12))
    t2 = implied_step_time_s(Measurement("tflops_per_gpu", 50.0, flop_rule="6n"), model=m, batch=B, gpus=8)
    assert t2 == pytest.approx(t)


def test_good_file_reads(tmp_path):
    rf = load_runs(write_runs(tmp_path, [GOOD_RUN]))
    (r,) = rf.runs
    assert r.gpus == 64 and r.layout == "1x1x1x64" and r.subset == "fit"
    assert r.measured_step_time_s == pytest.approx(64 * 8192 / (64 * 331))


def test_extra_parallel_fields_are_read_without_building(tmp_path):
    """cp / cp_impl / dp_replicate / fp8 are runs-file fields whatever this build supports."""
    run = copy.deepcopy(GOOD_RUN)
    run["parallel"] = {"dp": 16, "cp": 2, "cp_impl": "allgather", "dp_replicate": 2, "fp8": True,
                       "data_parallel": "fsdp"}
    run["batch"]["global_batch"] = 16
    run["nodes"] = 4
    (r,) = load_runs(write_runs(tmp_path, [run])).runs
    assert r.degree("cp") == 2 and r.layout == "1x2x1x16"


# ----------------------------------------------------------------------------- malformed files
MALFORMED = [
    ("unknown model", {"model": "llama-9-1t"}, "field 'model'", "unknown model"),
    ("impossible layout: product", {"parallel.dp": 32}, "field 'parallel'", "must equal the cluster's 64 GPUs"),
    ("impossible layout: tp vs heads", {"parallel": {"tp": 8, "dp": 8, "data_parallel": "fsdp"},
                                        "model": {"name": "m", "hidden": 1200, "ffn_hidden": 4800, "heads": 12,
                                                  "layers": 4, "vocab": 1000, "seq_len": 1024}},
     "field 'parallel'", "tp=8 must divide"),
    ("impossible layout: batch", {"batch.global_batch": 100}, "field 'batch'", "multiple of dp x micro_batch"),
    ("impossible layout: hsdp", {"parallel.dp_replicate": 3}, "field 'parallel.dp_replicate'", "must divide dp=64"),
    ("impossible layout: cp", {"parallel.cp": 2}, "field 'parallel'", "must equal the cluster's 64 GPUs"),
    ("missing measurement", {"measured": {"flop_rule": "palm"}}, "field 'measured'", "missing measurement"),
    ("missing measured section", {"measured": None}, "field 'measured'", "missing"),
    ("two measurements", {"measured": {"step_time_s": 20.0, "tokens_per_s": 5.0}}, "field 'measured'", "exactly one"),
    ("wrong units: TFLOP/s given in FLOP/s", {"measured": {"tflops_per_gpu": 1.5e14, "flop_rule": "palm"}},
     "field 'measured.tflops_per_gpu'", "wrong units"),
    ("wrong units: step time in ms", {"measured": {"step_time_s": 24749.0}}, "field 'measured.step_time_s'", "wrong units"),
    ("wrong units: tokens/s of the job as per GPU", {"measured": {"tokens_per_s_per_gpu": 331 * 64 * 100}},
     "field 'measured.tokens_per_s_per_gpu'", "wrong units"),
    ("wrong units: MFU in percent", {"measured": {"mfu": 51.7, "flop_rule": "palm", "peak_tflops": 312}},
     "field 'measured.mfu'", "fraction"),
    ("wrong units: text", {"measured": {"step_time_s": "24 s"}}, "field 'measured.step_time_s'", "expected a number"),
    ("no FLOP rule", {"measured": {"tflops_per_gpu": 150}}, "field 'measured.flop_rule'", "needs the FLOP rule"),
    ("unknown FLOP rule", {"measured": {"tflops_per_gpu": 150, "flop_rule": "mine"}}, "field 'measured.flop_rule'",
     "unknown FLOP rule"),
    ("unknown run field", {"gpus_total": 64}, "field 'gpus_total'", "unknown field"),
    ("unknown parallel field", {"parallel.zero_stage": 3}, "field 'parallel.zero_stage'", "unknown field"),
    ("unknown batch field", {"batch.tokens": 5}, "field 'batch.tokens'", "unknown field"),
    ("unknown measured field", {"measured.tflops": 5}, "field 'measured.tflops'", "unknown field"),
    ("unknown knob", {"knobs": {"prefetch": 2}}, "field 'knobs'", "unknown field"),
    ("wrong type", {"parallel.dp": "64"}, "field 'parallel.dp'", "expected int"),
    ("unknown framework", {"framework": "jax"}, "field 'framework'", "unknown framework profile"),
    ("bad subset", {"subset": "train"}, "field 'subset'", "must be one of"),
    ("missing source", {"source": None}, "field 'source'", "missing"),
    ("unknown cluster", {"cluster": "dgx-z9"}, "field 'cluster'", "unknown cluster 'dgx-z9'"),
]


@pytest.mark.parametrize("label,changes,field,words", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_run_names_run_and_field(tmp_path, label, changes, field, words):
    p = bad(tmp_path, **changes)
    with pytest.raises(ConfigError) as ei:
        load_runs(p)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(str(p))
    assert "run 'tt-70b' (#2)" in msg, msg
    assert field in msg, msg
    assert words in msg, msg


def test_duplicate_names_and_file_level_problems(tmp_path):
    with pytest.raises(ConfigError, match=r"run 'tt-70b' \(#2\): field 'name': duplicate of run #1"):
        load_runs(write_runs(tmp_path, [GOOD_RUN, GOOD_RUN]))
    with pytest.raises(ConfigError, match="unknown top-level field 'cases'"):
        load_runs(write_runs(tmp_path, [GOOD_RUN], cases=[]))
    with pytest.raises(ConfigError, match="field 'runs': expected a non-empty list"):
        load_runs(write_runs(tmp_path, []))
    p = tmp_path / "broken.yaml"
    p.write_text("runs: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_runs(p)


def test_added_catalog_models_reproduce_published_sizes():
    """Llama-2-7B / 13B (added for the IBM and torchtitan runs): HF config shapes give the
    published 6.74B and 13.0B parameters."""
    from ccoverlap.catalog.models import get_model

    assert get_model("Llama-2-7B").param_count().total == 6_738_415_616
    assert get_model("llama2-13b").param_count().total == pytest.approx(13.016e9, rel=1e-3)


def test_cluster_by_gpu_name_and_changes(tmp_path):
    """The interface's short form {gpu, nodes, gpus_per_node} starts from the GPU's default
    cluster; {base, gpu/inter changes} changes a catalog cluster; a bad change names its field."""
    run = copy.deepcopy(GOOD_RUN)
    run.pop("nodes")
    run["cluster"] = {"gpu": "a100", "nodes": 8, "gpus_per_node": 8}
    (r,) = load_runs(write_runs(tmp_path, [run])).runs
    assert r.gpus == 64 and r.gpu_name == "A100-80GB-SXM" and r.cluster.inter.fabric == "infiniband"
    run["cluster"] = {"base": "dgx-a100", "nodes": 8, "inter": {"fabric": "roce", "bandwidth_bytes_per_s": 50e9}}
    (r,) = load_runs(write_runs(tmp_path, [run])).runs
    assert r.cluster.inter.fabric == "roce" and r.cluster.inter.bandwidth_bytes_per_s == 50e9
    run["cluster"] = {"base": "dgx-a100", "nodes": 8, "inter": {"speed": 5}}
    with pytest.raises(ConfigError, match=r"field 'cluster.inter.speed': unknown field"):
        load_runs(write_runs(tmp_path, [run]))


def test_sensitivity_file_varies_published_runs():
    """benchmarks/published_sensitivity.yaml: every run is a published run with one unstated
    assumption changed, says which first, and is never in a fit subset."""
    sens = load_runs(PUBLISHED.parents[3] / "benchmarks" / "published_sensitivity.yaml").runs
    pub = {r.name: r for r in load_runs(PUBLISHED).runs}
    assert sens
    for r in sens:
        base = pub[r.name.split(" [")[0]]
        assert r.assumptions[0].startswith("SENSITIVITY VARIANT: ")
        assert r.subset is None
        assert r.measured_step_time_s == pytest.approx(base.measured_step_time_s)
        assert (r.parallel, r.batch, r.knobs) != (base.parallel, base.batch, base.knobs)
        # a variant states every knob its published run states (facts such as Megatron's bucket)
        assert set(base.knobs) <= set(r.knobs), (r.name, sorted(set(base.knobs) - set(r.knobs)))
