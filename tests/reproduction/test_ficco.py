"""FiCCO's reproduction cases: the case file, the evaluator's kinds, the paper's setting
(Table I per GPU, copy-engine copies, the DMA collective's fixed cost) and bad specs."""

from __future__ import annotations

import json

import pytest

from ccoverlap.cli import main
from ccoverlap.cost import comm
from ccoverlap.cost.model import CostModel
from ccoverlap.deciders.ficco import accuracy as ficco_accuracy
from ccoverlap.deciders.ficco import schedules as ficco
from ccoverlap.errors import ConfigError
from ccoverlap.reproduction import ficco as rf
from ccoverlap.reproduction.suite import Case, load_cases, run_suite
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, MemorySpec

MESH = ficco.machine("MI300X", "full_mesh", 8)


@pytest.fixture(scope="module")
def suite():
    return run_suite(["ficco"], jobs=1)


@pytest.fixture(scope="module")
def cost():
    return ficco.cost_model_for_cluster(MESH)


def _case(**spec) -> Case:
    return Case(id="t", setting="s", source="§", quote="q", method="m", baseline="b", spec=spec, paper="ficco")


def test_case_file_quotes_the_paper_and_covers_table_one():
    cases, titles = load_cases(["ficco"])
    assert "FiCCO" in titles["ficco"]
    assert all(c.quote and c.source for c in cases)
    assert {f"ficco-g{i}" for i in range(1, 17)} <= {c.id for c in cases}
    assert [c.id for c in cases if c.headline] == ["ficco-heuristic-max"]
    assert all(c.why_not for c in cases if not c.expressible)


def test_every_expressible_case_gets_a_figure(suite):
    for row in suite.rows:
        assert row.error == "", row.error
        if row.case.expressible:
            assert row.outcome is not None and row.outcome.ours_speedup > 0
    s = suite.summary()["papers"]["ficco"]
    counted = [r for r in suite.rows if r.case.paper_speedup is not None and r.case.expressible and not r.case.fit]
    assert s["expressible"] == len(counted)
    json.dumps(suite.to_dict())


def test_the_fit_cases_are_marked_and_not_counted(suite):
    """MI300X's two copy-engine coefficients are fitted on the two GEMM figures of §IV-D1: those
    rows show the paper's 1.11 and 1.07 by construction, carry the verdict 'fit' and stay out
    of the match count."""
    fits = {r.case.id: r for r in suite.rows if r.case.fit}
    assert set(fits) == {"ficco-gemm-cil", "ficco-gemm-cil-shard"}
    assert all(r.verdict == "fit" and r.matches is None and not r.expressible for r in fits.values())
    assert 1 / fits["ficco-gemm-cil"].outcome.ours_speedup == pytest.approx(1.11, abs=0.003)
    assert 1 / fits["ficco-gemm-cil-shard"].outcome.ours_speedup == pytest.approx(1.07, abs=0.003)
    assert suite.summary()["papers"]["ficco"]["fit"] == 2


def test_params_hold_the_fitted_copy_engine_coefficients():
    """The MI300X values in cost/params.py are what the fit on the two GEMM cases gives."""
    from ccoverlap.cost.params import default_params

    fixed, per_share = rf.fit_copy_engine_gemm(1.11, 1.07)
    p = default_params(MESH.gpu)
    assert p.copy_engine_gemm_slowdown == pytest.approx(fixed, abs=0.001)
    assert p.copy_engine_gemm_interference == pytest.approx(per_share, abs=0.001)
    assert rf.fit_copy_engine_gemm(1.0, 1.0) == (0.0, 0.0)
    with pytest.raises(ConfigError, match="shard slowdown"):
        rf.fit_copy_engine_gemm(1.05, 1.07)


def test_copy_engine_traffic_slows_the_gemm_cases(cost):
    """Without the copy-engine terms a GEMM beside copy-engine transfers is < 3% slower
    (HBM bandwidth and L2 only: Table I's per-GPU GEMMs are compute-bound); with them, the
    FiCCO step, moving 7x the bytes per second of a shard transfer, slows it more."""
    cases = ficco_accuracy.paper_cases(MESH)
    off = CostModel(MESH, cost.params.with_overrides(copy_engine_gemm_slowdown=0.0,
                                                     copy_engine_gemm_interference=0.0))
    for overlap in ("ficco", "shard"):
        assert rf._geomean(rf._cil_ratios(overlap, "gemm", off, cases)) < 1.03
    step = rf._geomean(rf._cil_ratios("ficco", "gemm", cost, cases))
    shard = rf._geomean(rf._cil_ratios("shard", "gemm", cost, cases))
    assert step > shard > 1.05


