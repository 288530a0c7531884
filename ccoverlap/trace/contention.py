"""Contention: how much slower compute runs while communication runs beside it.

The measurement Lagom (§3.2, Fig. 3) and FiCCO (§IV-D, "contention inefficiency caused
loss", CIL) make by hand - the same computation timed in isolation and overlapped with a
collective - done on the trace itself: for every compute kernel name (and launch shape,
``grid``/``block``, so a GEMM is compared with the same GEMM) that ran both *alone* (no
communication running at any moment of it) and *overlapped* (communication running for at
least ``overlapped_fraction`` of it, default half), at least ``min_samples`` times each and
lasting at least 10 µs alone (shorter kernels are launch jitter and µs rounding), its
slowdown is

    median duration overlapped / median duration alone,

and the per-kernel slowdowns are aggregated weighted by the overlapped kernels' time. The
*time lost* is what the overlapped instances took beyond the median alone duration:
``Σ_overlapped (d - median_alone)``, seconds of compute added by contention.

Medians resist outliers but not confounders: a kernel that is overlapped only in one phase
(e.g. backward) may also differ in its inputs there; ``coverage`` says which share of the
compute time the comparison rests on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Union

import numpy as np

from ccoverlap.sim.timeline import merge_intervals
from ccoverlap.trace.classify import RankTrace

# times are float seconds from the job's first event: a difference of two of them carries up to ~1e-15 s
# of rounding, which must not decide whether a kernel ran alone or is long enough to compare
_NOISE_S = 1e-12


def covered_length(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each [a_i, b_i], the length covered by the disjoint sorted intervals (starts, ends) (seconds)."""
    if len(starts) == 0:
        return np.zeros(len(a))
    lengths = ends - starts
    prefix = np.concatenate([[0.0], np.cumsum(lengths)])

    def upto(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right") - 1
        kc = np.maximum(k, 0)
        inside = np.clip(t - starts[kc], 0.0, lengths[kc])
        return np.where(k >= 0, prefix[kc] + inside, 0.0)

    return np.maximum(upto(b) - upto(a), 0.0)


@dataclass
class KernelContention:
    """One compute kernel (name + launch shape): alone vs overlapped durations (seconds)."""

    name: str
    n_alone: int
    n_overlapped: int
    median_alone_s: float
    median_overlapped_s: float
    slowdown: float
    time_lost_s: float


@dataclass
class Contention:
    """Time-weighted slowdown of compute under overlap, per rank and over the job.

    ``slowdown`` is 1.0 (and ``kernels`` empty) when no kernel ran both ways; ``coverage`` is
    the share of overlapped compute time whose kernels also ran alone.
    """

    slowdown: float
    time_lost_s: float
    coverage: float
    kernels: list[KernelContention]
    per_rank: dict[int, dict] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict:
        """Plain dict for JSON (rank keys as strings)."""
        d = asdict(self)
        d["per_rank"] = {str(k): v for k, v in self.per_rank.items()}
        return d


#: Kernel labels: an object array of labels, or (distinct labels, each row's label index).
_Keys = Union[np.ndarray, tuple[np.ndarray, np.ndarray]]


def _samples(rt: RankTrace, mask: np.ndarray,
             overlapped_fraction: float) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """A rank's compute kernels as samples: (labels, row label index), duration (s), ran alone,
    ran overlapped (at least ``overlapped_fraction`` of it under communication)."""
    tl = rt.timeline
    comm = mask & (tl.kind == "comm")
    cs, ce = merge_intervals(tl.start_s[comm], tl.end_s[comm])
    comp = np.flatnonzero(mask & (tl.kind == "compute") & rt.leaf)
    a, b = tl.start_s[comp], tl.end_s[comp]
    d = b - a
    cov = covered_length(cs, ce, a, b)
    frac = np.divide(cov, d, out=np.zeros_like(cov), where=d > 0)
    alone = (cov <= _NOISE_S) & (d > 0)      # rounding noise of the clock is no overlap
    over = (frac >= overlapped_fraction) & (d > 0)
    # (name, shape) -> one int key per row, then to "name\x00shape" strings only per distinct key
    pair = (rt.name_id[comp].astype(np.int64) << 32) ^ (rt.shape[comp].astype(np.int64) & 0xFFFFFFFF)
    uniq, first, inv = np.unique(pair, return_index=True, return_inverse=True)
    names_c, shapes_c = tl.name[comp], rt.shape[comp]
    labels = np.array([f"{names_c[f]}\x00{shapes_c[f]}" for f in first], dtype=object)
    return (labels, inv.reshape(-1).astype(np.int64)), d, alone, over


def _factor(keys: _Keys, use: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys[use], return_inverse=True)`` where ``keys`` is an object array of labels or,
    as :func:`_samples` gives them, a pair (distinct labels, each row's label index): then only the
    few distinct labels are sorted, not a string per row."""
    if not isinstance(keys, tuple):
        uniq, inv = np.unique(keys[use], return_inverse=True)
        return uniq, inv.reshape(-1)
    labels, codes = keys
    codes = codes[use]
    present = np.unique(codes)
    order = np.argsort(labels[present], kind="stable")
    pos = np.empty(len(labels), dtype=np.int64)
    pos[present[order]] = np.arange(len(order))
    return labels[present[order]], pos[codes]


def _median_of(a: np.ndarray) -> float:
    """The median of a small array without NaN, as ``np.median`` gives it (the mean of the two middle
    values when their count is even) at a tenth of its fixed cost: a rank asks for hundreds."""
    s = np.sort(a)
    h = len(s) // 2
    return float(s[h]) if len(s) % 2 else float((s[h - 1] + s[h]) / 2)


def _aggregate(keys: _Keys, d: np.ndarray, alone: np.ndarray, over: np.ndarray, min_samples: int,
               min_duration_s: float = 10e-6) -> Contention:
    """Per-kernel and time-weighted slowdown of the samples ``d`` (s), ``alone`` / ``over`` masks."""
    kernels: list[KernelContention] = []
    over_time = float(d[over].sum())
    use = alone | over
    if use.any():
        uniq, inv = _factor(keys, use)
        du, au, ou = d[use], alone[use], over[use]
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
        for g in range(len(uniq)):
            rows = order[bounds[g]:bounds[g + 1]]
            da, do = du[rows][au[rows]], du[rows][ou[rows]]
            if len(da) < min_samples or len(do) < min_samples:
                continue
            ma, mo = _median_of(da), _median_of(do)
            if ma < min_duration_s - _NOISE_S:   # launch jitter and µs rounding dominate tiny kernels
                continue
            kernels.append(KernelContention(
                name=str(uniq[g]).split("\x00")[0], n_alone=len(da), n_overlapped=len(do), median_alone_s=ma,
                median_overlapped_s=mo, slowdown=mo / ma, time_lost_s=float(do.sum() - len(do) * ma)))
    if not kernels:
        note = ("no compute kernel ran both alone and overlapped with communication"
                if over_time > 0 else "no compute ran overlapped with communication")
        return Contention(slowdown=1.0, time_lost_s=0.0, coverage=0.0, kernels=[], note=note)
    w = np.array([k.median_overlapped_s * k.n_overlapped for k in kernels])
    s = np.array([k.slowdown for k in kernels])
    covered = float(sum(k.median_overlapped_s * k.n_overlapped for k in kernels))
    kernels.sort(key=lambda k: -k.time_lost_s)
    return Contention(slowdown=float(np.sum(w * s) / np.sum(w)), time_lost_s=float(sum(k.time_lost_s for k in kernels)),
                      coverage=min(1.0, covered / over_time) if over_time > 0 else 0.0, kernels=kernels)


def contention(rts: list[RankTrace], masks: dict[int, np.ndarray], *, overlapped_fraction: float = 0.5,
               min_samples: int = 3) -> Contention:
    """Slowdown of compute kernels under overlap (see the module docstring), pooled over ranks;
    ``per_rank[r]`` holds each rank's own slowdown / time lost / kernels compared."""
    all_keys, all_d, all_alone, all_over = [], [], [], []
    per_rank = {}
    for rt in rts:
        keys, d, alone, over = _samples(rt, masks[rt.rank], overlapped_fraction)
        c = _aggregate(keys, d, alone, over, min_samples)
        per_rank[rt.rank] = {"slowdown": c.slowdown, "time_lost_s": c.time_lost_s, "kernels": len(c.kernels)}
        all_keys.append(keys[0][keys[1]]); all_d.append(d); all_alone.append(alone); all_over.append(over)
    if not rts:
        return Contention(1.0, 0.0, 0.0, [], note="no ranks")
    pooled = _aggregate(np.concatenate(all_keys), np.concatenate(all_d), np.concatenate(all_alone),
                        np.concatenate(all_over), min_samples)
    pooled.per_rank = per_rank
    return pooled


# ----------------------------------------------------------------------------- per rank, then pooled

def rank_samples(rt: RankTrace, mask: np.ndarray, *, overlapped_fraction: float = 0.5,
                 min_samples: int = 3) -> dict:
    """One rank's contention evidence, reduced: this rank's own :class:`Contention` numbers
    (``per_rank``), the overlapped compute time (``over_time_s``) and, per compute kernel
    (``labels``: name + launch shape), the distinct durations seen alone / overlapped with their
    counts (``key``, ``dur_s``, ``n_alone``, ``n_over`` columns) - all that pooling over ranks needs."""
    keys, d, alone, over = _samples(rt, mask, overlapped_fraction)
    c = _aggregate(keys, d, alone, over, min_samples)
    out = {"per_rank": {"slowdown": c.slowdown, "time_lost_s": c.time_lost_s, "kernels": len(c.kernels)},
           "over_time_s": float(d[over].sum()), "labels": [], "key": np.empty(0, np.int64),
           "dur_s": np.empty(0), "n_alone": np.empty(0, np.int64), "n_over": np.empty(0, np.int64)}
    use = alone | over
    if use.any():
        labels, inv = _factor(keys, use)
        out["labels"] = labels.tolist()
        out.update(_count(inv, d[use], alone[use].astype(np.int64), over[use].astype(np.int64)))
    return out


def _count(key: np.ndarray, dur: np.ndarray, na: np.ndarray, no: np.ndarray) -> dict:
    """Rows with the same (key, duration) merged, their alone / overlapped counts summed."""
    if not len(key):
        return {"key": key, "dur_s": dur, "n_alone": na, "n_over": no}
    order = np.lexsort((dur, key))
    k, v = key[order], dur[order]
    start = np.ones(len(k), dtype=bool)
    start[1:] = (k[1:] != k[:-1]) | (v[1:] != v[:-1])
    cut = np.flatnonzero(start)
    return {"key": k[cut], "dur_s": v[cut], "n_alone": np.add.reduceat(na[order], cut),
            "n_over": np.add.reduceat(no[order], cut)}


class PooledContention:
    """Contention pooled over ranks from :func:`rank_samples` results, added one rank at a time
    (memory: the distinct (kernel, duration) pairs of the job, not its kernels: the ranks' rows are
    merged once they outnumber the merged rows, and at the end)."""

    def __init__(self) -> None:
        self.label_ids: dict[str, int] = {}
        self.labels: list[str] = []
        self._merged = _count(np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64))
        self._pending: list[dict] = []
        self._pending_rows = 0
        self.over_time_s = 0.0
        self.per_rank: dict[int, dict] = {}

    @property
    def cols(self) -> dict:
        """The (kernel, duration) rows of every rank added so far, merged (sorted by key, then duration)."""
        if self._pending:
            parts = [self._merged, *self._pending]
            self._merged = _count(*(np.concatenate([c[k] for c in parts]) for k in ("key", "dur_s", "n_alone", "n_over")))
            self._pending, self._pending_rows = [], 0
        return self._merged

    def add(self, rank: int, s: dict) -> None:
        """Fold one rank's samples in."""
        self.per_rank[rank] = s["per_rank"]
        self.over_time_s += s["over_time_s"]
        if not len(s["key"]):
            return
        ids = []
        for lab in s["labels"]:
            if lab not in self.label_ids:
                self.label_ids[lab] = len(self.labels)
                self.labels.append(lab)
            ids.append(self.label_ids[lab])
        key = np.asarray(ids, dtype=np.int64)[s["key"]]
        self._pending.append({"key": key, "dur_s": s["dur_s"], "n_alone": s["n_alone"], "n_over": s["n_over"]})
        self._pending_rows += len(key)
        if self._pending_rows > max(len(self._merged["key"]), 1 << 16):
            self.cols       # noqa: B018 - merges the pending rows: memory stays about the distinct pairs

    def result(self, min_samples: int = 3, min_duration_s: float = 10e-6) -> Contention:
        """The pooled :class:`Contention` (same rules as for one rank)."""
        if not self.per_rank:
            return Contention(1.0, 0.0, 0.0, [], note="no ranks")
        kernels = self._kernels(self.cols, min_samples, min_duration_s)
        if not kernels:
            note = ("no compute kernel ran both alone and overlapped with communication"
                    if self.over_time_s > 0 else "no compute ran overlapped with communication")
            out = Contention(slowdown=1.0, time_lost_s=0.0, coverage=0.0, kernels=[], note=note)
        else:
            w = np.array([k.median_overlapped_s * k.n_overlapped for k in kernels])
            s = np.array([k.slowdown for k in kernels])
            covered = float(sum(k.median_overlapped_s * k.n_overlapped for k in kernels))
            kernels.sort(key=lambda k: -k.time_lost_s)
            out = Contention(slowdown=float(np.sum(w * s) / np.sum(w)),
                             time_lost_s=float(sum(k.time_lost_s for k in kernels)),
                             coverage=min(1.0, covered / self.over_time_s) if self.over_time_s > 0 else 0.0,
                             kernels=kernels)
        out.per_rank = dict(self.per_rank)
        return out

    def _kernels(self, c: dict, min_samples: int, min_duration_s: float) -> list[KernelContention]:
        """The kernels compared (label order, as ``np.unique`` gives it): per kernel the counts by
        one ``reduceat`` and the medians by one ``searchsorted`` over the whole columns."""
        if not len(c["key"]):
            return []
        v, na, no = c["dur_s"], c["n_alone"], c["n_over"]
        cut = np.flatnonzero(np.r_[True, c["key"][1:] != c["key"][:-1]])
        ends = np.r_[cut[1:], len(c["key"])]
        n_a, n_o = np.add.reduceat(na, cut), np.add.reduceat(no, cut)
        ok = (n_a >= max(min_samples, 1)) & (n_o >= max(min_samples, 1))
        med_a, med_o = _medians(v, na, cut, n_a), _medians(v, no, cut, n_o)
        bounds = {int(c["key"][a]): g for g, a in enumerate(cut.tolist())}
        kernels: list[KernelContention] = []
        for lab in sorted(range(len(self.labels)), key=self.labels.__getitem__):
            g = bounds.get(lab)
            if g is None or not ok[g]:
                continue
            ma, mo = float(med_a[g]), float(med_o[g])
            if ma < min_duration_s - _NOISE_S:
                continue
            a, b, n = cut[g], ends[g], int(n_o[g])
            kernels.append(KernelContention(
                name=self.labels[lab].split("\x00")[0], n_alone=int(n_a[g]), n_overlapped=n, median_alone_s=ma,
                median_overlapped_s=mo, slowdown=mo / ma, time_lost_s=float(np.sum(v[a:b] * no[a:b]) - n * ma)))
        return kernels


def _medians(values: np.ndarray, counts: np.ndarray, cut: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per group (rows ``cut[g]`` up to the next cut, ``values`` ascending in each, ``n[g]`` their
    summed ``counts``, at least 1) the median of its values each repeated ``counts`` times - numpy's
    definition, the mean of the two middle ones when ``n`` is even: for all groups at once."""
    cum = np.cumsum(counts)
    base = np.r_[0, cum][cut]                   # rows before the group
    hi = values[np.minimum(np.searchsorted(cum, base + n // 2 + 1), len(values) - 1)]
    lo = values[np.minimum(np.searchsorted(cum, base + np.maximum(n // 2, 1)), len(values) - 1)]
    return np.where(n % 2 == 1, hi, (lo + hi) / 2)
