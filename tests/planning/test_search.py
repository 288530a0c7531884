"""`ccoverlap plan --search`: legal layouts only, memory filter, ranking, JSON, picture, bad input."""

import json

import pytest

from ccoverlap.catalog.hardware import get_cluster
from ccoverlap.catalog.models import get_model
from ccoverlap.cli import main
from ccoverlap.parallel.config import BatchConfig, config_problems
from ccoverlap.planning.search import enumerate_layouts, label, screen_estimate

ARGS = ["plan", "--search", "--model", "phi-2", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "16",
        "--seq-len", "2048", "--max-simulations", "4", "--top", "1"]


def test_enumerated_layouts_are_legal_and_cover_the_axes():
    model, cluster = get_model("llama-3-8b"), get_cluster("dgx-h100", nodes=2)
    batch = BatchConfig(global_batch=32, micro_batch=1, seq_len=4096)
    layouts = enumerate_layouts(model, cluster, batch)
    assert layouts
    for p, b in layouts:
        assert p.world_size == 16 and not config_problems(p, model, cluster, b)
        assert p.sequence_parallel == (p.tp > 1)
    seen = lambda f: {f(p, b) for p, b in layouts}  # noqa: E731
    assert seen(lambda p, b: p.tp) == {1, 2, 4, 8}
    assert {1, 2, 4, 8} <= seen(lambda p, b: p.pp)
    assert seen(lambda p, b: p.data_parallel) == {"ddp", "fsdp"}
    assert seen(lambda p, b: p.recompute) == {"none", "selective", "full"}
    assert seen(lambda p, b: p.pp_schedule) == {"1f1b", "interleaved", "gpipe", "dualpipe"}
    assert {1, 2, 4, 8} <= seen(lambda p, b: p.dp_replicate)
    assert seen(lambda p, b: p.ep) == {1}  # a dense model gets no expert parallelism
    assert seen(lambda p, b: b.micro_batch) == {1, 2, 4}
    assert seen(lambda p, b: getattr(p, "cp", 1)) == ({1, 2, 4, 8} if hasattr(layouts[0][0], "cp") else {1})
    assert len({(p, b) for p, b in layouts}) == len(layouts)