def test_bounds_hold_between_the_cases(suite):
    """The ideal bound is above every schedule, the best 1-D pick above the heuristic's 1-D pick,
    and the shard ring's 7 peer transfers are 7x the all-gather on a full mesh of 8."""
    ours = {r.case.id: r.outcome.ours_speedup for r in suite.rows if r.outcome}
    assert ours["ficco-ideal"] >= max(ours["ficco-best-1d"], ours["ficco-best-2d"])
    assert ours["ficco-best-1d"] >= ours["ficco-heuristic-max"]
    assert ours["ficco-shard-worst"] < 1.0
    assert ours["ficco-shard-comm"] == pytest.approx(1 / 7, rel=0.05)


def test_table_one_rows_name_the_pick_and_the_estimators_best(suite):
    row = next(r for r in suite.rows if r.case.id == "ficco-g2")
    assert row.outcome.extra["pick"] in ficco.SCHEDULES
    assert row.outcome.extra["best"] in ficco.SCHEDULES
    assert "(131072,2048,16384)" in row.outcome.detail  # N/8 per GPU
    assert row.verdict == "n/a"  # the paper gives no per-GEMM number in its text


def test_ideal_is_the_linear_pipeline_of_fig_6(cost):
    c = ficco_accuracy.paper_cases(MESH)[1]
    g = cost.alone_s(GemmSpec(m=c.m, n=c.n, k=c.k))
    cm = cost.alone_s(CollectiveSpec(collective="all_gather", bytes=float(c.m * c.k * 2), group=c.group,
                                     transport="dma"))
    assert ficco.ideal_time_s(c, cost) == pytest.approx(max(g, cm) + min(g, cm) / 8)


def test_heuristic_as_written_on_table_one():
    """§V-C with the GPU's own GEMM: 2-D where M <= K; on 1-D rows the flop count against the
    MI300X peak (1.3e15 flop): only g13 (a whole DeepSeek-size expert, 1.5e15) is above it."""
    picks = {c.name: ficco.heuristic_pick(c)[0] for c in ficco_accuracy.paper_cases(MESH)}
    assert {n for n, p in picks.items() if p == "uniform-fused-2d"} == {"g1", "g3", "g5", "g7"}
    assert picks["g13"] == "hetero-fused-1d"
    assert all(p == "uniform-fused-1d" for n, p in picks.items() if n not in {"g1", "g3", "g5", "g7", "g13"})


def test_gather_and_scatter_run_on_copy_engines_with_dma():
    c = ficco_accuracy.paper_cases(MESH)[1]
    dma = ficco.schedule_graph(c, "uniform-fused-1d")
    copies = [op.spec for op in dma.ops if op.stream in ("gather", "scatter")]
    assert copies and all(isinstance(s, CopySpec) for s in copies)
    sm_case = ficco.FiccoCase(m=c.m, n=c.n, k=c.k, world=8, cluster=MESH, engine="sm")
    sm = ficco.schedule_graph(sm_case, "uniform-fused-1d")
    assert all(isinstance(op.spec, MemorySpec) for op in sm.ops if op.stream in ("gather", "scatter"))


def test_dma_collective_pays_the_measured_latency_ratio(cost):
    """DMA-Latte: a DMA all-gather takes 4.5x RCCL's time at latency-bound sizes, so every DMA
    collective carries that fixed cost and 8 pieces pay it 8 times."""
    p = cost.params
    grp = ficco_accuracy.paper_cases(MESH)[0].group
    probe = CollectiveSpec(collective="all_gather", bytes=float(comm.DMA_LATENCY_PROBE_BYTES), group=grp)
    lat = comm.dma_collective_latency_s("all_gather", 8, MESH, p)
    assert lat == pytest.approx(p.dma_allgather_latency_factor * cost.alone_s(probe))
    whole = CollectiveSpec(collective="all_gather", bytes=8e9, group=grp, transport="dma")
    piece = CollectiveSpec(collective="all_gather", bytes=1e9, group=grp, transport="dma")
    assert 8 * cost.alone_s(piece) - cost.alone_s(whole) == pytest.approx(7 * lat, rel=1e-6)
    assert comm.dma_collective_latency_s("all_gather", 8, MESH, p.with_overrides(dma_allgather_latency_factor=0)) == 0


@pytest.mark.parametrize("spec, match", [
    ({"kind": "nope"}, "spec.kind"),
    ({"kind": "table1", "gemm": "g99"}, "g1..g16"),
    ({"kind": "table1", "gemm": "g2", "extra": 1}, "unknown spec key"),
    ({"kind": "schedule_max", "schedules": ["warp"]}, "schedules"),
    ({"kind": "gemm_cil", "overlap": "both"}, "overlap"),
    ({"kind": "ideal_max", "engine": "pcie"}, "engine"),
    ({"kind": "ideal_max", "world": 1}, "world"),
])
def test_bad_specs_are_one_clear_error(spec, match):
    with pytest.raises(ConfigError, match=match):
        rf.evaluate(_case(**spec))


def test_command_prints_the_ficco_table(capsys):
    assert main(["reproduce", "--paper", "ficco", "--case", "ficco-heuristic-max", "--case", "ficco-g2",
                 "--markdown", "-q", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "| ficco | ficco-heuristic-max * |" in out and "ficco-g2" in out
