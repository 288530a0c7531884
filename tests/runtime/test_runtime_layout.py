"""The overlapped ops on batch-first inputs (sharded along dim 1 or 2), gloo, world sizes 2 and 4.

One process group per world size runs every case of ``layout_cases`` (one spawn, joined with
a deadline); each case is reported as its own test: every schedule along dim 1 (and
``serial``/``ring`` along dim 2) equals a single-process float64 reference and the dim-0 path
on the same data, forward and backward, in float32 and bfloat16; and a forward + backward
of the lm-head shape (all-gather + GEMM, output much wider than the input) and of the
wo/w2 shape (GEMM + reduce-scatter, input much wider than the output) copies no block of
the wide side.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import layout_cases  # noqa: E402  (tests/runtime is on sys.path under pytest's default import mode)
from spawned import SPAWN_TIMEOUT_S, SpawnedCases, world_cases  # noqa: E402

CASES_BY_WORLD = SpawnedCases(layout_cases.run_all)
CASES = world_cases(lambda w: [n for n, _ in layout_cases.CASES])


@pytest.mark.slow
@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world,name", CASES, ids=[f"w{w}-{n}" for w, n in CASES])
def test_case(world, name):
    CASES_BY_WORLD.values(world, name)  # fails with the first failing rank's traceback
