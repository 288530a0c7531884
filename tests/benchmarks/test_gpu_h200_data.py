"""The measurements committed from an H200 (calibrations/h200.json, benchmarks/data/gpu-h200/):
the calibration file is valid, says where and when it was measured, and its parameters are what
the fit gives from its own measurements; the committed layer trace and contention records read
back through the scripts that made the docs tables."""

from __future__ import annotations

import json

import pytest
from bench_scripts import ROOT, load_script

from ccoverlap.calibrate import fileformat
from ccoverlap.cli import main
from ccoverlap.cost.params import CostParams

CAL = ROOT / "calibrations" / "h200.json"
DATA = ROOT / "benchmarks" / "data" / "gpu-h200"


def test_the_calibration_names_its_machine_and_date_and_holds_every_section():
    doc = fileformat.read(CAL)
    src = doc["source"]
    assert doc["gpu"] == "H200" and src["device"]["name"] == "NVIDIA H200" and src["created"].startswith("2026-11-26")
    kinds = {r["kind"] for r in src["measurements"]}
    assert kinds == {"gemm", "gemm_split", "copy", "channel_copy", "sm_contention", "ce_contention", "sustained"}
    assert all(r.get("timing") == "graph" for r in src["measurements"] if r["kind"] == "gemm")
    assert CostParams.load(CAL).sustained_clock_fraction == pytest.approx(doc["params"]["sustained_clock_fraction"])


def test_its_parameters_are_what_the_fit_gives_from_its_own_measurements(tmp_path, capsys):
    out = tmp_path / "refit.json"
    assert main(["calibrate", "--refit", str(CAL), "--out", str(out), "--quiet", "--json"]) == 0
    capsys.readouterr()
    committed, refit = fileformat.read(CAL)["params"], fileformat.read(out)["params"]
    assert committed.keys() == refit.keys()
    for name, value in committed.items():
        assert refit[name] == pytest.approx(value, rel=1e-6), name


def test_the_layer_trace_reads_back_with_every_op_of_the_table(tmp_path):
    lvs = load_script("layer_vs_sim")
    assert lvs.main([str(DATA / "layer"), "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "layer_vs_sim.json").read_text())
    assert doc["device"] == "NVIDIA H200" and doc["steps"] == [1, 2, 3]
    ops = {(r["op"], r["pass"]) for r in doc["comparison"]["rows"]}
    for lin in ("qkv", "out_proj", "gate_up", "down"):
        assert {(lin, "fwd"), (lin, "dgrad"), (lin, "wgrad")} <= ops
    assert {("attention", "fwd"), ("attention", "bwd"), ("other", "fwd"), ("other", "bwd")} <= ops


def test_the_contention_table_has_the_whole_nc_by_c_grid_and_the_copy_engine_rows():
    ct = load_script("contention_table")
    data = fileformat.read(CAL)
    from ccoverlap.catalog.hardware import get_gpu

    rows = ct.rows(data["source"]["measurements"], get_gpu("H200"), CostParams.load(CAL), "gemm")
    grid = {(r["nc"], r["chunk_bytes"]) for r in rows if r["engine"] == "sm" and r["nt"] == 512}
    assert grid == {(nc, c << 10) for nc in (1, 2, 4, 8, 16, 32, 64, 128) for c in (16, 64, 256, 1024, 4096)}
    chunks = sorted(r["chunk_bytes"] for r in rows if r["engine"] == "ce" and r["chunk_bytes"])
    assert chunks == [64 << 10, 256 << 10, 1 << 20, 4 << 20]
