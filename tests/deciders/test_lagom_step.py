"""Lagom and AutoCCL on a whole training step: a per-communication plan, its candidates, and
the ``plan`` rows (from the knobs as given, and combined with the best knobs)."""

from __future__ import annotations

import pytest

from ccoverlap.deciders.lagom import step as lagom_step
from ccoverlap.deciders.lagom.profiler import SimulatedProfiler
from ccoverlap.deciders.lagom.space import autoccl_tune
from ccoverlap.deciders.lagom.tune import lagom_tune
from ccoverlap.nccl.plan import CommKey
from ccoverlap.predict.strategy import Planner
from ccoverlap.predict.workload import workload_from_mapping

# the paper's cluster A (lagom §4.1): A40s on a 400 Gb/s NVLink, where NCCL opens 8 channels
CLUSTER_A = {"name": "a40-nvlink", "gpu": "A40", "nodes": 1, "gpus_per_node": 8,
             "intra": {"fabric": "nvlink_pair", "bandwidth_bytes_per_s": 50e9, "latency_s": 2e-6},
             "inter": {"fabric": "infiniband", "bandwidth_bytes_per_s": 12.5e9, "latency_s": 5e-6}}
PHI2_FSDP = {"model": "phi-2", "cluster": CLUSTER_A, "nodes": 1, "parallel": {"dp": 8, "data_parallel": "fsdp"},
             "batch": {"global_batch": 16, "micro_batch": 2, "seq_len": 2048}}


@pytest.fixture(scope="module")
def fsdp():
    w = workload_from_mapping(PHI2_FSDP)
    planner = Planner(w, jobs=1)
    base = planner.evaluate(w, "nccl")
    return w, planner, base, lagom_step.tune_step(planner, w, "lagom"), lagom_step.tune_step(planner, w, "autoccl")


def test_compute_bound_fsdp_lagom_beats_nccl_and_autoccl(fsdp):
    """lagom §4.2: on compute-bound FSDP Lagom is faster than NCCL's defaults, AutoCCL's
    aggressive tuning is not."""
    w, planner, base, lag, auto = fsdp
    assert lag.result.step_time_s < 0.95 * base.step_time_s
    assert lag.result.step_time_s < 0.97 * auto.result.step_time_s
    assert auto.result.step_time_s > 0.98 * base.step_time_s


def test_plan_is_per_communication_not_per_process_group(fsdp):
    _, _, _, lag, _ = fsdp
    rows = lag.plan.rules
    kinds = {(r.group, r.collective) for r in rows}
    assert ("dp", "all_gather") in kinds and ("dp", "reduce_scatter") in kinds
    # the layers' reduce-scatter, hidden under backward computation, gets fewer channels than
    # NCCL's 8 (lagom §4.3); the embedding's, exposed at the end of the step, gets more: two
    # configurations on one process group, told apart by message size
    rs = sorted((r for r in rows if r.collective == "reduce_scatter"), key=lambda r: r.min_bytes)
    assert len(rs) == 2 and rs[0].config.channels < 8 < rs[1].config.channels
    # each row covers its own message size only
    for r in rows:
        assert r.min_bytes < r.max_bytes <= 4 * r.min_bytes
    assert all(r.source == "lagom" for r in rows)
    assert lag.result.name == "lagom"


def test_communication_only_group_reaches_what_a_communication_bound_collective_needs():
    """A collective nothing hides: Lagom's Algorithm 2 grows its resources until it stops
    getting faster, so it ends where own-speed tuning (AutoCCL) does."""
    w = workload_from_mapping(PHI2_FSDP)
    planner = Planner(w, jobs=1)
    key = CommKey("tp", "all_reduce", 84.0 * 2**20, 8, 8)
    g = lagom_step.alone_group(key, w.cluster)
    assert not g.computations and g.n_collectives == 1
    prof = SimulatedProfiler(g, planner.cost)
    lag, auto = lagom_tune(g, prof), autoccl_tune(g, prof)
    assert lag.result.compute_time_s == 0.0
    assert lag.makespan_s <= 1.01 * auto.makespan_s
    assert lag.configs[0].channels >= 2


def test_exposed_and_hidden_occurrences_each_offer_a_candidate():
    """The same key occurs beside computations and exposed; Lagom keeps a candidate from each
    place and lets the step decide (lagom_step module docstring)."""
    w = workload_from_mapping(PHI2_FSDP)
    planner = Planner(w, jobs=1)
    ws = planner.screened(w)
    groups, keys = lagom_step.step_groups(planner, ws)
    order = lagom_step._tuned_keys(groups, keys)
    found, profiles, tuned = lagom_step.group_candidates(planner, groups, order, "lagom")
    assert profiles > 0 and len(tuned) == len(groups) + len(order)  # one communication-only group per key
    ag = max((k for k in order if k.collective == "all_gather"), key=lambda k: keys[k])
    assert len(found[ag]) >= 2  # from its overlap groups and from its communication-only group


def test_plan_rows_start_from_the_knobs_as_given_and_combine_with_the_best_knobs():
    from ccoverlap.planning.strategies import plan

    w = workload_from_mapping(PHI2_FSDP)
    res = plan(w, extra=["lagom", "autoccl", "knobs+lagom"], planner=Planner(w, jobs=1))
    rows = {s.name: s for s in res.strategies}
    given, best = rows["as-given"], rows["best-knobs"]
    assert best.knobs != given.knobs  # the best knobs change something here
    assert rows["lagom"].knobs == given.knobs and rows["autoccl"].knobs == given.knobs
    assert rows["knobs+lagom"].knobs == best.knobs
    assert "knobs as given" in rows["lagom"].note and "both levers" in rows["knobs+lagom"].note
    assert rows["lagom"].step_time_s < given.step_time_s
    assert rows["knobs+lagom"].step_time_s <= best.step_time_s


def test_best_knobs_lagom_row_is_skipped_when_the_knobs_do_not_change():
    w = workload_from_mapping(PHI2_FSDP)
    planner = Planner(w, jobs=1)
    assert lagom_step.lagom_with_knobs_strategy(planner, w) is None


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown tuning method"):
        lagom_step._tuner("nccl")


def test_lagom_runs_with_any_cost_a_planner_takes(fsdp):
    """A Planner takes any cost with ``duration_s(spec, concurrent)``; Lagom on it decides as on
    the cost model that cost answers for (the stand-alone weights of the communications are
    durations with nothing beside them)."""
    w, planner, _, lag, _ = fsdp

    class OnlyDuration:
        def duration_s(self, spec, concurrent=()):
            return planner.cost.duration_s(spec, concurrent)

    got = lagom_step.tune_step(Planner(w, cost=OnlyDuration(), jobs=1), w, "lagom")
    assert got.plan == lag.plan
    assert got.result.step_time_s == lag.result.step_time_s
