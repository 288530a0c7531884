"""Facade: trace files in, a replayable job out; node times in, step metrics out.

``load_job`` reads one Kineto trace per rank with the analyser's loader
(:func:`ccoverlap.trace.load.load_trace` with ``keep_runtime=True``) and classifier
(:func:`ccoverlap.trace.classify.build_rank`, exact times), builds each rank's dependency
graph (:mod:`.graph`) and joins them (:mod:`.engine`). Which rows belong to which profiler
step, and which are analysed (``--steps``), is decided once, on the measured trace, with the
analyser's rules (:mod:`ccoverlap.trace.steps`: the step an op was launched in, HTA's
window): every scenario measures the same work.

:func:`measure` gives, for node times of a scenario, per rank and step the analyser's
metrics over the step's window (:func:`ccoverlap.sim.timeline.rank_metrics`: exposed
communication, overlap) and the step's **end**: the later of its last op's end and the first
start of a later step's ops. A scenario's step time is the time from the start of the
analysed window - where the measured one started, the same in every scenario - to the end of
the last analysed step, divided by the number of steps: a what-if that only removes or
shortens work can only end every step earlier or at the same time, so it can never report a
longer step. (A step's own window, first op to end, is not used for that: once the CPU no
longer waits, the next step's first copy may start while this step's last kernels still run,
and two windows that overlap would count that time twice.)
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ccoverlap.config import few
from ccoverlap.errors import ConfigError, TraceError
from ccoverlap.replayer.graph import RankGraph, build_rank_graph
from ccoverlap.replayer.job import JobGraph, join
from ccoverlap.sim.timeline import RankMetrics, Timeline, rank_metrics
from ccoverlap.trace import load as _load
from ccoverlap.trace.classify import RankTrace, build_rank, origin_us
from ccoverlap.trace.load import RawTrace
from ccoverlap.trace.rank_assign import assign_ranks
from ccoverlap.trace.sources import Source
from ccoverlap.trace.steps import Steps, assign_steps, available_steps, parse_steps, selection_mask, step_rows

#: A ``ProfilerStep#N`` annotation: (N, start, end, on the GPU) - µs as loaded, s once placed.
_Step = tuple[int, float, float, bool]


@dataclass
class Bounds:
    """Where a rank's analysed window starts and each analysed step ends (s)."""

    start_s: float
    ends: dict[int, float]        # step -> end; {} for a window without profiler steps
    end_s: float                  # end of the last analysed step (or of the window)

    @property
    def n_steps(self) -> int:
        """Analysed steps (1 for a window without profiler steps)."""
        return max(len(self.ends), 1)


@dataclass
class Measured:
    """Metrics of one scenario, per rank over the selected rows and per step (seconds); measured
    without metrics (``measure(..., metrics=False)``) ``overall`` is empty and ``steps`` holds an
    empty dict per rank: only ``bounds`` is set."""

    overall: dict[int, RankMetrics]
    steps: dict[int, dict[int, RankMetrics]]           # rank -> step -> metrics over its window
    bounds: dict[int, Bounds]


@dataclass
class Job:
    """A loaded, graphed job ready to replay."""

    files: list[str]
    problems: list[str]
    spec: Steps
    job_step_names: int
    graph: JobGraph
    rts: list[RankTrace]
    masks: dict[int, np.ndarray]                        # rank -> analysed rows
    views: list[RankView] = field(default_factory=list)   # a RankView per rank
    whole_window: bool = False
    annotations: dict[int, list[_Step]] = field(default_factory=dict)   # rank -> [(N, start_s, end_s, is_gpu)]
    device_names: dict[int, str] = field(default_factory=dict)
    origin_us: float = 0.0
    anchors: dict[int, float] = field(default_factory=dict)      # rank -> start of the analysed window


@dataclass
class _Loaded:
    """One loaded file: what :func:`ccoverlap.trace.rank_assign.assign_ranks` weighs, and its graph."""

    path: Source
    rank: int | None
    world_size: int | None
    rank_source: str
    n_events: int
    n_malformed: int
    n_device: int
    graph: RankGraph | None
    steps: list[_Step]
    notes: list[str]


