"""The result of ``ccoverlap analyze``: :class:`Analysis` and its JSON form.

:class:`Analysis` holds every measurement of one set of traces (see
:func:`ccoverlap.trace.analyze.analyze`); :meth:`Analysis.to_dict` is the ``--json`` object.
Its ``comm_kernels`` rows - one per analysed communication kernel of the job - are also given
as columns (:func:`comm_kernel_columns`), so a writer can encode millions of them a few
thousand at a time; :func:`json_ready` / :func:`round12` make values JSON-ready (floats to 12
significant digits, inf / nan as null).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ccoverlap.sim.timeline import RankMetrics, compute_comm_ratio, job_overlap_ratio
from ccoverlap.trace.collectives import CollectiveStats, busbw_factor
from ccoverlap.trace.contention import Contention
from ccoverlap.trace.dimensions import DimensionStats
from ccoverlap.trace.ranks import CrossRank
from ccoverlap.trace.steps import StepRanges, Steps
from ccoverlap.trace.summary import RankSummary
from ccoverlap.trace.verdict import Verdict

METRIC_KEYS = ("step_time_s", "compute_s", "comm_s", "memcpy_s", "overlap_s", "overlap_ratio",
               "exposed_comm_s", "compute_only_s", "idle_s", "compute_comm_ratio")


@dataclass
class Analysis:
    """Everything measured on one set of traces (seconds, bytes, bytes/s); ``ranks`` holds each
    rank's :class:`~ccoverlap.trace.summary.RankSummary` (its analysed communication rows on the
    job's clock, its metrics), in rank order."""

    files: list[str]
    problems: list[str]
    steps_spec: Steps
    time_resolution: str
    ranks: list[RankSummary]
    metrics: list[RankMetrics]
    step_metrics: dict[int, dict[int, RankMetrics]]
    collectives: list[CollectiveStats]
    cross: CrossRank
    contention: Contention
    verdict: Verdict
    available_steps: list[int] = field(default_factory=list)
    dimensions: list[DimensionStats] = field(default_factory=list)

    @property
    def analysed_steps(self) -> list[int]:
        """Profiler step numbers with per-step metrics (launched inside the analysed window)."""
        return sorted(self.step_metrics)

    def summary(self) -> dict:
        """Job-level numbers: per-rank means, overlap ratio as Σoverlap / Σcomm."""
        ms = self.metrics
        out = {k: float(np.mean([getattr(m, k) for m in ms])) for k in METRIC_KEYS
               if k not in ("overlap_ratio", "compute_comm_ratio")}
        out["overlap_ratio"] = job_overlap_ratio(ms)
        out["compute_comm_ratio"] = compute_comm_ratio(sum(m.compute_s for m in ms), sum(m.comm_s for m in ms))
        out["ranks"] = len(ms)
        return out

    def per_step_mean(self) -> dict[int, dict]:
        """Per rank, each metric averaged over the analysed steps (the overall window when
        the trace has no steps) - what one simulated step is compared with."""
        out: dict[int, dict] = {}
        for m in self.metrics:
            per = [self.step_metrics[s][m.rank] for s in self.step_metrics if m.rank in self.step_metrics[s]]
            src = per or [m]
            d = {k: float(np.mean([getattr(x, k) for x in src])) for k in METRIC_KEYS}
            d["overlap_ratio"] = job_overlap_ratio(src)
            d["compute_comm_ratio"] = compute_comm_ratio(sum(x.compute_s for x in src), sum(x.comm_s for x in src))
            d["steps"] = len(per)
            out[m.rank] = d
        return out

    def comm_kernels(self) -> list[dict]:
        """Every analysed communication kernel (gloo op on CPU): rank, collective, group, size, start,
        duration, its own algbw / busbw in bytes/s (nccl-tests definitions) and where the size came from."""
        return [row for chunk in comm_kernel_chunks(self) for row in chunk]

    def to_dict(self, comm_kernels: object = None) -> dict:
        """One JSON-ready object (``inf``/``nan`` become null). ``comm_kernels``: put this value
        in place of the list of :meth:`comm_kernels` (a writer that streams the rows, one per
        analysed communication kernel of the job, passes a placeholder)."""
        ranks: list[dict[str, Any]] = []
        for m, rt in zip(self.metrics, self.ranks):
            d: dict[str, Any] = {"rank": m.rank}
            d.update({k: getattr(m, k) for k in METRIC_KEYS})
            d.update({"bubble_s": m.bubble_s, "comm_bytes": m.comm_bytes, "file": str(rt.path), "mode": rt.mode,
                      "rank_source": rt.meta.get("rank_source"), "device": rt.meta.get("device"),
                      "rows": rt.rows, "malformed_events": rt.n_malformed, "dropped_events": rt.n_dropped})
            d["steps"] = [dict({"step": s}, **{k: getattr(self.step_metrics[s][m.rank], k) for k in METRIC_KEYS})
                          for s in self.analysed_steps if m.rank in self.step_metrics[s]]
            ranks.append(d)
        steps = []
        for s in self.analysed_steps:
            per = self.step_metrics[s]
            steps.append({"step": s, "slowest_rank": self.cross.slowest_rank_per_step.get(s),
                          "step_time_s": {str(r): per[r].step_time_s for r in sorted(per)}})
        doc = {
            "tool": "ccoverlap analyze",
            "files": self.files,
            "problems": self.problems,
            "steps": {"spec": self.steps_spec if not isinstance(self.steps_spec, StepRanges) else str(self.steps_spec),
                      "analysed": self.analysed_steps, "available": self.available_steps},
            "time_resolution": self.time_resolution,
            "summary": self.summary(),
            "ranks": ranks,
            "per_step": steps,
            "collectives": [c.to_dict() for c in self.collectives],
            "dimensions": [d.to_dict() for d in self.dimensions],
            "comm_kernels": self.comm_kernels() if comm_kernels is None else comm_kernels,
            "cross_rank": self.cross.to_dict(),
            "contention": self.contention.to_dict(),
            "verdict": self.verdict.to_dict(),
        }
        return json_ready(doc)


