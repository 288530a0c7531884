"""Shared fixtures of the trace-analyser tests (helpers live in trace_synth.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FIXTURES = HERE.parent / "fixtures" / "traces"
# the shared real traces sit beside the checkout or one folder further up
SHARED = next((p / "shared" / "traces" for p in HERE.parents[2:4] if (p / "shared" / "traces").is_dir()),
              HERE.parents[2] / "shared" / "traces")


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED.is_dir():
        pytest.skip("real traces (../shared/traces) not present")
    return SHARED
