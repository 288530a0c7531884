"""The cross-rank half of ``ccoverlap analyze``: rank summaries in, the job's :class:`Analysis` out.

:func:`analyze_job` maps :func:`ccoverlap.trace.summary.summarize_rank` over the files with an
engine (:mod:`ccoverlap.workers.pool`), then :func:`combine` decides which file is which rank
(:mod:`.rank_assign`), finds the facts only the whole job knows (its clock origin, whether it has
profiler steps, its world size, the process group of each gloo thread), runs the few ranks whose
summary assumed otherwise again, puts every rank on the job's clock and pools the summaries: the
collective table, the per-dimension overlap, the cross-rank matching, the pooled contention and
the verdict. Only summaries are held - a few numbers per collective call and per distinct kernel
duration of each rank - never a rank's events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ccoverlap.config import few
from ccoverlap.errors import ConfigError, TraceError
from ccoverlap.sim.timeline import RankMetrics
from ccoverlap.trace.collectives import pooled_collective_stats
from ccoverlap.trace.contention import PooledContention
from ccoverlap.trace.dimensions import choose_cpu_groups, combine_dimension_parts
from ccoverlap.trace.rank_assign import assign_ranks
from ccoverlap.trace.ranks import cross_rank
from ccoverlap.trace.result import Analysis
from ccoverlap.trace.sources import Source
from ccoverlap.trace.steps import is_numbered, missing_steps
from ccoverlap.trace.summary import JobContext, RankSummary, summarize_rank
from ccoverlap.trace.verdict import decide
from ccoverlap.workers.pool import Engine

MAX_PICTURE_RANKS = 16


class NothingAnalysed(TraceError):
    """No file of the job could be analysed; ``problems`` (one line each) and ``files`` are kept for
    ``--json``'s one object."""

    def __init__(self, message: str, problems: list[str], files: list[str]) -> None:
        super().__init__(message)
        self.problems = problems
        self.files = files


def _assigned_rank(s: RankSummary) -> int:
    """The rank :func:`~ccoverlap.trace.rank_assign.assign_ranks` gave ``s`` (it gives every file one)."""
    assert s.rank is not None
    return int(s.rank)


def analyze_job(files: list[Source], ctx: JobContext, engine: Engine, problems: list[str],
                png_step: int | None = None, picture: bool = False) -> Analysis:
    """Summaries of ``files`` by ``engine``, combined (see :func:`combine`)."""
    items = [(f, ctx) for f in files]
    summaries = list(engine.map(_summarize, items))

    def rerun(jobs: list[tuple[Source, JobContext]]) -> list[RankSummary]:
        return list(engine.map(_summarize, jobs))

    return combine(summaries, ctx, [str(f) for f in files], problems, rerun, png_step=png_step, picture=picture)


def _summarize(item: tuple[Source, JobContext]) -> RankSummary:
    return summarize_rank(*item)


def combine(summaries: list[RankSummary], ctx: JobContext, files: list[str], problems: list[str],
            rerun: Callable[[list[tuple[Source, JobContext]]], list[RankSummary]], *, png_step: int | None = None,
            picture: bool = False) -> Analysis:
    """The job's :class:`~ccoverlap.trace.result.Analysis` from one summary per file (file order).

    ``rerun([(path, JobContext), ...])`` summarizes files again with the job's facts. Problems are
    added to ``problems`` in the order the report lists them. Raises :class:`TraceError` when no
    file could be analysed and :class:`ConfigError` when none of the ``--steps`` is in the traces.
    """
    for s in summaries:
        problems.extend([s.error] if s.error else s.warnings)
    ranked, rank_problems = assign_ranks([s for s in summaries if not s.error])
    problems += rank_problems
    origin = min((s.origin_us for s in ranked), default=0.0)
    kept = []
    for s in ranked:
        if s.empty:
            problems.append(f"{s.path}: no GPU kernel events and no gloo collectives on CPU threads - "
                            f"nothing to measure (a rank without GPU activity in the trace?)")
        else:
            kept.append(s)
    if not kept:
        detail = few(problems) if problems else "no trace files given"
        raise NothingAnalysed(f"nothing could be analysed: {detail}", list(problems) or ["no trace files given"],
                              list(files))
    kept, notes = _with_job_facts(kept, ctx, origin, rerun, png_step, picture)
    problems += notes
    avail = sorted({n for s in kept for n, _, _ in s.steps})
    if is_numbered(ctx.steps):
        none, text = missing_steps(ctx.steps, avail)
        if none:
            raise ConfigError(f"--steps {ctx.steps if not isinstance(ctx.steps, list) else ','.join(map(str, ctx.steps))}"
                              f": no such profiler step; the traces have "
                              f"{', '.join(map(str, avail)) or 'no ProfilerStep annotations'}")
        if text:
            problems.append(f"--steps: step(s) {text} not in the traces (have {', '.join(map(str, avail))})")
    metrics: list[RankMetrics] = []
    step_metrics: dict[int, dict[int, RankMetrics]] = {}
    for s in kept:
        if s.mode == "cpu":
            problems.append(f"{s.path}: no GPU events - measured the gloo collectives and CPU ops of its "
                            f"threads instead")
        assert s.comm is not None and s.metrics is not None     # measured: no error, not empty
        if not len(s.comm):
            problems.append(f"{s.path}: no communication kernels in the analysed window (rank {s.rank})")
        metrics.append(s.metrics)
        for st, m in s.step_metrics.items():
            step_metrics.setdefault(st, {})[_assigned_rank(s)] = m
    step_metrics = {st: step_metrics[st] for st in sorted(step_metrics)}
    colls = pooled_collective_stats([(s.rank, s.comm, s.comm_group_size, s.comm_exposed_s) for s in kept])
    dims = combine_dimension_parts([(_assigned_rank(s), s.dimension_parts) for s in kept])
    step_times = {st: {r: m.step_time_s for r, m in per.items()} for st, per in step_metrics.items()}
    cross = cross_rank(kept, None, step_times)
    if cross.note.startswith("the ranks' first events"):
        problems.append(cross.note)
    pooled = PooledContention()
    for s in kept:
        pooled.add(_assigned_rank(s), s.contention)
    cont = pooled.result(min_samples=ctx.min_samples)
    verdict = decide(metrics, colls, cont, mode="cpu" if all(s.mode == "cpu" for s in kept) else "gpu",
                     comm_bounds=[s.comm_bound_s for s in kept])
    return Analysis(files=list(files), problems=problems, steps_spec=ctx.steps, time_resolution=ctx.time_resolution,
                    ranks=kept, metrics=metrics, step_metrics=step_metrics, collectives=colls, cross=cross,
                    contention=cont, verdict=verdict, available_steps=avail, dimensions=dims)


