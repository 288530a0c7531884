"""Multi-process cases run once per world size and reported case by case.

A test module hands its ``run_all(rank, world)`` (every case on one rank, each result
``(status, traceback, value)`` by case name) to :class:`SpawnedCases`; the first test of a
world size spawns that world (gloo, one thread per rank, joined with a deadline so a hang fails
instead of stalling) and every later test of it reads the same results.
"""

from __future__ import annotations

import threading
import time
import traceback

import pytest

from ccoverlap.runtime.launch import spawn

WORLDS = (2, 4)          # the world sizes every spawned test module runs
SPAWN_TIMEOUT_S = 240    # deadline of one world's spawn; a test's own timeout adds a minute


def world_cases(names) -> list[tuple[int, str]]:
    """``(world, case name)`` for every world size of :data:`WORLDS`; ``names(world)`` lists
    the cases of one world size."""
    return [(w, n) for w in WORLDS for n in names(w)]


class SpawnedCases:
    """Results of ``run_all`` per world size, spawned on first use, shared by the tests."""

    def __init__(self, run_all, timeout_s: float = SPAWN_TIMEOUT_S) -> None:
        self.run_all, self.timeout_s = run_all, timeout_s
        self._results: dict[int, object] = {}
        self._lock = threading.Lock()

    def results(self, world: int):
        """Every rank's case results for ``world`` ranks; fails the test when the spawn failed."""
        with self._lock:
            if world not in self._results:
                try:
                    self._results[world] = spawn(self.run_all, world, timeout_s=self.timeout_s, threads=1)
                except Exception as exc:  # noqa: BLE001 - every case of this world reports it
                    self._results[world] = exc
            res = self._results[world]
        if isinstance(res, Exception):
            pytest.fail(f"world {world}: the spawned ranks failed:\n{res}")
        return res

    def values(self, world: int, name: str) -> list:
        """Each rank's value of case ``name``; fails the test with the first failing rank's traceback."""
        res = self.results(world)
        failures = [(r, res[r][name][1]) for r in range(world) if res[r][name][0] != "ok"]
        if failures:
            rank, tb = failures[0]
            pytest.fail(f"{len(failures)} rank(s) failed; rank {rank}:\n{tb}")
        return [res[r][name][2] for r in range(world)]


def run_cases(cases, rank: int, world: int) -> dict[str, tuple[str, str, object]]:
    """Run ``(name, fn)`` cases on this rank, each ``fn(rank, world)``, after seeding torch and
    turning the cross-rank shape check on for every call: ``{name: ("ok", elapsed, value)}`` or
    ``{name: ("fail", traceback, None)}``."""
    import torch

    from ccoverlap.runtime import set_shape_check

    torch.manual_seed(0)
    set_shape_check("always")
    results = {}
    for name, fn in cases:
        t0 = time.perf_counter()
        try:
            value = fn(rank, world)
            results[name] = ("ok", f"{time.perf_counter() - t0:.3f}s", value)
        except Exception:  # noqa: BLE001 - reported to pytest
            results[name] = ("fail", traceback.format_exc(), None)
    return results
