"""The per-rank half of ``ccoverlap analyze``: one trace file in, a compact :class:`RankSummary` out.

:func:`summarize_rank` is a pure function of ``(source, JobContext)`` - a path or URL and what
the per-rank work must know about the job - and its result is small and picklable, so any engine
can run it where the file is (:mod:`ccoverlap.workers.pool`; a process pool here, a cluster's
workers elsewhere) and send only the summary back. It streams the file (:mod:`.load`), builds
the rank's Timeline (:mod:`.classify`), selects the analysed rows (:mod:`.steps`) and reduces
them to what the cross-rank analyses (:mod:`.combine`) read:

* the rank's metrics over the window and per profiler step (durations, seconds);
* its analysed communication rows (a few per collective call) with the part of each during which
  no compute ran - for the collective table, the cross-rank matching and the kernel list;
* its compute kernels' durations alone / overlapped with communication as value counts per
  kernel (name + launch shape) - for the pooled contention medians;
* its parts of the per-dimension overlap, the gloo worker threads' calls (CPU traces only) and,
  when a picture is wanted, one step's merged compute / communication intervals.

Times count from the rank's own first event (``origin_us``); the combine step shifts them to the
job's clock. Everything per event stays inside this function: the summary's size grows with the
number of collective calls and distinct kernels, not with the number of events.

Three facts about the job can change a rank's result (HTA's step window when a rank alone has
fewer than two ``ProfilerStep`` names, the world size of a file that states none, the process
group of each gloo thread); the summary says what it assumed (:attr:`RankSummary.assumed`) and the
combine step runs the few ranks whose assumption was wrong again with the job's facts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ccoverlap.config import clip_middle
from ccoverlap.errors import ConfigError, TraceError
from ccoverlap.sim.timeline import RankMetrics, Timeline, merge_intervals, rank_metrics
from ccoverlap.trace import load as _load
from ccoverlap.trace.classify import RankTrace, build_rank, origin_us
from ccoverlap.trace.contention import covered_length, rank_samples
from ccoverlap.trace.critical import comm_bound_s
from ccoverlap.trace.dimensions import ThreadCalls, apply_cpu_groups, cpu_thread_calls, rank_dimension_parts
from ccoverlap.trace.sources import as_source
from ccoverlap.trace.steps import Steps, assign_steps, selection_mask, step_rows, step_windows


@dataclass
class JobContext:
    """What the per-rank work needs to know about the job (picklable).

    ``job_has_steps``: whether the job has two or more distinct ProfilerStep names (None: judge
    from this rank); ``world_size``: the job's, for a file that states none; ``cpu_groups``: the
    process group of each gloo worker thread (label of its family's first thread -> group);
    ``lanes_step``: the profiler step whose intervals the picture draws (None: this rank's first
    analysed step), only with ``lanes``.
    """

    steps: Steps = "hta"
    time_resolution: str = "hta"
    groups: dict | None = None
    min_samples: int = 3
    job_has_steps: bool | None = None
    world_size: int | None = None
    cpu_groups: dict | None = None
    lanes: bool = False
    lanes_step: int | None = None


@dataclass
class RankSummary:
    """One rank reduced to what the cross-rank analyses need (see the module docstring).

    Times are seconds from ``origin_us`` (this file's earliest timestamp, µs). ``comm`` holds the
    analysed communication rows (a Timeline; ``comm_group_size``, ``comm_size_source`` and
    ``comm_exposed_s`` are its extra columns). ``error`` is set (and nothing else measured) when
    the file could not be read; ``empty`` when it has nothing to measure. ``n_malformed``: events
    skipped as unreadable; ``n_dropped``: events dropped for inconsistent timestamps.
    """

    path: str
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    header: dict = field(default_factory=dict)
    rank: int | None = None
    world_size: int | None = None
    rank_source: str = ""
    n_events: int = 0
    n_malformed: int = 0
    n_dropped: int = 0
    n_device: int = 0
    origin_us: float = 0.0
    empty: bool = False
    mode: str = ""
    meta: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    step_names: set = field(default_factory=set)
    assumed: dict = field(default_factory=dict)
    rows: int = 0
    first_start_s: float | None = None
    metrics: RankMetrics | None = None
    step_metrics: dict = field(default_factory=dict)
    comm: Timeline | None = None
    comm_group_size: np.ndarray | None = None
    comm_size_source: np.ndarray | None = None
    comm_exposed_s: np.ndarray | None = None
    comm_bound_s: float | None = None     # what removing all communication could save (GPU traces, :mod:`.critical`)
    analysed_names: list[str] = field(default_factory=list)
    contention: dict = field(default_factory=dict)
    dimension_parts: list = field(default_factory=list)
    cpu_threads: dict[str, ThreadCalls] = field(default_factory=dict)
    lanes: dict = field(default_factory=dict)

    @property
    def timeline(self) -> Timeline | None:
        """The analysed communication rows (what the cross-rank matching reads)."""
        return self.comm

    def shifted(self, offset_s: float) -> RankSummary:
        """The same summary with every absolute time moved by ``offset_s`` seconds (to the job's clock)."""
        out = dataclasses.replace(self)
        if self.comm is not None and offset_s:
            c = self.comm.select(np.ones(len(self.comm), dtype=bool))
            c.start_s = c.start_s + offset_s
            c.end_s = c.end_s + offset_s
            out.comm = c
        if offset_s:
            out.steps = [(n, s + offset_s, e + offset_s) for n, s, e in self.steps]
            out.first_start_s = None if self.first_start_s is None else self.first_start_s + offset_s
            out.cpu_threads = {h: (m, ends + offset_s, d, k, g) for h, (m, ends, d, k, g) in self.cpu_threads.items()}
            out.lanes = {s: tuple(x + offset_s for x in iv) for s, iv in self.lanes.items()}
        return out


def summarize_rank(source: str | Path, ctx: JobContext | None = None) -> RankSummary:
    """Stream one trace file and reduce it to a :class:`RankSummary` (see the module docstring).

    Never raises for a bad file: the summary's ``error`` holds the one-line reason.
    """
    ctx = ctx or JobContext()
    path = as_source(source)
    try:
        raw = _load.load_trace(path, keep_cpu_ops=False)
    except TraceError as exc:
        return RankSummary(path=str(path), error=str(exc))
    out = RankSummary(path=str(path), warnings=list(raw.warnings), header=_header(raw.meta), rank=raw.rank,
                      world_size=raw.world_size, rank_source=raw.rank_source, n_events=raw.n_events,
                      n_malformed=raw.n_malformed, n_dropped=raw.n_dropped, n_device=len(raw.k_ts))
    origin = origin_us([raw])
    out.origin_us = origin
    own_world = raw.world_size
    if own_world is None and ctx.world_size is not None:
        raw.world_size = ctx.world_size
    out.assumed["world_size"] = raw.world_size
    try:
        rt = build_rank(raw, origin, hta_rounding=(ctx.time_resolution == "hta"))
        del raw
        if rt is None:
            out.empty = True
            return out
        _measure(rt, ctx, out)
    except ConfigError:
        raise
    except (ValueError, OverflowError) as exc:      # a value no check foresaw: this rank only
        return RankSummary(path=str(path), error=f"{clip_middle(str(path))}: cannot be analysed "
                                                 f"({type(exc).__name__}: {str(exc)[:120]})")
    return out


def _header(meta: dict) -> dict:
    """The header keys the combine step reads (rank evidence, device, groups)."""
    return {k: meta[k] for k in ("distributedInfo", "traceName") if k in meta}


def _measure(rt: RankTrace, ctx: JobContext, out: RankSummary) -> None:
    out.mode = rt.mode
    out.meta = rt.meta
    out.steps = list(rt.steps)
    out.step_names = set(rt.n_steps_names)
    if rt.mode == "cpu":
        out.cpu_threads = cpu_thread_calls(rt)
        if ctx.cpu_groups:
            apply_cpu_groups(rt, ctx.cpu_groups)
    out.assumed["cpu_groups"] = dict(ctx.cpu_groups or {})
    has_steps = ctx.job_has_steps if ctx.job_has_steps is not None else len(rt.n_steps_names) >= 2
    out.assumed["job_has_steps"] = has_steps
    assign_steps(rt)
    mask = selection_mask(rt, ctx.steps, 2 if has_steps else 0)
    tl = rt.timeline
    out.rows = int(mask.sum())
    out.first_start_s = float(tl.start_s[mask].min()) if out.rows else None
    sel = tl if out.rows == len(tl) else tl.select(mask)   # no copy of every row when all are analysed
    out.metrics = rank_metrics(sel, rt.rank)
    by_step = step_rows(rt, mask)
    for s, window in step_windows(rt, mask).items():
        out.step_metrics[s] = rank_metrics(tl.select(by_step[s]), rt.rank, window=window)
    out.analysed_names = sorted(set(sel.name.tolist()))
    comp = mask & (tl.kind == "compute")
    cs, ce = merge_intervals(tl.start_s[comp], tl.end_s[comp])
    cm = mask & (tl.kind == "comm")
    out.comm = tl.select(cm)
    out.comm_group_size = rt.group_size[cm]
    out.comm_size_source = rt.size_source[cm] if rt.size_source is not None else np.full(int(cm.sum()), "", object)
    out.comm_exposed_s = out.comm.duration_s - covered_length(cs, ce, out.comm.start_s, out.comm.end_s)
    if rt.mode == "gpu":
        first = out.first_start_s       # None exactly when no row is analysed
        later = np.flatnonzero(~mask & (tl.start_s >= first)) if first is not None else np.empty(0, dtype=int)
        nxt = int(later[np.argmin(tl.start_s[later])]) if len(later) else -1
        out.comm_bound_s = comm_bound_s(tl.start_s[mask], tl.end_s[mask], cm[mask], rt.launch_s[mask],
                                        float(tl.start_s[nxt]) if nxt >= 0 else np.inf,
                                        float(rt.launch_s[nxt]) if nxt >= 0 else np.nan)
    out.contention = rank_samples(rt, mask, min_samples=ctx.min_samples)
    out.dimension_parts = rank_dimension_parts(rt, mask, ctx.groups, (cs, ce))
    if ctx.lanes:
        out.lanes = _lanes(rt, mask, ctx.lanes_step if ctx.lanes_step is not None else
                           (min(out.step_metrics) if out.step_metrics else None))


def _lanes(rt: RankTrace, mask: np.ndarray, step: int | None) -> dict:
    """Merged compute and communication intervals of one step (or the window), for the picture."""
    tl = rt.timeline
    if step is not None:
        mask = mask & (tl.step == step)
    comp = merge_intervals(tl.start_s[mask & (tl.kind == "compute")], tl.end_s[mask & (tl.kind == "compute")])
    comm = merge_intervals(tl.start_s[mask & (tl.kind == "comm")], tl.end_s[mask & (tl.kind == "comm")])
    return {step: (comp[0], comp[1], comm[0], comm[1])}
