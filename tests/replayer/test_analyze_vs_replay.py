"""``analyze``'s verdict never promises more than ``replay``'s no-communication bound.

``analyze`` counts communication exposed when no compute runs beside it; whether removing it
shortens the step depends on the critical path, which ``replay`` follows. On every multi-rank
trace we have (the repository's fixtures, the shared real traces when present, and hand-made
jobs: communication on the critical path, and a CPU-bound step where it is not), what the
verdict says could be gained from communication - its critical-path bound, and the hideable
share it prints as "up to X% of the step could be hidden" - is at most what removing all
communication gains in the replay, within 1 % of the step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ccoverlap.replayer.run import replay
from ccoverlap.trace.analyze import analyze

from .conftest import FIXTURES, SHARED
from .synth import Rank, allreduce_args, two_rank_job

TOLERANCE = 0.01      # of the step


def _multi_rank_dirs() -> list[Path]:
    dirs = [p for p in sorted(FIXTURES.rglob("*")) if p.is_dir() and len(list(p.glob("*.json*"))) > 1]
    if SHARED.exists():
        dirs += [p for p in sorted(SHARED.iterdir()) if p.is_dir() and len(list(p.glob("*.json*"))) > 1]
    return dirs


def _cpu_bound_two_ranks(d: Path) -> Path:
    """Per rank: K (10-110), an all-reduce C (120-520) with nothing beside it, and the CPU busy until
    it launches K2 at 1000 (1010-1110): C is exposed, the GPU waits for the CPU anyway."""
    for r in (0, 1):
        k = Rank(r, 2)
        k.step(1, 0.0, 1200.0)
        k.launch("gemm_K", 0.0, 7, 10.0, 100.0)
        k.launch("ncclDevKernel_AllReduce_RING_LL", 1.0, 20, 120.0, 400.0, **allreduce_args(2))
        k.launch("gemm_K2", 1000.0, 7, 1010.0, 100.0)
        k.step(2, 1200.0, 100.0)
        k.launch("gemm_next", 1210.0, 7, 1220.0, 10.0)
        k.write(d / f"rank-{r}.json")
    return d


def _compare(paths: list[str]) -> tuple[float, float, float, str]:
    """(the verdict's communication bound, its hideable share, replay's no-comm gain) as fractions
    of the step, and the verdict's label."""
    v = analyze(paths).verdict
    res = replay(paths, whatifs=["no-comm"])
    nc = res.whatifs[0]
    return v.comm_bound_fraction, v.hideable_fraction, nc.gain_s / res.measured.step_time_s, v.label


@pytest.mark.parametrize("trace", _multi_rank_dirs(), ids=lambda p: p.name)
def test_analyze_promises_no_more_than_removing_communication_gains(trace):
    if not any(p.name.startswith(("rank", "sampled")) for p in trace.iterdir()):
        pytest.skip("no rank files")
    from ccoverlap.errors import TraceError

    try:
        bound, hideable, gain, label = _compare([str(trace)])
    except TraceError as exc:          # gloo traces: no GPU events, nothing for replay to follow
        assert "nothing could be replayed" in str(exc)
        pytest.skip("replay needs GPU events")
    assert hideable <= bound + 1e-12
    assert bound <= gain + TOLERANCE, (trace.name, label, bound, gain)


def test_a_cpu_bound_step_is_not_called_overlap_limited(tmp_path):
    bound, hideable, gain, label = _compare([str(_cpu_bound_two_ranks(tmp_path))])
    assert gain == 0.0
    assert bound <= TOLERANCE and hideable <= TOLERANCE
    assert label == "host-bound"


def test_communication_on_the_critical_path_is_still_promised(tmp_path):
    # C (rank 0 waits 500 µs for rank 1, then 400 µs of transfer) delays B: removing it gains
    two_rank_job(tmp_path)
    bound, hideable, gain, label = _compare([str(tmp_path)])
    assert gain > 0.1
    assert 0.5 * gain <= bound <= gain + TOLERANCE
    assert label in ("overlap-limited", "communication-bound")


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/traces not present")
def test_an_eight_rank_job_of_a_cpu_bound_trace_is_host_bound(tmp_path):
    # 8 ranks built from trace_filter's rank 0 (benchmarks/make_trace_job.py: its events, a clock
    # offset and collective jitter per rank): 26% of the step is exposed all-to-all, yet the GPU
    # waits for the CPU - removing every collective gains nothing in the replay
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_trace_job", Path(__file__).resolve().parents[2] / "benchmarks" / "make_trace_job.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_job(SHARED / "trace_filter" / "sampled_rank-0.json.gz", tmp_path, 8)
    bound, hideable, gain, label = _compare([str(tmp_path)])
    assert bound <= gain + TOLERANCE and hideable <= gain + TOLERANCE
    assert label == "host-bound"
