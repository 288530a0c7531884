"""The Timeline: one columnar set of intervals, written by the simulator and the trace loader.

Every metric is computed here, once, so a predicted step and a measured step are compared
by the same code (DESIGN.md, "one timeline, two sources"). Times are seconds.

Columns: ``rank``, ``stream`` (stream or thread name), ``kind`` (compute | comm | memcpy |
other), ``name``, ``start_s``, ``end_s``, ``bytes``, ``flops``, ``collective``, ``group``
(process-group name), ``step`` (profiler step number, -1 when unknown).

Overlap ratio follows HolisticTraceAnalysis' ``get_comm_comp_overlap``: the time during
which at least one communication kernel and at least one computation kernel run, divided
by the length of the union of communication kernel intervals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

KINDS = ("compute", "comm", "memcpy", "other")


class Timeline:
    """Columnar intervals. Build with :class:`TimelineBuilder` or :meth:`from_rows`."""

    __slots__ = ("rank", "stream", "kind", "name", "start_s", "end_s", "bytes", "flops",
                 "collective", "group", "step", "meta")

    def __init__(
        self,
        *,
        rank: Sequence[int] | np.ndarray,
        stream: Sequence[str] | np.ndarray,
        kind: Sequence[str] | np.ndarray,
        name: Sequence[str] | np.ndarray,
        start_s: Sequence[float] | np.ndarray,
        end_s: Sequence[float] | np.ndarray,
        bytes: Sequence[float] | np.ndarray | None = None,
        flops: Sequence[float] | np.ndarray | None = None,
        collective: Sequence[str] | np.ndarray | None = None,
        group: Sequence[str] | np.ndarray | None = None,
        step: Sequence[int] | np.ndarray | None = None,
        meta: dict | None = None,
    ) -> None:
        n = len(start_s)
        self.rank = np.asarray(rank, dtype=np.int64)
        self.stream = np.asarray(stream, dtype=object)
        self.kind = np.asarray(kind, dtype=object)
        self.name = np.asarray(name, dtype=object)
        self.start_s = np.asarray(start_s, dtype=np.float64)
        self.end_s = np.asarray(end_s, dtype=np.float64)
        self.bytes = np.zeros(n) if bytes is None else np.asarray(bytes, dtype=np.float64)
        self.flops = np.zeros(n) if flops is None else np.asarray(flops, dtype=np.float64)
        self.collective = np.full(n, "", dtype=object) if collective is None else np.asarray(collective, dtype=object)
        self.group = np.full(n, "", dtype=object) if group is None else np.asarray(group, dtype=object)
        self.step = np.full(n, -1, dtype=np.int64) if step is None else np.asarray(step, dtype=np.int64)
        self.meta = dict(meta or {})
        for col in ("rank", "stream", "kind", "name", "end_s", "bytes", "flops", "collective", "group", "step"):
            if len(getattr(self, col)) != n:
                raise ValueError(f"Timeline column {col!r} has {len(getattr(self, col))} rows, expected {n}")
        bad = set(self.kind.tolist()) - set(KINDS)
        if bad:
            raise ValueError(f"Timeline kind must be one of {KINDS}, got {sorted(bad)}")

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def duration_s(self) -> np.ndarray:
        return self.end_s - self.start_s

    def ranks(self) -> list[int]:
        return sorted(int(r) for r in np.unique(self.rank))

    def select(self, mask: np.ndarray) -> Timeline:
        """The rows where ``mask`` is true (same meta)."""
        return Timeline(
            rank=self.rank[mask], stream=self.stream[mask], kind=self.kind[mask], name=self.name[mask],
            start_s=self.start_s[mask], end_s=self.end_s[mask], bytes=self.bytes[mask],
            flops=self.flops[mask], collective=self.collective[mask], group=self.group[mask],
            step=self.step[mask], meta=self.meta,
        )

    def for_rank(self, rank: int) -> Timeline:
        return self.select(self.rank == rank)

    def clip(self, start_s: float, end_s: float) -> Timeline:
        """Intervals cut to the window [start_s, end_s] (rows entirely outside are dropped)."""
        mask = (self.end_s > start_s) & (self.start_s < end_s)
        out = self.select(mask)
        out.start_s = np.maximum(out.start_s, start_s)
        out.end_s = np.minimum(out.end_s, end_s)
        return out

    def rows(self) -> Iterable[dict]:
        for i in range(len(self)):
            yield {
                "rank": int(self.rank[i]), "stream": str(self.stream[i]), "kind": str(self.kind[i]),
                "name": str(self.name[i]), "start_s": float(self.start_s[i]), "end_s": float(self.end_s[i]),
                "bytes": float(self.bytes[i]), "flops": float(self.flops[i]),
                "collective": str(self.collective[i]), "group": str(self.group[i]), "step": int(self.step[i]),
            }


class TimelineBuilder:
    """Appends rows one at a time (lists), then :meth:`build` makes the columnar Timeline."""

    def __init__(self) -> None:
        self._cols: dict[str, list] = {c: [] for c in (
            "rank", "stream", "kind", "name", "start_s", "end_s", "bytes", "flops", "collective", "group", "step")}

    def append(self, *, rank: int, stream: str, kind: str, name: str, start_s: float, end_s: float,
               bytes: float = 0.0, flops: float = 0.0, collective: str = "", group: str = "",
               step: int = -1) -> None:
        c = self._cols
        c["rank"].append(rank); c["stream"].append(stream); c["kind"].append(kind); c["name"].append(name)
        c["start_s"].append(start_s); c["end_s"].append(end_s); c["bytes"].append(bytes)
        c["flops"].append(flops); c["collective"].append(collective); c["group"].append(group)
        c["step"].append(step)

    def build(self, meta: dict | None = None) -> Timeline:
        return Timeline(meta=meta, **self._cols)


# ----------------------------------------------------------------------------- intervals

def merge_intervals(start: np.ndarray, end: np.ndarray, gap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint (start, end) arrays (a numpy sweep, O(n log n)).
    With ``gap`` > 0 (same unit as the times), gaps no longer than ``gap`` are closed too: what a
    picture at that resolution shows."""
    if len(start) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(start, kind="stable")
    s = np.asarray(start, dtype=np.float64)[order]
    e = np.asarray(end, dtype=np.float64)[order]
    running_end = np.maximum.accumulate(e)
    # a new merged interval begins where the start lies beyond every earlier end
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > running_end[:-1] + gap
    idx = np.flatnonzero(new)
    out_start = s[idx]
    out_end = np.maximum.reduceat(e, idx)
    return out_start, out_end


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Total length covered by the union of the intervals (seconds)."""
    s, e = merge_intervals(start, end)
    return float(np.sum(e - s))


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of (union of a) ∩ (union of b); a and b are already merged (disjoint, sorted)."""
    a_s, a_e = a
    b_s, b_e = b
    if len(a_s) == 0 or len(b_s) == 0:
        return 0.0
    # sweep over the boundary events: +1/-1 for a, +2/-2 for b; covered by both where sum == 3
    times = np.concatenate([a_s, a_e, b_s, b_e])
    delta = np.concatenate([np.ones(len(a_s)), -np.ones(len(a_e)), 2 * np.ones(len(b_s)), -2 * np.ones(len(b_e))])
    order = np.lexsort((delta, times))  # ends before starts at equal times: touching ≠ overlapping
    times, delta = times[order], delta[order]
    level = np.cumsum(delta)
    both = level[:-1] == 3
    return float(np.sum((times[1:] - times[:-1])[both]))


