"""Plans shared by the emit tests, each computed once per test run."""

from __future__ import annotations

import pytest

from ccoverlap.planning import strategies
from ccoverlap.predict.workload import Workload

ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def example_plan():
    """The built-in example (Llama-3-8B, TP2 x DP4 FSDP on 8 H100) planned with every strategy."""
    return strategies.plan(Workload())

