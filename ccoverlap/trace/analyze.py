"""Facade: trace files in, every measurement of ``ccoverlap analyze`` out.

``analyze(paths)`` maps the per-rank work (:func:`ccoverlap.trace.summary.summarize_rank`: stream
one file, build its Timeline, pick the analysed rows - HolisticTraceAnalysis' default window
unless told otherwise - and reduce them with the simulator's own
:func:`ccoverlap.sim.timeline.rank_metrics`) over the files with an engine
(:mod:`ccoverlap.trace.engine`: worker processes by default), then combines the rank summaries
(:mod:`ccoverlap.trace.combine`): per rank and per step compute / communication / memcpy time,
overlap ratio (HTA's definition), exposed communication, compute-only and idle time,
R = compute / communication; per-collective bandwidths, cross-rank skew and stragglers,
contention, and a verdict. Problems with single files become lines in ``Analysis.problems``;
:class:`TraceError` is raised only when no file could be analysed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ccoverlap.errors import ConfigError
from ccoverlap.sim.timeline import RankMetrics
from ccoverlap.trace import load as _load
from ccoverlap.trace.collectives import CollectiveStats, busbw_factor
from ccoverlap.trace.combine import analyze_job
from ccoverlap.trace.contention import Contention
from ccoverlap.trace.dimensions import DimensionStats
from ccoverlap.trace.engine import make_engine
from ccoverlap.trace.ranks import CrossRank
from ccoverlap.trace.sources import size as source_size
from ccoverlap.trace.steps import StepRanges, parse_steps
from ccoverlap.trace.summary import JobContext, RankSummary
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
    steps_spec: object
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
        comm = sum(m.comm_s for m in ms)
        comp = sum(m.compute_s for m in ms)
        out["overlap_ratio"] = sum(m.overlap_s for m in ms) / comm if comm > 0 else 0.0
        out["compute_comm_ratio"] = comp / comm if comm > 0 else math.inf
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
            comm = sum(x.comm_s for x in src)
            d["overlap_ratio"] = sum(x.overlap_s for x in src) / comm if comm > 0 else 0.0
            d["compute_comm_ratio"] = sum(x.compute_s for x in src) / comm if comm > 0 else math.inf
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
        ranks = []
        for m, rt in zip(self.metrics, self.ranks):
            d = {"rank": m.rank}
            d.update({k: getattr(m, k) for k in METRIC_KEYS})
            d.update({"bubble_s": m.bubble_s, "comm_bytes": m.comm_bytes, "file": str(rt.path), "mode": rt.mode,
                      "rank_source": rt.meta.get("rank_source"), "device": rt.meta.get("device"),
                      "rows": rt.rows})
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
            "collectives": [c.as_dict() for c in self.collectives],
            "dimensions": [d.as_dict() for d in self.dimensions],
            "comm_kernels": self.comm_kernels() if comm_kernels is None else comm_kernels,
            "cross_rank": self.cross.as_dict(),
            "contention": self.contention.as_dict(),
            "verdict": self.verdict.as_dict(),
        }
        return json_ready(doc)


def comm_kernel_rows(a: Analysis):
    """The rows of :meth:`Analysis.comm_kernels`, one at a time, already :func:`json_ready`."""
    for chunk in comm_kernel_chunks(a):
        yield from chunk


#: rows per list of :func:`comm_kernel_chunks`
CHUNK_ROWS = 4096


def comm_kernel_chunks(a: Analysis, size: int = CHUNK_ROWS):
    """The rows of :meth:`Analysis.comm_kernels` in lists of at most ``size``, each row as
    :func:`json_ready` makes it."""
    for cols in comm_kernel_columns(a, size):
        yield [dict(zip(COMM_KERNEL_KEYS, row)) for row in zip(*cols)]


#: the keys of a :meth:`Analysis.comm_kernels` row, in order
COMM_KERNEL_KEYS = ("rank", "name", "collective", "group", "group_desc", "group_size", "step", "start_s", "dur_s",
                    "bytes", "size_source", "algbw", "busbw")


def comm_kernel_columns(a: Analysis, size: int = CHUNK_ROWS):
    """The rows of :meth:`Analysis.comm_kernels` as columns (one list per key of
    :data:`COMM_KERNEL_KEYS`, values as :func:`json_ready` makes them), at most ``size`` rows at a
    time; built column by column per rank (what repeats - bandwidth factors, group descriptions -
    is converted once per distinct value)."""
    for rt in a.ranks:
        n = len(rt.comm) if rt.comm is not None else 0
        for lo in range(0, n, size):
            yield _rank_columns(rt, lo, min(lo + size, n))


def _round12_one(v) -> float | None:
    """:func:`json_ready` of one float (or None)."""
    return float(f"{v:.12g}") if v is not None and v - v == 0 else None


def round12(values: np.ndarray) -> list:
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


def _rank_columns(rt: RankSummary, lo: int, hi: int) -> list[list]:
    """Rows ``lo:hi`` of one rank's analysed communication kernels, as columns (see
    :func:`comm_kernel_columns`)."""
    tl = rt.comm
    pg = rt.meta.get("pg_config") or {}
    st = tl.start_s[lo:hi]
    dur = tl.end_s[lo:hi] - st
    nbytes = tl.bytes[lo:hi]
    colls, gsizes = tl.collective[lo:hi].tolist(), rt.comm_group_size[lo:hi].tolist()
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where((nbytes > 0) & (dur > 0), nbytes / dur, np.nan)
    factors: dict = {}
    fac = [factors[k] if k in factors else factors.setdefault(k, busbw_factor(k[0], int(k[1])) if k[1] else None)
           for k in zip(colls, gsizes)]
    bus = alg * np.array([np.nan if f is None else f for f in fac], dtype=np.float64)   # nan: no factor
    descs: dict = {}
    groups = tl.group[lo:hi].tolist()
    desc = [descs[g] if g in descs else descs.setdefault(g, (pg.get(str(g)) or {}).get("desc")) for g in groups]
    src = rt.comm_size_source[lo:hi].tolist() if rt.comm_size_source is not None else [""] * (hi - lo)
    return [[json_ready(rt.rank)] * (hi - lo), list(map(str, tl.name[lo:hi].tolist())), colls, groups, desc,
            list(map(int, gsizes)), list(map(int, tl.step[lo:hi].tolist())), round12(st),
            round12(dur), round12(nbytes), [s or None for s in src], round12(alg), round12(bus)]


def json_ready(x):
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


def analyze(paths: Sequence[str | os.PathLike], *, steps: str | None = "hta", time_resolution: str = "hta",
            jobs: int | None = None, min_samples: int = 3, groups: dict[str, str] | None = None,
            engine=None, address: str | None = None, picture: bool = False,
            png_step: int | None = None) -> Analysis:
    """Analyse the traces under ``paths`` (files or directories; one file per rank).

    ``steps``: ``"hta"`` (HolisticTraceAnalysis' default window), ``"all"``, or ``"3,4"`` /
    ``"3-5"`` (see :mod:`ccoverlap.trace.steps`). ``time_resolution``: ``"hta"`` rounds
    sub-µs timestamps inward to whole µs as HTA does (start up, end down); ``"exact"`` keeps
    them. ``engine``: what runs the per-rank work (:mod:`ccoverlap.trace.engine`): an engine
    object, ``"ray"`` (the Ray cluster at ``address``, default one started on this machine) or
    ``"local"`` / None: a pool of ``jobs`` processes (default: one per CPU when there are two or
    more files totalling at least 2 MiB, else this process). ``paths`` may be fsspec URLs
    (:mod:`ccoverlap.trace.sources`). ``picture``: also keep one step's intervals of the first
    16 ranks for :func:`ccoverlap.trace.report.write_png` (``png_step``, default the first
    analysed). Raises :class:`TraceError` when nothing could be analysed and
    :class:`ConfigError` for a bad ``steps`` / ``time_resolution``. ``groups``: process group ->
    parallelism dimension (``--groups``; see :mod:`ccoverlap.trace.dimensions`).
    """
    spec = parse_steps(steps)
    if time_resolution not in ("hta", "exact"):
        raise ConfigError(f"time resolution must be 'hta' or 'exact', got {time_resolution!r}")
    files, problems = _load.discover(list(paths))
    if engine is None or isinstance(engine, str):
        local = engine in (None, "local")
        engine = make_engine(engine, address=address, n_items=len(files), jobs=jobs,
                             total_bytes=sum(source_size(f) for f in files) if local else 0)
    ctx = JobContext(steps=spec, time_resolution=time_resolution, groups=groups, min_samples=min_samples,
                     lanes=picture, lanes_step=png_step)
    return analyze_job(files, ctx, engine, problems, png_step=png_step, picture=picture)




COMPARE_KEYS = ("step_time_s", "compute_s", "comm_s", "overlap_ratio", "exposed_comm_s", "compute_only_s",
                "idle_s", "compute_comm_ratio")


def compare(a: Analysis, b: Analysis) -> dict:
    """``A --vs B``: each metric of one step (per-rank means over the analysed steps), per rank
    present in both and over the job, plus the mean time of each collective type.

    Returns ``{"job": [...], "ranks": {rank: [...]}, "collectives": [...]}`` with rows
    ``{"metric", "a", "b", "diff" (b - a), "ratio" (b / a)}``.
    """
    pa, pb = a.per_step_mean(), b.per_step_mean()

    def rows(da: dict, db: dict) -> list[dict]:
        out = []
        for k in COMPARE_KEYS:
            x, y = da.get(k), db.get(k)
            ok = x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
            out.append({"metric": k, "a": x, "b": y, "diff": (y - x) if ok else None,
                        "ratio": (y / x) if ok and x else None})
        return out

    def mean_over(p: dict) -> dict:
        keys = COMPARE_KEYS
        out = {k: float(np.mean([v[k] for v in p.values() if math.isfinite(v[k])] or [math.nan])) for k in keys}
        comm = sum(v["comm_s"] for v in p.values())
        out["overlap_ratio"] = (sum(v["overlap_ratio"] * v["comm_s"] for v in p.values()) / comm) if comm else 0.0
        return out

    common = sorted(set(pa) & set(pb))
    ca = {c.collective: c for c in a.collectives}
    cb = {c.collective: c for c in b.collectives}
    coll_rows = []
    for name in sorted(set(ca) | set(cb)):
        x = ca[name].time_mean_s if name in ca else None
        y = cb[name].time_mean_s if name in cb else None
        coll_rows.append({"metric": f"{name} mean time_s", "a": x, "b": y,
                          "diff": (y - x) if x is not None and y is not None else None,
                          "ratio": (y / x) if x and y is not None else None})
    return json_ready({"job": rows(mean_over(pa), mean_over(pb)),
                   "ranks": {r: rows(pa[r], pb[r]) for r in common},
                   "collectives": coll_rows,
                   "only_in_a": sorted(set(pa) - set(pb)), "only_in_b": sorted(set(pb) - set(pa))})
