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
* ``3,4`` / ``3-5`` / ``3`` - kernels launched inside those profiler steps.
"""

from __future__ import annotations

import numpy as np

from ccoverlap.errors import ConfigError
from ccoverlap.trace.classify import RankTrace


def parse_steps(spec: str | None) -> str | list[int]:
    """``"hta"`` / ``"all"`` / a sorted list of step numbers from ``"3,4"`` or ``"3-5"``."""
    if spec is None or spec.strip().lower() in ("", "hta", "default"):
        return "hta"
    s = spec.strip().lower()
    if s == "all":
        return "all"
    out: set[int] = set()
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
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ConfigError(f"--steps: {spec!r} is not 'hta', 'all', or step numbers like '3,4' or '3-5'") from None
    if not out:
        raise ConfigError(f"--steps: {spec!r} names no step")
    return sorted(out)


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


def selection_mask(rt: RankTrace, steps: str | list[int], job_step_names: int) -> np.ndarray:
    """Rows of ``rt`` analysed under ``steps`` (see the module docstring)."""
    tl = rt.timeline
    n = len(tl)
    if isinstance(steps, list):
        return np.isin(tl.step, steps)
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
