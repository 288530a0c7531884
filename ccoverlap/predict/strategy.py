"""The planner object: one workload, its cost model (built once) and a simulation cache,
handed to every strategy.

A :class:`Planner` is what every overlap strategy receives (the built-in ones of
:mod:`ccoverlap.planning.strategies` and the deciders' in :mod:`ccoverlap.deciders`). Strategies never build
a cost model or a step themselves: they ask the planner, so a configuration that two
strategies try (e.g. the best knobs, which Lagom, AutoCCL and Centauri all start from) is
built and simulated once.

Strategies implement the :class:`Strategy` protocol (a ``name``, a one-line ``summary`` and
``run(planner, start) -> StrategyResult | None``) and are registered explicitly in a
:class:`StrategyRegistry` (see :func:`ccoverlap.planning.strategies.default_registry`); nothing registers
itself on import.

This module sits below the deciders in the import order (README, Layout): it imports the
simulator, the step builder and the summary definitions of :mod:`ccoverlap.predict.evaluate` only.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ccoverlap.config import Count, check_value, short, suggest
from ccoverlap.errors import ConfigError
from ccoverlap.predict.evaluate import (
    StepMetrics,
    StrategyResult,
    build_workload_step,
    cost_model_for,
    extrapolate_metrics,
    step_totals,
    summarize,
    summarize_metrics,
)
from ccoverlap.predict.workload import Workload, require_workload
from ccoverlap.sim.simulator import simulate
from ccoverlap.types import ProgressFn

if TYPE_CHECKING:
    from ccoverlap.cost import CostModel
    from ccoverlap.parallel.config import OverlapKnobs, ParallelConfig
    from ccoverlap.parallel.step import StepGraph
    from ccoverlap.sim.graph import OpGraph
    from ccoverlap.sim.timeline import Timeline


def _hashable(x: object) -> Hashable:
    try:
        hash(x)
        return x
    except TypeError:  # frozen dataclasses holding dicts (e.g. a GPU's peak FLOP/s per dtype)
        return repr(x)


def effective_knobs(knobs: OverlapKnobs, parallel: ParallelConfig) -> OverlapKnobs:
    """``knobs`` with the values the step builder ignores set to their defaults, so that two
    configurations building the same step share one cache entry: ``tp_chunks`` is read only with
    ``tp_overlap="chunked"`` and tp > 1 (:mod:`ccoverlap.parallel.tp`; the memory estimate
    does not read it)."""
    defaults = type(knobs)()
    if knobs.tp_overlap != "chunked" or parallel.tp <= 1:
        return replace(knobs, tp_chunks=defaults.tp_chunks)
    return knobs


def workload_key(w: Workload) -> tuple[Hashable, ...]:
    """What a step simulation depends on: model, cluster, parallelism, batch, the knobs the
    step builder reads (:func:`effective_knobs`) (frozen dataclasses; those holding dicts are
    keyed by their repr). The calibration enters through the planner's cost model."""
    knobs = effective_knobs(w.knobs, w.parallel)
    return tuple(_hashable(x) for x in (w.model, w.cluster, w.parallel, w.batch, knobs,
                                        w.framework))


