"""benchmarks/contention_table.py on a synthetic calibration file: one row per contention
record of the chosen victim with the measured ratios, the model's predictions from the fit's own
functions, the held-out split, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_scripts import BENCH, load_script

from ccoverlap.calibrate import fileformat
from ccoverlap.calibrate import fit as F
from ccoverlap.catalog.hardware import GPUS
from ccoverlap.cost.params import default_params

ct = load_script("contention_table")
GPU = GPUS["H200"]
VICTIM = {"op": "gemm", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192}
SMALL = {"op": "gemm", "dtype": "bf16", "m": 1024, "n": 1024, "k": 1024}


def sm(nc, c, victim=VICTIM, slow=1.2):
    return {"kind": "sm_contention", "victim": victim, "nc": nc, "nt": 512, "chunk_bytes": c,
            "copy_bytes": 2.0 ** 26, "victim_alone_s": 1e-3, "victim_s": slow * 1e-3,
            "copy_alone_s": 1e-4 * (64 / nc), "copy_s": 1.5e-4 * (64 / nc)}


def ce(chunk=None):
    rec = {"kind": "ce_contention", "victim": VICTIM, "direction": "d2d", "bytes": 2.0 ** 28,
           "victim_alone_s": 1e-3, "victim_s": 1.05e-3, "copy_alone_s": 2e-4, "copy_s": 2.5e-4}
    return rec | ({"chunk_bytes": chunk} if chunk else {})


def write(tmp_path, records, params=None):
    data = fileformat.build(gpu=GPU.name, params=params or {}, fit_error=None, notes=[],
                            device={"name": "NVIDIA H200"}, settings={}, fit={}, heldout=[], train=[],
                            decomposition=[], measurements=records, created="2026-01-01T00:00:00Z", tool="test")
    return fileformat.write(tmp_path / "cal.json", data)


def test_rows_hold_the_measured_ratios_and_the_fit_functions_predictions(tmp_path):
    recs = [sm(1, 16384, slow=1.01), sm(32, 1 << 20, slow=1.3), sm(32, 1 << 20, victim=SMALL, slow=2.0), ce(), ce(65536)]
    fitted = default_params(GPU).with_overrides(comm_sm_fraction_per_channel=1.0)
    table = ct.rows(recs, GPU, fitted, "gemm")
    assert len(table) == 4  # the largest GEMM's records only
    first = table[0]
    assert first["engine"] == "sm" and first["nc"] == 1 and first["slowdown"] == pytest.approx(1.01)
    assert first["copy_alone_bps"] == pytest.approx(2.0 ** 26 / 1e-4 / 64)
    ctx = F.make_context(GPU)
    assert first["predicted_default"] == pytest.approx(F.predict_sm_victim(recs[0], default_params(GPU), ctx))
    assert first["predicted_fitted"] == pytest.approx(F.predict_sm_victim(recs[0], fitted, ctx))
    chunked = [r for r in table if r["chunk_bytes"] == 65536]
    assert len(chunked) == 1 and chunked[0]["engine"] == "ce" and chunked[0]["slowdown"] == pytest.approx(1.05)
    s = ct.summary(table)
    assert s["sm"]["n"] == 2 and s["sm"]["measured_slowdown_max"] == pytest.approx(1.3)


def test_script_writes_markdown_json_and_names_the_device(tmp_path):
    path = write(tmp_path, [sm(nc, c) for nc in (1, 8, 32) for c in (16384, 1 << 20)] + [ce()])
    r = subprocess.run([sys.executable, str(BENCH / "contention_table.py"), str(path), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "o" / "contention.md").read_text()
    assert md.startswith("# Contention on NVIDIA H200") and md.count("| SM channel copy |") == 6
    doc = json.loads((tmp_path / "o" / "contention.json").read_text())
    assert len(doc["rows"]) == 7 and doc["gpu"] == "H200"


def test_a_file_without_contention_records_is_one_line_and_exit_2(tmp_path):
    path = write(tmp_path, [{"kind": "gemm", "dtype": "bf16", "m": 512, "n": 512, "k": 512, "time_s": 1e-5}])
    r = subprocess.run([sys.executable, str(BENCH / "contention_table.py"), str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no contention measurement" in r.stderr
    missing = subprocess.run([sys.executable, str(BENCH / "contention_table.py"), str(tmp_path / "nope.json")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
