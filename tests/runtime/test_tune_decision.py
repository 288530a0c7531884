"""``tune``'s decision logic on synthetic timings (CPU, deterministic, no process group).

The interval, the round order and the per-round step are pure functions; the whole
``tune_choice`` loop runs here with the collectives replaced by one-rank stand-ins and the
clock replaced by scripted call durations, so what it times and picks is exact.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from ccoverlap.runtime import tuning  # noqa: E402
from ccoverlap.runtime.tuning import (  # noqa: E402
    TuneOptions,
    median_ratio_interval,
    paired_scores,
    round_order,
    tune_step,
)

LOAD = [1.0, 2.0, 1.2, 1.9, 1.1, 2.2, 0.9, 1.7, 1.3, 2.5, 1.0, 1.4]  # a drifting background load per round


def test_median_ratio_interval_is_the_sign_test_interval():
    # n = 20 at 95%: the 6th smallest and the 6th largest ratio (P(Bin(20, .5) <= 5) = 0.0207 <= 0.025 < P(<= 6))
    num = [float(i) for i in range(1, 21)]
    assert median_ratio_interval(num, [1.0] * 20, 0.95) == (6.0, 15.0)
    # n = 8 at 99%: min and max (coverage 1 - 2/256); n = 7 cannot reach 99%: no information
    assert median_ratio_interval(num[:8], [1.0] * 8, 0.99) == (1.0, 8.0)
    assert median_ratio_interval(num[:7], [1.0] * 7, 0.99) == (0.0, math.inf)
    # paired: a common per-round factor cancels exactly
    lo, hi = median_ratio_interval([1.06 * f for f in LOAD], LOAD, 0.99)
    assert lo == pytest.approx(1.06) and hi == pytest.approx(1.06)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_round_order_puts_every_candidate_after_every_other_equally_often(n):
    cycle = 2 * n if n % 2 else n
    rows = [round_order(n, r) for r in range(cycle)]
    assert all(sorted(row) == list(range(n)) for row in rows)
    follows = Counter((row[i], row[i + 1]) for row in rows for i in range(n - 1))
    assert set(follows) == {(a, b) for a, b in itertools.permutations(range(n), 2)}
    assert len(set(follows.values())) == 1
    assert Counter(row[0] for row in rows) == Counter({i: cycle // n for i in range(n)})
    assert round_order(n, cycle) == rows[0]  # the cycle repeats


def test_tune_step_drops_the_provably_slower_and_keeps_a_noisy_candidate():
    samples = {
        "a": [10.0 * f for f in LOAD],
        "slow": [10.4 * f for f in LOAD],  # 4% slower in every round: provably slower at any load
        "noisy": [10.0 * f * (0.8 if i % 2 else 1.25) for i, f in enumerate(LOAD)],  # straddles a
    }
    step = tune_step(samples, ["a", "slow", "noisy"], margin=0.02, confidence=0.99)
    assert step.keep == ("a", "noisy")
    assert step.pick is None  # noisy is not provably within 2% of a: keep measuring


def test_tune_step_waits_for_enough_rounds():
    samples = {"a": [10.0 * f for f in LOAD[:7]], "b": [13.0 * f for f in LOAD[:7]]}
    assert tune_step(samples, ["a", "b"], 0.02, 0.99) == tuning.TuneStep(("a", "b"), None, "undecided")
    samples = {"a": [10.0 * f for f in LOAD[:8]], "b": [13.0 * f for f in LOAD[:8]]}
    step = tune_step(samples, ["a", "b"], 0.02, 0.99)
    assert step.keep == ("a",) and step.pick == "a"


def test_tune_step_tie_break_is_the_simplest_candidate_within_the_margin():
    # per round, "simple" (listed first) takes 1% more or 0.5% less than "fancy": not provably
    # slower, but provably within 2% -> tied, and the tie goes to the simpler one
    jitter = [1.01 if i % 2 else 0.995 for i in range(len(LOAD))]
    samples = {"simple": [10.0 * f * j for f, j in zip(LOAD, jitter)], "fancy": [10.0 * f for f in LOAD]}
    step = tune_step(samples, ["simple", "fancy"], margin=0.02, confidence=0.99)
    assert step.pick == "simple" and step.keep == ("simple", "fancy") and "within 2%" in step.why
    # listing order is the tie-break, not the names or the point estimate
    assert tune_step(samples, ["fancy", "simple"], margin=0.02, confidence=0.99).pick == "fancy"
    # a margin below the spread: not provably within it, keep measuring
    assert tune_step(samples, ["simple", "fancy"], margin=0.005, confidence=0.99).pick is None


def test_tune_step_never_ties_a_provably_slower_candidate():
    # 1% slower in every round: within the margin, but provably slower, so dropped rather than tied
    samples = {"simple": [10.1 * f for f in LOAD], "fancy": [10.0 * f for f in LOAD]}
    step = tune_step(samples, ["simple", "fancy"], margin=0.02, confidence=0.99)
    assert step.keep == ("fancy",) and step.pick == "fancy"


def test_tune_step_only_calls_a_tie_when_the_pick_is_close_to_every_survivor():
    # per round relative to c: a is 0.98 or 1.04 (within 2% of b but up to 4% behind c), b is 0.99
    # or 1.01. Nobody is provably slower; a is listed first but not provably within 2% of c, b is.
    alt = [i % 2 for i in range(len(LOAD))]
    samples = {
        "a": [10.0 * f * (1.04 if o else 0.98) for f, o in zip(LOAD, alt)],
        "b": [10.0 * f * (1.01 if o else 0.99) for f, o in zip(LOAD, alt)],
        "c": [10.0 * f for f in LOAD],
    }
    step = tune_step(samples, ["a", "b", "c"], margin=0.02, confidence=0.99)
    assert step.keep == ("a", "b", "c") and step.pick == "b"


def test_paired_scores_cancel_the_round_load():
    samples = {"a": [10.0 * f for f in LOAD], "b": [10.6 * f for f in LOAD]}
    scores = paired_scores(samples, ["a", "b"])
    assert scores["a"] == 1.0 and scores["b"] == pytest.approx(1.06)


class _FakeRun:
    """Scripted call durations on a fake clock; records the order candidates ran in."""

    def __init__(self, durations):
        self.durations = durations  # name -> list of seconds per call (cycled)
        self.now = 0.0
        self.calls: list[str] = []

    def run_for(self, name):
        def run():
            i = sum(1 for c in self.calls if c == name)
            self.calls.append(name)
            seq = self.durations[name]
            self.now += seq[i % len(seq)]

        return run


@pytest.fixture
def one_rank(monkeypatch):
    """tune_choice's collectives as a one-rank group: all-reduce/broadcast leave the tensor as it is."""
    monkeypatch.setattr(tuning.comm, "comm_device", lambda group=None: torch.device("cpu"))
    monkeypatch.setattr(tuning.comm, "group_rank", lambda group=None: 0)
    monkeypatch.setattr(tuning.comm, "barrier", lambda group=None: None)
    monkeypatch.setattr(tuning.comm, "all_reduce", lambda t, group=None, op=None, async_op=True: None)
    monkeypatch.setattr(tuning.comm, "broadcast", lambda t, src, group=None, async_op=True: None)

    def install(fake):
        monkeypatch.setattr(tuning.time, "perf_counter", lambda: fake.now)

    return install


