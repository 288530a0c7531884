"""How much of the analysed window removing all communication could save, from one rank's trace.

``analyze`` counts communication *exposed* when no compute runs beside it. That time is on the
step's critical path only when the work after it was waiting for it: when the GPU was waiting
for the CPU to launch the next kernel (a CPU-bound step), exposed communication runs in time the
GPU would idle anyway, and removing it saves nothing. ``ccoverlap replay``'s ``no-comm`` what-if
answers this on the whole dependency graph; this module estimates it cheaply from what the
analyser already has - each GPU op's start, end and the time its CPU launch happened - so the
verdict does not promise what the critical path cannot give.

The estimate (:func:`comm_bound_s`): the non-communication ops of the window, by start, on one
lane. Op *i* can run earlier by ``shift_i = min(shift_{i-1} + removed_i, slack_i)``, where
``removed_i`` is the communication time inside the idle gap just before it (the GPU busy with
nothing else) and ``slack_i`` is how long before its start it was launched (it cannot run before
its launch; CPU time is fixed, as in the replay). A launch that came right after a collective
the CPU waited for (it launched nothing while that collective ran and launched within
:data:`BLOCKED_WINDOW_S` of its end: a host sync on it, returning, then the next launch) may
move earlier by that collective's duration. The bound is the window's end minus the latest shifted end - or minus the start of the
first op after the window (the next, unanalysed step's, launched by the CPU when it got there),
whichever is later: as the replay measures a step's end - unless that op's launch came right
after the window's last op ended, the CPU having launched nothing while it ran (a host sync on
the GPU: then the next step moves with it). The recurrence unrolls to
``shift_i = C_i + min(0, min_{j<=i} (slack_j - C_j))`` with ``C`` the running sum of ``removed``
(one cumulative sum and one running minimum). Taking the previous op by start, not the one the
op waited for, can only lower a shift: the estimate errs towards "communication costs less".
Seconds throughout.
"""

from __future__ import annotations

import numpy as np

from ccoverlap.sim.timeline import merge_intervals
from ccoverlap.trace.contention import covered_length

#: a launch this soon after a collective's end that the CPU launched nothing beside is taken as
#: the CPU waiting for it (a host sync: ``.item()``, a blocking copy), s
BLOCKED_WINDOW_S = 30e-6


def comm_bound_s(start_s: np.ndarray, end_s: np.ndarray, is_comm: np.ndarray, launch_s: np.ndarray,
                 after_s: float = np.inf, after_launch_s: float = np.nan) -> float:
    """The estimated shortening (s) of the window spanned by these ops (one rank's analysed rows)
    if every communication op took no time (see the module docstring). ``launch_s``: when each
    op's CPU launch happened (nan: unknown - then only the gaps bound it); ``after_s`` and
    ``after_launch_s``: the start and launch of the first op after the window (inf / nan: none)."""
    if not len(start_s) or not is_comm.any():
        return 0.0
    first, last = float(start_s.min()), float(end_s.max())
    if np.isfinite(after_s) and _waited_for_gpu(after_launch_s, start_s, end_s, launch_s):
        after_s = np.inf
    keep = ~is_comm
    if not keep.any():
        return max(0.0, last - max(first, after_s if np.isfinite(after_s) else first))
    cs, ce = merge_intervals(start_s[is_comm], end_s[is_comm])
    s, e, lt = start_s[keep], end_s[keep], launch_s[keep]
    if len(s) > 1 and np.any(s[1:] < s[:-1]):
        order = np.argsort(s, kind="stable")
        s, e, lt = s[order], e[order], lt[order]
    prev_end = np.empty_like(e)
    prev_end[0] = first
    np.maximum.accumulate(e[:-1], out=prev_end[1:])
    np.maximum(prev_end[1:], first, out=prev_end[1:])
    removed = np.zeros(len(s))
    gap = np.flatnonzero(s > prev_end)              # only an idle gap can hold exposed communication
    removed[gap] = covered_length(cs, ce, prev_end[gap], s[gap])
    slack = np.where(np.isfinite(lt), np.maximum(s - lt, 0.0), np.inf)
    _add_blocked(slack, lt, cs, ce, launch_s)
    c = np.cumsum(removed)
    shift = c + np.minimum(0.0, np.minimum.accumulate(slack - c))
    np.clip(shift, 0.0, None, out=shift)
    floor = after_s if np.isfinite(after_s) else first
    return max(0.0, last - max(float(np.max(e - shift)), first, floor))


def _waited_for_gpu(launch: float, start_s: np.ndarray, end_s: np.ndarray, launch_s: np.ndarray) -> bool:
    """Whether a launch at ``launch`` came within :data:`BLOCKED_WINDOW_S` after the last of these
    ops ended, with no launch while that op ran (the CPU waited for the GPU)."""
    if not np.isfinite(launch):
        return False
    i = int(np.argmax(end_s))
    if not 0.0 <= launch - end_s[i] <= BLOCKED_WINDOW_S:
        return False
    between = launch_s[np.isfinite(launch_s) & (launch_s > start_s[i]) & (launch_s < launch)]
    return not len(between)


def _add_blocked(slack: np.ndarray, lt: np.ndarray, cs: np.ndarray, ce: np.ndarray, launch_s: np.ndarray) -> None:
    """Add to ``slack`` (in place), per launch time in ``lt``, the duration of the merged
    collective interval ``[cs, ce]`` that launch waited for (see :data:`BLOCKED_WINDOW_S`)."""
    if not len(ce):
        return
    with np.errstate(invalid="ignore"):
        k = np.searchsorted(ce, lt, side="right") - 1      # the last collective ending at or before the launch
        near = np.flatnonzero((k >= 0) & (lt - ce[np.maximum(k, 0)] <= BLOCKED_WINDOW_S))
    if not len(near):
        return
    a, b = cs[k[near]], ce[k[near]]
    allx = np.sort(launch_s[np.isfinite(launch_s)])
    j = np.searchsorted(allx, lt[near], side="left") - 1   # the launch just before: any while the collective ran?
    prev = np.where(j >= 0, allx[np.maximum(j, 0)], -np.inf)
    blocked = prev <= a
    slack[near[blocked]] += (b - a)[blocked]
