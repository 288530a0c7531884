"""Pair the collective calls of one process group across ranks (used by ``analyze`` and ``replay``).

Collectives of one process group run in one order on every member (NCCL and gloo require it),
and every member of a call finishes at nearly the same moment (the last chunk arrives
everywhere together). Pairing the N-th call of each rank is only right when every rank's trace
holds every call: a sampled or cut trace that misses one call shifts every later pair. So
:func:`pair_calls` pairs by call order only where that is safe, and otherwise walks the
sequences beside each other and pairs two calls only when they have the same type and their
ends line up.
"""

from __future__ import annotations

import numpy as np

from ccoverlap.sim.timeline import Timeline


def comm_rows_by_group(tl: Timeline, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Row indices of the communication rows of ``tl`` (within ``mask``) per process group,
    each sorted by start time."""
    m = tl.kind == "comm" if mask is None else (mask & (tl.kind == "comm"))
    idx = np.flatnonzero(m)
    idx = idx[np.argsort(tl.start_s[idx], kind="stable")]
    out: dict[str, np.ndarray] = {}
    for g in np.unique(tl.group[idx]) if len(idx) else []:
        out[str(g)] = idx[tl.group[idx] == g]
    return out


def align_by_ends(tl_a: Timeline, rows_a: np.ndarray, tl_b: Timeline, rows_b: np.ndarray, *,
                  tol_s: float = 1e-3, tol_frac: float = 0.02) -> list[tuple[int, int]]:
    """(i, j) positions of the calls of ``rows_a`` and ``rows_b`` that are one call.

    Two ops are one call when they have the same collective type, end within
    ``tol_s + tol_frac * (shorter duration)`` seconds of each other, and neither ended before
    the other started (and no neighbour of the same type ends closer); otherwise the one that
    ended first has no partner (a call cut off by the profiling window or dropped by sampling)
    and the walk moves past it. Clocks are taken as synchronised.
    """
    out = []
    i = j = 0
    while i < len(rows_a) and j < len(rows_b):
        a, b = int(rows_a[i]), int(rows_b[j])
        ea, eb = tl_a.end_s[a], tl_b.end_s[b]
        dur = min(tl_a.end_s[a] - tl_a.start_s[a], tl_b.end_s[b] - tl_b.start_s[b])
        ok = (tl_a.collective[a] == tl_b.collective[b] and abs(ea - eb) <= tol_s + tol_frac * dur
              and ea >= tl_b.start_s[b] - 1e-6 and eb >= tl_a.start_s[a] - 1e-6)
        if ok and i + 1 < len(rows_a):      # the next call of the same type fits better
            a2 = int(rows_a[i + 1])
            ok = not (tl_a.collective[a2] == tl_b.collective[b] and abs(tl_a.end_s[a2] - eb) < abs(ea - eb)
                      and tl_a.end_s[a2] >= tl_b.start_s[b] - 1e-6)
        if ok and j + 1 < len(rows_b):
            b2 = int(rows_b[j + 1])
            ok = not (tl_b.collective[b2] == tl_a.collective[a] and abs(tl_b.end_s[b2] - ea) < abs(ea - eb)
                      and tl_b.end_s[b2] >= tl_a.start_s[a] - 1e-6)
        if ok:
            out.append((i, j))
            i += 1
            j += 1
        elif ea <= eb:
            i += 1
        else:
            j += 1
    return out


# collectives whose every member moves the same number of bytes (all-to-all splits may differ)
_EQUAL_SIZE = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def _same_calls(tl_a: Timeline, rows_a: np.ndarray, tl_b: Timeline, rows_b: np.ndarray,
                tol_s: float, tol_frac: float) -> bool:
    """True when the i-th calls of two equally long sequences can be one call each: same type,
    same bytes for :data:`_EQUAL_SIZE` collectives (when both are known), and the two ops
    overlap in time (up to ``tol_s`` seconds of clock offset): a collective cannot finish on
    one member before another member has started it. Ends need not line up (gloo's CPU ops
    return at different moments on each rank). ``tol_frac`` is unused here."""
    if not np.array_equal(tl_a.collective[rows_a], tl_b.collective[rows_b]):
        return False
    ba, bb = tl_a.bytes[rows_a], tl_b.bytes[rows_b]
    eq = np.isin(tl_a.collective[rows_a], _EQUAL_SIZE) & (ba > 0) & (bb > 0)
    if np.any(eq & (ba != bb)):
        return False
    # no member of a call can finish before every member has started
    return bool(np.all(tl_a.end_s[rows_a] >= tl_b.start_s[rows_b] - tol_s)
                and np.all(tl_b.end_s[rows_b] >= tl_a.start_s[rows_a] - tol_s))


def pair_calls(tls: dict[int, Timeline], rows: dict[int, np.ndarray], *, by_order: bool = True,
               tol_s: float = 1e-3, tol_frac: float = 0.02) -> tuple[list[list[tuple[int, int]]], str]:
    """The calls of one process group matched across ranks, and how they were paired.

    ``tls[k]`` is rank ``k``'s timeline (``k``: a rank or a rank's index) and ``rows[k]`` its rows of this group sorted by start.
    Returns ``(calls, how)``: each call is ``[(k, row), ...]`` with two or more members, in the
    lowest key's call order; ``how`` is ``"order"`` when ``by_order`` allows it, every rank has
    the same number of calls and the N-th calls agree (:func:`_same_calls`: type, size where the
    collective needs equal sizes, the ops overlap in time), so call order alone pairs them; else
    ``"ends"``: each rank is aligned with the lowest key's rank by :func:`align_by_ends`. Equal
    counts and types are not enough: two sampled traces can each miss a different call.
    """
    keys = sorted(rows)
    if len(keys) < 2:
        return [], "order"
    ref = keys[0]
    n = len(rows[ref])
    if by_order and all(len(rows[k]) == n for k in keys) and all(
            _same_calls(tls[ref], rows[ref], tls[k], rows[k], tol_s, tol_frac) for k in keys[1:]):
        return [[(k, int(rows[k][i])) for k in keys] for i in range(n)], "order"
    partners: list[list[tuple[int, int]]] = [[(ref, int(r))] for r in rows[ref]]
    for k in keys[1:]:
        for i, j in align_by_ends(tls[ref], rows[ref], tls[k], rows[k], tol_s=tol_s, tol_frac=tol_frac):
            partners[i].append((k, int(rows[k][j])))
    return [p for p in partners if len(p) >= 2], "ends"