def _graph_one(raw: RawTrace, origin: float, keep_calls: bool) -> _Loaded:
    """The graph of one loaded trace (times from ``origin``, µs), or None with a note."""
    rt = build_rank(raw, origin, hta_rounding=False)
    notes: list[str] = []
    graph: RankGraph | None = None
    if rt is None or rt.mode != "gpu":
        notes.append(f"{raw.path}: no GPU kernel events - replay needs device events (a CPU-only or GPU-less rank); "
                     f"not replayed")
    else:
        if len(raw.l_ts) == 0:
            notes.append(f"{raw.path}: no CUDA runtime events (launches) - kernels replayed at their measured starts "
                         f"only")
        try:
            graph = build_rank_graph(raw, rt, origin, keep_calls=keep_calls)
        except (ValueError, IndexError) as exc:      # pragma: no cover - defensive: one rank, one line
            notes.append(f"{raw.path}: cannot build the dependency graph ({exc}); not replayed")
    return _Loaded(path=raw.path, rank=raw.rank, world_size=raw.world_size, rank_source=raw.rank_source,
                   n_events=raw.n_events, n_malformed=raw.n_malformed, n_device=len(raw.k_ts), graph=graph,
                   steps=list(raw.steps), notes=notes)


def _relabel(g: RankGraph, x: _Loaded) -> None:
    """Give a graph built before the ranks were assigned its rank and world size."""
    rt = g.rt
    assert x.rank is not None       # assign_ranks gave every file a rank
    g.rank = rt.rank = x.rank
    rt.timeline.rank[:] = x.rank
    rt.meta["world_size"] = x.world_size
    rt.meta["rank_source"] = x.rank_source


def _load_ranks(paths: Sequence[str | os.PathLike[str]], keep_calls: bool
                ) -> tuple[list[Source], list[RankGraph], dict[int, list[_Step]], list[str], float]:
    """(files, graphs, ProfilerStep annotations per rank, problems, origin in µs): each file is
    graphed as soon as it is loaded and its columns released, so one file's raw columns are held
    at a time; times count from the first file's earliest event (any common origin would do),
    and the ranks are assigned once every file is in (:func:`ccoverlap.trace.rank_assign.assign_ranks`)."""
    files, problems = _load.discover(list(paths))
    loaded: list[_Loaded] = []
    origin: float | None = None
    for f in files:
        try:
            raw = _load.load_trace(f, keep_cpu_ops=False, keep_runtime=True)
        except TraceError as exc:
            problems.append(str(exc))
            continue
        problems.extend(raw.warnings)
        origin = origin_us([raw]) if origin is None else origin
        loaded.append(_graph_one(raw, origin, keep_calls))
        del raw
    kept, rank_problems = assign_ranks(loaded)
    problems += rank_problems
    graphs: list[RankGraph] = []
    annotations: dict[int, list[_Step]] = {}
    for x in kept:
        problems += x.notes
        if x.graph is None:
            continue
        _relabel(x.graph, x)
        graphs.append(x.graph)
        assert origin is not None           # set by the first file loaded (this one or before)
        annotations[x.graph.rank] = [(n, (ts - origin) * 1e-6, (ts + d - origin) * 1e-6, gpu)
                                     for n, ts, d, gpu in x.steps]
    return files, graphs, annotations, problems, origin or 0.0


