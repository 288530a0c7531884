"""Timestamp consistency of one trace file: events whose time cannot be true are dropped and counted.

The loader (:mod:`ccoverlap.trace.columns`) checks each ``ts`` / ``dur`` alone (a number, in
range, a non-negative duration). A value can pass that and still be impossible - ``ts: -1`` on
one memset of a trace whose other events sit at ~1.7e15 µs since the epoch would stretch the
rank's span to 53 years and give the replay a dependency cycle. :func:`check_times` checks every
event against the rest of its rank, in this order, on the columns the loader built:

1. **span**: the event starts and ends within the bulk of the rank's events - the middle half of
   all start times (first to third quartile, each a real event's time, so one bad event cannot
   move it) widened by :data:`SPAN_WIDTHS` of its own width and at least :data:`SPAN_FLOOR_US`
   on each side. Applies to every kind (GPU events, CPU ops, launches, ``ProfilerStep``
   annotations);
2. **launch**: a GPU event does not start before the CPU-side call that launched it
   (``cudaLaunchKernel``, ``cudaMemsetAsync`` ..., joined by correlation id), with
   :data:`LAUNCH_SLACK_US` of slack. When most linked events of the file break this rule the
   clocks are skewed rather than the events bad: nothing is dropped and a warning says so;
3. **stream order**: kernels, copies and memsets on one CUDA stream run in the order they were
   launched, so taken in the order of their launch calls' timestamps (then correlation ids) their
   starts do not decrease. The longest run of events that keeps the order is kept; the others
   (usually the one bad event) are dropped. Events without a launch in the file are not ordered.

What is dropped is counted per rule; the caller reports the count (the ``load_trace`` warning,
``RawTrace.n_dropped``, the analysis's ``dropped_events`` per rank).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

#: Widths of the bulk (first to third quartile of the rank's start times) an event may lie beyond it.
SPAN_WIDTHS = 8
#: Least margin beyond the bulk of the rank's events (µs): 60 s, far more than a profiled step.
SPAN_FLOOR_US = 60e6
#: How far a GPU event may start before its launch call (µs): clock rounding, never a real delay.
LAUNCH_SLACK_US = 1.0
#: Fewest events for a span check (fewer have no bulk to speak of).
SPAN_MIN_EVENTS = 8
#: Device categories that run in stream order (indices into DEVICE_CAT_LIST: kernel, memcpy, memset).
_ORDERED_CATS = (0, 1, 2)
_FIRST_KEPT = 3          # events named by index in the warning


@dataclass
class Dropped:
    """What :func:`check_times` removed: per rule counts, the first events (file index, what), notes."""

    span: int = 0
    launch: int = 0
    stream: int = 0
    first: list[tuple[int, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Events dropped in all."""
        return self.span + self.launch + self.stream

    def describe(self) -> str:
        """One line: how many were dropped, why, and the first few by index."""
        parts = [f"{n} {why}" for n, why in ((self.span, "far outside the rank's time span"),
                                            (self.launch, "starting before their CPU launch"),
                                            (self.stream, "out of order on their CUDA stream")) if n]
        first = "; ".join(f"event #{i} ({what})" for i, what in sorted(self.first)[:_FIRST_KEPT])
        return (f"dropped {self.count} event(s) with inconsistent timestamps ({', '.join(parts)}), "
                f"first: {first}")

    def _note(self, seq: np.ndarray, ts: np.ndarray, what: str) -> None:
        for i, t in zip(seq[:_FIRST_KEPT].tolist(), ts[:_FIRST_KEPT].tolist()):
            if len(self.first) < 2 * _FIRST_KEPT:
                self.first.append((int(i), f"{what}, ts {t:.17g} µs"))


def check_times(cols: dict, steps: list) -> Dropped:
    """Drop, in place, the rows of ``cols`` (the ``k_*`` device, ``c_*`` CPU-op and ``l_*`` launch
    columns of :meth:`Columns.finish`, with their ``*_seq`` file indices) and the ``steps``
    (``(N, ts, dur, gpu, seq)``) whose timestamps are inconsistent (see the module docstring).
    Times in µs. Returns what was dropped."""
    out = Dropped()
    _check_span(cols, steps, out)
    _check_launch(cols, out)
    _check_streams(cols, out)
    return out


def _keep_rows(cols: dict, prefix: str, keep: np.ndarray) -> None:
    n = len(keep)
    for k, arr in cols.items():
        if k.startswith(prefix) and len(arr) == n:
            cols[k] = arr[keep]


