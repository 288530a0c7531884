"""benchmarks/run_pair_increments.py: measured vs predicted increments of a pair, and its
--calibration option (the same cost parameters `ccoverlap validate --calibration` uses)."""

from __future__ import annotations

import json
import os

import pytest
from bench_scripts import BENCH, load_script

RUNS = os.path.join(BENCH, "megatron_bridge_h100.yaml")
PAIR = "mbridge-llama3-70b-fp8cs-gbs128-h100x64:mbridge-llama3-70b-fp8cs-gbs256-h100x64"



def _row(out: str) -> list[str]:
    lines = [ln for ln in out.splitlines() if ln.startswith("| mbridge-")]
    assert len(lines) == 1
    return [c.strip() for c in lines[0].strip("|").split("|")]


def test_calibration_slows_both_runs_and_leaves_the_measurements(tmp_path, capsys):
    mod = load_script("run_pair_increments")
    mod.main(["--runs", RUNS, PAIR])
    base = _row(capsys.readouterr().out)
    cal = tmp_path / "clock.json"
    cal.write_text(json.dumps({"gpu": "H100-SXM", "params": {"sustained_clock_fraction": 0.5}}))
    mod.main(["--runs", RUNS, PAIR, "--calibration", str(cal)])
    slow = _row(capsys.readouterr().out)
    assert slow[1] == base[1] and slow[3] == base[3]  # measured steps and increment unchanged
    pa, pb = (float(x) for x in base[2].split("/"))
    sa, sb = (float(x) for x in slow[2].split("/"))
    assert sa > pa * 1.2 and sb > pb * 1.2  # half the clock: tensor work twice as long
    assert float(slow[4]) > float(base[4])
    with pytest.raises(SystemExit, match="expected RUN_A:RUN_B"):
        mod.main(["--runs", RUNS, "nope:other"])
