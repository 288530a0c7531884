"""Multi-process gloo tests of the runtime, world sizes 2 and 4.

One process group per world size runs every case of ``rt_cases`` (one spawn, joined with a
deadline so a hang fails instead of stalling); each case is reported as its own test.
Every schedule, partition, fallback and the TP transformer block is compared with the
single-process fp32 reference (``torch.allclose``); illegal shapes must raise the same
message on every rank.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import rt_cases  # noqa: E402  (tests/runtime is on sys.path under pytest's default import mode)
from spawned import SPAWN_TIMEOUT_S, WORLDS, SpawnedCases, world_cases  # noqa: E402

CASES_BY_WORLD = SpawnedCases(rt_cases.run_all)
CASES = world_cases(rt_cases.case_names)


@pytest.mark.slow
@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world,name", CASES, ids=[f"w{w}-{n}" for w, n in CASES])
def test_case(world, name):
    values = CASES_BY_WORLD.values(world, name)
    if name.startswith("error/"):
        assert values[0], "no error message"
        assert all(v == values[0] for v in values), f"ranks raised different messages: {values}"
    if name.startswith("train/"):
        assert all(v == values[0] for v in values), f"ranks saw different losses: {values}"


def test_case_lists_cover_every_schedule():
    from ccoverlap.runtime import ALL_SCHEDULES

    for w in WORLDS:
        names = rt_cases.case_names(w)
        for sched in ALL_SCHEDULES:
            assert any(n.startswith(f"ag/{sched}/") for n in names)
            assert any(n.startswith(f"rs/{sched}/") for n in names)