def _check_span(cols: dict, steps: list, out: Dropped) -> None:
    starts = [cols["k_ts"], cols["c_ts"], cols["l_ts"], np.array([s[1] for s in steps], dtype=np.float64)]
    every = np.concatenate(starts)
    if len(every) < SPAN_MIN_EVENTS:
        return
    q1, q3 = np.quantile(every, [0.25, 0.75], method="inverted_cdf")
    margin = max(SPAN_WIDTHS * float(q3 - q1), SPAN_FLOOR_US)
    lo, hi = float(q1) - margin, float(q3) + margin
    del every
    for prefix, what in (("k_", "GPU event"), ("c_", "CPU op"), ("l_", "launch")):
        ts = cols[prefix + "ts"]
        end = ts + cols[prefix + "dur"] if prefix + "dur" in cols and len(cols[prefix + "dur"]) == len(ts) else ts
        bad = (ts < lo) | (end > hi)
        if bad.any():
            out.span += int(bad.sum())
            out._note(cols[prefix + "seq"][bad], ts[bad], f"{what} outside {lo:.17g}..{hi:.17g} µs")
            _keep_rows(cols, prefix, ~bad)
    bad_steps = [s for s in steps if s[1] < lo or s[1] + s[2] > hi]
    if bad_steps:
        out.span += len(bad_steps)
        for s in bad_steps[:_FIRST_KEPT]:
            out.first.append((s[4], f"ProfilerStep#{s[0]} outside {lo:.17g}..{hi:.17g} µs, ts {s[1]:.17g} µs"))
        steps[:] = [s for s in steps if lo <= s[1] and s[1] + s[2] <= hi]


def _launch_ts(cols: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per device event: whether a launch shares its correlation id, and that (earliest) launch's ts."""
    k_corr, l_corr, l_ts = cols["k_corr"], cols["l_corr"], cols["l_ts"]
    if not len(l_corr) or not len(k_corr):
        return np.zeros(len(k_corr), dtype=bool), np.zeros(len(k_corr))
    order = np.lexsort((l_ts, l_corr))
    cs = l_corr[order]
    first = np.ones(len(cs), dtype=bool)
    first[1:] = cs[1:] != cs[:-1]
    u_corr, u_ts = cs[first], l_ts[order][first]
    pos = np.minimum(np.searchsorted(u_corr, k_corr), len(u_corr) - 1)
    hit = (u_corr[pos] == k_corr) & (k_corr >= 0)
    return hit, u_ts[pos]


def _check_launch(cols: dict, out: Dropped) -> None:
    hit, launch = _launch_ts(cols)
    ts = cols["k_ts"]
    bad = hit & (ts < launch - LAUNCH_SLACK_US)
    n_bad, n_hit = int(bad.sum()), int(hit.sum())
    if not n_bad:
        return
    if 2 * n_bad > n_hit:
        out.notes.append(f"{n_bad} of {n_hit} GPU events start before their CPU launch - the GPU and CPU "
                         f"clocks of this trace disagree; no event was dropped for it")
        return
    out.launch += n_bad
    out._note(cols["k_seq"][bad], ts[bad], "GPU event before its launch")
    _keep_rows(cols, "k_", ~bad)


def _check_streams(cols: dict, out: Dropped) -> None:
    ts, corr = cols["k_ts"], cols["k_corr"]
    hit, launch = _launch_ts(cols)
    idx = np.flatnonzero(np.isin(cols["k_cat"], _ORDERED_CATS) & hit)
    if len(idx) < 2:
        return
    stream, device = cols["k_stream"][idx], cols["k_device"][idx]
    o = np.lexsort((ts[idx], corr[idx], launch[idx], stream, device))
    rows = idx[o]
    same = (stream[o][1:] == stream[o][:-1]) & (device[o][1:] == device[o][:-1])
    back = same & (np.diff(ts[rows]) < 0)
    if not back.any():
        return
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    ends = np.append(starts[1:], len(rows))
    drop: list[int] = []
    for a, b in zip(starts.tolist(), ends.tolist()):
        if b - a > 1 and back[a:b - 1].any():
            group = rows[a:b]
            keep = _longest_non_decreasing(ts[group].tolist())
            mask = np.ones(len(group), dtype=bool)
            mask[keep] = False
            drop.extend(group[mask].tolist())
    bad = np.zeros(len(ts), dtype=bool)
    bad[drop] = True
    out.stream += len(drop)
    out._note(cols["k_seq"][bad], ts[bad], "starts before an earlier launch on its stream")
    _keep_rows(cols, "k_", ~bad)


def _longest_non_decreasing(values: list[float]) -> list[int]:
    """Indices of one longest non-decreasing subsequence of ``values`` (patience sorting, O(n log n))."""
    tails: list[float] = []
    tail_at: list[int] = []
    parent = [-1] * len(values)
    for i, v in enumerate(values):
        j = bisect_right(tails, v)
        if j == len(tails):
            tails.append(v)
            tail_at.append(i)
        else:
            tails[j] = v
            tail_at[j] = i
        parent[i] = tail_at[j - 1] if j else -1
    out = []
    i = tail_at[-1] if tail_at else -1
    while i >= 0:
        out.append(i)
        i = parent[i]
    return out[::-1]