def load_job(paths: Sequence[str | os.PathLike[str]], *, steps: str | None = "hta", keep_calls: bool = True) -> Job:
    """Load, classify and graph every rank (problems per file collected, never raised).
    ``keep_calls``: keep every runtime call's columns, needed to write replayed traces.

    Raises :class:`TraceError` only when no rank could be replayed, :class:`ConfigError` when
    ``steps`` names no step of the traces.
    """
    spec = parse_steps(steps)
    files, graphs, annotations, problems, origin = _load_ranks(paths, keep_calls)
    if not graphs:
        detail = few(problems) if problems else "no trace files given"
        raise TraceError(f"nothing could be replayed: {detail}")
    rts = [g.rt for g in graphs]
    _check_steps(spec, rts, problems)
    jg = join(graphs)
    step_names = len(set().union(*[rt.n_steps_names for rt in rts]))
    whole = all(not rt.steps for rt in rts)
    if whole:
        problems.append("no ProfilerStep annotation in any trace - replayed the whole window as one step")
    unmatched = [x for x in jg.notes if "#" in x and " " not in x]
    if unmatched:
        problems.append(f"{len(unmatched)} collective(s) not matched across ranks (a member ended before another "
                        f"started: clock offset between hosts?) - replayed with their measured durations")
    problems.extend(x for x in jg.notes if " " in x)
    masks: dict[int, np.ndarray] = {}
    for rt in rts:
        assign_steps(rt)
        masks[rt.rank] = selection_mask(rt, spec, step_names)
    return Job(files=[str(f) for f in files], problems=problems, spec=spec, job_step_names=step_names, graph=jg,
               rts=rts, masks=masks, views=[rank_view(rt, masks[rt.rank]) for rt in rts], whole_window=whole,
               annotations=annotations,
               device_names={rt.rank: str(rt.meta.get("device") or "") for rt in rts}, origin_us=origin)


def _check_steps(spec: Steps, rts: list[RankTrace], problems: list[str]) -> None:
    """ConfigError when ``--steps`` names no step of the traces; a problem line for some missing."""
    if not isinstance(spec, list):
        return
    avail = available_steps(rts)
    missing = [s for s in spec if s not in avail]
    if len(missing) == len(spec):
        raise ConfigError(f"--steps {','.join(map(str, spec))}: no such profiler step; the traces have "
                          f"{', '.join(map(str, avail)) or 'no ProfilerStep annotations'}")
    if missing:
        problems.append(f"--steps: step(s) {', '.join(map(str, missing))} not in the traces (have "
                        f"{', '.join(map(str, avail))})")


