"""Simulator regression: predictions of a set of diverse workloads must not move.

``step_baseline.json`` holds their step times, per-rank metrics and per-rank sums of every op's
start and end time, recorded with
``python tests/sim/regression/record_baseline.py tests/sim/regression/step_baseline.json``;
any change to the simulator must reproduce it within a relative tolerance of 1e-6. A deliberate
change of predictions re-records the file and says why in the commit and in CHANGELOG.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from regression_workloads import WORKLOADS, metrics_of

from ccoverlap.predict.evaluate import simulate_workload
from ccoverlap.predict.workload import workload_from_mapping

BASELINE = json.loads((Path(__file__).parent / "step_baseline.json").read_text())
REL = 1e-6


def _close(a: float, b: float, scale: float) -> bool:
    """Equal within REL of ``scale`` (the step time, so that near-zero idle / overlap sums
    are judged against the size of the step, not against themselves)."""
    return math.isclose(a, b, rel_tol=REL, abs_tol=REL * scale)


def test_fixture_covers_every_workload():
    assert sorted(BASELINE) == sorted(WORKLOADS)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_step_matches_baseline(name):
    step, tl = simulate_workload(workload_from_mapping(WORKLOADS[name], source=name))
    got, want = metrics_of(step, tl), BASELINE[name]
    scale = want["step_time_s"]
    assert got["ops"] == want["ops"]
    assert _close(got["step_time_s"], want["step_time_s"], scale), (got["step_time_s"], want["step_time_s"])
    assert sorted(got["ranks"]) == sorted(want["ranks"])
    for rank, w in want["ranks"].items():
        g = got["ranks"][rank]
        assert g["ops"] == w["ops"], (rank, g["ops"], w["ops"])
        for key, value in w.items():
            if key == "ops":
                continue
            # sums over every op of the rank: scale by the number of ops as well
            s = scale * (w["ops"] if key.startswith("sum_") else 1)
            assert _close(g[key], value, s), (rank, key, g[key], value)
