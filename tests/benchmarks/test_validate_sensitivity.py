"""benchmarks/validate_sensitivity.py: the per-group table of signed errors under one scaled
cost parameter (checked against `ccoverlap validate`'s own summaries) and its one-line errors."""

from __future__ import annotations

import copy
import os

import pytest
import yaml
from bench_scripts import BENCH, load_script

RUN = {"name": "a", "group": "g1", "source": "test", "assumptions": [], "model": "Llama-3-70B",
       "cluster": "dgx-a100", "nodes": 8, "parallel": {"dp": 64, "data_parallel": "fsdp", "recompute": "full"},
       "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 8192}, "knobs": {"fsdp_prefetch": 1},
       "framework": "torchtitan", "measured": {"tokens_per_s_per_gpu": 331}, "subset": "fit"}


def test_slower_gemms_raise_every_groups_signed_error_and_defaults_match_validate(tmp_path):
    from ccoverlap.validation.compare import compare_runs, summarize_groups
    from ccoverlap.validation.reader import load_runs

    b = dict(copy.deepcopy(RUN), name="b", group="g2", model="Llama-2-70B",
             batch={"global_batch": 128, "micro_batch": 2, "seq_len": 4096}, measured={"tokens_per_s_per_gpu": 353})
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump({"runs": [RUN, b]}))
    runs = load_runs(p).runs
    mod = load_script("validate_sensitivity")
    rows = dict(mod.table(runs, [("gemm_peak_fraction", 0.5)]))
    base, slow = rows["defaults"], rows["gemm_peak_fraction x0.5"]
    ref = summarize_groups(compare_runs(runs))
    for g in ("g1", "g2"):
        assert base[g].mean_signed_pct == pytest.approx(ref[g].mean_signed_pct)
        assert slow[g].mean_signed_pct > base[g].mean_signed_pct + 5  # half the GEMM rate: a much slower step


@pytest.mark.parametrize("item", ["gemm_peak_fraction", "nope=0.9", "gemm_peak_fraction=-1", "gemm_peak_fraction=x"])
def test_malformed_scaling_exits_with_one_line(item):
    with pytest.raises(SystemExit) as exc:
        load_script("validate_sensitivity").parse_scalings([item])
    assert "NAME=FACTOR" in str(exc.value) and item in str(exc.value)



def test_pair_increments_are_differences_of_validate_rows(tmp_path):
    from ccoverlap.validation.compare import compare_runs
    from ccoverlap.validation.reader import load_runs

    b = dict(copy.deepcopy(RUN), name="b", batch={"global_batch": 128, "micro_batch": 2, "seq_len": 8192},
             measured={"tokens_per_s_per_gpu": 320})
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump({"runs": [RUN, b]}))
    runs = load_runs(p).runs
    (r,) = load_script("run_pair_increments").increments(runs, [("a", "b")])
    ref = {x.run.name: x for x in compare_runs(runs)}
    assert r["measured_increment"] == pytest.approx(ref["b"].measured_s - ref["a"].measured_s)
    assert r["predicted_increment"] == pytest.approx(ref["b"].prediction.step_time_s - ref["a"].prediction.step_time_s)
    assert r["predicted_ratio"] == pytest.approx(ref["b"].prediction.step_time_s / ref["a"].prediction.step_time_s)
    # twice the local batch: the predicted step grows, by less than 2x plus the fixed costs
    assert 1.5 < r["predicted_ratio"] < 2.2


def test_pair_with_unknown_run_exits_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        load_script("run_pair_increments").main(["no-such-run:other"])
    assert "RUN_A:RUN_B" in str(exc.value) and "no-such-run:other" in str(exc.value)


def test_shipped_ac_pair_differs_only_in_recompute_and_costs_time():
    """benchmarks/torchtitan_ac_pair.yaml: the two published rows differ only in the AC policy
    (and the measurement); recomputing costs predicted time, less than a full forward."""
    from ccoverlap.validation.reader import load_runs

    runs = load_runs(os.path.join(BENCH, "torchtitan_ac_pair.yaml")).runs
    a, b = runs
    assert (a.parallel["recompute"], b.parallel["recompute"]) == ("none", "selective")
    assert {k: v for k, v in a.parallel.items() if k != "recompute"} == \
        {k: v for k, v in b.parallel.items() if k != "recompute"}
    assert (a.model, a.batch, a.framework, a.cluster) == (b.model, b.batch, b.framework, b.cluster)
    (r,) = load_script("run_pair_increments").increments(runs, [(a.name, b.name)])
    assert 1.0 < r["predicted_ratio"] < 1.34
