"""FiCCO's reproduction cases: the case file, the evaluator's kinds, the paper's setting
(Table I per GPU, copy-engine copies, the DMA collective's fixed cost) and bad specs."""

from __future__ import annotations

import json

import pytest

from ccoverlap.cli import main
from ccoverlap.cost import comm
from ccoverlap.cost.model import CostModel
from ccoverlap.deciders import ficco, ficco_accuracy
from ccoverlap.errors import ConfigError
from ccoverlap.reproduce import ficco as rf
from ccoverlap.reproduce.suite import Case, load_cases, run_suite
from ccoverlap.sim.graph import CollectiveSpec, CopySpec, GemmSpec, MemorySpec

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