def test_tune_choice_drops_the_slow_and_stops_on_a_tie_with_the_simplest(one_rank):
    # per-round load alike for all (paired rounds cancel it); "serial" 40% slower; "ring" 1% slower or
    # 0.5% faster than "hetero" by turns: not provably slower, provably within 2%
    noise = [1.0, 1.3, 0.9, 1.1]
    fake = _FakeRun({"serial": [0.14 * f for f in noise], "ring": [0.1 * f * j for f, j in zip(noise, (1.01, 0.995) * 2)],
                     "hetero": [0.100 * f for f in noise]})  # fmt: skip
    one_rank(fake)
    opt = TuneOptions(warmup=1, min_reps=8, max_reps=50, budget_s=100.0, margin=0.02, confidence=0.99)
    dec = tuning.tune_choice("ag", fake.run_for, ["serial", "ring", "hetero"], None, torch.device("cpu"), options=opt)
    assert dec.schedule == "ring"  # within 2% of hetero and listed first: the tie-break
    assert dec.rounds == 8 and dec.eliminated == ("serial",)
    assert "within 2%" in dec.reason
    timed = fake.calls[3:]  # after one warm-up call each
    rounds = [timed[i : i + 3] for i in range(0, 24, 3)]
    assert all(sorted(r) == ["hetero", "ring", "serial"] for r in rounds)
    assert len({tuple(r) for r in rounds}) == 6  # the Williams rows, not one rotation: 6 different orders


