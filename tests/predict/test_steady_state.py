"""Steady-state extrapolation (Planner.metrics / rewritten_metrics): a full step's summary taken
from two shorter simulated steps must match the full simulation on every pipeline schedule it is
used for, with and without TP, with FSDP and DDP, with recomputation, context and expert
parallelism, and for graphs the deciders rewrite.

Tolerance: 1e-4 of the step time (step time, exposed communication, compute, communication)
and 1e-4 of overlap ratio. 1F1B, interleaved and no-pipeline steps are affine in the micro-batch
count to rounding (~1e-13 measured); a decider's configuration can leave a little more (Lagom's
on the README 70B plan: 2.4e-7 of exposed communication). 1e-4 is below the plan table's print
resolution (0.1 ms for any step up to 1 s, whole per cent of overlap). GPipe is not extrapolated
because it fails this check (overlap ratio off by 3.2e-4 on the PP4 DDP layout below, step time
by 2.1e-5), nor is DualPipe (step time off by 1.6e-4 from 8 and 12 micro-batches).
"""

import pytest

from ccoverlap.deciders.centauri.tiers import centauri_graph
from ccoverlap.deciders.ficco.plan import _spliced_graph
from ccoverlap.predict.evaluate import StepMetrics, extrapolate_metrics
from ccoverlap.predict.strategy import Planner, steady_state_microbatches, with_microbatches
from ccoverlap.predict.workload import workload_from_mapping

TOL = 1e-4


def _w(parallel, microbatches, nodes=1, model="phi-2", seq_len=2048):
    dp = parallel.get("dp", 1)
    return workload_from_mapping({"model": model, "cluster": "dgx-h100", "nodes": nodes, "parallel": parallel,
                                  "batch": {"global_batch": microbatches * dp, "micro_batch": 1, "seq_len": seq_len}})


LAYOUTS = {
    "1f1b-tp2-sp-fsdp": _w({"tp": 2, "pp": 2, "dp": 2, "data_parallel": "fsdp", "sequence_parallel": True,
                            "pp_schedule": "1f1b"}, 24),
    "interleaved-tp2-ddp": _w({"tp": 2, "pp": 2, "dp": 2, "data_parallel": "ddp", "pp_schedule": "interleaved",
                               "virtual_stages": 2}, 24),
    "interleaved-pp4-tp2-sp-fsdp": _w({"tp": 2, "pp": 4, "dp": 2, "data_parallel": "fsdp", "sequence_parallel": True,
                                       "pp_schedule": "interleaved", "virtual_stages": 2}, 32, nodes=2),
    "1f1b-pp4-fsdp": _w({"pp": 4, "dp": 2, "data_parallel": "fsdp", "pp_schedule": "1f1b"}, 24),
    "no-pp-tp2-sp-fsdp": _w({"tp": 2, "dp": 4, "data_parallel": "fsdp", "sequence_parallel": True}, 16),
    "no-pp-dp8-ddp": _w({"dp": 8, "data_parallel": "ddp"}, 16),
    "1f1b-tp2-full-recompute": _w({"tp": 2, "pp": 2, "dp": 2, "pp_schedule": "1f1b", "recompute": "full"}, 24),
    "1f1b-cp2-fsdp": _w({"cp": 2, "pp": 2, "dp": 2, "pp_schedule": "1f1b", "data_parallel": "fsdp"}, 24,
                        seq_len=8192),
    "1f1b-moe-ep4": _w({"pp": 2, "dp": 4, "ep": 4, "pp_schedule": "1f1b"}, 24, model="olmoe"),
    "no-pp-moe-ep4-tp2-sp": _w({"tp": 2, "dp": 4, "ep": 4, "sequence_parallel": True}, 16, model="olmoe"),
}


def _close(fast, exact):
    t = exact.step_time_s
    assert fast.step_time_s == pytest.approx(t, rel=TOL)
    for field in ("exposed_comm_s", "compute_s", "comm_s"):
        assert abs(getattr(fast, field) - getattr(exact, field)) <= TOL * t, field
    assert fast.overlap_ratio == pytest.approx(exact.overlap_ratio, abs=TOL)
    assert fast.mfu == pytest.approx(exact.mfu, rel=TOL)
    assert fast.peak_memory_bytes == exact.peak_memory_bytes and fast.fits_memory == exact.fits_memory


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_extrapolated_step_matches_full_simulation(name):
    w = LAYOUTS[name]
    fast, exact = Planner(w, jobs=1), Planner(w, jobs=1, exact=True)
    assert fast.steady_state(w) is not None and exact.steady_state(w) is None
    got = fast.evaluate(w, "x")
    assert fast.extrapolations == 1 and fast.simulations == 2  # two short steps, not the full one
    assert exact.metrics(w).extrapolated_from is None
    _close(got, exact.evaluate(w, "x"))


