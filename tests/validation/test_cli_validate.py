"""`ccoverlap validate` end to end on small runs files (runs with fields every build has), the
per-run problem path, the one-line exit-2 errors, and `--fit` on a declared subset writing a
calibration file that `plan --calibration` reads."""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml

from ccoverlap.cli import main
from ccoverlap.cost.params import CostParams

RUN_A = {  # torchtitan Llama 3 70B on 64 A100 (fast to simulate)
    "name": "tt-llama3-70b",
    "source": "[TT24A] torchtitan docs/performance.md @1ea476e9f, row 70B: WPS 331",
    "assumptions": ["DGX-A100-like network"],
    "model": "Llama-3-70B", "cluster": "dgx-a100", "nodes": 8,
    "parallel": {"dp": 64, "data_parallel": "fsdp", "recompute": "full"},
    "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 8192},
    "knobs": {"fsdp_prefetch": 1}, "framework": "torchtitan",
    "measured": {"tokens_per_s_per_gpu": 331}, "subset": "fit",
}
RUN_B = dict(copy.deepcopy(RUN_A), name="tt-llama2-70b", model="Llama-2-70B",
             batch={"global_batch": 128, "micro_batch": 2, "seq_len": 4096},
             measured={"tokens_per_s_per_gpu": 353}, subset="held-out")


