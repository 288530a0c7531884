"""benchmarks/dp_exposure_bound.py: the lower bound Megatron-Core's schedule puts on a step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dp_exposure_bound.py"


def _load():
    spec = importlib.util.spec_from_file_location("dp_exposure_bound", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bound_lies_between_compute_and_the_simulated_step(capsys):
    mod = _load()
    assert mod.main(["--run", "mcore-gpt-16b-h100x192"]) == 0
    rows = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| mcore-")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    mb, m, compute, rs, w_bwd, ag, w_fwd, bound, predicted, measured = (
        int(cells[1]), int(cells[2]), *map(float, cells[3:]))
    assert (mb, m) == (1, 4)
    # the bound is compute plus what the windows cannot hide, and the simulation (with
    # contention and bucket granularity) can only expose more
    assert bound == pytest.approx(compute + max(0.0, rs - w_bwd) + max(0.0, ag - w_fwd), abs=2e-3)
    assert compute < bound <= predicted + 1e-3
    assert measured == pytest.approx(0.850, abs=1e-3)
    # micro-batch 4: one micro-batch, the whole backward hides the reduce-scatter
    assert mod.main(["--run", "mcore-gpt-16b-h100x192", "--micro-batch", "4"]) == 0
    row = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| mcore-")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[2]) == 1 and float(cells[8]) == pytest.approx(float(cells[3]), abs=1e-3)
