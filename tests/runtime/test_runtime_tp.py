"""ccoverlap's ParallelStyles against torch's on torchtitan's Llama plan, gloo, world sizes 2 and 4.

One process group per world size runs every case of ``tp_cases`` (one spawn, joined with a
deadline); each case is reported as its own test: equal results to torch's styles over 5
AdamW steps (fp32 within 2e-5 relative, bf16 as close to fp32 as torch's), a module that
reads its input with ``to_local()`` and one under ``use_local_output=True``, loss
parallelism, activation checkpointing, the number of activation collectives per block, and
errors that every rank raises alike.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import tp_cases  # noqa: E402  (tests/runtime is on sys.path under pytest's default import mode)
from spawned import SPAWN_TIMEOUT_S, SpawnedCases, world_cases  # noqa: E402

CASES_BY_WORLD = SpawnedCases(tp_cases.run_all)
CASES = world_cases(lambda w: [n for n, _ in tp_cases.CASES])


@pytest.mark.slow
@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world,name", CASES, ids=[f"w{w}-{n}" for w, n in CASES])
def test_case(world, name):
    values = CASES_BY_WORLD.values(world, name)
    if name.startswith("error/") or name.startswith("count/") or name == "train/model-loss-parallel-adamw":
        assert all(v == values[0] for v in values), f"ranks differ: {values}"