def test_tune_choice_picks_the_point_leader_when_the_budget_ends_undecided(one_rank):
    # "b" is faster in most rounds but the two alternate too much to be told apart in 12 rounds
    fake = _FakeRun({"a": [0.10, 0.10, 0.10, 0.10], "b": [0.09, 0.097, 0.12, 0.095]})
    one_rank(fake)
    opt = TuneOptions(warmup=0, min_reps=8, max_reps=12, budget_s=100.0, margin=0.0, confidence=0.99)
    dec = tuning.tune_choice("ag", fake.run_for, ["a", "b"], None, torch.device("cpu"), options=opt)
    assert dec.rounds == 12 and dec.schedule == "b" and "max_reps" in dec.reason
    assert dict(dec.samples_s)["a"] == pytest.approx((0.10,) * 12)


def test_tune_choice_stops_at_the_time_budget(one_rank):
    fake = _FakeRun({"a": [1.0, 1.0, 1.0], "b": [0.9, 1.2, 1.0]})
    one_rank(fake)
    opt = TuneOptions(warmup=0, min_reps=8, max_reps=200, budget_s=20.0, margin=0.0, confidence=0.99)
    dec = tuning.tune_choice("ag", fake.run_for, ["a", "b"], None, torch.device("cpu"), options=opt)
    assert dec.rounds == 10 and "time budget" in dec.reason  # 2 s per round: over 20 s after round 10


def test_tune_options_reject_a_confidence_outside_one_half_to_one(monkeypatch):
    before = tuning.get_tune_options()
    for bad in (0.3, 1.0):
        with pytest.raises(ValueError, match="confidence"):
            tuning.set_tune_options(confidence=bad)
    assert tuning.get_tune_options() == before
    monkeypatch.setenv("CCOVERLAP_TUNE", "confidence=0.95,min_reps=10")
    assert tuning._options_from_env() == TuneOptions(confidence=0.95, min_reps=10)


def test_auto_candidate_on_cpu_is_ring_when_overlap_can_pay_else_serial(monkeypatch):
    monkeypatch.setattr(tuning.comm, "group_size", lambda group=None: 2)
    comm_heavy = (torch.zeros(4096, 1024), torch.zeros(1024, 128))  # T_comm/T_gemm 1.6 at the CPU defaults
    name, why = tuning.auto_candidate("ag", *comm_heavy, None)
    assert name == "ring" and "fewest steps" in why
    gemm_heavy = (torch.zeros(2048, 1024), torch.zeros(1024, 4096))
    assert tuning.auto_candidate("ag", *gemm_heavy, None)[0] == "serial"


@pytest.mark.parametrize("ring_s,expect", [(0.5, "ring"), (1.5, "serial"), (1.01, "serial")])
def test_auto_runs_its_candidate_only_when_measured_faster_than_serial(one_rank, monkeypatch, ring_s, expect):
    """auto times the candidate against serial on forward + backward; slower or tied within 2% keeps serial."""
    monkeypatch.setattr(tuning.comm, "group_size", lambda group=None: 2)
    fake = _FakeRun({"serial": [1.0, 1.02, 0.98], "ring": [ring_s, ring_s * 1.02, ring_s * 0.98]})
    one_rank(fake)
    monkeypatch.setattr(tuning, "_fwd_bwd_runner", lambda kind, a, b, group, name, engine="sm": fake.run_for(name))
    d = tuning._auto_decision("ag", torch.zeros(4096, 1024), torch.zeros(1024, 128), None, "sm")
    assert d.schedule == expect and d.how == "auto" and "forward + backward" in d.reason
    assert set(fake.calls) == {"serial", "ring"} and d.rounds >= tuning.AUTO_MEASURE.min_reps


def test_auto_does_not_measure_when_the_candidate_is_serial(one_rank, monkeypatch):
    monkeypatch.setattr(tuning.comm, "group_size", lambda group=None: 2)
    fake = _FakeRun({"serial": [1.0]})
    one_rank(fake)
    monkeypatch.setattr(tuning, "_fwd_bwd_runner", lambda *a, **k: pytest.fail("measured a serial-only decision"))
    d = tuning._auto_decision("ag", torch.zeros(2048, 1024), torch.zeros(1024, 4096), None, "sm")
    assert d.schedule == "serial" and "overlap cannot help" in d.reason
