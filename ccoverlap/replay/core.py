"""Facade: trace files in, replayed step times (and what-ifs) out.

``load_job`` reads one Kineto trace per rank with the analyser's loader
(:func:`ccoverlap.trace.load.load_trace` with ``keep_runtime=True``) and classifier
(:func:`ccoverlap.trace.classify.build_rank`, exact times), builds each rank's dependency
graph (:mod:`.graph`) and joins them (:mod:`.engine`). ``scenario_metrics`` turns node times
into a replayed :class:`~ccoverlap.trace.classify.RankTrace` per rank and measures it with the
analyser's own functions (step assignment by launch time, HTA's step window, per-step
windows, :func:`ccoverlap.sim.timeline.rank_metrics`), so replayed and measured numbers - and a
replayed Chrome trace read back by ``ccoverlap analyze`` - are computed by the same code.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ccoverlap.errors import ConfigError, TraceError
from ccoverlap.replay.engine import JobGraph, join
from ccoverlap.replay.graph import build_rank_graph
from ccoverlap.sim.timeline import RankMetrics, Timeline, rank_metrics
from ccoverlap.trace import load as _load
from ccoverlap.trace.classify import RankTrace, build_rank, origin_us
from ccoverlap.trace.steps import assign_steps, available_steps, parse_steps, selection_mask, step_windows


@dataclass
class Measured:
    """Metrics of one scenario: per rank over the selected window and per step (seconds)."""

    overall: dict[int, RankMetrics]
    steps: dict[int, dict[int, RankMetrics]]           # rank -> step -> metrics
    rts: dict[int, RankTrace]
    masks: dict[int, np.ndarray]


@dataclass
class Job:
    """A loaded, graphed job ready to replay."""

    files: list[str]
    problems: list[str]
    spec: str | list[int]
    job_step_names: int
    graph: JobGraph
    rts: list[RankTrace]
    step_threads: dict[int, dict[int, int]] = field(default_factory=dict)   # rank -> step -> tid
    whole_window: bool = False
    all_steps: dict[int, list] = field(default_factory=dict)    # rank -> [(N, start_s, end_s, is_gpu)]
    names: dict[int, list] = field(default_factory=dict)        # rank -> launch names
    cpu_threads: dict[int, list] = field(default_factory=dict)  # rank -> thread labels
    device_names: dict[int, str] = field(default_factory=dict)
    origin_us: float = 0.0


def load_job(paths: Sequence[str], *, steps: str | None = "hta") -> Job:
    """Load, classify and graph every rank (problems per file collected, never raised).

    Raises :class:`TraceError` only when no rank could be replayed.
    """
    spec = parse_steps(steps)
    files, problems = _load.discover(list(paths))
    raws = []
    for f in files:
        try:
            raw = _load.load_trace(f, keep_runtime=True)
        except TraceError as exc:
            problems.append(str(exc))
            continue
        problems.extend(raw.warnings)
        raws.append(raw)
    raws, rank_problems = _load.assign_ranks(raws)
    problems += rank_problems
    origin = origin_us(raws)
    graphs, rts, kept_raws = [], [], []
    for raw in raws:
        rt = build_rank(raw, origin, hta_rounding=False)
        if rt is None or rt.mode != "gpu":
            problems.append(f"{raw.path}: no GPU kernel events - replay needs device events (a CPU-only or "
                            f"GPU-less rank); not replayed")
            continue
        if len(raw.l_ts) == 0:
            problems.append(f"{raw.path}: no CUDA runtime events (launches) - kernels replayed at their measured "
                            f"starts only")
        try:
            g = build_rank_graph(raw, rt, origin)
        except (ValueError, IndexError) as exc:      # pragma: no cover - defensive: one rank, one line
            problems.append(f"{raw.path}: cannot build the dependency graph ({exc}); not replayed")
            continue
        graphs.append(g)
        rts.append(rt)
        kept_raws.append(raw)
    if not graphs:
        detail = "; ".join(problems) if problems else "no trace files given"
        raise TraceError(f"nothing could be replayed: {detail}")
    if isinstance(spec, list):
        avail = available_steps(rts)
        missing = [s for s in spec if s not in avail]
        if len(missing) == len(spec):
            raise ConfigError(f"--steps {','.join(map(str, spec))}: no such profiler step; the traces have "
                              f"{', '.join(map(str, avail)) or 'no ProfilerStep annotations'}")
        if missing:
            problems.append(f"--steps: step(s) {', '.join(map(str, missing))} not in the traces (have "
                            f"{', '.join(map(str, avail))})")
    jg = join(graphs)
    step_names = len(set().union(*[rt.n_steps_names for rt in rts]))
    whole = all(not rt.steps for rt in rts)
    if whole:
        problems.append("no ProfilerStep annotation in any trace - replayed the whole window as one step")
    threads = {}
    for raw, rt in zip(kept_raws, rts):
        per = {}
        for i in np.flatnonzero([raw.names[k].startswith("ProfilerStep") for k in raw.c_nid]) if len(raw.c_nid) else []:
            name = raw.names[raw.c_nid[i]]
            try:
                num = int(name.split("#")[1])
            except (IndexError, ValueError):
                continue
            per.setdefault(num, int(raw.c_tid[i]))
        threads[rt.rank] = per
    unmatched = [x for x in jg.notes if "#" in x and " " not in x]
    if unmatched:
        problems.append(f"{len(unmatched)} collective(s) not matched across ranks (a member ended before another "
                        f"started: clock offset between hosts?) - replayed with their measured durations")
    problems.extend(x for x in jg.notes if " " in x)
    all_steps = {rt.rank: [(n, (ts - origin) * 1e-6, (ts + d - origin) * 1e-6, gpu) for n, ts, d, gpu in raw.steps]
                 for raw, rt in zip(kept_raws, rts)}
    lnames = {rt.rank: [raw.names[i] for i in raw.l_nid] for raw, rt in zip(kept_raws, rts)}
    devs = {rt.rank: str(rt.meta.get("device") or "") for rt in rts}
    return Job(files=[str(f) for f in files], problems=problems, spec=spec, job_step_names=step_names,
               graph=jg, rts=rts, step_threads=threads, whole_window=whole, all_steps=all_steps, names=lnames,
               cpu_threads={rt.rank: raw.threads for raw, rt in zip(kept_raws, rts)}, device_names=devs,
               origin_us=origin)


def _shift_fn(jg: JobGraph, gi: int, t: np.ndarray, end: np.ndarray):
    """Per thread: t -> t + the delay the replay gave the last CPU call that ended by t."""
    g = jg.ranks[gi]
    off = jg.offset[gi]
    n = g.n_gpu
    m = g.n_cpu
    out = {}
    if m == 0:
        return out
    nodes = off + n + np.arange(m)
    exits = np.array([off + g.exit_of.get(n + j, n + j) for j in range(m)])
    rep_end = np.where(exits == nodes, t[nodes] + jg.dur[nodes], t[exits])
    meas_end = g.cpu_end
    delay = rep_end - meas_end
    for tid in np.unique(g.cpu_tid):
        rows = np.flatnonzero(g.cpu_tid == tid)
        rows = rows[np.argsort(meas_end[rows], kind="stable")]
        out[int(tid)] = (meas_end[rows], delay[rows])
    return out


def _shift(tables: dict, tid: int | None, x: float) -> float:
    tab = tables.get(tid) if tid is not None else None
    if tab is None:
        # the step's thread launched nothing: use the thread that launched the most
        if not tables:
            return x
        tab = max(tables.values(), key=lambda v: len(v[0]))
    ends, delay = tab
    i = int(np.searchsorted(ends, x, side="right")) - 1
    return x + (float(delay[i]) if i >= 0 else 0.0)


def replayed_ranks(job: Job, t: np.ndarray, dur: np.ndarray | None = None) -> list[RankTrace]:
    """The replayed :class:`RankTrace` of every rank for node times ``t`` (from ``JobGraph.run``)."""
    jg = job.graph
    start, end = jg.intervals(t, dur)
    out = []
    for gi, (g, rt) in enumerate(zip(jg.ranks, job.rts)):
        off = jg.offset[gi]
        n = g.n_gpu
        tl = rt.timeline
        new_tl = Timeline(rank=tl.rank, stream=tl.stream, kind=tl.kind, name=tl.name,
                          start_s=start[off:off + n].copy(), end_s=end[off:off + n].copy(), bytes=tl.bytes,
                          flops=tl.flops, collective=tl.collective, group=tl.group, meta=tl.meta)
        r2 = copy.copy(rt)
        r2.timeline = new_tl
        launch = g.launch_of
        ls = np.full(n, np.nan)
        has = launch >= 0
        ls[has] = t[off + n + launch[has]]
        r2.launch_s = ls
        tables = _shift_fn(jg, gi, t, end)
        tids = job.step_threads.get(rt.rank, {})
        shifted = [(num, _shift(tables, tids.get(num), s), _shift(tables, tids.get(num), e), gpu)
                   for num, s, e, gpu in job.all_steps.get(rt.rank, [])]
        # ops without a launch in the trace belong to a step by their own start: keep each in the
        # step it ran in, stretching the step's annotation over its replayed start if needed
        nol = np.isnan(rt.launch_s)
        if nol.any() and shifted:
            assign_steps(rt)
            st = rt.timeline.step
            out_steps = []
            for num, s0, e0, gpu in shifted:
                rows = nol & (st == num)
                if rows.any():
                    s0 = min(s0, float(new_tl.start_s[rows].min()))
                    e0 = max(e0, float(new_tl.start_s[rows].max()) + 1e-9)
                out_steps.append((num, s0, e0, gpu))
            shifted = out_steps
        r2.steps = [(num, s0, e0) for num, s0, e0, gpu in shifted if not gpu]
        meta = dict(rt.meta)
        if shifted:
            r2.cutoff_s = max(s for _, s, _, _ in shifted)
            meta["last_step_end_s"] = max(e for _, _, e, _ in shifted)
        meta["replayed_steps"] = shifted
        meta["replayed_launch"] = (t[off + n: off + n + g.n_cpu].copy(), end[off + n: off + n + g.n_cpu].copy())
        exits = [off + g.exit_of.get(n + j, n + j) for j in range(g.n_cpu)]
        if g.n_cpu:
            ex = np.asarray(exits)
            own = ex == off + n + np.arange(g.n_cpu)
            cend = np.where(own, t[off + n: off + n + g.n_cpu] + jg.dur[off + n: off + n + g.n_cpu], t[ex])
            meta["replayed_launch"] = (t[off + n: off + n + g.n_cpu].copy(), cend)
        r2.meta = meta
        out.append(r2)
    return out


def measure(rts: list[RankTrace], spec, job_step_names: int) -> Measured:
    """Per rank and per step metrics with the analyser's window rules (seconds)."""
    overall, steps, masks, byrank = {}, {}, {}, {}
    for rt in rts:
        assign_steps(rt)
        mask = selection_mask(rt, spec, job_step_names)
        masks[rt.rank] = mask
        byrank[rt.rank] = rt
        overall[rt.rank] = rank_metrics(rt.timeline.select(mask), rt.rank)
        per = {}
        for s, window in step_windows(rt, mask).items():
            rows = mask & (rt.timeline.step == s)
            per[s] = rank_metrics(rt.timeline.select(rows), rt.rank, window=window)
        steps[rt.rank] = per
    return Measured(overall=overall, steps=steps, rts=byrank, masks=masks)


def fidelity_rows(measured: Measured, replayed: Measured, structure: Measured | None = None) -> list[dict]:
    """Per rank and step: measured vs replayed step time and the error (%); with ``structure``
    (the replay with nominal GPU gaps instead of the fitted ones) its step time and error too."""
    rows = []
    for r in sorted(measured.steps):
        per_m = measured.steps[r]
        per_r = replayed.steps.get(r, {})
        keys = sorted(per_m) or []
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
            x = (structure.overall[r].step_time_s if s is None else
                 structure.steps.get(r, {}).get(s).step_time_s if s in structure.steps.get(r, {}) else math.nan)
            row["structure_s"] = x
            row["structure_error_pct"] = 100 * (x - row["measured_s"]) / row["measured_s"] if row["measured_s"] else 0.0
    return rows