def test_search_json_ranks_fitting_layouts(capsys, tmp_path):
    code = main(ARGS + ["--json", "--png", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["enumerated"] >= doc["fitting"] >= doc["simulated"] >= 1
    assert doc["simulated"] <= 4
    ranked = doc["ranked"]
    times = [r["best_knobs_step_time_s"] or r["step_time_s"] for r in ranked]
    assert times == sorted(times) and all(t > 0 for t in times)
    assert all(r["fits"] for r in ranked)
    assert ranked[0]["best_knobs"] is not None  # the top layout got the knob search
    assert (tmp_path / "search.png").stat().st_size > 10_000


def test_search_table_and_bad_input(capsys, tmp_path):
    assert main(ARGS + ["--no-png", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "layout search" in out and "legal layouts" in out and "TP" in out
    assert main(ARGS + ["--max-simulations", "0", "--out", str(tmp_path)]) == 2
    assert "--max-simulations" in capsys.readouterr().err
    assert main(ARGS + ["--top", "-1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--top" in err and "Traceback" not in err


# a small case checked by hand: Llama-3-8B (32 heads, 8 KV heads, 32 layers) on one 8-GPU node,
# global batch 8 x 4096, micro-batch 1, no recomputation, FSDP only, 1F1B only
SMALL = dict(micro_batches=(1,), recompute=("none",), data_parallel=("fsdp",), schedules=("1f1b",))


def _small(model="llama-3-8b", **kw):
    return enumerate_layouts(get_model(model), get_cluster("dgx-h100", nodes=1),
                             BatchConfig(global_batch=8, micro_batch=1, seq_len=4096), **dict(SMALL, **kw))


def test_hsdp_count_by_hand():
    # (tp, cp, pp, dp) with tp*cp*pp*dp = 8: 10 layouts with dp > 1 (FSDP) and 10 with dp = 1
    assert len(_small(hsdp=False)) == 20
    layouts = _small()
    # dp_replicate r > 1 dividing dp with shard groups dp*cp/r >= 2:
    # DP8: r=2,4; CP2 DP4: r=2,4; PP2 DP4, CP2 PP2 DP2, CP4 DP2, TP2 DP4, TP2 CP2 DP2: r=2;
    # PP4 DP2, TP2 PP2 DP2, TP4 DP2: none (r=2 leaves shard groups of one rank)
    hsdp = [(p, b) for p, b in layouts if p.dp_replicate > 1]
    assert len(layouts) == 29 and len(hsdp) == 9
    assert {label(p, b) for p, b in hsdp} >= {"TP1 DP8 HSDP(2x4) mb1 rc=none", "TP1 DP8 HSDP(4x2) mb1 rc=none",
                                              "TP1 CP4 DP2 HSDP(2x4) mb1 rc=none"}
    assert all(p.data_parallel == "fsdp" and p.dp_shard >= 2 and p.dp % p.dp_replicate == 0 for p, _ in hsdp)
    # no HSDP without FSDP
    assert not [p for p, _ in _small(data_parallel=("ddp",)) if p.dp_replicate > 1]


def test_gpipe_and_dualpipe_counts_by_hand():
    one_f_one_b = [(p, b) for p, b in _small() if p.pp > 1]
    gpipe = [(p, b) for p, b in _small(schedules=("gpipe",)) if p.pp > 1]
    dual = [(p, b) for p, b in _small(schedules=("dualpipe",)) if p.pp > 1]
    # GPipe has no rule of its own: the same 12 pipelined layouts as 1F1B
    assert len(one_f_one_b) == len(gpipe) == 12
    # DualPipe needs an even pp and an even number of micro-batches M = 8/dp >= 2 pp: PP2 DP4 (M=2),
    # PP4 DP2 (M=4) and PP8 DP1 (M=8) are dropped; CP2 PP2 DP2 (FSDP and HSDP 2x2), CP2 PP4, CP4 PP2,
    # TP2 PP2 DP2, TP2 PP4, TP2 CP2 PP2 and TP4 PP2 stay
    assert len(dual) == 8
    for p, b in dual:
        m = b.global_batch // (p.dp * b.micro_batch)
        assert p.pp % 2 == 0 and m % 2 == 0 and m >= 2 * p.pp
    assert not [p for p, _ in dual if (p.tp, p.cp, p.pp) == (1, 1, 2)]


def test_expert_parallel_count_by_hand():
    # Mixtral-8x7B has the same heads and layers as Llama-3-8B (29 layouts without EP) and 8 experts;
    # ep > 1 must divide 8 and dp: per (dp, FSDP/HSDP variant) DP8 adds 3, DP4 adds 2, DP2 adds 1:
    # DP8 x3 variants: 9; PP2 DP4 x2: 4; CP2 DP4 x3: 6; TP2 DP4 x2: 4; the DP2 layouts
    # (PP4, CP2 PP2 x2, CP4 x2, TP2 PP2, TP2 CP2 x2, TP4): 9
    assert len(_small("mixtral-8x7b", expert_parallel=False)) == 29
    layouts = _small("mixtral-8x7b")
    ep = [(p, b) for p, b in layouts if p.ep > 1]
    assert len(ep) == 32 and len(layouts) == 61
    assert {p.ep for p, _ in ep} == {2, 4, 8}
    assert all(p.dp % p.ep == 0 and 8 % p.ep == 0 for p, _ in ep)
    assert "TP1 DP8 HSDP(2x4) EP8 mb1 rc=none" in {label(p, b) for p, b in ep}


def _simulated_vs_estimate(model, p, b, nodes=1):
    """(screening estimate, simulated step with default knobs and overlap on) of one layout."""
    from dataclasses import replace

    from ccoverlap.predict.evaluate import cost_model_for
    from ccoverlap.predict.strategy import Planner
    from ccoverlap.predict.workload import workload_from_mapping

    w = workload_from_mapping({"model": model, "cluster": "dgx-h100", "nodes": nodes,
                               "parallel": p.to_dict(), "batch": b.to_dict()})
    w = replace(w, knobs=replace(w.knobs, overlap=True))
    cost = cost_model_for(w)
    est = screen_estimate(w.model, w.cluster, w.parallel, w.batch, cost)
    return est, Planner(w, cost=cost).evaluate(w, "x").step_time_s


@pytest.mark.parametrize("model,want", [
    ("llama-3-8b", "TP1 DP8 HSDP(2x4) mb1 rc=none"),
    ("llama-3-8b", "TP1 PP2(gpipe) DP4 FSDP mb1 rc=none"),
    ("llama-3-8b", "TP2+SP PP2(dualpipe) DP2 FSDP mb1 rc=none"),
    ("llama-3-8b", "TP1 CP2 PP2(dualpipe) DP2 HSDP(2x2) mb1 rc=none"),
    ("mixtral-8x7b", "TP2+SP DP4 FSDP EP4 mb1 rc=none"),
    ("mixtral-8x7b", "TP1 PP2(gpipe) DP4 HSDP(2x2) EP2 mb1 rc=none"),
])
def test_screening_estimate_stays_below_the_simulated_step(model, want):
    sched = ("1f1b", "gpipe", "dualpipe")
    (p, b), = [(p, b) for p, b in _small(model, schedules=sched) if label(p, b) == want]
    est, sim = _simulated_vs_estimate(model, p, b)
    assert 0 < est <= sim * (1 + 1e-6)
    # and not trivially low: measured 0.49-0.86 on these layouts (the estimate uses isolated
    # times; the simulated step adds communication's contention with the GEMMs beside it)
    assert est > 0.45 * sim


def test_moe_search_json_carries_the_new_fields(capsys, tmp_path):
    code = main(["plan", "--search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "4",
                 "--global-batch", "64", "--seq-len", "4096", "--max-simulations", "8", "--top", "1",
                 "--json", "--no-png", "--out", str(tmp_path)])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bound_violations"] == 0 and doc["simulated"] >= 2
    rows = doc["ranked"] + doc["not_simulated"]
    assert {r["parallel"]["ep"] for r in rows} >= {1, 2, 4, 8}
    assert {r["parallel"]["dp_replicate"] for r in rows} >= {1, 2, 4}
    assert {r["parallel"]["pp_schedule"] for r in rows} >= {"gpipe", "dualpipe"}
    for r in rows:
        p = r["parallel"]
        assert ("EP" in r["label"]) == (p["ep"] > 1) and ("HSDP" in r["label"]) == (p["dp_replicate"] > 1)


def test_memory_filter_uses_the_framework_profile():
    """The search's memory estimate is the one the simulated step carries for the workload's
    framework: torchtitan's layouts (per-op selective recompute, the gathered SP input kept,
    an fp32 loss) are charged torchtitan's memory, megatron-core's theirs, and the two differ."""
    from ccoverlap.parallel.memory import estimate_memory
    from ccoverlap.planning.search import search
    from ccoverlap.predict.workload import workload_from_mapping

    def run(framework):
        w = workload_from_mapping({"model": "phi-2", "cluster": "dgx-h100", "nodes": 1, "parallel": {"dp": 8},
                                   "batch": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048},
                                   "framework": framework})
        return w, {c.label: c for c in search(w, max_simulations=1, top=0).candidates}

    w, tt = run("torchtitan")
    _, mc = run("megatron-core")
    tp_sp = [c for c in tt.values() if c.parallel.tp > 1 and c.parallel.sequence_parallel]
    assert tp_sp
    knobs = w.knobs.__class__(**{**w.knobs.__dict__, "overlap": True})
    for c in tp_sp[:5]:
        want = estimate_memory(w.model, c.parallel, c.batch, w.cluster, knobs, framework="torchtitan")
        other = estimate_memory(w.model, c.parallel, c.batch, w.cluster, knobs, framework="megatron-core")
        assert c.memory_bytes == pytest.approx(float(want.total_bytes))
        assert mc[c.label].memory_bytes == pytest.approx(float(other.total_bytes))
        assert want.total_bytes != pytest.approx(float(other.total_bytes), rel=1e-3)
