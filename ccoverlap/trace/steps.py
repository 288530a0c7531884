"""Profiler steps: which rows belong to which ``ProfilerStep#N``, and which rows to analyse.

A row's step is the ``ProfilerStep#N`` CPU annotation during which it was *launched* (for a
GPU kernel: its ``cudaLaunchKernel``, joined by correlation id; a row without a launch
uses its own start), the rule of HolisticTraceAnalysis' ``add_iteration``.

``--steps`` chooses the rows:

* ``hta`` (default) - HTA's ``TraceAnalysis(include_last_profiler_step=False)``: every
  kernel launched before the start of the last ``ProfilerStep`` annotation of its rank
  (so the last, often truncated, step is dropped, and kernels launched before the first
  step are kept); kernels without a launch event in the trace are dropped. When the whole
  job has fewer than two distinct ``ProfilerStep#N`` names nothing is dropped (HTA's rule).
* ``all`` - HTA's ``include_last_profiler_step=True``: launched no later than the end of
  the last profiler step.
* ``3,4`` / ``3-5`` / ``3`` - kernels launched inside those profiler steps (a range of more than
  :data:`MAX_LISTED_STEPS` steps is kept as a range, never listed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeGuard, Union

import numpy as np

from ccoverlap.config import short
from ccoverlap.errors import ConfigError
from ccoverlap.trace.classify import RankTrace

# a --steps list longer than this is kept as ranges (never expanded into memory)
MAX_LISTED_STEPS = 10_000
#: Largest step number ``--steps`` may name: a trace's ``ProfilerStep#N`` is read up to 15 digits.
MAX_STEP = 10**15 - 1


class StepRanges:
    """A ``--steps`` selection of many step numbers, kept as sorted, disjoint inclusive ranges
    ``((lo, hi), ...)``: ``1-1000000000000`` costs two integers, never a list."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Iterable[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.ranges = tuple((lo, hi) for lo, hi in merged)

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    def __contains__(self, step: int) -> bool:
        return any(lo <= step <= hi for lo, hi in self.ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepRanges) and other.ranges == self.ranges

    def __reduce__(self) -> tuple[type[StepRanges], tuple[tuple[tuple[int, int], ...]]]:
        return (StepRanges, (self.ranges,))

    def mask(self, steps: np.ndarray) -> np.ndarray:
        """Which of ``steps`` (an integer array) are selected."""
        out = np.zeros(len(steps), dtype=bool)
        for lo, hi in self.ranges:
            out |= (steps >= lo) & (steps <= hi)
        return out

    def __str__(self) -> str:
        return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)


#: A ``--steps`` selection as :func:`parse_steps` gives it: ``"hta"`` / ``"all"``, a sorted list
#: of step numbers, or :class:`StepRanges`.
Steps = Union[str, list[int], StepRanges]


def parse_steps(spec: str | None) -> Steps:
    """``"hta"`` / ``"all"`` / the step numbers of ``"3,4"`` or ``"3-5"``: a sorted list, or
    :class:`StepRanges` when they are more than :data:`MAX_LISTED_STEPS` (never expanded)."""
    if spec is not None and not isinstance(spec, str):
        raise ConfigError(f"--steps: expected 'hta', 'all' or step numbers like '3,4' or '3-5', got {short(spec)}")
    if spec is None or spec.strip().lower() in ("", "hta", "default"):
        return "hta"
    s = spec.strip().lower()
    if s == "all":
        return "all"
    ranges: list[tuple[int, int]] = []
    for part in s.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                ranges.append((lo, hi))
            else:
                ranges.append((int(part), int(part)))
        except ValueError:
            raise ConfigError(f"--steps: {short(spec)} is not 'hta', 'all', or step numbers like '3,4' or '3-5'") from None
        if ranges[-1][1] > MAX_STEP:
            raise ConfigError(f"--steps: step {short(ranges[-1][1])} is larger than {MAX_STEP} (the largest "
                              f"ProfilerStep number a trace can hold)")
    if not ranges:
        raise ConfigError(f"--steps: {short(spec)} names no step")
    sel = StepRanges(ranges)
    if len(sel) > MAX_LISTED_STEPS:
        return sel
    return [n for lo, hi in sel.ranges for n in range(lo, hi + 1)]


def is_numbered(spec: object) -> TypeGuard[list[int] | StepRanges]:
    """Whether ``spec`` names step numbers (a list or :class:`StepRanges`), not ``hta`` / ``all``."""
    return isinstance(spec, (list, StepRanges))