def screen_microbatches(w: Workload) -> int | None:
    """Micro-batches per pipeline of the reduced step on which candidates are judged in
    screened mode (:meth:`Planner.screened`), or None when the step is already that small:
    the smallest multiple of ``pp`` that is at least ``2·pp + 2`` (4 without a pipeline).
    That is enough for the 1F1B / interleaved steady state (pp warm-up micro-batches, at
    least pp + 2 in steady state, the same in-flight activations as the full step) and keeps
    the interleaved schedule's "multiple of pp" rule (Narayanan et al. 2021, §2.2)."""
    pp = max(1, int(w.parallel.pp))
    if w.parallel.pp_group:  # a pipeline group ties the schedule to the micro-batch count
        return None
    m_s = pp * -(-(2 * pp + 2) // pp)
    m = w.batch.microbatches(w.parallel.dp)
    return m_s if m_s < m else None


#: pipeline schedules whose step is affine in the micro-batch count past the warm-up, so a
#: step may be extrapolated from two shorter ones (checked against full simulations in
#: tests/predict/test_steady_state.py; steps without a pipeline qualify too). Left out: DualPipe (it
#: splits the micro-batches between two directions; extrapolated from 8 and 12 micro-batches
#: it is off by 1.6e-4) and GPipe (measured off by 2.1e-5 in step time and 3.2e-4 in overlap
#: ratio on a PP4 DDP step, where 1F1B and interleaved agree to rounding; docs/planner.md).
PERIODIC_SCHEDULES = ("1f1b", "interleaved")


def steady_state_microbatches(w: Workload) -> tuple[int, int] | None:
    """The two step lengths (micro-batches per pipeline) from which a step of ``w`` is
    extrapolated (:func:`ccoverlap.predict.evaluate.extrapolate_metrics`), or None when it must be
    simulated in full: a schedule not in :data:`PERIODIC_SCHEDULES`, or no more micro-batches
    than the second length. The first length is :func:`screen_microbatches`' (past the 1F1B /
    interleaved warm-up, and the step candidates are judged on, so its simulation is usually
    cached), the second one pipeline round (``pp`` micro-batches) longer, keeping the
    interleaved schedule's "multiple of pp" rule."""
    p = w.parallel
    pp = max(1, int(p.pp))
    if pp > 1 and (p.pp_schedule not in PERIODIC_SCHEDULES or p.pp_group):
        return None
    m1 = pp * -(-(2 * pp + 2) // pp)
    m2 = m1 + pp
    return (m1, m2) if m2 < w.batch.microbatches(p.dp) else None


#: fewest ops in a candidate's step for which :meth:`Planner.evaluate_many` uses worker
#: processes: a map over 2 forked workers costs 0.05-0.08 s wall (measured after the README
#: plan's knob search, load ~7, docs/planner.md), about what simulating 15,000 ops of that plan
#: costs; below ~40,000 ops the candidates run faster in this process.
PARALLEL_MIN_OPS = 40_000


def with_microbatches(w: Workload, m: int) -> Workload:
    """``w`` with the global batch cut (or grown) to ``m`` micro-batches per pipeline (same
    model, layout, micro-batch size and knobs)."""
    b = w.batch
    return replace(w, batch=replace(b, global_batch=m * b.micro_batch * w.parallel.dp))


class Planner:
    """One workload, its cost model and a cache of simulated steps.

    ``workload``: the configuration as given (a :class:`ccoverlap.predict.workload.Workload`).
    ``cost``: the cost model to use (default: the workload's, with its calibration file).
    ``keep_timelines``: how many simulated timelines the cache holds (least recently used
    dropped first; summaries are kept for every configuration simulated).
    ``progress``: called as ``progress(done, total, what)`` by long searches.
    ``jobs``: processes for independent candidates (:meth:`map`); default: the CPUs this
    process may use (1 = everything in this process).
    ``exact``: False (default) lets strategies judge candidates on a reduced step with fewer
    micro-batches (:meth:`screened`, :func:`screen_microbatches`), and the step time of a full
    step be extrapolated from two shorter ones where the schedule is periodic
    (:meth:`steady_state`, :meth:`metrics`); True makes :meth:`screened` the identity and
    simulates every step in full.

    Counters: ``simulations`` (full step simulations run), ``cache_hits`` (simulations avoided
    because the same configuration had been simulated), ``graph_simulations`` (simulations of
    graphs a decider rewrote, which are not cached).
    """

    def __init__(self, workload: Workload, *, cost: CostModel | None = None, keep_timelines: int = 4,
                 progress: ProgressFn | None = None, jobs: int | None = None, exact: bool = False) -> None:
        require_workload(workload, "Planner")
        if jobs is not None:
            check_value("jobs", jobs, Count)
        check_value("keep_timelines", keep_timelines, Count)
        if cost is not None and not callable(getattr(cost, "duration_s", None)):
            raise ConfigError(f"Planner: cost must have a duration_s(spec, concurrent) method (a CostModel), "
                              f"got {type(cost).__name__}")
        self.workload = workload
        self.exact = bool(exact)
        self.jobs = default_jobs() if jobs is None else jobs
        self.cost = cost if cost is not None else cost_model_for(workload)
        self.progress = progress
        self.keep_timelines = keep_timelines
        self._steps: OrderedDict[tuple, StepGraph] = OrderedDict()
        self._timelines: OrderedDict[tuple, Timeline] = OrderedDict()
        self._summaries: dict[tuple, StrategyResult] = {}
        self._pinned: set[tuple] = set()
        self._memo: dict[tuple, Any] = {}
        self._metrics: dict[tuple, StepMetrics] = {}
        self._simulated_summaries: set[tuple] = set()  # summaries from a full simulation, not extrapolated
        self.extrapolations = 0
        self.simulations = 0
        self.cache_hits = 0
        self.graph_simulations = 0

    def workload_of(self, w: Workload | None = None) -> Workload:
        """``w``, or the planner's workload when ``w`` is None: what every method taking a
        workload works on. ConfigError when ``w`` is not a :class:`Workload`."""
        return self.workload if w is None else require_workload(w, "Planner")

    # ------------------------------------------------------------------ screening
    def screened(self, w: Workload | None = None) -> Workload:
        """The workload on which candidates for ``w`` are judged: ``w`` itself in exact mode or
        when it has few micro-batches, else ``w`` with the global batch cut to
        :func:`screen_microbatches` micro-batches per pipeline (same model, layout, micro-batch
        size and knobs). Choices made on it are re-simulated on the full step
        (:meth:`restore`) before they are reported."""
        w = self.workload_of(w)
        if self.exact:
            return w
        m_s = screen_microbatches(w)
        if m_s is None:
            return w
        return with_microbatches(w, m_s)

    @staticmethod
    def restore(w_screened: Workload, like: Workload) -> Workload:
        """``w_screened`` (a configuration chosen on a :meth:`screened` step) with the batch of
        the full workload ``like``: what is simulated and reported."""
        return replace(w_screened, batch=like.batch)

    def screening(self, w: Workload | None = None) -> bool:
        """Whether :meth:`screened` reduces ``w``."""
        w = self.workload_of(w)
        return self.screened(w) is not w

    def steady_state(self, w: Workload | None = None) -> tuple[int, int] | None:
        """The two step lengths from which :meth:`metrics` extrapolates ``w``'s step
        (:func:`steady_state_microbatches`), or None when it is simulated in full (always in
        exact mode)."""
        w = self.workload_of(w)
        return None if self.exact else steady_state_microbatches(w)

    def full_step_how(self, w: Workload | None = None) -> str:
        """How :meth:`metrics` gets ``w``'s full step, for notes: "simulated in full" or
        "extrapolated from M1 and M2 micro-batches"."""
        pts = self.steady_state(self.workload_of(w))
        return "simulated in full" if pts is None else f"extrapolated from {pts[0]} and {pts[1]} micro-batches"

    def metrics(self, w: Workload | None = None) -> StepMetrics:
        """:class:`~ccoverlap.predict.evaluate.StepMetrics` of ``w``'s step: extrapolated from the
        simulations of two shorter steps (:meth:`steady_state`) or, where that does not apply,
        from its full simulation. Cached per configuration."""
        w = self.workload_of(w)
        key = workload_key(w)
        got = self._metrics.get(key)
        if got is not None:
            self.cache_hits += 1
            return got
        got = self.rewritten_metrics(w, None)
        self._metrics[key] = got
        return got

    def rewritten_metrics(self, w: Workload | None, rewrite: Callable[[StepGraph], OpGraph] | None,
                          key: Hashable | None = None) -> StepMetrics:
        """:class:`~ccoverlap.predict.evaluate.StepMetrics` of ``w``'s step rewritten by a decider:
        ``rewrite(step)`` returns the op graph to simulate for a :class:`StepGraph` (None: the
        step as built). Where :meth:`steady_state` applies, the rewrite is applied to and
        simulated on two shorter steps and the metrics extrapolated (so ``rewrite`` must do
        per micro-batch what it does on the full step); else on the full step. ``key``
        (hashable, naming the rewrite) caches the result per step length, so a decider that
        judged a rewrite on the screened step does not simulate it again."""
        w = self.workload_of(w)
        pts = self.steady_state(w)
        if pts is None:
            return self._short_metrics(w, rewrite, key)
        a, b = (self._short_metrics(with_microbatches(w, m), rewrite, key) for m in pts)
        self.extrapolations += 1
        return extrapolate_metrics(a, b, w.batch.microbatches(w.parallel.dp))

    def _short_metrics(self, w: Workload, rewrite: Callable[[StepGraph], OpGraph] | None,
                       key: Hashable | None) -> StepMetrics:
        if rewrite is None:
            got = self._metrics.get(workload_key(w))
            if got is not None:
                return got
            st, tl = self.simulate(w)
            got = self._metrics[workload_key(w)] = StepMetrics.of(tl, st.microbatches)
            return got
        ck = ("rewritten-metrics", key, workload_key(w)) if key is not None else None
        if ck is not None and ck in self._memo:
            self.cache_hits += 1
            return self._memo[ck]
        st = self.step(w)
        got = StepMetrics.of(self.simulate_graph(rewrite(st)), st.microbatches)
        if ck is not None:
            self._memo[ck] = got
        return got

    def summarize_metrics(self, name: str, w: Workload, metrics: StepMetrics, *, note: str = "",
                          extra_memory_bytes: float = 0.0) -> StrategyResult:
        """:func:`ccoverlap.predict.evaluate.summarize_metrics` with ``w``'s totals (tokens, model FLOPs,
        memory estimate), for metrics from :meth:`metrics` / :meth:`rewritten_metrics`."""
        return summarize_metrics(name, w, metrics, step_totals(w), note=note, extra_memory_bytes=extra_memory_bytes)

    # ------------------------------------------------------------------ building and simulating
    def step(self, w: Workload | None = None) -> StepGraph:
        """The :class:`~ccoverlap.parallel.StepGraph` of ``w`` (default: the planner's workload),
        built once per configuration."""
        w = self.workload_of(w)
        key = workload_key(w)
        st = self._steps.get(key)
        if st is None:
            st = build_workload_step(w)
            self._steps[key] = st
            while len(self._steps) > self.keep_timelines:
                self._steps.popitem(last=False)
        else:
            self._steps.move_to_end(key)
        return st

    def simulate(self, w: Workload | None = None) -> tuple[StepGraph, Timeline]:
        """Build and simulate one training step of ``w`` (default: the planner's workload);
        returns ``(StepGraph, Timeline)``. A configuration simulated before (and whose timeline
        is still cached) is not simulated again."""

        w = self.workload_of(w)
        key = workload_key(w)
        tl = self._timelines.get(key)
        st = self.step(w)
        if tl is not None:
            self.cache_hits += 1
            self._timelines.move_to_end(key)
            return st, tl
        tl = simulate(st.graph, self.cost)
        self.simulations += 1
        self._timelines[key] = tl
        for old in [k for k in self._timelines if k not in self._pinned][:-self.keep_timelines]:
            del self._timelines[old]
        return st, tl

    def memo(self, key: tuple, make: Callable[[], Any]) -> Any:
        """A value strategies share, made once per planner by ``make()`` (e.g. the overlap groups
        of a workload and their simulated profilers, which Lagom and AutoCCL both use)."""
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = make()
            return value

    def pin(self, w: Workload, pinned: bool = True) -> None:
        """Keep (or stop keeping) ``w``'s timeline in the cache whatever else is simulated."""
        key = workload_key(w)
        if pinned:
            self._pinned.add(key)
        else:
            self._pinned.discard(key)

    def simulate_graph(self, graph: OpGraph) -> Timeline:
        """Simulate an op graph a strategy built or rewrote (not cached); returns the Timeline."""

        self.graph_simulations += 1
        return simulate(graph, self.cost)

    def evaluate(self, w: Workload | None = None, name: str = "as-given", *, note: str = "",
                 keep_timeline: bool = False) -> StrategyResult:
        """Simulate ``w`` (cached) and summarize it as a :class:`StrategyResult` named ``name``
        (definitions in :mod:`ccoverlap.predict.evaluate`). Each call returns a fresh result object.
        Without ``keep_timeline`` the step may be extrapolated from two shorter ones
        (:meth:`metrics`); with it, it is simulated in full (the timeline is what is kept)."""
        w = self.workload_of(w)
        key = workload_key(w)
        base = self._summaries.get(key)
        if keep_timeline and (key not in self._timelines or key not in self._simulated_summaries):
            st, full = self.simulate(w)
            base = summarize(name, w, st, full, keep_timeline=False)
            self._summaries[key] = base
            self._simulated_summaries.add(key)
        elif base is None:
            base = self.summarize_metrics(name, w, self.metrics(w))
            self._summaries[key] = base
        else:
            self.cache_hits += 1
        tl = self._timelines.get(key) if keep_timeline else None
        return replace(base, name=name, note=note, knobs=w.knobs.to_dict(), timeline=tl)

    def map(self, fn: Callable[[int], Any], n: int) -> list[Any]:
        """``[fn(0), ..., fn(n - 1)]`` for independent candidates, in up to ``jobs`` forked
        processes (each inherits this planner and its cache; results come back pickled, so
        ``fn`` should return small values: step times, summaries without timelines). Runs in
        this process when ``jobs`` is 1, ``n`` < 2, fork is unavailable, or already in a worker.
        Simulations done in workers are not added to this planner's cache."""
        global _MAP_TASK
        jobs = min(self.jobs, n)
        if jobs < 2 or _IN_WORKER or "fork" not in mp.get_all_start_methods():
            return [fn(i) for i in range(n)]
        from concurrent.futures import ProcessPoolExecutor

        _MAP_TASK = fn
        try:
            with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork"),
                                     initializer=_mark_worker) as ex:
                return list(ex.map(_run_task, range(n)))
        finally:
            _MAP_TASK = None

    def _worth_processes(self, w: Workload) -> bool:
        """Whether simulating steps like ``w``'s (at the length :meth:`metrics` would simulate)
        takes long enough to pay for worker processes: at least :data:`PARALLEL_MIN_OPS` ops.
        Builds that step (cached, so the candidate's own evaluation reuses it)."""
        pts = self.steady_state(w)
        probe = with_microbatches(w, pts[1]) if pts else w
        return len(self.step(probe).graph.ops) >= PARALLEL_MIN_OPS

    def evaluate_many(self, ws: Sequence[Workload], name: str) -> list[StrategyResult]:
        """:meth:`evaluate` of each workload in ``ws`` (no timelines), the uncached ones in
        parallel (:meth:`map`) when their steps are large enough (:meth:`_worth_processes`);
        their summaries join this planner's cache."""
        todo = [i for i, w in enumerate(ws) if workload_key(w) not in self._summaries]
        if len(todo) > 1 and self.jobs > 1 and not _IN_WORKER and self._worth_processes(ws[todo[0]]):
            done = self.map(lambda j: self.evaluate(ws[todo[j]], name), len(todo))
            for j, res in zip(todo, done):
                self._summaries[workload_key(ws[j])] = replace(res, timeline=None)
            self.simulations += len(todo)
        return [self.evaluate(w, name) for w in ws]

    def summarize(self, name: str, w: Workload, step: StepGraph, timeline: Timeline, **kw: Any) -> StrategyResult:
        """:func:`ccoverlap.predict.evaluate.summarize` (same definitions for every strategy)."""
        return summarize(name, w, step, timeline, **kw)

    def add_counts(self, counts: Mapping[str, int]) -> None:
        """Add counter increments (from :meth:`stats` differences, e.g. of a worker process)."""
        for k, v in counts.items():
            if k in ("simulations", "graph_simulations", "cache_hits", "extrapolations"):
                setattr(self, k, getattr(self, k) + int(v))

    def stats(self) -> dict[str, int]:
        """Counters, for reports: simulations, graph simulations, cache hits."""
        return {"simulations": self.simulations, "graph_simulations": self.graph_simulations,
                "cache_hits": self.cache_hits, "extrapolations": self.extrapolations}


# ----------------------------------------------------------------------------- processes

_MAP_TASK: Callable[[int], Any] | None = None
_IN_WORKER = False


def planner_workload(who: str, planner: object, w: Workload | None = None) -> Workload:
    """The workload a decider's entry point (``who``) works on: ``w``, or ``planner``'s when
    None; ConfigError when ``planner`` is not a :class:`Planner` or ``w`` not a Workload."""
    if not isinstance(planner, Planner):
        raise ConfigError(f"{who}: planner must be a Planner (Planner(workload)), got {short(planner)}")
    return planner.workload_of(w)


def _mark_worker() -> None:
    global _IN_WORKER
    _IN_WORKER = True


def _run_task(i: int) -> Any:
    assert _MAP_TASK is not None
    return _MAP_TASK(i)


def default_jobs() -> int:
    """CPUs this process may run on (``CCOVERLAP_JOBS`` overrides; 1 = no worker processes)."""
    env = os.environ.get("CCOVERLAP_JOBS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# ----------------------------------------------------------------------------- strategies

@runtime_checkable
class Strategy(Protocol):
    """An overlap strategy the planner can run.

    ``name``: short unique name (a table row, a ``--strategies`` value).
    ``summary``: one line saying what it does and which paper it follows.
    ``run(planner, start)``: simulate the strategy starting from workload ``start`` (the
    planner's best knobs) with the planner's cost model and cache; return a
    :class:`StrategyResult` (seconds, bytes) or None when it does not apply to the workload.

    Optional attributes read by :func:`ccoverlap.planning.strategies.plan` when it runs strategies in worker
    processes (:func:`strategy_groups`): ``group`` (strategies with the same non-empty group
    run in one process, in registration order, so they share what they :meth:`Planner.memo`)
    and ``weight`` (relative cost, a scheduling hint: heavier groups start first; default 1).
    """

    @property
    def name(self) -> str: ...  # read-only: strategies are frozen dataclasses

    @property
    def summary(self) -> str: ...

    def run(self, planner: Planner, start: Workload) -> StrategyResult | None: ...


@dataclass(frozen=True)
class FunctionStrategy:
    """A :class:`Strategy` made of a function ``fn(planner, start) -> StrategyResult | None``."""

    name: str
    fn: Callable[[Planner, Workload], StrategyResult | None]
    summary: str = ""
    group: str = ""
    weight: float = 1.0

    def run(self, planner: Planner, start: Workload) -> StrategyResult | None:
        """Run ``fn`` on the planner and the starting workload."""
        return self.fn(planner, start)


def strategy_groups(strategies: Sequence[Strategy]) -> list[list[Strategy]]:
    """``strategies`` split into the groups that :func:`ccoverlap.planning.strategies.plan` may run in separate
    processes: one per distinct ``group`` attribute (strategies without one alone), members in
    the given order; groups ordered by total ``weight``, heaviest first (the longest-processing-
    time-first rule, so the last group to start is a short one)."""
    groups: dict[str, list[Strategy]] = {}
    for i, s in enumerate(strategies):
        groups.setdefault(getattr(s, "group", "") or f"\0{i}", []).append(s)
    return sorted(groups.values(), key=lambda g: -sum(float(getattr(s, "weight", 1.0)) for s in g))


def fork_available() -> bool:
    """Whether :meth:`Planner.map` can use worker processes here (fork start method, not
    already inside a worker)."""
    return not _IN_WORKER and "fork" in mp.get_all_start_methods()


class StrategyRegistry:
    """An ordered, explicit set of strategies (no registration on import)."""

    def __init__(self, strategies: Iterable[Strategy] = ()) -> None:
        self._by_name: dict[str, Strategy] = {}
        for s in strategies:
            self.add(s)

    def add(self, strategy: Strategy) -> None:
        """Register ``strategy``; ConfigError if it is not a Strategy or its name is taken."""
        if not isinstance(strategy, Strategy):
            raise ConfigError(f"{strategy!r} is not a strategy (needs name, summary and run(planner, start))")
        if strategy.name in self._by_name:
            raise ConfigError(f"strategy {strategy.name!r} registered twice")
        self._by_name[strategy.name] = strategy

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._by_name)

    def get(self, name: str) -> Strategy:
        """The strategy called ``name``; ConfigError naming the available ones otherwise."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(f"unknown strategy {short(name)}{suggest(name, self._by_name)}; "
                              f"available: {', '.join(self._by_name) or 'none'}") from None

    def select(self, names: Iterable[str] | None) -> list[Strategy]:
        """The strategies called ``names`` (all when None), checked."""
        return list(self._by_name.values()) if names is None else [self.get(n) for n in names]

    def __iter__(self) -> Iterator[Strategy]:
        return iter(self._by_name.values())

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)
