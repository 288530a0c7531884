"""``ccoverlap analyze --json`` and its tables stay what they were on every real and fixture trace.

The pinned outputs (tests/fixtures/analyze_golden, written by ``tests/trace/golden.py --write``)
were taken from the analyser before its per-rank / combine structure; every string, integer and
list must be equal, floats to 1e-9 relative (sums over ranks may be added in another order). The
real traces' cases skip when the shared traces are absent.
"""

from __future__ import annotations

import gzip
import json

import pytest

import golden


@pytest.mark.parametrize("case", golden.CASES, ids=[c[0] for c in golden.CASES])
def test_json_output_is_pinned(case):
    name, where, folder, opts = case
    if not (golden.base_dir(where) / folder).is_dir():
        pytest.skip("real traces not present")
    with gzip.open(golden.GOLDEN / f"{name}.json.gz", "rt") as fh:
        pinned = json.load(fh)
    got = golden.run_case(where, folder, opts)
    problems = golden.diff(got, pinned)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("case", golden.CASES, ids=[c[0] for c in golden.CASES])
def test_tables_are_pinned(case):
    name, where, folder, opts = case
    if not (golden.base_dir(where) / folder).is_dir():
        pytest.skip("real traces not present")
    pinned = (golden.GOLDEN / f"{name}.txt").read_text()
    assert golden.run_case_text(where, folder, opts) + "\n" == pinned


def test_the_comparison_notices_a_change():
    a = {"x": [1.0, "s", 2], "y": {"z": 0.5}}
    assert golden.diff(a, a) == []
    assert golden.diff({"x": [1.0 + 1e-6, "s", 2], "y": {"z": 0.5}}, a)
    assert golden.diff({"x": [1.0, "t", 2], "y": {"z": 0.5}}, a)
    assert golden.diff({"x": [1.0, "s"], "y": {"z": 0.5}}, a)