def missing_steps(spec: list[int] | StepRanges, available: list[int]) -> tuple[bool, str]:
    """``(none_present, text)`` for a numbered ``spec``: whether none of its steps is in the
    traces, and the steps that are not, in words (ranges stay ranges)."""
    avail = set(available)
    if isinstance(spec, list):
        missing = [s for s in spec if s not in avail]
        return len(missing) == len(spec), ", ".join(map(str, missing))
    present = [s for s in available if s in spec]
    return not present, f"{spec} except {', '.join(map(str, present))}" if present else str(spec)


def assign_steps(rt: RankTrace) -> None:
    """Set ``rt.timeline.step`` from the launch time of each row (-1: outside every step)."""
    tl = rt.timeline
    when = np.where(np.isnan(rt.launch_s), tl.start_s, rt.launch_s)
    step = np.full(len(tl), -1, dtype=np.int64)
    if rt.steps and len(tl):
        order = sorted(rt.steps, key=lambda s: s[1])
        starts = np.array([s[1] for s in order])
        ends = np.array([s[2] for s in order])
        nums = np.array([s[0] for s in order])
        pos = np.searchsorted(starts, when, side="right") - 1
        ok = pos >= 0
        pc = np.maximum(pos, 0)
        ok &= when < ends[pc]
        step[ok] = nums[pc[ok]]
    tl.step = step


def selection_mask(rt: RankTrace, steps: Steps, job_step_names: int) -> np.ndarray:
    """Rows of ``rt`` analysed under ``steps`` (see the module docstring)."""
    tl = rt.timeline
    n = len(tl)
    if isinstance(steps, list):
        return np.isin(tl.step, steps)
    if isinstance(steps, StepRanges):
        return steps.mask(tl.step)
    if job_step_names < 2 or rt.cutoff_s is None:
        return np.ones(n, dtype=bool)
    launched = ~np.isnan(rt.launch_s)
    if rt.mode == "cpu":  # CPU ops are their own launch
        launched = np.ones(n, dtype=bool)
    when = np.where(np.isnan(rt.launch_s), tl.start_s, rt.launch_s)
    if steps == "hta":
        return launched & (when < rt.cutoff_s)
    # "all": launched no later than the end of the last profiler step
    last_end = rt.meta.get("last_step_end_s")
    if last_end is None:
        last_end = rt.cutoff_s
    return launched & (when <= last_end)


def step_rows(rt: RankTrace, mask: np.ndarray | None = None) -> dict[int, np.ndarray]:
    """Row indices of each profiler step (``mask``ed rows only when given), by one stable sort."""
    step = rt.timeline.step
    idx = np.flatnonzero(step >= 0) if mask is None else np.flatnonzero(mask & (step >= 0))
    if not len(idx):
        return {}
    order = idx[np.argsort(step[idx], kind="stable")]
    s_sorted = step[order]
    cuts = np.flatnonzero(np.diff(s_sorted)) + 1
    return {int(step[g[0]]): g for g in np.split(order, cuts)}


def step_windows(rt: RankTrace, mask: np.ndarray) -> dict[int, tuple[float, float]]:
    """GPU-side window of each selected step N on this rank (seconds).

    From the first start of a row launched in step N to the later of its last end and the
    first start of step N+1's rows, so the gap before the next step counts as idle of N.
    Linear in the rows (one sort), whatever the number of steps.
    """
    tl = rt.timeline
    out: dict[int, tuple[float, float]] = {}
    first_start = {s: float(tl.start_s[r].min()) for s, r in step_rows(rt).items()}
    later_keys = sorted(first_start)
    # min first start over the steps after each step: a suffix minimum
    suffix: dict[int, float] = {}
    best = np.inf
    for s in reversed(later_keys):
        suffix[s] = best
        best = min(best, first_start[s])
    for s, rows in sorted(step_rows(rt, mask).items()):
        a = float(tl.start_s[rows].min())
        b = float(tl.end_s[rows].max())
        nxt = suffix.get(s, np.inf)
        if np.isfinite(nxt):
            b = max(b, nxt)
        out[s] = (a, b)
    return out


def available_steps(rts: list[RankTrace]) -> list[int]:
    """Profiler step numbers seen on any rank (CPU-side annotations)."""
    return sorted({n for rt in rts for n, _, _ in rt.steps})
