"""``ccoverlap calibrate``: one line and exit 2 without CUDA; ``--refit`` redoes the fit from a
file's measurements without a GPU and writes a file the planner loads."""

import json
import os
import subprocess
import sys

import calibrate_synth as synth
import pytest

from ccoverlap.calibrate import fileformat
from ccoverlap.cli import main
from ccoverlap.commands.calibrate import slug
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.errors import ConfigError


def test_without_cuda_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU even where there is one
    out = subprocess.run([sys.executable, "-m", "ccoverlap", "calibrate", "--out", str(tmp_path / "c.json")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("ccoverlap calibrate: error: no CUDA GPU available")
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "c.json").exists()


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for opt in ("--out", "--quick", "--device", "--gpu", "--kernel", "--refit", "--sections", "--add"):
        assert opt in text


@pytest.mark.parametrize("name,expected", [("H100-SXM", "h100-sxm"), ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
                                           ("  ", "gpu")])
def test_slug(name, expected):
    assert slug(name) == expected


@pytest.fixture(scope="module")
def measured_file(tmp_path_factory, gpu, truth):
    """A calibration file holding only measurements (as written before the fit): GEMMs and copies."""
    records = [r for r in synth.records(gpu, truth, noise=0.02, seed=5, quick=True) if r["kind"] in ("gemm", "copy")]
    data = fileformat.build(gpu=gpu.name, params={}, fit_error=None, notes=["fit not done yet"],
                            device={"name": "synthetic"}, settings={"measurement_notes": ["synthetic data"]},
                            fit={}, heldout=[], train=[], decomposition=[], measurements=records,
                            created="2026-01-01T00:00:00Z", tool="test")
    return fileformat.write(tmp_path_factory.mktemp("cal") / "measured.json", data)


def test_refit_writes_a_file_the_planner_loads(tmp_path, measured_file, gpu, capsys):
    out = tmp_path / "fitted.json"
    assert main(["calibrate", "--refit", str(measured_file), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "model error on held-out measurements" in text and "gemm" in text
    assert f"ccoverlap plan --calibration {out}" in text
    data = fileformat.read(out)
    assert data["params"]["gemm_peak_fraction"] == pytest.approx(synth.TRUE["gemm_peak_fraction"], rel=0.05)
    assert data["fit_error"] is not None and data["fit_error"] < 0.05
    assert data["source"]["settings"]["refit_of"] == str(measured_file)
    assert "synthetic data" in data["notes"]
    assert any("sm_contention" in n and "too few" in n for n in data["notes"])
    assert data["source"]["measurements"] == json.loads(measured_file.read_text())["source"]["measurements"]
    loaded = CostParams.load(out, base=default_params(gpu))
    assert loaded.gemm_peak_fraction == data["params"]["gemm_peak_fraction"]


def test_refit_of_a_broken_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "gpu": "H100-SXM", "params": {"gemm_peak_fraction": "x"}}))
    assert main(["calibrate", "--refit", str(bad), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ccoverlap calibrate: error: {bad}: field 'params.gemm_peak_fraction': "
                   "expected a finite number, got 'x'"]


def test_refit_without_measurements_says_so(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"version": 1, "gpu": "H100-SXM", "params": {}}))
    assert main(["calibrate", "--refit", str(empty)]) == 2
    assert "no measurements to fit" in capsys.readouterr().err


@pytest.mark.parametrize("width", [80, 60])
def test_refit_report_reads_whole_in_a_narrow_terminal(tmp_path, measured_file, width, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["calibrate", "--refit", str(measured_file), "--out", str(tmp_path / "f.json"), "--quiet"]) == 0
    text = capsys.readouterr().out
    data = fileformat.read(tmp_path / "f.json")
    assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
    rows = [line.replace("│", " ").split() for line in text.splitlines()]
    for name, value in data["params"].items():  # each parameter whole on its row, with its fitted value
        assert any(r[:1] == [name] and f"{value:.4g}" in r for r in rows), name
    for row in data["source"]["heldout"]:
        assert any(r[:2] == [row["group"], str(row["n"])] for r in rows), row


def test_a_run_cut_short_keeps_the_sections_it_measured_and_refits_them(tmp_path, gpu, truth, monkeypatch, capsys):
    """Each finished section is written at once: a run stopped in a later section (a time limit)
    leaves a file with the earlier measurements, which ``--refit`` fits without a GPU."""
    from ccoverlap.calibrate import suite
    from ccoverlap.commands import calibrate as cmd

    gemms = _fake_gpu(monkeypatch, gpu, truth)

    def cut(bench, notes):
        raise KeyboardInterrupt  # what a time limit's signal does to the run

    monkeypatch.setattr(suite, "split_section", cut)
    out = tmp_path / "cut.json"
    assert main(["calibrate", "--quick", "--out", str(out), "--quiet"]) == 130
    kept = fileformat.read(out)
    assert kept["source"]["measurements"] == gemms
    assert kept["params"] == {} and kept["source"]["settings"]["partial"] is True
    assert any("had not finished" in n for n in kept["notes"])
    refit = tmp_path / "refit.json"
    assert cmd.run(cmd_args(refit=str(out), out=str(refit))) == 0
    assert fileformat.read(refit)["params"], "the GEMM measurements alone give fitted parameters"
    capsys.readouterr()


