"""Multi-process gloo tests of the runtime, world sizes 2 and 4.

One process group per world size runs every case of ``rt_cases`` (one spawn, joined with a
deadline so a hang fails instead of stalling); each case is reported as its own test.
Every schedule, partition, fallback and the TP transformer block is compared with the
single-process fp32 reference (``torch.allclose``); illegal shapes must raise the same
message on every rank.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import rt_cases  # noqa: E402  (tests/runtime is on sys.path under pytest's default import mode)

from ccoverlap.runtime.launch import spawn  # noqa: E402

WORLDS = (2, 4)
SPAWN_TIMEOUT_S = 240
_results: dict[int, object] = {}
_lock = threading.Lock()


def results_for(world: int):
    with _lock:
        if world not in _results:
            try:
                _results[world] = spawn(rt_cases.run_all, world, timeout_s=SPAWN_TIMEOUT_S, threads=1)
            except Exception as exc:  # noqa: BLE001 - every case of this world reports it
                _results[world] = exc
        res = _results[world]
    if isinstance(res, Exception):
        pytest.fail(f"world {world}: the spawned ranks failed:\n{res}")
    return res


CASES = [(w, name) for w in WORLDS for name in rt_cases.case_names(w)]


@pytest.mark.slow
@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world,name", CASES, ids=[f"w{w}-{n}" for w, n in CASES])
def test_case(world, name):
    res = results_for(world)
    failures = [(r, res[r][name][1]) for r in range(world) if res[r][name][0] != "ok"]
    if failures:
        rank, tb = failures[0]
        pytest.fail(f"{len(failures)} rank(s) failed; rank {rank}:\n{tb}")
    values = [res[r][name][2] for r in range(world)]
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