#: rows per list of :func:`comm_kernel_chunks`
CHUNK_ROWS = 4096


def comm_kernel_chunks(a: Analysis, size: int = CHUNK_ROWS) -> Iterator[list[dict[str, Any]]]:
    """The rows of :meth:`Analysis.comm_kernels` in lists of at most ``size``, each row as
    :func:`json_ready` makes it."""
    for cols in comm_kernel_columns(a, size):
        yield [dict(zip(COMM_KERNEL_KEYS, row)) for row in zip(*cols)]


#: the keys of a :meth:`Analysis.comm_kernels` row, in order
COMM_KERNEL_KEYS = ("rank", "name", "collective", "group", "group_desc", "group_size", "step", "start_s", "dur_s",
                    "bytes", "size_source", "algbw", "busbw")


def comm_kernel_columns(a: Analysis, size: int = CHUNK_ROWS) -> Iterator[list[list[Any]]]:
    """The rows of :meth:`Analysis.comm_kernels` as columns (one list per key of
    :data:`COMM_KERNEL_KEYS`, values as :func:`json_ready` makes them), at most ``size`` rows at a
    time; built column by column per rank (what repeats - bandwidth factors, group descriptions -
    is converted once per distinct value)."""
    for rt in a.ranks:
        n = len(rt.comm) if rt.comm is not None else 0
        for lo in range(0, n, size):
            yield _rank_columns(rt, lo, min(lo + size, n))


def _round12_one(v: float | None) -> float | None:
    """:func:`json_ready` of one float (or None)."""
    return float(f"{v:.12g}") if v is not None and v - v == 0 else None


def round12(values: np.ndarray) -> list[float | None]:
    """:func:`json_ready` of each value of a float array: the float nearest to the value rounded to
    12 significant digits, None for inf / nan.

    Exact, without a string per value: with ``k = 11 - floor(log10|v|)`` the rounded value is
    ``rint(v * 10**k) / 10**k``; both operands are exact doubles (``|k| <= 22``) so the division
    (or product) is correctly rounded, as parsing the 12-digit text is. ``v * 10**k`` itself is
    off by at most 1e-4, so a value whose scaled fraction is within 1e-3 of one half, or whose
    exponent or range is in doubt, goes through the text instead."""
    v = np.asarray(values, dtype=np.float64)
    a = np.abs(v)
    fast = (a >= 1e-9) & (a < 1e30)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        k = 11 - np.floor(np.log10(np.where(fast, a, 1.0)))
        scale = 10.0 ** np.abs(k)
        m = np.where(k >= 0, v * scale, v / scale)
        r = np.rint(m)
        out = np.where(k >= 0, r / scale, r * scale)
        ra = np.abs(r)
        fast &= (np.abs(np.abs(m - np.trunc(m)) - 0.5) > 1e-3) & (ra >= 1e11) & (ra <= 1e12)
    res = out.tolist()
    for i in np.flatnonzero(~fast).tolist():
        res[i] = _round12_one(float(v[i]))
    return res


def _rank_columns(rt: RankSummary, lo: int, hi: int) -> list[list[Any]]:
    """Rows ``lo:hi`` of one rank's analysed communication kernels, as columns (see
    :func:`comm_kernel_columns`)."""
    tl = rt.comm
    assert tl is not None and rt.comm_group_size is not None      # rows exist: the summary set both
    pg = rt.meta.get("pg_config") or {}
    st = tl.start_s[lo:hi]
    dur = tl.end_s[lo:hi] - st
    nbytes = tl.bytes[lo:hi]
    colls, gsizes = tl.collective[lo:hi].tolist(), rt.comm_group_size[lo:hi].tolist()
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where((nbytes > 0) & (dur > 0), nbytes / dur, np.nan)
    factors: dict[tuple[str, int], float | None] = {}
    fac = [factors[k] if k in factors else factors.setdefault(k, busbw_factor(k[0], int(k[1])) if k[1] else None)
           for k in zip(colls, gsizes)]
    bus = alg * np.array([np.nan if f is None else f for f in fac], dtype=np.float64)   # nan: no factor
    descs: dict[str, str | None] = {}
    groups = tl.group[lo:hi].tolist()
    desc = [descs[g] if g in descs else descs.setdefault(g, (pg.get(str(g)) or {}).get("desc")) for g in groups]
    src = rt.comm_size_source[lo:hi].tolist() if rt.comm_size_source is not None else [""] * (hi - lo)
    return [[json_ready(rt.rank)] * (hi - lo), list(map(str, tl.name[lo:hi].tolist())), colls, groups, desc,
            list(map(int, gsizes)), list(map(int, tl.step[lo:hi].tolist())), round12(st),
            round12(dur), round12(nbytes), [s or None for s in src], round12(alg), round12(bus)]


def json_ready(x: Any) -> Any:
    """``x`` with numpy integers as ints, floats to 12 significant digits (no 1e-17 noise), inf /
    nan as None, tuples as lists and dict keys as strings."""
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_ready(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return float(f"{v:.12g}") if math.isfinite(v) else None   # 12 significant digits: no 1e-17 noise
    return x
