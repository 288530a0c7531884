"""Facade: trace files in, every measurement of ``ccoverlap analyze`` out.

``analyze(paths)`` maps the per-rank work (:func:`ccoverlap.trace.summary.summarize_rank`: stream
one file, build its Timeline, pick the analysed rows - HolisticTraceAnalysis' default window
unless told otherwise - and reduce them with the simulator's own
:func:`ccoverlap.sim.timeline.rank_metrics`) over the files with an engine
(:mod:`ccoverlap.workers.pool`: worker processes by default), then combines the rank summaries
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
from typing import Any

import numpy as np

from ccoverlap.config import Count, check_value, short
from ccoverlap.errors import ConfigError
from ccoverlap.sim.timeline import overlap_ratio
from ccoverlap.trace import load as _load
from ccoverlap.trace.combine import analyze_job
from ccoverlap.trace.dimensions import check_groups
from ccoverlap.trace.result import Analysis, json_ready
from ccoverlap.trace.sources import size as source_size
from ccoverlap.trace.steps import parse_steps
from ccoverlap.trace.summary import JobContext
from ccoverlap.workers.pool import Engine, make_engine


def analyze(paths: Sequence[str | os.PathLike[str]], *, steps: str | None = "hta", time_resolution: str = "hta",
            jobs: int | None = None, min_samples: int = 3, groups: dict[str, str] | None = None,
            engine: Engine | str | None = None, address: str | None = None, picture: bool = False,
            png_step: int | None = None) -> Analysis:
    """Analyse the traces under ``paths`` (files or directories; one file per rank).

    ``steps``: ``"hta"`` (HolisticTraceAnalysis' default window), ``"all"``, or ``"3,4"`` /
    ``"3-5"`` (see :mod:`ccoverlap.trace.steps`). ``time_resolution``: ``"hta"`` rounds
    sub-µs timestamps inward to whole µs as HTA does (start up, end down); ``"exact"`` keeps
    them. ``engine``: what runs the per-rank work (:mod:`ccoverlap.workers.pool`): an engine
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
        raise ConfigError(f"time resolution must be 'hta' or 'exact', got {short(time_resolution)}")
    if jobs is not None:
        check_value("jobs", jobs, Count)
    groups = check_groups(groups) if groups is not None else None
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

    def rows(da: dict[str, float], db: dict[str, float]) -> list[dict[str, Any]]:
        out = []
        for k in COMPARE_KEYS:
            x, y = da.get(k), db.get(k)
            diff = ratio = None
            if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
                diff, ratio = y - x, (y / x if x else None)
            out.append({"metric": k, "a": x, "b": y, "diff": diff, "ratio": ratio})
        return out

    def mean_over(p: dict) -> dict:
        keys = COMPARE_KEYS
        out = {k: float(np.mean([v[k] for v in p.values() if math.isfinite(v[k])] or [math.nan])) for k in keys}
        out["overlap_ratio"] = overlap_ratio(sum(v["overlap_s"] for v in p.values()), sum(v["comm_s"] for v in p.values()))
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
