"""On real profiler traces (HolisticTraceAnalysis' test data in ../shared/traces; skipped when
absent), and against HTA itself when ``hta`` (pip ``traceinsight``) is installed."""

from __future__ import annotations

import json

import pytest

from ccoverlap.cli import main
from ccoverlap.trace.analyze import analyze

# HTA 0.6.1's get_comm_comp_overlap on these traces (percent, rounded by HTA to 2 decimals)
HTA_OVERLAP_PCT = {
    ("nccl_parser_config", "hta"): {0: 14.31}, ("nccl_parser_config", "all"): {0: 15.14},
    ("trace_filter", "hta"): {0: 11.81, 1: 20.05}, ("trace_filter", "all"): {0: 14.95, 1: 19.93},
}


@pytest.mark.parametrize("key", sorted(HTA_OVERLAP_PCT))
def test_overlap_equals_htas_recorded_values(shared_traces, key):
    name, steps = key
    a = analyze([shared_traces / name], steps=steps)
    got = {m.rank: 100 * m.overlap_ratio for m in a.metrics}
    for rank, want in HTA_OVERLAP_PCT[key].items():
        assert got[rank] == pytest.approx(want, abs=0.1), (rank, got[rank], want)


def test_nccl_trace_collectives(shared_traces):
    a = analyze([shared_traces / "nccl_parser_config"], steps="all")
    colls = {c.collective: c for c in a.collectives}
    assert set(colls) == {"all_reduce", "broadcast"}
    ar = colls["all_reduce"]
    assert ar.group == "0" and ar.group_size == 2 and ar.count == 15 and ar.busbw > 0
    assert a.available_steps == [4, 5, 6]


def test_ns_resolution_trace(shared_traces):
    path = shared_traces / "ns_resolution_trace"
    hta, exact = analyze([path]), analyze([path], time_resolution="exact")
    assert hta.ranks[0].meta["displayTimeUnit"] == "ns"
    assert hta.analysed_steps == [101, 102, 103, 104]
    # same kernels; HTA's inward rounding removes up to 1 µs per kernel
    n = hta.ranks[0].rows
    assert 0 < exact.metrics[0].compute_s - hta.metrics[0].compute_s < n * 1e-6
    assert any("no communication kernels" in p for p in hta.problems)


def test_traces_without_gpu_or_rank(shared_traces, capsys):
    assert main(["analyze", str(shared_traces / "rank_non_gpu"), "--no-png"]) == 2
    assert "rank_non_gpu.json.gz" in capsys.readouterr().err
    a = analyze([shared_traces / "amd_trace"])
    assert any("assumed rank 0" in p for p in a.problems) and a.metrics[0].compute_s > 0
    cpu = analyze([shared_traces / "cpu_only"])
    assert cpu.ranks[0].rank == 34 and cpu.ranks[0].mode == "cpu" and cpu.collectives[0].count == 10


def test_every_real_trace_at_once(shared_traces, capsys):
    """All seven folders in one call: the analysable ones are analysed, the rest named."""
    rc = main(["analyze", *[str(p) for p in sorted(shared_traces.iterdir()) if p.is_dir()], "--json", "--no-png"])
    out = capsys.readouterr()
    assert rc == 0
    doc = json.loads(out.out)
    # seven different jobs: the most common world size (128, trace_filter's two ranks) wins,
    # every other file is named with its reason
    assert {r["rank"] for r in doc["ranks"]} >= {0, 1}
    assert "world_size 2 differs" in out.err and "world_size 300 differs" in out.err
    assert "rank_non_gpu" in out.err


def _hta_overlap(trace_dir, include_last: bool) -> dict[int, float]:
    import logging

    hta = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    ta = hta.TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=include_last)
    df = ta.get_comm_comp_overlap(visualize=False)
    return {int(r): float(p) for r, p in zip(df["rank"], df["comp_comm_overlap_pctg"])}


@pytest.mark.slow
@pytest.mark.parametrize("steps", ["hta", "all"])
def test_overlap_equals_hta_live(shared_traces, steps):
    """Every real trace with communication kernels: our overlap ratio == HTA's to 0.1 pp."""
    checked = 0
    for d in sorted(p for p in shared_traces.iterdir() if p.is_dir()):
        try:
            a = analyze([d], steps=steps)
        except Exception:
            continue
        if not any((rt.timeline.kind == "comm").any() for rt in a.ranks) or any(rt.mode == "cpu" for rt in a.ranks):
            continue
        ref = _hta_overlap(d, include_last=(steps == "all"))
        for m in a.metrics:
            assert 100 * m.overlap_ratio == pytest.approx(ref[m.rank], abs=0.1), (d.name, m.rank)
            checked += 1
    assert checked >= 3
