"""What the commands write and echo: plans of models with collectives over 4 GiB, a failing
``--emit`` that keeps the plan and the user's files, output paths checked before the work,
``--png-step`` / ``--groups`` that match nothing, huge flag values and paths shortened in one
error line, ``validate --run`` with the closest name, NumPy scalars in the API, and the
package metadata."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import ccoverlap as cc
from ccoverlap.cli import main
from ccoverlap.errors import ConfigError
from ccoverlap.nccl.apply import TunerRow, parse_tuner_csv, tuner_csv_text

ROOT = Path(__file__).resolve().parents[2]
TPDP = ROOT / "tests" / "fixtures" / "traces" / "gloo_tpdp_4rank"
#: A plan with all-gathers of about 4.2 GB (Llama-3 405B, FSDP over 128 H100s): over 2**32 bytes.
BIG = ["--model", "llama-3-405b", "--cluster", "dgx-h100", "--nodes", "16", "--dp", "128", "--data-parallel", "fsdp",
       "--global-batch", "128", "--micro-batch", "1", "--strategies", "lagom", "-q"]  # lagom: the row with tuner CSV rows


def _one_error_line(err: str, command: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    assert lines and lines[-1].startswith(f"ccoverlap {command}: error: "), err[-500:]
    return lines[-1]


# ----------------------------------------------------------------------------- > 4 GiB collectives

def test_tuner_rows_reach_the_plugins_size_t_bound():
    big = TunerRow("allgather", 4202708992, 5176300548, "ring", "simple", 16, 16, 128)
    top = TunerRow("allgather", 0, 2**64 - 1, "ring", "simple", -1)
    assert parse_tuner_csv(tuner_csv_text([big, top])) == [big, top]
    with pytest.raises(ConfigError, match="max_bytes <= 18446744073709551615"):
        TunerRow("allgather", 0, 2**64, "ring", "simple", -1)


def test_plan_with_a_collective_over_4_gib_plans_and_emits(tmp_path, capsys):
    emit = tmp_path / "emit"
    assert main(["plan", *BIG, "--out", str(tmp_path / "out"), "--emit", str(emit), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["strategies"][-1]["name"] == "applicable" and doc["emit_error"] is None
    rows = cc.planning.emit.read_emit(emit)["tuner_rows"]
    assert max(r.max_bytes for r in rows) > 2**32


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["--model", "gpt3-175b", "--cluster", "dgx-h100", "--nodes", "16", "--dp", "128", "--data-parallel", "fsdp",
     "--global-batch", "128", "--micro-batch", "1"],
    "fsdp16", "tp4-pp3-dp4"], ids=["gpt3-fsdp128", "centauri-large-30l-fsdp16", "centauri-large-30l-tp4pp3dp4"])
def test_the_reported_large_models_plan(argv, tmp_path, capsys):
    if isinstance(argv, str):  # Centauri's Large model (hidden 8192) with 30 layers on its cluster A
        parallel = ({"dp": 16, "data_parallel": "fsdp", "recompute": "selective"} if argv == "fsdp16" else
                    {"tp": 4, "pp": 3, "dp": 4, "sequence_parallel": True, "pp_schedule": "interleaved",
                     "virtual_stages": 2, "recompute": "selective"})
        nodes = 2 if argv == "fsdp16" else 6
        cfg = {"model": {"name": "llama-large-30l", "hidden": 8192, "ffn_hidden": 22016, "heads": 64, "kv_heads": 64,
                         "layers": 30, "vocab": 32000, "seq_len": 2048},
               "cluster": {"name": "centauri-cluster-a", "gpu": "A100-80GB-SXM", "nodes": nodes, "gpus_per_node": 8,
                           "intra": {"fabric": "nvswitch", "bandwidth_bytes_per_s": 300e9, "latency_s": 2e-6},
                           "inter": {"fabric": "infiniband", "bandwidth_bytes_per_s": 3.125e9, "latency_s": 5e-6}},
               "nodes": nodes, "parallel": parallel, "framework": "megatron-lm-2021",
               "batch": {"micro_batch": 8 if argv == "fsdp16" else 1, "global_batch": 128 if argv == "fsdp16" else 24,
                         "seq_len": 2048}}
        (tmp_path / "w.json").write_text(json.dumps(cfg))
        argv = ["--config", str(tmp_path / "w.json")]
    assert main(["plan", *argv, "-q", "--out", str(tmp_path / "out"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["applicable_error"] is None and doc["strategies"][-1]["name"] == "applicable"


# ----------------------------------------------------------------------------- a failing --emit

def _user_emit_dir(tmp_path: Path) -> Path:
    emit = tmp_path / "emit"
    emit.mkdir()
    (emit / "nccl.env").write_text("NCCL_MINE=1\n")
    return emit


def test_emit_that_cannot_be_built_keeps_the_plan_and_the_users_files(tmp_path, capsys, monkeypatch):
    import ccoverlap.planning.emit.files as files

    def broken(*a, **k):
        raise ConfigError("README: cannot be built")

    monkeypatch.setattr(files, "readme_text", broken)  # the last file built: every other one was ready
    emit = _user_emit_dir(tmp_path)
    code = main(["plan", *BIG, "--out", str(tmp_path / "out"), "--emit", str(emit)])
    out, err = capsys.readouterr()
    assert code == 2
    assert "as-given" in out and "best-knobs" in out and "applicable" in out  # the plan is printed
    line = _one_error_line(err, "plan")
    assert "--emit" in line and "README: cannot be built" in line and "left as it was" in line
    assert sorted(p.name for p in emit.iterdir()) == ["nccl.env"]
    assert (emit / "nccl.env").read_text() == "NCCL_MINE=1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emit", "out"]  # no temporary left beside it


def test_emit_that_cannot_be_moved_into_place_reports_it_in_json(tmp_path, capsys):
    emit = _user_emit_dir(tmp_path)
    (emit / "README.md").mkdir()  # a directory where a file goes: found before any file is replaced
    code = main(["plan", *BIG, "--out", str(tmp_path / "out"), "--emit", str(emit), "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 2 and doc["strategies"] and "README.md: is a directory" in doc["emit_error"]
    assert doc["emitted"] == {} and "files" in doc
    _one_error_line(err, "plan")
    assert (emit / "nccl.env").read_text() == "NCCL_MINE=1\n"
    assert sorted(p.name for p in emit.iterdir()) == ["README.md", "nccl.env"]


def test_tune_emit_failure_keeps_the_tables_and_the_users_files(tmp_path, capsys):
    emit = _user_emit_dir(tmp_path)
    (emit / "README.md").mkdir()
    assert main(["tune", "--emit", str(emit), "-q"]) == 2
    out, err = capsys.readouterr()
    assert "lagom" in out and "settings not written" in _one_error_line(err, "tune")
    assert (emit / "nccl.env").read_text() == "NCCL_MINE=1\n"
    assert sorted(p.name for p in emit.iterdir()) == ["README.md", "nccl.env"]


def test_applicable_row_that_cannot_be_built_leaves_the_plan(monkeypatch):
    import ccoverlap.planning.strategies as strategies

    def broken(*a, **k):
        raise ConfigError("tuner row: cannot be built")

    monkeypatch.setattr(strategies, "build_emit", broken)
    w = cc.Workload(model="llama-3-8b")
    result = strategies.plan(w, extra=["lagom"])
    assert [s.name for s in result.strategies][:3] == ["as-given", "no-overlap", "best-knobs"]
    assert result.applicable is None and result.stats["applicable_error"] == "tuner row: cannot be built"


# ----------------------------------------------------------------------------- output paths, before the work

def _cases(tmp_path: Path, unwritable: Path) -> list[list[str]]:
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    return [["simulate", "--out", str(afile)], ["plan", "--out", str(afile)],
            ["simulate", "--out", str(unwritable / "x")], ["plan", "--out", str(unwritable / "x")],
            ["simulate", "--out", str(tmp_path / "s"), "--png", str(unwritable / "x.png")],
            ["plan", "--out", str(tmp_path / "p"), "--png", str(unwritable / "x.png")],
            ["simulate", "--out", str(tmp_path / "s"), "--png", str(afile / "x.png")],
            ["simulate", "--out", str(tmp_path / "s"), "--png", str(tmp_path)]]


def test_unwritable_outputs_are_one_line_before_the_work(tmp_path, unwritable_dir, capsys, monkeypatch):
    import ccoverlap.commands.options as workload

    def no_work(*a, **k):
        raise AssertionError("the work started before the output paths were checked")

    cases = _cases(tmp_path, unwritable_dir)
    for argv in cases:  # each command's own name first: a module imported after the next line would keep no_work
        monkeypatch.setattr(f"ccoverlap.commands.{argv[0]}.workload_from_args", no_work)
    monkeypatch.setattr(workload, "workload_from_args", no_work)
    for argv in cases:
        assert main([*argv, "-q"]) == 2, argv
        line = _one_error_line(capsys.readouterr().err, argv[0])
        assert re.search(r"--(out|png) ", line), line
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_validate_checks_write_calibration_before_the_fit(unwritable_dir, capsys, monkeypatch):
    def no_fit(*a, **k):
        raise AssertionError("the fit started before --write-calibration was checked")

    monkeypatch.setattr("ccoverlap.commands.validate._fit", no_fit)
    monkeypatch.setattr("ccoverlap.commands.validate._predict_runs", no_fit)
    code = main(["validate", "published", "--fit", "sustained_clock_fraction", "--fit-on", "fit",
                 "--write-calibration", str(unwritable_dir / "c.json"), "-q"])
    assert code == 2
    assert "--write-calibration" in _one_error_line(capsys.readouterr().err, "validate")


def test_simulate_writes_its_traces_as_a_set(tmp_path, capsys):
    out = tmp_path / "sim"
    out.mkdir()
    (out / "rank-0.json").mkdir()  # cannot be replaced: nothing of the set is written
    assert main(["simulate", "--out", str(out), "-q"]) == 2
    _one_error_line(capsys.readouterr().err, "simulate")
    assert [p.name for p in out.iterdir()] == ["rank-0.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim"]


# ----------------------------------------------------------------------------- flags that match nothing

def test_png_step_that_was_not_analysed_is_an_error(tmp_path, capsys):
    code = main(["analyze", str(TPDP), "--png", str(tmp_path / "a.png"), "--png-step", "999", "-q"])
    line = _one_error_line(capsys.readouterr().err, "analyze")
    assert code == 2 and "--png-step 999" in line and "analysed steps are" in line
    assert not (tmp_path / "a.png").exists()


def test_groups_key_that_matches_no_group_is_an_error(tmp_path, capsys):
    groups = tmp_path / "g.json"
    groups.write_text(json.dumps({"mesh_tpp": "TP", "mesh_dp": "DP"}))
    assert main(["analyze", str(TPDP), "--groups", str(groups), "-q"]) == 2
    line = _one_error_line(capsys.readouterr().err, "analyze")
    assert "'mesh_tpp' matches no process group" in line and "did you mean 'mesh_tp'" in line and "'mesh_dp'" in line
    groups.write_text(json.dumps({"mesh_tp": "TP"}))
    assert main(["analyze", str(TPDP), "--groups", str(groups), "-q", "--json"]) == 0
    capsys.readouterr()
    with pytest.raises(ConfigError, match="did you mean 'mesh_tp'"):
        cc.analyze(TPDP, groups={"mesh_tpp": "TP"})


def test_validate_run_suggests_the_closest_name(capsys):
    from ccoverlap.validation.reader import load_runs, runs_path

    names = [r.name for r in load_runs(runs_path("published"), keep_going=True).runs]
    assert main(["validate", "published", "--run", names[0] + "x", "-q"]) == 2
    line = _one_error_line(capsys.readouterr().err, "validate")
    assert f"did you mean {names[0]!r}" in line and "runs:" in line


# ----------------------------------------------------------------------------- huge values and paths

HUGE = "9" * 5000
WORD = "x" * 5000
LONG_PATH = "/tmp/" + "a/" * 2100 + "w.yaml"


@pytest.mark.parametrize("argv", [
    ["plan", "--tp", HUGE], ["simulate", "--global-batch", HUGE], ["plan", "--dtype", WORD], ["list", WORD],
    ["plan", "--model", WORD], ["plan", "--target", WORD], ["plan", "--strategy", WORD], ["plan", "--cluster", WORD],
    ["plan", "--" + WORD], ["validate", "published", "--run", WORD], ["validate", "published", "--subset", WORD],
    ["analyze", "--steps", WORD, str(TPDP)], ["plan", "--config", LONG_PATH], ["plan", "--out", LONG_PATH],
    ["simulate", "--out", LONG_PATH], ["simulate", "--png", LONG_PATH],
    ["simulate", "--config", "/tmp/" + "b" * 300 + "/w.yaml"], ["plan", "--emit", WORD],
    ["replay", "--whatif", WORD, str(TPDP)], ["validate", "published", "--fit", WORD, "--fit-on", "fit"],
    ["validate", "published", "--fit", "sustained_clock_fraction", "--fit-on", WORD], ["tune", "--model", WORD],
    ["plan", "--strategies", WORD], ["analyze", str(TPDP), "--groups", WORD],
    ["reproduce", "--paper", "ficco", "--case", HUGE],
], ids=lambda a: " ".join(x[:12] for x in a))
def test_huge_values_are_echoed_short(argv, capsys):
    try:
        code = main([*argv, "-q"])
    except SystemExit as exc:  # a usage error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert len(last) <= 560, len(last)
    assert WORD[:200] not in err and HUGE[:200] not in err and LONG_PATH[:300] not in err


def test_the_cli_caps_any_error_line(capsys, monkeypatch):
    import ccoverlap.commands.listing as listing

    def loud(args):
        raise ConfigError("start " + "y" * 10_000 + "\nsecond line " + "z" * 100 + " end")

    monkeypatch.setattr(listing, "run", loud)
    parser_run = main(["list", "models"])
    line = _one_error_line(capsys.readouterr().err, "list")
    assert parser_run == 2 and len(line) <= 530 and "start" in line and line.endswith("end") and " ... " in line


# ----------------------------------------------------------------------------- NumPy scalars in the API

@pytest.mark.parametrize("kw", [{"tp": np.int64(2)}, {"global_batch": np.int32(16)}, {"nodes": np.int64(1)},
                                {"seq_len": np.int64(2048), "micro_batch": np.uint8(1)},
                                {"tp": np.int64(2), "sequence_parallel": np.bool_(True)},
                                {"parallel": {"tp": np.int16(2)}, "batch": {"global_batch": np.int64(8)}}])
def test_workload_takes_numpy_scalars(kw):
    plain = {k: (v.item() if isinstance(v, np.generic) else
                 {a: b.item() for a, b in v.items()} if isinstance(v, dict) else v) for k, v in kw.items()}
    assert cc.Workload(model="llama-3-8b", **kw).to_dict() == cc.Workload(model="llama-3-8b", **plain).to_dict()


def test_numpy_bool_is_still_refused_where_a_count_goes():
    with pytest.raises(ConfigError, match="tp must be an integer"):
        cc.Workload(model="llama-3-8b", tp=np.bool_(True))
    with pytest.raises(ConfigError, match="max_simulations must be an integer"):
        cc.search(model="llama-3-8b", max_simulations=np.float64(2.0))


# ----------------------------------------------------------------------------- package metadata

def test_pyproject_uses_the_spdx_licence_form():
    from ccoverlap.config import toml_module

    doc = toml_module().loads((ROOT / "pyproject.toml").read_text())
    assert doc["project"]["license"] == "Apache-2.0" and doc["project"]["license-files"] == ["LICENSE"]
    assert "setuptools>=77" in doc["build-system"]["requires"]
    assert not any("License ::" in c for c in doc["project"].get("classifiers", []))