def write(tmp_path, runs, name="runs.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump({"runs": runs}, sort_keys=False))
    return p


def test_table_json_and_details(tmp_path, capsys):
    p = write(tmp_path, [RUN_A, RUN_B])
    assert main(["validate", str(p), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parameters"] == "defaults (nothing fitted)"
    rows = {r["name"]: r for r in out["runs"]}
    a = rows["tt-llama3-70b"]
    assert a["measured_step_time_s"] == pytest.approx(64 * 8192 / (64 * 331))
    assert a["predicted_step_time_s"] > 0
    assert a["error_pct"] == pytest.approx((a["predicted_step_time_s"] / a["measured_step_time_s"] - 1) * 100)
    assert 0 < a["compute_s"] <= a["predicted_step_time_s"] * 1.0001
    assert 0 <= a["exposed_comm_s"] <= a["comm_s"] + 1e-12
    errs = [r["error_pct"] for r in out["runs"]]
    s = out["summary"]
    assert s["runs_predicted"] == 2
    assert s["mean_abs_error_pct"] == pytest.approx(sum(map(abs, errs)) / 2)
    assert s["mean_signed_error_pct"] == pytest.approx(sum(errs) / 2)
    assert abs(s["worst_error_pct"]) == pytest.approx(max(map(abs, errs)))
    assert set(out["subsets"]) == {"fit", "held-out"}

    assert main(["validate", str(p), "--details", "--markdown"]) == 0
    cap = capsys.readouterr()
    assert "| tt-llama3-70b | A100-80GB-SXM | 64 | 1x1x1x64 | fit |" in cap.out
    assert "mean |error|" in cap.out and "worst" in cap.out
    assert "source: [TT24A]" in cap.out and "assumption: DGX-A100-like network" in cap.out
    assert "[1/2] tt-llama3-70b" in cap.err  # progress goes to stderr, not into the table

    assert main(["validate", str(p), "--run", "tt-llama2-70b", "--json", "--quiet"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["tt-llama2-70b"]


def test_unpredictable_run_is_reported_and_others_still_validated(tmp_path, capsys, monkeypatch):
    from ccoverlap.validation import compare, predict

    real = predict.workload_for

    def fake(run, **kw):
        if run.name == "tt-llama2-70b":
            raise predict.Unsupported("parallel.cp=2 is not supported by this build of ccoverlap")
        return real(run, **kw)

    monkeypatch.setattr(compare, "workload_for", fake)
    p = write(tmp_path, [RUN_A, RUN_B])
    assert main(["validate", str(p), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "1 run(s) not predicted" in out and "tt-llama2-70b: not supported by this build" in out
    assert "over 1 of 2 runs" in out

    monkeypatch.setattr(compare, "workload_for", lambda run, **kw: (_ for _ in ()).throw(
        predict.Unsupported("parallel.fp8=True is not supported")))
    assert main(["validate", str(p), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no run of" in err and "could be predicted" in err and "Traceback" not in err


@pytest.mark.parametrize("argv_tail,words", [
    (["--fit", "gemm_tile_m", "--fit-on", "fit"], "'gemm_tile_m' is not a physical efficiency or overhead"),
    (["--fit", "gemm_peak_fractoin", "--fit-on", "fit"], "unknown cost parameter 'gemm_peak_fractoin'"),
    (["--fit", "gemm_peak_fraction"], "--fit and --fit-on go together"),
    (["--fit", "gemm_peak_fraction", "--fit-on", "train"], "--fit-on must be one of"),
    (["--run", "nope"], "no run named 'nope'"),
])
def test_bad_arguments_exit_2_one_line(tmp_path, capsys, argv_tail, words):
    p = write(tmp_path, [RUN_A, RUN_B])
    assert main(["validate", str(p), "--quiet", *argv_tail]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err and "Traceback" not in err


@pytest.mark.parametrize("change,words", [
    ({"model": "gpt-7"}, "field 'model'"),
    ({"parallel": {"dp": 32, "data_parallel": "fsdp"}}, "field 'parallel'"),
    ({"measured": {"flop_rule": "palm"}}, "missing measurement"),
    ({"measured": {"tokens_per_s_per_gpu": 331e6}}, "wrong units"),
    ({"gpu_count": 64}, "field 'gpu_count': unknown field"),
])
def test_malformed_run_is_listed_naming_run_and_field_and_the_others_validated(tmp_path, capsys, change, words):
    p = write(tmp_path, [RUN_A, dict(copy.deepcopy(RUN_B), **change)])
    assert main(["validate", str(p), "--quiet"]) == 0
    cap = capsys.readouterr()
    assert cap.err == ""
    assert "1 run(s) of the file not read" in cap.out and "tt-llama3-70b" in cap.out
    (line,) = [x for x in cap.out.splitlines() if "run 'tt-llama2-70b' (#2)" in x]
    assert words in line
    # with no good run left: exit 2 and one line naming the run and field
    assert main(["validate", str(write(tmp_path, [dict(copy.deepcopy(RUN_B), **change)])), "--quiet"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert "\n" not in err and "Traceback" not in err and cap.out == ""
    assert err.startswith("ccoverlap validate: error: ") and "run 'tt-llama2-70b' (#1)" in err and words in err


def test_fit_on_declared_subset_writes_calibration_plan_reads(tmp_path, capsys):
    p = write(tmp_path, [RUN_A, RUN_B])
    cal = tmp_path / "cal.json"
    assert main(["validate", str(p), "--fit", "gemm_peak_fraction", "--fit-on", "fit",
                 "--write-calibration", str(cal), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    fit = out["fit"]
    v = fit["values"]["A100-80GB-SXM"]["gemm_peak_fraction"]
    assert 0.05 <= v <= 1.0
    assert fit["loss_after"]["A100-80GB-SXM"] <= fit["loss_before"]["A100-80GB-SXM"]
    rows = {r["name"]: r for r in out["runs"]}
    assert out["subsets"]["fit (fitted on)"]["runs_predicted"] == 1
    assert out["subsets"]["held out (every other run)"]["mean_abs_error_pct"] == pytest.approx(
        abs(rows["tt-llama2-70b"]["error_pct"]))
    # the calibration file is what plan/simulate --calibration read: the GPU's defaults + the fit
    params = CostParams.load(cal)
    assert params.gemm_peak_fraction == pytest.approx(v)
    assert json.loads(cal.read_text())["gpu"] == "A100-80GB-SXM"
    # the fitted prediction of the fit run is what validate --calibration reproduces
    assert main(["validate", str(p), "--calibration", str(cal), "--run", "tt-llama3-70b", "--json", "--quiet"]) == 0
    again = json.loads(capsys.readouterr().out)["runs"][0]
    assert again["predicted_step_time_s"] == pytest.approx(rows["tt-llama3-70b"]["predicted_step_time_s"])
    assert main(["simulate", "--model", "llama-3-70b", "--cluster", "dgx-a100", "--nodes", "8", "--dp", "64",
                 "--data-parallel", "fsdp", "--recompute", "full", "--global-batch", "64", "--seq-len", "8192",
                 "--calibration", str(cal), "--out", str(tmp_path / "sim"), "--json", "--framework", "torchtitan"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert math.isclose(sim["step_time_s"], again["predicted_step_time_s"], rel_tol=0.02)


def test_fit_optimizer_recovers_a_known_minimum():
    from ccoverlap.validation.fit import fit_params

    class R:
        def __init__(self, gpu):
            self.gpu_name = gpu
            from types import SimpleNamespace

            from ccoverlap.catalog.hardware import get_gpu
            self.cluster = SimpleNamespace(gpu=get_gpu(gpu))

    target = {"H100-SXM": 0.61, "A100-80GB-SXM": 0.74}

    def loss(group, ov):
        t = target[group[0].gpu_name]
        return (ov["gemm_peak_fraction"] - t) ** 2 + (ov["kernel_launch_overhead_s"] - 7e-6) ** 2 * 1e8

    res = fit_params([R("H100-SXM"), R("A100-80GB-SXM")], ["gemm_peak_fraction", "kernel_launch_overhead_s"],
                     loss_fn=loss, rounds=3, iters=14)
    for gpu, t in target.items():
        assert res.values[gpu]["gemm_peak_fraction"] == pytest.approx(t, abs=0.01)
        assert res.values[gpu]["kernel_launch_overhead_s"] == pytest.approx(7e-6, abs=0.5e-6)
        assert res.loss_after[gpu] < res.loss_before[gpu]


def test_cached_step_resimulated_with_new_params_equals_a_fresh_build(tmp_path):
    """The fit re-simulates a cached step graph: it must give what building afresh gives."""
    from ccoverlap.validation.predict import cost_params_for, predict_run
    from ccoverlap.validation.reader import load_runs

    (run,) = load_runs(write(tmp_path, [RUN_A])).runs
    cache: dict = {}
    slow = cost_params_for(run, {"gemm_peak_fraction": 0.5})
    first = predict_run(run, step_cache=cache)
    again = predict_run(run, params=slow, step_cache=cache)
    assert run.name in cache
    assert again.step_time_s == pytest.approx(predict_run(run, params=slow).step_time_s, rel=1e-12)
    assert predict_run(run, step_cache=cache).step_time_s == pytest.approx(first.step_time_s, rel=1e-12)
    assert again.step_time_s > first.step_time_s


def test_summary_by_group_matches_each_groups_rows(tmp_path, capsys):
    """Runs that declare a ``group`` get one summary line per group (JSON ``groups``), computed
    from that group's rows only; a runs file with a single group prints no group block."""
    a = dict(copy.deepcopy(RUN_A), group="torchtitan (A100)")
    b = dict(copy.deepcopy(RUN_B), group="other stack")
    c = dict(copy.deepcopy(RUN_A), name="tt-llama3-70b-again", group="torchtitan (A100)",
             measured={"tokens_per_s_per_gpu": 300}, subset="held-out")
    p = write(tmp_path, [a, b, c])
    assert main(["validate", str(p), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    err = {r["name"]: r["error_pct"] for r in out["runs"]}
    g = out["groups"]
    assert list(g) == ["torchtitan (A100)", "other stack"]
    tt = [err["tt-llama3-70b"], err["tt-llama3-70b-again"]]
    assert g["torchtitan (A100)"]["runs_predicted"] == 2
    assert g["torchtitan (A100)"]["mean_signed_error_pct"] == pytest.approx(sum(tt) / 2)
    assert g["torchtitan (A100)"]["mean_abs_error_pct"] == pytest.approx(sum(map(abs, tt)) / 2)
    assert g["other stack"]["mean_signed_error_pct"] == pytest.approx(err["tt-llama2-70b"])
    # the same run measured at a lower throughput is a slower measured step, so the (same)
    # prediction is relatively faster: a more negative signed error
    assert err["tt-llama3-70b-again"] < err["tt-llama3-70b"]

    assert main(["validate", str(p), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "by group" in text
    assert f"torchtitan (A100): mean |error| {g['torchtitan (A100)']['mean_abs_error_pct']:.1f}%" in text

    p1 = write(tmp_path, [a, c], name="one-group.yaml")
    assert main(["validate", str(p1), "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["groups"] == {}
    assert main(["validate", str(p1), "--quiet"]) == 0
    assert "by group" not in capsys.readouterr().out


def test_memory_summary_compares_the_stated_peaks_only(tmp_path, capsys):
    """Runs that state a measured peak (``memory_gib``) get the predicted peak's error per run
    and a summary over those runs only (JSON ``memory_summary``, a text block); a file where no
    run states one prints neither."""
    a = dict(copy.deepcopy(RUN_A), measured={"tokens_per_s_per_gpu": 331, "memory_gib": 60.0})
    b = dict(copy.deepcopy(RUN_B), measured={"tokens_per_s_per_gpu": 353, "memory_gib": 40.0})
    c = dict(copy.deepcopy(RUN_A), name="no-memory")
    p = write(tmp_path, [a, b, c])
    assert main(["validate", str(p), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in out["runs"]}
    errs = []
    for name, gib in (("tt-llama3-70b", 60.0), ("tt-llama2-70b", 40.0)):
        want = (rows[name]["predicted_peak_memory_gib"] / gib - 1) * 100
        assert rows[name]["memory_error_pct"] == pytest.approx(want)
        errs.append(want)
    assert rows["no-memory"]["memory_error_pct"] is None
    m = out["memory_summary"]
    assert (m["runs_predicted"], m["runs"]) == (2, 2)
    assert m["mean_signed_error_pct"] == pytest.approx(sum(errs) / 2)
    assert m["mean_abs_error_pct"] == pytest.approx(sum(map(abs, errs)) / 2)

    assert main(["validate", str(p), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "peak memory per GPU" in text and f"memory: mean |error| {m['mean_abs_error_pct']:.1f}%" in text

    p1 = write(tmp_path, [c], name="none.yaml")
    assert main(["validate", str(p1), "--json", "--quiet"]) == 0
    assert "memory_summary" not in json.loads(capsys.readouterr().out)
    assert main(["validate", str(p1), "--quiet"]) == 0
    assert "peak memory per GPU" not in capsys.readouterr().out
