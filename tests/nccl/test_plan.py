"""The per-communication NCCL plan (process group x collective type x message-size range)."""

from __future__ import annotations

import pytest

from ccoverlap.errors import ConfigError
from ccoverlap.nccl.plan import CommKey, CommPlan, CommRule, comm_keys, size_ranges
from ccoverlap.sim.graph import OpGraph
from ccoverlap.specs import CollectiveSpec, CommConfig, GemmSpec, GroupSpec

MiB = 1 << 20
DP = GroupSpec(name="dp", size=8, local_size=8)
TP = GroupSpec(name="tp", size=8, local_size=8)
SMALL = CommConfig(channels=2, threads=512, chunk_bytes=684 * 1024, protocol="simple", algorithm="ring")
BIG = CommConfig(channels=16, threads=512, chunk_bytes=512 * 1024, protocol="simple", algorithm="ring")


def coll(kind, nbytes, group=DP):
    return CollectiveSpec(collective=kind, bytes=float(nbytes), group=group)


def step_graph():
    g = OpGraph()
    a = g.add("gemm", GemmSpec(m=1024, n=1024, k=1024))
    g.add("ag", coll("all_gather", 150 * MiB), stream="ag", deps=[a])
    g.add("ag_embed", coll("all_gather", 250 * MiB), stream="ag")
    g.add("rs", coll("reduce_scatter", 300 * MiB), stream="rs")
    g.add("tp_ar", coll("all_reduce", 84 * MiB, TP), stream="compute")
    g.add("ag2", coll("all_gather", 150 * MiB), stream="ag", deps=[1])
    return g


def test_size_ranges_cover_each_size_and_never_overlap():
    r = size_ranges([150 * MiB, 250 * MiB, 150 * MiB, 10 * MiB])
    assert sorted(r) == [10 * MiB, 150 * MiB, 250 * MiB]
    spans = [r[k] for k in sorted(r)]
    for (lo, hi), size in zip(spans, sorted(r)):
        assert lo <= size < hi
    for (_, hi), (lo, _) in zip(spans, spans[1:]):
        assert hi == pytest.approx(lo)


def test_rows_are_per_group_collective_and_size():
    keys = comm_keys(step_graph())
    assert keys[CommKey("dp", "all_gather", 150.0 * MiB, 8, 8)] == 2  # two occurrences
    plan = CommPlan.from_configs({CommKey("dp", "all_gather", 150.0 * MiB, 8, 8): SMALL,
                                  CommKey("tp", "all_reduce", 84.0 * MiB, 8, 8): BIG}, universe=keys)
    assert plan.lookup(coll("all_gather", 150 * MiB)) == SMALL
    assert plan.lookup(coll("all_gather", 250 * MiB)) is None      # another size: not covered
    assert plan.lookup(coll("reduce_scatter", 150 * MiB)) is None  # another collective type
    assert plan.lookup(coll("all_reduce", 84 * MiB, TP)) == BIG
    assert plan.lookup(coll("all_reduce", 84 * MiB)) is None       # another process group


def test_apply_changes_only_matching_collectives_and_keeps_the_graph():
    g = step_graph()
    before = [op.spec for op in g.ops]
    plan = CommPlan.from_configs({CommKey("dp", "all_gather", 150.0 * MiB, 8, 8): SMALL}, universe=comm_keys(g))
    new = plan.apply(g)
    assert [op.spec for op in g.ops] == before  # the source graph is untouched
    assert [(o.op_id, o.name, o.stream, o.deps) for o in new.ops] == [(o.op_id, o.name, o.stream, o.deps)
                                                                      for o in g.ops]
    by_name = {o.name: o.spec for o in new.ops}
    assert by_name["ag"].config == SMALL and by_name["ag2"].config == SMALL
    assert by_name["ag_embed"].config == CommConfig() and by_name["rs"].config == CommConfig()


def test_plan_round_trips_through_plain_data():
    plan = CommPlan.from_configs({CommKey("dp", "reduce_scatter", 300.0 * MiB, 16, 8): SMALL},
                                 sources={CommKey("dp", "reduce_scatter", 300.0 * MiB, 16, 8): "lagom"})
    d = plan.to_dict()
    row = d["rules"][0]
    assert row["group"] == "dp" and row["collective"] == "reduce_scatter" and row["source"] == "lagom"
    assert row["group_size"] == 16 and row["local_size"] == 8
    assert row["config"] == {"channels": 2, "threads": 512, "chunk_bytes": 684 * 1024, "protocol": "simple",
                             "algorithm": "ring"}
    assert row["min_bytes"] <= 300 * MiB < row["max_bytes"]
    assert CommPlan.from_dict(d) == plan
    assert "NC=2 NT=512 C=684 KiB simple ring" in plan.describe()


@pytest.mark.parametrize("data, message", [
    ([], "list 'rules'"),
    ({"rules": [{"group": "dp"}]}, "'config' mapping"),
    ({"rules": [{"group": "dp", "collective": "all_gather", "min_bytes": 1, "max_bytes": 2,
                 "config": {"channels": 2, "nc": 3}}]}, "rules\\[0\\]"),
    ({"rules": [{"group": "dp", "collective": "gather", "min_bytes": 1, "max_bytes": 2, "config": {}}]},
     "unknown collective 'gather'"),
    ({"rules": [{"group": "dp", "collective": "all_gather", "min_bytes": 5, "max_bytes": 2, "config": {}}]},
     "min_bytes < max_bytes"),
])
def test_malformed_plans_name_what_is_wrong(data, message):
    with pytest.raises(ConfigError, match=message):
        CommPlan.from_dict(data, where="plan.json")


def test_rule_needs_a_comm_config():
    with pytest.raises(ConfigError, match="CommConfig"):
        CommRule("dp", "all_gather", 0, 1, {"channels": 2})


def test_weights_need_only_the_duration_a_planner_cost_promises():
    # a Planner takes any cost with duration_s(spec, concurrent), and Lagom hands planner.cost here
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.predict.evaluate import cost_model_for_cluster

    real = cost_model_for_cluster(get_cluster("dgx-h100"))

    class OnlyDuration:
        def duration_s(self, spec, concurrent=()):
            return real.duration_s(spec, concurrent)

    g = step_graph()
    want = comm_keys(g, real)
    assert want[CommKey("dp", "all_gather", 150.0 * MiB, 8, 8)] == pytest.approx(
        2 * real.alone_s(coll("all_gather", 150 * MiB)))  # two occurrences, each its stand-alone time
    assert comm_keys(g, OnlyDuration()) == want