def _fake_gpu(monkeypatch, gpu, truth) -> list[dict]:
    """A stand-in CUDA device whose GEMM section returns synthetic records (returned too);
    the other sections are the real ones unless a test replaces them."""
    pytest.importorskip("torch")
    import torch

    from ccoverlap.calibrate import microbench, suite

    gemms = [r for r in synth.records(gpu, truth, noise=0.02, seed=3, quick=True) if r["kind"] == "gemm"]
    monkeypatch.setattr(microbench, "require_cuda", lambda device: "cuda:0")
    monkeypatch.setattr(microbench, "device_info", lambda dev: {
        "name": "NVIDIA H100 80GB HBM3", "catalog_gpu": gpu.name, "sms": gpu.sms, "driver": "test",
        "torch": "test", "cuda": "test"})
    monkeypatch.setattr(suite.mb, "Bench", lambda dev, grid, log: None)
    monkeypatch.setattr(suite, "gemm_section", lambda bench, notes: list(gemms))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (80e9, 80e9))
    return gemms


def test_sections_measures_only_those(tmp_path, gpu, truth, monkeypatch, capsys):
    from ccoverlap.calibrate import suite

    gemms = _fake_gpu(monkeypatch, gpu, truth)

    def never(*a):
        raise AssertionError("a section that was not asked for ran")

    for name in ("split_section", "copy_section", "contention_sections", "sustained_section"):
        monkeypatch.setattr(suite, name, never)
    out = tmp_path / "gemm.json"
    assert main(["calibrate", "--sections", "gemm", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    doc = fileformat.read(out)
    assert doc["source"]["measurements"] == gemms and doc["source"]["settings"]["sections"] == ["gemm"]


def cmd_args(**kw):
    import argparse

    base = dict(out=None, quick=False, device=None, gpu=None, kernel="auto", refit=None, json=False, quiet=True,
                sections="gemm,split,copy,contention,sustained", add=[])
    return argparse.Namespace(**{**base, **kw})


def test_sections_are_checked_and_kept_in_measuring_order():
    from ccoverlap.commands.calibrate import parse_sections

    assert parse_sections("sustained, gemm") == ("gemm", "sustained")
    with pytest.raises(ConfigError, match=r"unknown section 'contentions' \(did you mean 'contention'\?\)"):
        parse_sections("gemm,contentions")
    with pytest.raises(ConfigError, match="name at least one"):
        parse_sections(" , ")


def _file(tmp_path, name, gpu, records):
    data = fileformat.build(gpu=gpu, params={}, fit_error=None, notes=["fit not done yet"], device={"name": "synthetic"},
                            settings={}, fit={}, heldout=[], train=[], decomposition=[], measurements=records,
                            created="2026-01-01T00:00:00Z", tool="test")
    return fileformat.write(tmp_path / name, data)


def test_a_plan_measured_in_parts_is_fitted_together_with_add(tmp_path, gpu, truth, capsys):
    """Two files, each of some sections (as two short GPU slots would write them), fitted as one:
    every measurement of both is in the result, the shared ones once, and the file says so."""
    recs = synth.records(gpu, truth, noise=0.02, seed=7, quick=True)
    gemm = [r for r in recs if r["kind"] in ("gemm", "copy")]
    contention = [r for r in recs if r["kind"] in ("sm_contention", "ce_contention", "channel_copy")]
    a = _file(tmp_path, "a.json", gpu.name, gemm)
    b = _file(tmp_path, "b.json", gpu.name, contention + gemm[:3])  # 3 measured in both: a's are kept
    out = tmp_path / "both.json"
    assert main(["calibrate", "--refit", str(a), "--add", str(b), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    doc = fileformat.read(out)
    assert len(doc["source"]["measurements"]) == len(gemm) + len(contention)
    assert doc["source"]["settings"]["added_from"] == [str(b)]
    assert f"{len(contention)} measurements added from {b}" in doc["notes"]
    assert "comm_hbm_bytes_per_wire_byte" in doc["params"]  # a contention parameter: fitted from b's part


def test_adding_another_gpus_file_is_one_line_and_exit_2(tmp_path, gpu, truth, capsys):
    recs = [r for r in synth.records(gpu, truth, noise=0.02, seed=7, quick=True) if r["kind"] == "gemm"]
    a = _file(tmp_path, "a.json", gpu.name, recs)
    other = _file(tmp_path, "other.json", "A40", recs)
    assert main(["calibrate", "--refit", str(a), "--add", str(other), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured as GPU 'A40'" in err and not (tmp_path / "x.json").exists()