def gpu_times(job: Job, t: np.ndarray, dur: np.ndarray | None = None
              ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Per rank: (start, end) of its GPU rows (s) for node times ``t`` (from ``JobGraph.run``)."""
    jg = job.graph
    dur = jg.dur if dur is None else dur
    s_out: dict[int, np.ndarray] = {}
    e_out: dict[int, np.ndarray] = {}
    for off, g in zip(jg.offset, jg.ranks):
        rows = slice(off, off + g.n_gpu)
        en = jg.end_node[rows]
        own = en == np.arange(off, off + g.n_gpu)
        s_out[g.rank] = t[rows].copy()
        e_out[g.rank] = np.where(own, t[rows] + dur[rows], t[en])
    return s_out, e_out


@dataclass
class RankView:
    """One rank's analysed rows, fixed for every scenario: the rows, each step's rows (analysed,
    and all of them, whose first start ends the step before), and skeleton timelines of those
    rows whose start/end columns each scenario replaces."""

    rank: int
    rows: np.ndarray
    tl: Timeline
    step_rows: dict[int, np.ndarray]
    step_tl: dict[int, Timeline]
    step_all: dict[int, np.ndarray]


def _skeleton(tl: Timeline, rows: np.ndarray) -> Timeline:
    """The rows of ``tl`` with the columns :func:`rank_metrics` reads; the label columns it does
    not read (stream, name, collective, group) are one shared empty string."""
    blank = np.broadcast_to(np.array("", dtype=object), (len(rows),))
    return Timeline(rank=tl.rank[rows], stream=blank, kind=tl.kind[rows], name=blank, start_s=tl.start_s[rows],
                    end_s=tl.end_s[rows], bytes=tl.bytes[rows], flops=tl.flops[rows], collective=blank, group=blank,
                    step=tl.step[rows])


def _part(skel: Timeline, a: int, b: int) -> Timeline:
    """Rows ``a:b`` of a skeleton, sharing its columns (no copy)."""
    cols = {c: getattr(skel, c)[a:b] for c in ("rank", "stream", "kind", "name", "start_s", "end_s", "bytes",
                                               "flops", "collective", "group", "step")}
    return Timeline(**cols)


def rank_view(rt: RankTrace, mask: np.ndarray) -> RankView:
    """The :class:`RankView` of ``rt`` (its ``timeline.step`` set) for the analysed ``mask``: the
    analysed rows ordered by step, so each step's rows are a slice of one skeleton."""
    tl = rt.timeline
    sel = step_rows(rt, mask)
    rest = np.flatnonzero(mask & (tl.step < 0))
    rows = np.concatenate([rest] + [sel[s] for s in sorted(sel)]).astype(np.int64)
    skel = _skeleton(tl, rows)
    parts: dict[int, Timeline] = {}
    at = len(rest)
    for s in sorted(sel):
        parts[s] = _part(skel, at, at + len(sel[s]))
        at += len(sel[s])
    return RankView(rank=rt.rank, rows=rows, tl=skel, step_rows=sel, step_tl=parts, step_all=step_rows(rt))


def _timed(skel: Timeline, start: np.ndarray, end: np.ndarray) -> Timeline:
    t = copy.copy(skel)
    t.start_s, t.end_s = start, end
    return t


def _rank_measure(v: RankView, start: np.ndarray, end: np.ndarray, anchor: float | None, metrics: bool = True
                  ) -> tuple[RankMetrics | None, dict[int, RankMetrics], Bounds]:
    """(overall metrics, per-step metrics, bounds) of one rank (see the module docstring): each
    step's window is HTA's, from its first op to the later of its last end and the first start
    of a later step's ops (:func:`ccoverlap.trace.steps.step_windows`); without ``metrics`` only
    the bounds (the metrics are None / empty)."""
    first_all = {s: float(start[r].min()) for s, r in v.step_all.items()}
    later: dict[int, float] = {}
    best = math.inf
    for s in sorted(first_all, reverse=True):
        later[s] = best
        best = min(best, first_all[s])
    windows: dict[int, tuple[float, float]] = {}
    for s in sorted(v.step_rows):
        r = v.step_rows[s]
        nxt = later.get(s, math.inf)
        b = float(end[r].max())
        windows[s] = (float(start[r].min()), max(b, nxt) if math.isfinite(nxt) else b)
    ends = {s: w[1] for s, w in windows.items()}
    if windows:
        first, last = windows[min(windows)][0], max(ends.values())
    else:
        first = float(start[v.rows].min()) if len(v.rows) else 0.0
        last = float(end[v.rows].max()) if len(v.rows) else 0.0
    bounds = Bounds(start_s=first if anchor is None else anchor, ends=ends, end_s=last)
    if not metrics:
        return None, {}, bounds
    per = {s: rank_metrics(_timed(v.step_tl[s], start[v.step_rows[s]], end[v.step_rows[s]]), v.rank, window=w)
           for s, w in windows.items()}
    return rank_metrics(_timed(v.tl, start[v.rows], end[v.rows]), v.rank), per, bounds


def measure(job: Job, starts: dict[int, np.ndarray], ends: dict[int, np.ndarray],
            anchors: dict[int, float] | None = None, *, metrics: bool = True) -> Measured:
    """Per rank and per step metrics of a scenario whose GPU rows run at ``starts``/``ends``
    (seconds); ``anchors``: where each rank's analysed window starts (default: its own first
    op); ``metrics=False``: the step bounds only (what a step time needs)."""
    overall: dict[int, RankMetrics] = {}
    steps: dict[int, dict[int, RankMetrics]] = {}
    bounds: dict[int, Bounds] = {}
    for v in job.views:
        r = v.rank
        o, steps[r], bounds[r] = _rank_measure(v, starts[r], ends[r], None if anchors is None else anchors.get(r),
                                               metrics)
        if o is not None:
            overall[r] = o
    return Measured(overall=overall, steps=steps, bounds=bounds)


def step_time(m: Measured) -> float:
    """The step time of a measured scenario (s): per rank from the start of the analysed window
    to the end of its last analysed step, per step; the slowest rank's."""
    return max(((b.end_s - b.start_s) / b.n_steps for b in m.bounds.values()), default=0.0)


def fidelity_rows(measured: Measured, replayed: Measured, structure: Measured | None = None) -> list[dict[str, Any]]:
    """Per rank and step: measured vs replayed step window (s) and the error (%); with
    ``structure`` (the replay with nominal GPU gaps instead of the fitted ones) its too."""
    rows: list[dict[str, Any]] = []
    for r in sorted(measured.steps):
        per_m, per_r = measured.steps[r], replayed.steps.get(r, {})
        keys = sorted(per_m)
        if not keys:
            m, p = measured.overall[r].step_time_s, replayed.overall[r].step_time_s
            rows.append({"rank": r, "step": None, "measured_s": m, "replayed_s": p,
                         "error_pct": 100 * (p - m) / m if m else 0.0})
            continue
        for s in keys:
            m = per_m[s].step_time_s
            p = per_r[s].step_time_s if s in per_r else math.nan
            rows.append({"rank": r, "step": s, "measured_s": m, "replayed_s": p,
                         "error_pct": 100 * (p - m) / m if m else 0.0})
    if structure is not None:
        for row in rows:
            r, s = row["rank"], row["step"]
            per = structure.steps.get(r, {})
            x = structure.overall[r].step_time_s if s is None else per[s].step_time_s if s in per else math.nan
            row["structure_s"] = x
            row["structure_error_pct"] = 100 * (x - row["measured_s"]) / row["measured_s"] if row["measured_s"] else 0.0
    return rows


def replayed_calls(job: Job, gi: int, t: np.ndarray, dur: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every runtime call of rank ``jg.ranks[gi]`` in the replay ``t`` (s): a
    call in the graph at its node's time (a blocking one ends when its wait node does), a
    folded call at its measured offset after the end of the kept call before it."""
    jg = job.graph
    dur = jg.dur if dur is None else dur
    g, off = jg.ranks[gi], jg.offset[gi]
    c = g.calls
    assert c is not None        # the job was loaded with keep_calls
    kept = c.node >= 0
    exits = off + g.exit_of
    exit_end = t[exits] + dur[exits]                     # per kept call, in node order
    node_end = np.empty(len(c.start))
    anchor_pos = c.node[c.anchor] - g.n_gpu              # index into kept calls
    start = exit_end[anchor_pos] + (c.start - c.end[c.anchor])
    start[kept] = t[off + c.node[kept]]
    node_end[:] = start + (c.end - c.start)
    node_end[kept] = exit_end[c.node[kept] - g.n_gpu]
    return start, node_end


def step_thread(g: RankGraph, s: float, e: float) -> int | None:
    """The launch thread of a profiler step: the one with the most runtime calls inside it."""
    c = g.calls
    assert c is not None        # the job was loaded with keep_calls
    inside = (c.start >= s) & (c.start < e)
    if not inside.any():
        return None
    tids, counts = np.unique(c.tid[inside], return_counts=True)
    return int(tids[np.argmax(counts)])


def replayed_annotations(job: Job, gi: int, t: np.ndarray, call_end: np.ndarray,
                         starts: np.ndarray) -> list[tuple[int, float, float, bool, int]]:
    """``(N, start_s, end_s, is_gpu, tid)`` of every ``ProfilerStep#N`` annotation of the rank,
    moved with its thread: by the delay the replay gave the last call of that thread that ended
    by the annotation's start (and end); a step whose ops have no launch is stretched over
    their replayed starts so every op stays in the step it ran in."""
    jg = job.graph
    g = jg.ranks[gi]
    c = g.calls
    assert c is not None        # the job was loaded with keep_calls
    kept = np.flatnonzero(c.node >= 0)
    out: list[tuple[int, float, float, bool, int]] = []
    nol = np.isnan(g.rt.launch_s)
    for num, s, e, gpu in job.annotations.get(g.rank, []):
        tid = step_thread(g, s, e)
        rows = kept[c.tid[kept] == tid] if tid is not None else kept
        rows = rows[np.argsort(c.end[rows], kind="stable")]
        delay = call_end[rows] - c.end[rows]

        def shift(x: float) -> float:
            i = int(np.searchsorted(c.end[rows], x, side="right")) - 1
            return x + (float(delay[i]) if i >= 0 else 0.0)

        s2, e2 = shift(s), shift(e)
        own = nol & (g.rt.timeline.step == num)
        if own.any():
            s2 = min(s2, float(starts[own].min()))
            e2 = max(e2, float(starts[own].max()) + 1e-9)
        out.append((num, s2, e2, gpu, tid if tid is not None else 0))
    return out