def test_ficco_rewrite_extrapolated_matches_full_simulation():
    w = LAYOUTS["1f1b-tp2-sp-fsdp"]
    fast, exact = Planner(w, jobs=1), Planner(w, jobs=1, exact=True)

    def rewrite(pl):
        return lambda st: _spliced_graph(pl, st, w.cluster, 2, "sm", "heuristic")

    a = fast.rewritten_metrics(w, rewrite(fast), key=("test",))
    b = exact.rewritten_metrics(w, rewrite(exact), key=("test",))
    assert a.extrapolated_from == (6, 8) and b.extrapolated_from is None
    _close(fast.summarize_metrics("f", w, a), exact.summarize_metrics("f", w, b))
    # the rewrite changed the step (else this would only re-test the plain step); both are
    # deterministic, so any difference above rounding is the rewrite's (here ~0.07%)
    assert a.step_time_s != pytest.approx(fast.metrics(w).step_time_s, rel=1e-5)
    # cached per step length under its key: asking again simulates nothing
    n = fast.graph_simulations
    fast.rewritten_metrics(w, rewrite(fast), key=("test",))
    assert fast.graph_simulations == n


@pytest.mark.parametrize("kw", [{"layer": "T2"}, {"defer_units": 2}], ids=["t2", "defer-2"])
def test_centauri_rewrite_extrapolated_matches_full_simulation(kw):
    w = LAYOUTS["1f1b-pp4-fsdp"]
    fast, exact = Planner(w, jobs=1), Planner(w, jobs=1, exact=True)
    a = fast.rewritten_metrics(w, lambda st: centauri_graph(st, **kw))
    b = exact.rewritten_metrics(w, lambda st: centauri_graph(st, **kw))
    assert a.extrapolated_from is not None
    _close(fast.summarize_metrics("c", w, a), exact.summarize_metrics("c", w, b))


def test_which_steps_are_extrapolated():
    assert steady_state_microbatches(LAYOUTS["1f1b-tp2-sp-fsdp"]) == (6, 8)
    inter = LAYOUTS["interleaved-pp4-tp2-sp-fsdp"]
    assert steady_state_microbatches(inter) == (12, 16) and all(m % 4 == 0 for m in (12, 16))
    assert steady_state_microbatches(LAYOUTS["no-pp-dp8-ddp"]) == (4, 5)
    # GPipe and DualPipe are not extrapolated; nor is a step no longer than the second short one
    assert steady_state_microbatches(_w({"pp": 4, "dp": 2, "pp_schedule": "dualpipe"}, 24)) is None
    assert steady_state_microbatches(_w({"pp": 4, "dp": 2, "pp_schedule": "gpipe"}, 24)) is None
    assert steady_state_microbatches(_w({"pp": 2, "dp": 4, "pp_schedule": "1f1b"}, 8)) is None
    assert with_microbatches(LAYOUTS["no-pp-dp8-ddp"], 5).batch.microbatches(8) == 5


@pytest.mark.parametrize("schedule", ["gpipe", "dualpipe"])
def test_schedules_not_extrapolated_are_simulated_in_full(schedule):
    w = _w({"pp": 4, "dp": 2, "data_parallel": "ddp", "pp_schedule": schedule}, 24)
    fast, exact = Planner(w, jobs=1), Planner(w, jobs=1, exact=True)
    got = fast.evaluate(w, "x")
    assert fast.extrapolations == 0 and fast.metrics(w).extrapolated_from is None
    assert got.step_time_s == exact.evaluate(w, "x").step_time_s


def test_extrapolation_needs_two_lengths():
    w = LAYOUTS["no-pp-dp8-ddp"]
    pl = Planner(w, jobs=1, exact=True)
    m = pl.metrics(with_microbatches(w, 4))
    with pytest.raises(ValueError):
        extrapolate_metrics(m, m, 16)
    assert isinstance(m, StepMetrics) and m.microbatches == 4
