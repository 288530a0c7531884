"""The Planner object: cost model built once, simulation cache, typed strategies, explicit
registry, worker processes that do not change predictions."""


import pytest

from ccoverlap.errors import ConfigError
from ccoverlap.planning.strategies import AS_GIVEN, default_registry, plan
from ccoverlap.predict.strategy import (
    FunctionStrategy,
    Planner,
    Strategy,
    StrategyRegistry,
    strategy_groups,
    workload_key,
)
from ccoverlap.predict.workload import with_knobs, workload_from_mapping

W = workload_from_mapping({"model": "phi-2", "cluster": "dgx-h100", "nodes": 1,
                           "parallel": {"tp": 2, "dp": 4, "data_parallel": "fsdp", "sequence_parallel": True},
                           "batch": {"global_batch": 8, "micro_batch": 1, "seq_len": 2048}})


def test_cache_simulates_each_configuration_once():
    pl = Planner(W, jobs=1)
    a = pl.evaluate(W, "a")
    b = pl.evaluate(W, "b", note="again")
    assert pl.simulations == 1 and pl.cache_hits >= 1
    assert (a.name, b.name, b.note) == ("a", "b", "again") and a.step_time_s == b.step_time_s
    # tp_chunks is not read without chunked TP overlap: same step, same cache entry
    assert workload_key(with_knobs(W, tp_chunks=8)) == workload_key(W)
    assert workload_key(with_knobs(W, tp_overlap="chunked", tp_chunks=8)) != workload_key(
        with_knobs(W, tp_overlap="chunked", tp_chunks=2))
    c = pl.evaluate(with_knobs(W, tp_chunks=8), "c")
    assert pl.simulations == 1 and c.knobs["tp_chunks"] == 8  # reported knobs are the ones asked for
    pl.evaluate(with_knobs(W, fsdp_prefetch=2), "d")
    assert pl.simulations == 2


def test_registry_is_explicit_and_typed():
    reg = default_registry()
    assert reg.names() == ["lagom", "autoccl", "knobs+lagom", "centauri", "ficco"]
    assert all(isinstance(s, Strategy) and s.summary for s in reg)
    with pytest.raises(ConfigError, match="unknown strategy 'nope'; available: lagom"):
        reg.get("nope")
    with pytest.raises(ConfigError, match="registered twice"):
        reg.add(reg.get("lagom"))
    with pytest.raises(ConfigError, match="not a strategy"):
        StrategyRegistry([object()])


def test_a_new_strategy_runs_on_the_planners_cache():
    seen = []

    def fsdp_prefetch_two(planner, start):
        seen.append(planner.cost)
        return planner.evaluate(with_knobs(start, fsdp_prefetch=2), "prefetch-2", note="deeper prefetch")

    reg = StrategyRegistry([FunctionStrategy("prefetch-2", fsdp_prefetch_two, "FSDP prefetch depth 2")])
    pl = Planner(W, jobs=1)
    res = plan(W, registry=reg, planner=pl)
    # the last row re-simulates the recommended one with only what can be applied
    assert [s.name for s in res.strategies] == ["as-given", "no-overlap", "best-knobs", "prefetch-2", "applicable"]
    assert seen == [pl.cost]
    assert res.strategy("prefetch-2").knobs["fsdp_prefetch"] == 2
    assert AS_GIVEN.run(pl, W).step_time_s == res.as_given.step_time_s


def test_worker_processes_do_not_change_predictions():
    # the knob search, Lagom and Centauri send independent candidates to worker processes
    serial = plan(W, planner=Planner(W, jobs=1), extra=["lagom", "centauri"])
    parallel = plan(W, planner=Planner(W, jobs=2), extra=["lagom", "centauri"])
    assert [(s.name, s.step_time_s, s.note) for s in serial.strategies] == \
        [(s.name, s.step_time_s, s.note) for s in parallel.strategies]
    assert serial.best_workload == parallel.best_workload


def test_strategies_in_worker_processes_match_one_process_on_a_pipeline():
    # every registered strategy, each group in its own process, on a 1F1B step whose reported
    # rows are extrapolated from 6 and 8 micro-batches: the same rows as in one process
    w = workload_from_mapping({"model": "phi-2", "cluster": "dgx-h100", "nodes": 1,
                               "parallel": {"tp": 2, "pp": 2, "dp": 2, "data_parallel": "fsdp",
                                            "sequence_parallel": True, "pp_schedule": "1f1b"},
                               "batch": {"global_batch": 20, "micro_batch": 1, "seq_len": 2048}})
    serial = plan(w, planner=Planner(w, jobs=1))
    parallel = plan(w, planner=Planner(w, jobs=2))
    assert parallel.stats["extrapolated_from"] == (6, 8)
    assert [s.name for s in serial.strategies] == ["as-given", "no-overlap", "best-knobs", "lagom", "autoccl",
                                                   "knobs+lagom", "centauri", "ficco", "applicable"]
    assert [(s.name, s.step_time_s, s.exposed_comm_s, s.note) for s in serial.strategies] == \
        [(s.name, s.step_time_s, s.exposed_comm_s, s.note) for s in parallel.strategies]
    # the workers' simulations are counted
    assert parallel.stats["graph_simulations"] == serial.stats["graph_simulations"] > 0
    assert set(parallel.stats["cpu_seconds"]) == set(serial.stats["cpu_seconds"])


def test_strategy_groups_keep_shared_work_together_heaviest_first():
    def none(planner, start):
        return None

    a = FunctionStrategy("a", none, group="g", weight=1.0)
    b = FunctionStrategy("b", none, weight=5.0)
    c = FunctionStrategy("c", none, group="g", weight=1.5)
    d = FunctionStrategy("d", none)
    assert [[s.name for s in g] for g in strategy_groups([a, b, c, d])] == [["b"], ["a", "c"], ["d"]]
    lagom = next(s for s in default_registry().select(None) if s.name == "lagom")
    autoccl = next(s for s in default_registry().select(None) if s.name == "autoccl")
    assert lagom.group == autoccl.group != ""  # they share overlap-group profiles


def test_pinned_timeline_survives_eviction():
    pl = Planner(W, jobs=1, keep_timelines=1)
    pl.evaluate(W, "a")
    pl.pin(W)
    for d in (0, 2, 3):
        pl.evaluate(with_knobs(W, fsdp_prefetch=d), "x")
    n = pl.simulations
    assert pl.evaluate(W, "a", keep_timeline=True).timeline is not None
    assert pl.simulations == n  # not simulated again
    pl.pin(W, False)
    pl.evaluate(with_knobs(W, fsdp_prefetch=0), "y", keep_timeline=True)  # evicted earlier: simulated again
    assert pl.simulations == n + 1
    pl.evaluate(W, "a", keep_timeline=True)  # unpinned, so evicted by the line above
    assert pl.simulations == n + 2
