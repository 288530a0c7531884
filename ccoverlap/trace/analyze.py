"""Facade: trace files in, every measurement of ``ccoverlap analyze`` out.

``analyze(paths)`` streams each file (:mod:`.load`), builds one Timeline per rank
(:mod:`.classify`), picks the analysed rows (:mod:`.steps`, HolisticTraceAnalysis' default
window unless told otherwise), and computes with the simulator's own
:func:`ccoverlap.sim.timeline.rank_metrics`: per rank and per step compute / communication /
memcpy time, overlap ratio (HTA's definition), exposed communication, compute-only and idle
time, R = compute / communication; then per-collective bandwidths, cross-rank skew and
stragglers, contention, and a verdict. Problems with single files become lines in
``Analysis.problems``; :class:`TraceError` is raised only when no file could be analysed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ccoverlap.errors import ConfigError, TraceError
from ccoverlap.sim.timeline import RankMetrics, rank_metrics
from ccoverlap.trace import load as _load
from ccoverlap.trace.classify import RankTrace, build_rank, origin_us
from ccoverlap.trace.collectives import CollectiveStats, busbw_factor, collective_stats
from ccoverlap.trace.contention import Contention, contention
from ccoverlap.trace.dimensions import DimensionStats, assign_cpu_groups, dimension_stats
from ccoverlap.trace.ranks import CrossRank, cross_rank
from ccoverlap.trace.steps import (assign_steps, available_steps, parse_steps, selection_mask, step_rows,
                                   step_windows)
from ccoverlap.trace.verdict import Verdict, decide

METRIC_KEYS = ("step_time_s", "compute_s", "comm_s", "memcpy_s", "overlap_s", "overlap_ratio",
               "exposed_comm_s", "compute_only_s", "idle_s", "compute_comm_ratio")
_PARALLEL_MIN_BYTES = 8 << 20


@dataclass
class Analysis:
    """Everything measured on one set of traces (seconds, bytes, bytes/s)."""

    files: list[str]
    problems: list[str]
    steps_spec: str | list[int]
    time_resolution: str
    ranks: list[RankTrace]
    masks: dict[int, np.ndarray]
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
        return _comm_kernels(self)

    def to_dict(self) -> dict:
        """One JSON-ready object (``inf``/``nan`` become null)."""
        ranks = []
        for m, rt in zip(self.metrics, self.ranks):
            d = {"rank": m.rank}
            d.update({k: getattr(m, k) for k in METRIC_KEYS})
            d.update({"bubble_s": m.bubble_s, "comm_bytes": m.comm_bytes, "file": str(rt.path), "mode": rt.mode,
                      "rank_source": rt.meta.get("rank_source"), "device": rt.meta.get("device"),
                      "rows": int(self.masks[rt.rank].sum())})
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
            "steps": {"spec": self.steps_spec, "analysed": self.analysed_steps, "available": self.available_steps},
            "time_resolution": self.time_resolution,
            "summary": self.summary(),
            "ranks": ranks,
            "per_step": steps,
            "collectives": [c.as_dict() for c in self.collectives],
            "dimensions": [d.as_dict() for d in self.dimensions],
            "comm_kernels": self.comm_kernels(),
            "cross_rank": self.cross.as_dict(),
            "contention": self.contention.as_dict(),
            "verdict": self.verdict.as_dict(),
        }
        return _clean(doc)


def _comm_kernels(a: "Analysis") -> list[dict]:
    rows_out = []
    for rt in a.ranks:
        tl = rt.timeline
        idx = np.flatnonzero(a.masks[rt.rank] & (tl.kind == "comm"))
        if not len(idx):
            continue
        pg = rt.meta.get("pg_config") or {}
        for i, c, g, gs, st, en, b, src in zip(idx.tolist(), tl.collective[idx].tolist(), tl.group[idx].tolist(),
                                               rt.group_size[idx].tolist(), tl.start_s[idx].tolist(),
                                               tl.end_s[idx].tolist(), tl.bytes[idx].tolist(),
                                               (rt.size_source[idx].tolist() if rt.size_source is not None
                                                else [""] * len(idx))):
            dur = en - st
            alg = b / dur if b > 0 and dur > 0 else None
            f = busbw_factor(c, int(gs)) if gs else None
            rows_out.append({"rank": rt.rank, "name": str(tl.name[i]), "collective": c, "group": g,
                             "group_desc": (pg.get(str(g)) or {}).get("desc"), "group_size": int(gs),
                             "step": int(tl.step[i]), "start_s": st, "dur_s": dur, "bytes": b,
                             "size_source": src or None, "algbw": alg,
                             "busbw": alg * f if alg is not None and f is not None else None})
    return rows_out


def _clean(x):
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return float(f"{v:.12g}") if math.isfinite(v) else None   # 12 significant digits: no 1e-17 noise
    return x


def _load_one(path: Path):
    try:
        return _load.load_trace(path, keep_cpu_ops=False)
    except TraceError as exc:
        return str(exc)


def _load_files(files: list[Path], jobs: int | None) -> tuple[list, list[str]]:
    total = 0
    for f in files:
        try:
            total += f.stat().st_size
        except OSError:
            pass
    if jobs is None:
        # parsing is CPU-bound: extra processes pay off with >= 4 CPUs (on 2 vCPUs - often one
        # core with two hyper-threads - two parsers each ran ~1.6x slower and the wall time grew)
        cpus = os.cpu_count() or 1
        jobs = min(len(files), cpus) if total >= _PARALLEL_MIN_BYTES and cpus >= 4 else 1
    if jobs > 1 and len(files) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor   # imported only when used: start-up time

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            results = list(pool.map(_load_one, files))
    else:
        results = [_load_one(f) for f in files]
    raws, problems = [], []
    for r in results:
        if isinstance(r, str):
            problems.append(r)
        else:
            problems.extend(r.warnings)
            raws.append(r)
    return raws, problems


def analyze(paths: Sequence[str | os.PathLike], *, steps: str | None = "hta", time_resolution: str = "hta",
            jobs: int | None = None, min_samples: int = 3, groups: dict[str, str] | None = None) -> Analysis:
    """Analyse the traces under ``paths`` (files or directories; one file per rank).

    ``steps``: ``"hta"`` (HolisticTraceAnalysis' default window), ``"all"``, or ``"3,4"`` /
    ``"3-5"`` (see :mod:`ccoverlap.trace.steps`). ``time_resolution``: ``"hta"`` rounds
    sub-µs timestamps inward to whole µs as HTA does (start up, end down); ``"exact"`` keeps
    them. ``jobs``: processes for loading (default: one per file up to the CPU count when the
    files total >= 8 MiB and the machine has >= 4 CPUs, else 1). Raises :class:`TraceError`
    when nothing could be analysed and :class:`ConfigError` for a bad ``steps`` /
    ``time_resolution``. ``groups``: process group -> parallelism dimension (``--groups``; see
    :mod:`ccoverlap.trace.dimensions`).
    """
    spec = parse_steps(steps)
    if time_resolution not in ("hta", "exact"):
        raise ConfigError(f"time resolution must be 'hta' or 'exact', got {time_resolution!r}")
    files, problems = _load.discover(list(paths))
    raws, load_problems = _load_files(files, jobs)
    problems += load_problems
    raws, rank_problems = _load.assign_ranks(raws)
    problems += rank_problems
    origin = origin_us(raws)
    rts: list[RankTrace] = []
    for i, raw in enumerate(raws):
        raws[i] = None                       # each file's columns are freed once its rank is built
        rt = build_rank(raw, origin, hta_rounding=(time_resolution == "hta"))
        if rt is None:
            problems.append(f"{raw.path}: no GPU kernel events and no gloo collectives on CPU threads - "
                            f"nothing to measure (a rank without GPU activity in the trace?)")
            continue
        rts.append(rt)
    if not rts:
        detail = "; ".join(problems) if problems else "no trace files given"
        exc = TraceError(f"nothing could be analysed: {detail}")
        exc.problems = list(problems) or ["no trace files given"]   # for --json's one object
        exc.files = [str(f) for f in files]
        raise exc
    problems += assign_cpu_groups(rts)
    job_step_names = len(set().union(*[rt.n_steps_names for rt in rts]))
    avail = available_steps(rts)
    if isinstance(spec, list):
        missing = [s for s in spec if s not in avail]
        if missing and len(missing) == len(spec):
            raise ConfigError(f"--steps {','.join(map(str, spec))}: no such profiler step; the traces have "
                              f"{', '.join(map(str, avail)) or 'no ProfilerStep annotations'}")
        if missing:
            problems.append(f"--steps: step(s) {', '.join(map(str, missing))} not in the traces (have "
                            f"{', '.join(map(str, avail))})")
    masks: dict[int, np.ndarray] = {}
    metrics: list[RankMetrics] = []
    step_metrics: dict[int, dict[int, RankMetrics]] = {}
    for rt in rts:
        assign_steps(rt)
        mask = selection_mask(rt, spec, job_step_names)
        masks[rt.rank] = mask
        if rt.mode == "cpu":
            problems.append(f"{rt.path}: no GPU events - measured the gloo collectives and CPU ops of its "
                            f"threads instead")
        sel = rt.timeline.select(mask)
        if not (sel.kind == "comm").any():
            problems.append(f"{rt.path}: no communication kernels in the analysed window (rank {rt.rank})")
        metrics.append(rank_metrics(sel, rt.rank))
        by_step = step_rows(rt, mask)
        for s, window in step_windows(rt, mask).items():
            rows = by_step[s]                   # increasing row indices of step s (no per-step scan)
            step_metrics.setdefault(s, {})[rt.rank] = rank_metrics(rt.timeline.select(rows), rt.rank, window=window)
    colls = collective_stats(rts, masks)
    dims = dimension_stats(rts, masks, groups)
    step_times = {s: {r: m.step_time_s for r, m in per.items()} for s, per in step_metrics.items()}
    cross = cross_rank(rts, masks, step_times)
    if cross.note.startswith("the ranks' first events"):
        problems.append(cross.note)
    cont = contention(rts, masks, min_samples=min_samples)
    verdict = decide(metrics, colls, cont, mode="cpu" if all(rt.mode == "cpu" for rt in rts) else "gpu")
    return Analysis(files=[str(f) for f in files], problems=problems, steps_spec=spec,
                    time_resolution=time_resolution, ranks=rts, masks=masks, metrics=metrics,
                    step_metrics=step_metrics, collectives=colls, cross=cross, contention=cont,
                    verdict=verdict, available_steps=avail, dimensions=dims)


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
    return _clean({"job": rows(mean_over(pa), mean_over(pb)),
                   "ranks": {r: rows(pa[r], pb[r]) for r in common},
                   "collectives": coll_rows,
                   "only_in_a": sorted(set(pa) - set(pb)), "only_in_b": sorted(set(pb) - set(pa))})