def _with_job_facts(kept: list[RankSummary], ctx: JobContext, origin: float,
                    rerun: Callable[[list[tuple[Source, JobContext]]], list[RankSummary]], png_step: int | None,
                    picture: bool) -> tuple[list[RankSummary], list[str]]:
    """Summaries on the job's clock, each computed with the job's facts (the wrong ones run again)."""
    has_steps = len(set().union(*[s.step_names for s in kept])) >= 2
    notes: list[str] = []
    chosen: dict[int, dict] = {}
    cpu = [s for s in kept if s.mode == "cpu"]
    if len(cpu) >= 2:
        threads = {_assigned_rank(s): s.shifted((s.origin_us - origin) * 1e-6).cpu_threads for s in cpu}
        info = {_assigned_rank(s): (s.meta.get("pg_config") or {}, s.world_size, s.path) for s in cpu}
        chosen, notes = choose_cpu_groups(threads, info)
    lanes_step = png_step
    if picture and lanes_step is None:
        firsts = [min(s.step_metrics) for s in kept if s.step_metrics]
        lanes_step = min(firsts) if firsts else None
    redo: list[tuple[int, JobContext]] = []
    for i, s in enumerate(kept):
        want = dataclasses.replace(ctx, job_has_steps=has_steps, world_size=s.world_size,
                                   cpu_groups=chosen.get(_assigned_rank(s)) or None,
                                   lanes=picture and i < MAX_PICTURE_RANKS, lanes_step=lanes_step)
        stale = (s.assumed.get("job_has_steps") != has_steps or s.assumed.get("world_size") != s.world_size
                 or s.assumed.get("cpu_groups", {}) != (chosen.get(_assigned_rank(s)) or {})
                 or (want.lanes and (lanes_step not in s.lanes if s.lanes else True)))
        if stale:
            redo.append((i, want))
    if redo:
        fresh = rerun([(kept[i].path, want) for i, want in redo])
        for (i, _), new in zip(redo, fresh):
            old = kept[i]
            new.rank, new.rank_source, new.world_size = old.rank, old.rank_source, old.world_size
            kept[i] = new
    out: list[RankSummary] = []
    for s in kept:
        s = s.shifted((s.origin_us - origin) * 1e-6)
        _label(s)
        out.append(s)
    return out, notes


def _label(s: RankSummary) -> None:
    """Give a summary's metrics, rows and meta its assigned rank (the per-rank work did not know it)."""
    r = _assigned_rank(s)
    assert s.metrics is not None        # measured: the summary has no error and is not empty
    s.metrics = dataclasses.replace(s.metrics, rank=r)
    s.step_metrics = {st: dataclasses.replace(m, rank=r) for st, m in s.step_metrics.items()}
    if s.comm is not None:
        s.comm.rank = np.full(len(s.comm), r, dtype=np.int64)
    s.meta = dict(s.meta, rank_source=s.rank_source, world_size=s.world_size)
