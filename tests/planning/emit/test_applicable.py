"""The ``applicable`` plan row: a strategy re-simulated with only what the target framework and
stock NCCL can set, so the table never promises a gain that cannot be had."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ccoverlap.nccl.apply import TUNER_COLLECTIVES, match_row
from ccoverlap.nccl.plan import CommKey, CommPlan
from ccoverlap.planning.emit import build_emit, read_emit
from ccoverlap.planning.strategies import plan
from ccoverlap.predict.strategy import FunctionStrategy, Planner, StrategyRegistry
from ccoverlap.predict.workload import Workload
from ccoverlap.specs import CommConfig

W = Workload()


def _with_knobs(w, **kw):
    return replace(w, knobs=replace(w.knobs, **kw))


def _two_knobs(planner, start):
    # FSDP2 can keep gathered weights after forward, but cannot stop prefetching the next unit
    return planner.evaluate(_with_knobs(planner.workload, fsdp_reshard_after_forward=False, fsdp_prefetch=0),
                            "two-knobs")


def test_a_strategy_whose_knobs_cannot_all_be_applied_gets_a_row_without_them():
    reg = StrategyRegistry([FunctionStrategy("two-knobs", _two_knobs, "reshard off, no prefetch")])
    pl = Planner(W, jobs=1)
    res = plan(W, registry=reg, planner=pl, applicable_of="two-knobs")
    ideal, app = res.strategy("two-knobs"), res.applicable
    assert app is res.strategies[-1] and app.decision["of"] == "two-knobs"
    assert any(line.startswith("fsdp_prefetch: 0 -> 1") for line in app.decision["not_applied"])
    assert "fsdp_prefetch" in app.note and "FSDP2 always prefetches" in app.note
    # the row is the strategy with the applicable knob only, simulated
    only_reshard = Planner(W, jobs=1).evaluate(_with_knobs(W, fsdp_reshard_after_forward=False))
    assert app.step_time_s == pytest.approx(only_reshard.step_time_s, rel=1e-9)
    assert app.step_time_s != pytest.approx(ideal.step_time_s, rel=1e-6)
    assert app.knobs["fsdp_prefetch"] == W.knobs.fsdp_prefetch and app.knobs["fsdp_reshard_after_forward"] is False
    assert res.best().name != "applicable"  # a derived row is never the recommendation


def test_when_everything_applies_the_row_is_the_strategys_own(example_plan):
    b = build_emit(example_plan.strategy("ficco"), W, target="pytorch")  # FiCCO's schedules: ccoverlap's styles
    assert b.everything_applies and not b.dropped_lines()
    assert b.applicable.step_time_s == example_plan.strategy("ficco").step_time_s
    # torchtitan sets FiCCO's knobs (reshard after forward) but has no per-layer TP schedule
    tt = build_emit(example_plan.strategy("ficco"), W, target="torchtitan")
    assert {c.what.split(".")[0] for c, _ in tt.framework.dropped()} == {"tp_schedule"}
    ficco_knobs = Planner(W).evaluate(replace(W, knobs=replace(W.knobs, **{
        k: v for k, v in example_plan.strategy("ficco").knobs.items()
        if k not in ("comm_config", "comm_config_overrides")})))
    assert tt.applicable.step_time_s == pytest.approx(ficco_knobs.step_time_s, rel=1e-9)


def test_the_recommended_rows_applicable_step_is_what_the_emitted_files_run(example_plan, tmp_path):
    app = example_plan.applicable
    best = example_plan.best()
    assert app is not None and app.decision["of"] == best.name
    example_plan.emit(tmp_path)
    files = read_emit(tmp_path)
    env = files["env"]
    applied = {}
    for comm in files["decision"]["communications"]:  # each call's configuration from the files alone
        key = CommKey(comm["group"], comm["collective"], comm["bytes"], comm["group_size"], comm["local_size"])
        cfg = dict(comm["given"])
        if files["tuner_rows"] and key.collective in TUNER_COLLECTIVES:
            row = match_row(files["tuner_rows"], key)
            cfg.update(algorithm=row.algorithm, protocol=row.protocol, channels=row.channels)
        if "NCCL_NTHREADS" in env and cfg["protocol"] in ("simple", "ll"):
            cfg["threads"] = int(env["NCCL_NTHREADS"])
        if "NCCL_BUFFSIZE" in env and (cfg["protocol"], cfg["algorithm"]) == ("simple", "ring"):
            cfg["chunk_bytes"] = int(env["NCCL_BUFFSIZE"]) // 2
        applied[key] = CommConfig(**cfg)
    knobs = dict(W.knobs.to_dict())
    for c in files["decision"]["changes"]:
        if not c["why_not"]:
            knobs[c["what"]] = c["applied"]
    w = replace(W, knobs=type(W.knobs).from_dict(knobs))
    plan_from_files = CommPlan.from_configs(applied, universe=list(applied))
    pl = Planner(W)
    metrics = pl.rewritten_metrics(w, lambda st: plan_from_files.apply(st.graph), key=("from files",))
    assert metrics.step_time_s == pytest.approx(app.step_time_s, rel=1e-9)
    if files["decision"]["not_applied"]:
        assert app.step_time_s != pytest.approx(best.step_time_s, rel=1e-6)
