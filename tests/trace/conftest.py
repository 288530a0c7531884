"""Shared fixtures of the trace-analyser tests (helpers live in trace_synth.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FIXTURES = HERE.parent / "fixtures" / "traces"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED.is_dir():
        pytest.skip("real traces (../shared/traces) not present")
    return SHARED
