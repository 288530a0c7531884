"""Across ranks: match collectives, measure their start skew, find who everyone waits for.

Collectives on one process group are issued in the same order on every member rank (NCCL
and gloo require it), so when every rank's trace holds the same sequence of calls the N-th
communication row of group ``g`` on each rank is the same collective. A sampled or cut trace
may miss calls; then the sequences are aligned by collective type and ends that line up
(:mod:`ccoverlap.trace.match`, shared with ``replay``), calls without a partner are counted,
not compared, and a group where fewer than half the calls pair up gets no skew at all. A call's *start skew* is the latest minus the earliest start across the ranks; a
rank's *lateness* is its start minus the earliest. A collective cannot finish before its
last member arrives, so the latest starter is the rank the others wait for (the signal
HolisticTraceAnalysis' ``get_potential_stragglers`` uses, "late start of communication
kernels"). Times are compared on the job's clock: traces from different hosts are only as
aligned as the hosts' clocks (NTP: typically well under a millisecond).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ccoverlap.trace.classify import RankTrace  # noqa: F401 - the ranks cross_rank reads
from ccoverlap.trace.match import comm_rows_by_group, pair_calls


@dataclass
class GroupSkew:
    """Skew of the matched collectives of one process group (seconds)."""

    group: str
    ranks: list[int]
    matched: int
    mean_skew_s: float
    max_skew_s: float
    total_skew_s: float
    unmatched: dict[int, int] = field(default_factory=dict)   # rank -> its calls left unpaired
    paired_by: str = "order"      # "order": call order alone; "ends": aligned by type and ends
    reliable: bool = True         # False: too few calls pair up; skew not measured


@dataclass
class RankLateness:
    """How often and by how much one rank arrived last at collectives (seconds)."""

    rank: int
    collectives: int
    times_latest: int
    total_lateness_s: float
    mean_lateness_s: float


@dataclass
class CrossRank:
    """Everything :func:`cross_rank` finds; ``stragglers`` are ranks ordered by total lateness
    whose lateness stands out (see :func:`cross_rank`)."""

    groups: list[GroupSkew]
    lateness: list[RankLateness]
    stragglers: list[int]
    slowest_rank_per_step: dict[int, int]
    note: str = ""
    too_few: str = ""           # ranks that look late but on too few paired calls to be named


    def to_dict(self) -> dict:
        """Plain dict for JSON (step keys as strings)."""
        d = asdict(self)
        d["slowest_rank_per_step"] = {str(k): v for k, v in self.slowest_rank_per_step.items()}
        return d


MAX_CLOCK_SPREAD_S = 10.0
# A straggler is named only when its lateness is unlikely to be chance: being the latest arrival
# so often has a one-sided binomial tail below STRAGGLER_SIGNIFICANCE (each call's latest rank
# taken as uniform among the call's ranks), or, for a total-lateness straggler, at least
# MIN_STRAGGLER_CALLS paired calls back it. (A rank last in 3 of 3 calls of a 2-rank group has a
# 12.5% chance of that by luck alone.)
STRAGGLER_SIGNIFICANCE = 0.05
MIN_STRAGGLER_CALLS = 5


def chance_of_being_latest(times_latest: int, calls: int, p_latest: float) -> float:
    """Probability that a rank is the latest arrival in at least ``times_latest`` of ``calls``
    collectives by chance, when each call's latest is any of its ranks with probability
    ``p_latest`` (1 / ranks per call): the binomial upper tail, a plain sign test."""
    if times_latest <= 0:
        return 1.0
    if times_latest > calls or p_latest <= 0:
        return 0.0
    if p_latest >= 1:
        return 1.0
    if calls <= 1000:       # the binomial coefficients fit a float: summed as they are
        return float(sum(math.comb(calls, k) * p_latest ** k * (1 - p_latest) ** (calls - k)
                         for k in range(times_latest, calls + 1)))
    # more calls: C(calls, k) overflows a float; sum the terms from their logarithms
    lp, lq, lc = math.log(p_latest), math.log1p(-p_latest), math.lgamma(calls + 1)
    logs = [lc - math.lgamma(k + 1) - math.lgamma(calls - k + 1) + k * lp + (calls - k) * lq
            for k in range(times_latest, calls + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(x - top) for x in logs))
MIN_PAIRED_FRACTION = 0.5     # below this share of a group's calls paired, its skew is not measured


def clock_spread_s(rts: list, masks: dict[int, np.ndarray] | None) -> float:
    """Largest difference between the ranks' first analysed event (seconds). Ranks of one job
    start their profiled steps within milliseconds of each other; a spread of many seconds means
    their clocks are not comparable (e.g. per-host monotonic clocks). Without ``masks`` each rank's
    ``first_start_s`` is read (a rank summary's)."""
    if masks is None:
        firsts = [rt.first_start_s for rt in rts if rt.first_start_s is not None]
    else:
        firsts = [float(rt.timeline.start_s[masks[rt.rank]].min()) for rt in rts if masks[rt.rank].any()]
    return max(firsts) - min(firsts) if len(firsts) > 1 else 0.0


def cross_rank(rts: list, masks: dict[int, np.ndarray] | None,
               step_times: dict[int, dict[int, float]] | None = None) -> CrossRank:
    """Match the selected communication rows across ranks (see the module docstring).

    ``rts``: ranks with a ``timeline`` (and ``first_start_s`` when ``masks`` is None: then every
    row of each timeline is analysed - rank summaries hold only their analysed communication rows).
    ``step_times[step][rank]`` (seconds) gives the slowest rank per step. A rank is called a
    straggler when it is the latest arrival in more than half of the matched collectives it
    took part in (and that many is unlikely by chance: :func:`chance_of_being_latest` below
    ``STRAGGLER_SIGNIFICANCE``), or its total lateness is at least twice the median of the other
    ranks' and above 1% of the skew summed over groups (over at least ``MIN_STRAGGLER_CALLS``
    calls) - and, either way, its mean lateness is at least 5% of the mean duration of those
    collectives (microsecond jitter names no straggler). Ranks that pass the first tests on too
    few calls are listed in ``too_few`` instead.
    """
    slowest = _slowest_per_step(step_times)
    if len(rts) < 2:
        return CrossRank([], [], [], slowest, note="one rank: nothing to compare across ranks")
    spread = clock_spread_s(rts, masks)
    if spread > MAX_CLOCK_SPREAD_S:
        return CrossRank([], [], [], slowest, note=f"the ranks' first events are {spread:.0f} s apart: their clocks "
                                                   f"are not comparable, so start skew is not measured")
    tally = _Tally({rt.rank: rt.timeline for rt in rts})
    per_group: dict[str, dict[int, np.ndarray]] = {}
    for rt in rts:
        for g, rows in comm_rows_by_group(rt.timeline, None if masks is None else masks[rt.rank]).items():
            per_group.setdefault(g, {})[rt.rank] = rows
    groups: list[GroupSkew] = []
    unreliable: list[str] = []
    for g, by_rank in sorted(per_group.items()):
        gs = _group_skew(g, by_rank, tally, unreliable)
        if gs is not None:
            groups.append(gs)
    lateness = tally.lateness()
    stragglers, too_few = _stragglers(lateness, tally, sum(gs.total_skew_s for gs in groups))
    if not groups:
        note = "no process group has collectives on two or more of the loaded ranks"
    elif unreliable and not any(gs.reliable for gs in groups):
        note = ("no reliable pairing of collectives across ranks (" + "; ".join(unreliable)
                + "), so start skew and stragglers are not measured")
    elif unreliable:
        note = "not measured for " + "; ".join(unreliable)
    else:
        note = ""
    return CrossRank(groups=groups, lateness=lateness, stragglers=stragglers, slowest_rank_per_step=slowest,
                     note=note, too_few="; ".join(too_few))


def _slowest_per_step(step_times: dict[int, dict[int, float]] | None) -> dict[int, int]:
    """The rank with the longest step, per step where the ranks' step times differ."""
    slowest = {}
    for step, per_rank in sorted((step_times or {}).items()):
        if len(per_rank) > 1 and max(per_rank.values()) - min(per_rank.values()) > 1e-9:
            slowest[step] = max(per_rank, key=lambda r: per_rank[r])
    return slowest


class _Tally:
    """Per rank, over the matched calls: total lateness, times latest, calls seen, summed
    duration and summed chance of being the latest (1 / ranks in the call)."""

    def __init__(self, tls: dict) -> None:
        self.tls = tls
        self.late_total = {r: 0.0 for r in tls}
        self.late_count = {r: 0 for r in tls}
        self.seen = {r: 0 for r in tls}
        self.dur_total = {r: 0.0 for r in tls}
        self.p_latest_sum = {r: 0.0 for r in tls}

    def add(self, call: list) -> float:
        """Count one matched call (``[(rank, row), ...]``); returns its start skew (s)."""
        tls = self.tls
        st = np.array([tls[r].start_s[row] for r, row in call])
        skew = float(st.max() - st.min())
        latest = int(np.argmax(st))
        for i, (r, row) in enumerate(call):
            self.late_total[r] += float(st[i] - st.min())
            self.late_count[r] += int(i == latest and skew > 0)
            self.seen[r] += 1
            self.p_latest_sum[r] += 1.0 / len(call)
            self.dur_total[r] += float(tls[r].end_s[row] - tls[r].start_s[row])
        return skew

    def lateness(self) -> list[RankLateness]:
        """Each rank's lateness, the most late first."""
        seen, total = self.seen, self.late_total
        out = [RankLateness(rank=r, collectives=seen[r], times_latest=self.late_count[r], total_lateness_s=total[r],
                            mean_lateness_s=total[r] / seen[r] if seen[r] else 0.0) for r in sorted(total)]
        out.sort(key=lambda x: (-x.total_lateness_s, x.rank))
        return out


def _group_skew(g: str, by_rank: dict[int, np.ndarray], tally: _Tally, unreliable: list[str]) -> GroupSkew | None:
    """Pair group ``g``'s calls across its ranks and count them in ``tally``; None when fewer than two
    ranks (or no call) take part. A group where too few calls pair up is named in ``unreliable``
    and gets no skew."""
    ranks = sorted(by_rank)
    if len(ranks) < 2:
        return None
    calls, how = pair_calls(tally.tls, by_rank)
    n_rows = sum(len(by_rank[r]) for r in ranks)
    paired = {r: 0 for r in ranks}
    for call in calls:
        for r, _ in call:
            paired[r] += 1
    unmatched = {r: len(by_rank[r]) - paired[r] for r in ranks if len(by_rank[r]) > paired[r]}
    if sum(paired.values()) < MIN_PAIRED_FRACTION * n_rows:
        unreliable.append(f"group {g}: only {len(calls)} of "
                          f"{max(len(by_rank[r]) for r in ranks)} calls pair up across ranks")
        return GroupSkew(group=g, ranks=ranks, matched=len(calls), mean_skew_s=0.0, max_skew_s=0.0,
                         total_skew_s=0.0, unmatched=unmatched, paired_by=how, reliable=False)
    if not calls:
        return None
    sk = np.asarray([tally.add(call) for call in calls])
    return GroupSkew(group=g, ranks=ranks, matched=len(calls), mean_skew_s=float(sk.mean()), max_skew_s=float(sk.max()),
                     total_skew_s=float(sk.sum()), unmatched=unmatched, paired_by=how)


def _stragglers(lateness: list[RankLateness], tally: _Tally, total_skew: float) -> tuple[list[int], list[str]]:
    """(the ranks named stragglers, one line per rank that qualifies on too few calls) - the rule
    of :func:`cross_rank`'s docstring."""
    stragglers, too_few = [], []
    for x in lateness:
        if x.collectives == 0 or x.total_lateness_s <= 0:
            continue
        others = [y.total_lateness_s for y in lateness if y.rank != x.rank and y.collectives]
        med = float(np.median(others)) if others else 0.0
        often = x.times_latest > x.collectives / 2
        much = x.total_lateness_s >= 2 * med and x.total_lateness_s > 0.01 * total_skew
        material = x.total_lateness_s >= 0.05 * tally.dur_total[x.rank]
        if not ((often or much) and material):
            continue
        chance = chance_of_being_latest(x.times_latest, x.collectives, tally.p_latest_sum[x.rank] / x.collectives)
        if (often and chance < STRAGGLER_SIGNIFICANCE) or (much and x.collectives >= MIN_STRAGGLER_CALLS):
            stragglers.append(x.rank)
        else:
            too_few.append(f"rank {x.rank} was last in {x.times_latest} of {x.collectives} paired call(s) "
                           f"({chance:.0%} likely by chance): too few to name a straggler")
    return stragglers, too_few