# ----------------------------------------------------------------------------- metrics

@dataclass(kw_only=True)
class RankMetrics:
    """Overlap metrics of one rank over one window (seconds unless named otherwise).

    ``overlap_ratio`` = communication time overlapped by compute / communication time
    (merged intervals, HolisticTraceAnalysis' definition); ``exposed_comm_s`` =
    communication time not overlapped by compute; ``idle_s`` = time no kernel runs;
    ``bubble_s`` = time the compute streams wait while the rank is inside its step but
    neither computing nor communicating exposed (the pipeline bubble, when PP is used);
    ``compute_comm_ratio`` R = compute / communication time (R < 1: communication-bound).
    """

    rank: int
    step_time_s: float
    compute_s: float
    comm_s: float
    memcpy_s: float
    overlap_s: float
    overlap_ratio: float
    exposed_comm_s: float
    compute_only_s: float
    idle_s: float
    bubble_s: float
    compute_comm_ratio: float
    flops: float = 0.0
    comm_bytes: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


class HasOverlap(Protocol):
    """Anything with a rank's (or a step's) overlapped and communication seconds."""

    overlap_s: float
    comm_s: float


def overlap_ratio(overlap_s: float, comm_s: float) -> float:
    """Communication time overlapped by compute / communication time (HolisticTraceAnalysis'
    definition); 0 without communication. Both in seconds."""
    return overlap_s / comm_s if comm_s > 0 else 0.0


def compute_comm_ratio(compute_s: float, comm_s: float) -> float:
    """R = compute / communication time (R < 1: communication-bound); inf without communication."""
    return compute_s / comm_s if comm_s > 0 else float("inf")


