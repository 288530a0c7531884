"""benchmarks/gpu_contention_order.py without a GPU: the plan, the report from synthetic
records (slowdowns per order, the covered flag, the medians), and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from bench_scripts import BENCH, load_script

co = load_script("gpu_contention_order")
SCRIPT = BENCH / "gpu_contention_order.py"


def rec(victim, nc, c, v_together, v_first, c_together=2.0, c_first=3.0, covered=True):
    return {"victim": list(victim), "nc": nc, "nt": 512, "chunk_bytes": c, "copy_bytes": 2.0 ** 26,
            "victim_alone_s": 1e-3, "copy_alone_s": 1e-4, "victim_s_together": v_together * 1e-3,
            "victim_s_other_first": v_first * 1e-3, "copy_s_together": c_together * 1e-4,
            "copy_s_other_first": c_first * 1e-4, "covered_together": covered, "covered_other_first": True}


def test_plan_covers_every_victim_nc_and_chunk():
    pts = co.plan()
    assert len(pts) == len(co.VICTIMS) * len(co.CHANNELS) * len(co.CHUNKS)
    assert {p["nt"] for p in pts} == {512} and {p["nc"] for p in pts} == set(co.CHANNELS)


def test_report_holds_both_orders_and_the_medians():
    v = co.VICTIMS[0]
    records = [rec(v, 16, 16 * 1024, 1.01, 1.20), rec(v, 32, 16 * 1024, 1.03, 1.40),
               rec(v, 64, 16 * 1024, 9.0, 9.0, covered=False)]
    text = co.table(records, {"name": "NVIDIA H200", "kernel_backend": "triton", "lead_s": 2e-4})
    assert text.startswith("# Launch order and contention on NVIDIA H200")
    assert "| 16 | 1.010 / 1.200 |" in text and "| 64 | 9.000* / 9.000 |" in text
    assert "started 200 µs earlier" in text
    s = co.summary(records)  # the uncovered point is left out
    assert s["victim_together"] == pytest.approx(1.02) and s["victim_other_first"] == pytest.approx(1.30)
    assert s["victim_worst"] == pytest.approx(1.40) and s["copy_other_first"] == pytest.approx(3.0)


def test_dry_run_from_json_and_errors(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and len(json.loads((tmp_path / "contention_order.plan.json").read_text())) == 48
    doc = {"device": {"name": "NVIDIA H200", "lead_s": 2e-4}, "records": [rec(co.VICTIMS[1], 8, 4 << 20, 1.1, 1.3)]}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, str(SCRIPT), "--from-json", str(tmp_path / "c.json"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "| 8 | – | – | 1.100 / 1.300 |" in (tmp_path / "contention_order.md").read_text()
    bad = subprocess.run([sys.executable, str(SCRIPT), "--from-json", str(tmp_path / "nope.json"), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    nogpu = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                           timeout=120, env=env)
    assert nogpu.returncode == 2 and "no CUDA GPU" in nogpu.stderr and "Traceback" not in nogpu.stderr