def job_overlap_ratio(ranks: Iterable[HasOverlap]) -> float:
    """The overlap ratio of a job (or of several steps): Σ overlapped / Σ communication seconds
    over ``ranks``, so a rank that communicates more weighs more; 0 without communication."""
    overlap = comm = 0.0
    for m in ranks:
        overlap += m.overlap_s
        comm += m.comm_s
    return overlap_ratio(overlap, comm)


def rank_metrics(tl: Timeline, rank: int, *, window: tuple[float, float] | None = None) -> RankMetrics:
    """Metrics of ``rank`` on ``tl`` (optionally clipped to ``window`` = (start_s, end_s))."""
    mine = tl.rank == rank
    t = tl if mine.all() else tl.select(mine)   # one rank's timeline (a trace's) is read, not copied
    if window is not None:
        t = t.clip(*window)
    return _metrics(rank, (t.kind, t.start_s, t.end_s, t.flops, t.bytes), window)


def _metrics(rank: int, cols: tuple[np.ndarray, ...], window: tuple[float, float] | None) -> RankMetrics:
    """:func:`rank_metrics` from one rank's (already clipped) columns ``cols`` = (kind,
    start_s, end_s, flops, bytes), in the timeline's row order."""
    kind, start_s, end_s, flops, nbytes = cols
    if len(start_s) == 0:
        return RankMetrics(rank=rank, step_time_s=0.0, compute_s=0.0, comm_s=0.0, memcpy_s=0.0,
                           overlap_s=0.0, overlap_ratio=0.0, exposed_comm_s=0.0, compute_only_s=0.0,
                           idle_s=0.0, bubble_s=0.0, compute_comm_ratio=float("inf"))
    if window is not None:
        span_start, span_end = window
    else:
        span_start, span_end = float(start_s.min()), float(end_s.max())
    step = span_end - span_start
    is_comp = kind == "compute"
    is_comm = kind == "comm"
    is_copy = kind == "memcpy"
    comp = merge_intervals(start_s[is_comp], end_s[is_comp])
    comm = merge_intervals(start_s[is_comm], end_s[is_comm])
    compute_s = float(np.sum(comp[1] - comp[0]))
    comm_s = float(np.sum(comm[1] - comm[0]))
    memcpy_s = union_length(start_s[is_copy], end_s[is_copy])
    overlap = intersection_length(comp, comm)
    busy = union_length(start_s, end_s)
    idle = max(0.0, step - busy)
    exposed = comm_s - overlap
    return RankMetrics(
        rank=rank,
        step_time_s=step,
        compute_s=compute_s,
        comm_s=comm_s,
        memcpy_s=memcpy_s,
        overlap_s=overlap,
        overlap_ratio=overlap_ratio(overlap, comm_s),
        exposed_comm_s=exposed,
        compute_only_s=compute_s - overlap,
        idle_s=idle,
        bubble_s=max(0.0, step - compute_s - exposed),
        compute_comm_ratio=compute_comm_ratio(compute_s, comm_s),
        flops=float(np.sum(flops[is_comp])),
        comm_bytes=float(np.sum(nbytes[is_comm])),
    )


def all_rank_metrics(tl: Timeline, *, window: tuple[float, float] | None = None) -> list[RankMetrics]:
    """:func:`rank_metrics` for every rank in the timeline, in rank order.

    The rows are grouped by rank once (a stable sort keeps each rank's rows in timeline
    order) and only the five columns the metrics read are taken, rather than one full
    :meth:`Timeline.select` of every column per rank."""
    ranks = tl.ranks()
    if len(ranks) <= 1:
        return [rank_metrics(tl, r, window=window) for r in ranks]
    order = np.argsort(tl.rank, kind="stable")
    bounds = np.searchsorted(tl.rank[order], ranks + [ranks[-1] + 1]).tolist()
    out = []
    for r, a, b in zip(ranks, bounds[:-1], bounds[1:]):
        rows = order[a:b]
        start_s, end_s = tl.start_s[rows], tl.end_s[rows]
        cols = (tl.kind[rows], start_s, end_s, tl.flops[rows], tl.bytes[rows])
        if window is not None:  # Timeline.clip on the five columns
            keep = (end_s > window[0]) & (start_s < window[1])
            kind, start_s, end_s, flops, nbytes = (c[keep] for c in cols)
            cols = (kind, np.maximum(start_s, window[0]), np.minimum(end_s, window[1]), flops, nbytes)
        out.append(_metrics(r, cols, window))
    return out


def step_time_s(tl: Timeline) -> float:
    """The step time of a simulated step: first start to last end over all ranks (seconds)."""
    if len(tl) == 0:
        return 0.0
    return float(tl.end_s.max() - tl.start_s.min())
