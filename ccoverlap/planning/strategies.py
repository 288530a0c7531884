"""The planner: simulate a workload under several overlap strategies and rank them.

Strategies are named, each a set of overlap knobs (plus, from the deciders, communication
configurations and schedules):

* ``as-given``   — exactly the configuration the user described;
* ``no-overlap`` — every collective blocking on the compute stream (the floor);
* ``best-knobs`` — the best framework overlap knobs found by coordinate descent over the
  knobs that matter for the parallelism in use (DDP bucket size, FSDP prefetch depth and
  in-flight all-gather limit, TP chunking, EP micro-batch overlap), keeping only
  configurations whose memory estimate fits.

Further strategies come from the deciders (Lagom, AutoCCL, Centauri, FiCCO), registered
explicitly by :func:`default_registry`. Every strategy runs on one :class:`Planner` (the
workload, its cost model built once, and the simulation cache).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ccoverlap.config import short
from ccoverlap.deciders.centauri.decide import CENTAURI
from ccoverlap.deciders.ficco.plan import FICCO
from ccoverlap.deciders.lagom.step import AUTOCCL, LAGOM, LAGOM_WITH_KNOBS
from ccoverlap.errors import ConfigError
from ccoverlap.predict.evaluate import StrategyResult
from ccoverlap.predict.strategy import (
    FunctionStrategy,
    Planner,
    Strategy,
    StrategyRegistry,
    fork_available,
    strategy_groups,
    workload_key,
)
from ccoverlap.predict.workload import Workload
from ccoverlap.types import ProgressFn

from .emit import APPLICABLE, TARGETS, EmitBundle, build_emit, hints, write_emit


def knob_space(w: Workload) -> dict[str, list[Any]]:
    """The overlap knobs worth searching for this workload's parallelism, with candidate values."""
    p = w.parallel
    space: dict[str, list[Any]] = {}
    if p.ddp_enabled:
        space["bucket_cap_mb"] = [5, 10, 25, 50, 100, 200]
    if p.fsdp_enabled:
        space["fsdp_prefetch"] = [0, 1, 2, 3]
        space["fsdp_limit_all_gathers"] = [1, 2, 4]
        space["fsdp_reshard_after_forward"] = [True, False]
    if p.tp_enabled:
        space["tp_overlap"] = ["none", "chunked"]
        space["tp_chunks"] = [2, 4, 8]
    if p.ep_enabled:
        space["ep_overlap"] = [False, True]
    if p.pp_enabled:
        space["pp_p2p_overlap"] = [False, True]
    return space


def search_best_knobs(planner: Planner, w: Workload | None = None, *, progress: ProgressFn | None = None,
                      max_rounds: int = 2) -> tuple[Workload, StrategyResult, int]:
    """Coordinate descent over :func:`knob_space`: try each value of one knob with the others
    fixed, keep the fastest configuration that fits in memory, repeat until nothing improves.
    Simulations go through ``planner`` (cached). Candidates are judged on
    ``planner.screened(w)`` (fewer micro-batches unless the planner is exact); only the
    winner is simulated on the full step. Returns (best workload, its full result with its
    timeline, number of configurations evaluated)."""
    w_full = planner.workload if w is None else w
    w = planner.screened(w_full)
    space = knob_space(w)
    best_w = replace(w, knobs=replace(w.knobs, overlap=True))
    best = planner.evaluate(best_w, "best-knobs")
    screened = w is not w_full
    # in screened mode a candidate better on the screened step is confirmed on the full step
    # before it is accepted (plain steps simulate fast; this rejects gains that only exist
    # with few micro-batches)
    best_full = planner.evaluate(planner.restore(best_w, w_full), "best-knobs") if screened else best
    planner.pin(best_w)  # the winner's timeline is returned: keep the current best's
    evaluated = {workload_key(best_w)}
    n_evals = 1
    total = sum(len(v) for v in space.values()) * max_rounds
    done = 0
    for _ in range(max_rounds):
        improved = False
        for knob, values in space.items():
            # the values of one knob are independent candidates (each replaces only this knob
            # of the current best), so they are simulated together, in parallel where possible
            cands = []
            for value in values:
                cand_w = replace(best_w, knobs=replace(best_w.knobs, **{knob: value}))
                key = workload_key(cand_w)
                if key not in evaluated:
                    evaluated.add(key)
                    cands.append((value, cand_w))
            results = planner.evaluate_many([c for _, c in cands], "best-knobs")
            n_evals += len(cands)
            done += len(values)
            if progress:
                progress(done, total, f"{knob}")
            for (value, cand_w), res in zip(cands, results):
                better = res.step_time_s < best.step_time_s * (1 - 1e-9)
                if res.fits_memory and (better or not best.fits_memory):
                    if screened:
                        full = planner.evaluate(planner.restore(cand_w, w_full), "best-knobs")
                        n_evals += 1
                        if not (full.fits_memory and (full.step_time_s < best_full.step_time_s * (1 - 1e-9)
                                                      or not best_full.fits_memory)):
                            continue
                        best_full = full
                    planner.pin(best_w, False)
                    planner.pin(cand_w)
                    best_w, best, improved = cand_w, res, True
        if not improved:
            break
    planner.pin(best_w, False)
    best_w = planner.restore(best_w, w_full)
    best = planner.evaluate(best_w, "best-knobs", keep_timeline=True)
    return best_w, best, n_evals


def _as_given(planner: Planner, start: Workload) -> StrategyResult:
    return planner.evaluate(planner.workload, "as-given", keep_timeline=True)


def _no_overlap(planner: Planner, start: Workload) -> StrategyResult:
    w = planner.workload
    return planner.evaluate(replace(w, knobs=replace(w.knobs, overlap=False)), "no-overlap",
                            note="every collective blocking on the compute stream")


AS_GIVEN = FunctionStrategy("as-given", _as_given, "exactly the configuration described")
NO_OVERLAP = FunctionStrategy("no-overlap", _no_overlap, "every collective blocking on the compute stream (the floor)")


def default_registry() -> StrategyRegistry:
    """The decider strategies ``plan`` runs after the best-knobs search, registered explicitly:
    Lagom and the AutoCCL baseline (lagom §3; from the knobs as given, so their rows against
    ``as-given`` are what NCCL tuning alone buys) and Lagom from the best knobs (both levers),
    Centauri (its partition and scheduling tiers), FiCCO (§V-C schedules for TP+SP pairs)."""
    return StrategyRegistry([LAGOM, AUTOCCL, LAGOM_WITH_KNOBS, CENTAURI, FICCO])


def strategy_start(strategy: Strategy, as_given: Workload, best: Workload) -> Workload:
    """The workload a strategy starts from: the knobs as given when its ``start`` attribute
    says ``"as-given"`` (Lagom, AutoCCL: the paper's baseline keeps the framework's knobs),
    else the best knobs."""
    return as_given if getattr(strategy, "start", "best-knobs") == "as-given" else best


@dataclass
class PlanResult:
    """What :func:`plan` returns: one :class:`StrategyResult` per row (``as-given`` first; the
    last row is ``applicable`` when it was computed: the recommended strategy, or the one
    asked for, re-simulated with only what can be applied), the simulations run, seconds,
    the best knobs' workload, ``emit_bundle``: the settings behind the ``applicable`` row
    (:class:`~ccoverlap.planning.emit.EmitBundle`), and ``applied_s``: for each row checked, the
    step time (s) with only what the target and stock NCCL can set of it.

    The recommendation (:meth:`best`) is the row whose *applicable* step is fastest: a strategy
    that cannot be set in full is judged by the step its settable part runs, since that is what
    a user gets (``plan`` checks rows fastest first until the fastest one is checked)."""

    workload: Workload
    strategies: list[StrategyResult]
    simulations: int
    seconds: float
    best_workload: Workload
    stats: dict[str, Any] = field(default_factory=dict)
    emit_bundle: EmitBundle | None = None
    applied_s: dict[str, float] = field(default_factory=dict)   # row -> step with what the target can set

    @property
    def as_given(self) -> StrategyResult:
        return self.strategies[0]

    @property
    def applicable(self) -> StrategyResult | None:
        """The ``applicable`` row, or None."""
        return next((s for s in self.strategies if s.name == APPLICABLE), None)

    def candidates(self) -> list[StrategyResult]:
        """The rows a recommendation is chosen from: those that fit in memory (all, if none
        does); the ``applicable`` row is derived from one of them and is not one itself."""
        rows = [s for s in self.strategies if s.name != APPLICABLE]
        return [s for s in rows if s.fits_memory] or rows

    def applied_step_s(self, row: StrategyResult) -> float:
        """The step time (s) a user gets from ``row``: with only what can be set of it when
        that was checked, else its own."""
        return self.applied_s.get(row.name, row.step_time_s)

    def best(self) -> StrategyResult:
        """The strategy to recommend: the candidate (:meth:`candidates`) whose applicable step
        (:meth:`applied_step_s`) is fastest."""
        return min(self.candidates(), key=self.applied_step_s)

    def rows(self) -> list[dict[str, Any]]:
        """Every row as :meth:`StrategyResult.to_dict`, with ``applicable_step_time_s`` (s) on the
        rows checked for what the target can set."""
        out = []
        for s in self.strategies:
            d = s.to_dict()
            if s.name in self.applied_s:
                d["applicable_step_time_s"] = self.applied_s[s.name]
            out.append(d)
        return out

    def best_row(self) -> StrategyResult:
        """The row a user applies for :meth:`best`: the ``applicable`` row when it was made for
        it and something could not be set, else the strategy's own row."""
        best, app = self.best(), self.applicable
        if app is not None and app.decision.get("of") == best.name and app.decision.get("not_applied"):
            return app
        return best

    def strategy(self, name: str) -> StrategyResult:
        """The row named ``name``; ConfigError naming the rows there are."""
        for s in self.strategies:
            if s.name == name and s.name != APPLICABLE:
                return s
        names = [s.name for s in self.strategies if s.name != APPLICABLE]
        raise ConfigError(f"no strategy {name!r} in this plan; its rows are {', '.join(names)}")

    def bundle(self, strategy: str | None = None, target: str = "pytorch") -> EmitBundle:
        """The :class:`~ccoverlap.planning.emit.EmitBundle` of ``strategy`` (default: the one the
        ``applicable`` row was made for, else the recommended one) for ``target``."""
        b = self.emit_bundle
        name = strategy or (b.strategy if b is not None else self.best().name)
        if b is not None and b.strategy == name and b.target == target:
            return b
        return build_emit(self.strategy(name), self.workload, Planner(self.workload), target=target)

    def emit(self, out_dir: str | os.PathLike[str], strategy: str | None = None, target: str = "pytorch") -> dict[str, str]:
        """Write ``strategy``'s settings (default: as :meth:`bundle`) for ``target`` into
        ``out_dir``: nccl.env, the tuner CSV, per-group options, framework settings, the TP
        plan, decision.json and README.md (docs/emit.md). Returns ``{file: path}``."""
        return write_emit(self.bundle(strategy, target), out_dir, as_given=self.as_given,
                          source=self.workload.source)

    def apply_hints(self, strategy: str | None = None, target: str = "pytorch") -> dict[str, Any]:
        """What :meth:`emit` writes, as Python data: ``nccl_env``, ``tuner_rows``,
        ``process_groups``, ``fully_shard``, ``fsdp2_prefetch``, ``ddp``, ``torchtitan``,
        ``megatron_args``, ``tp_plan``, ``not_applied``."""
        return hints(self.bundle(strategy, target))


def plan(w: Workload, *, progress: ProgressFn | None = None, extra: Iterable[str] | None = None,
         registry: StrategyRegistry | None = None, planner: Planner | None = None,
         exact: bool = False, applicable: bool = True, applicable_of: str | None = None,
         target: str = "pytorch") -> PlanResult:
    """Simulate the as-given configuration, no overlap, the best knobs, and the registered
    strategies (``extra``: their names, default all of ``registry``, default
    :func:`default_registry`), all through one :class:`Planner`; the first entry is always
    ``as-given``. Times in seconds.

    ``exact`` (used when no ``planner`` is given): judge every candidate (knob values,
    decider alternatives) on the full step and simulate every reported row in full. Default:
    judge them on a step with fewer micro-batches (:meth:`Planner.screened`) and report each
    strategy's chosen configuration on the full step — simulated in full for ``as-given`` and
    ``best-knobs`` (their timelines are kept), else extrapolated from two short steps where the
    pipeline schedule allows (:meth:`Planner.metrics`; docs/planner.md, "Steady state").
    When the planner may use several processes, the registered strategies run in forked worker
    processes, one :func:`~ccoverlap.predict.strategy.strategy_groups` group each (same results).

    ``applicable``: add the ``applicable`` row, strategy ``applicable_of`` (default: the
    recommended one) re-simulated with only what ``target`` (``pytorch``, ``torchtitan``,
    ``megatron-lm``) and stock NCCL can set (:mod:`ccoverlap.planning.emit`; one more
    simulation, none when everything applies)."""
    if applicable and (not isinstance(target, str) or target not in TARGETS):
        # a target the settings cannot be built for would leave the plan without its applicable
        # check: a strategy the user cannot set could be recommended
        raise ConfigError(f"target must be one of {', '.join(TARGETS)}, got {short(target)}")
    t0 = time.perf_counter()
    planner = planner or Planner(w, progress=progress, exact=exact)
    registry = registry if registry is not None else default_registry()
    chosen = registry.select(list(extra) if extra is not None else None)
    seconds: dict[str, float] = {}
    cpu_seconds: dict[str, float] = {}  # of the process that ran the part (its own candidates' workers not counted)
    t, c = time.perf_counter(), time.process_time()

    def lap(name: str) -> None:
        nonlocal t, c
        seconds[name], cpu_seconds[name] = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()

    as_given = AS_GIVEN.run(planner, w)
    no_overlap = NO_OVERLAP.run(planner, w)
    assert as_given is not None and no_overlap is not None  # their functions always return a result
    lap("as-given+no-overlap")
    best_w, best, _ = search_best_knobs(planner, w, progress=progress)
    lap("best-knobs")
    changed = {k: v for k, v in best_w.knobs.to_dict().items() if w.knobs.to_dict().get(k) != v}
    best.note = ("changed: " + ", ".join(f"{k}={v}" for k, v in changed.items())) if changed else "as given is best"
    strategies: list[StrategyResult] = [as_given, no_overlap, best]
    groups = strategy_groups(chosen)
    if planner.jobs > 1 and len(groups) > 1 and fork_available():
        # independent strategies in worker processes (each inherits the planner and its cache,
        # e.g. the best knobs' simulations), heaviest group first; their own candidates then
        # run in that process. Results, times and counters come back; predictions are the same.
        if progress:
            progress(0, len(chosen), "strategies " + ", ".join(s.name for s in chosen))
        done: dict[str, StrategyResult | None] = {}
        for part in planner.map(lambda i: _run_group(planner, groups[i], w, best_w), len(groups)):
            for name, res, wall, cpu, counts in part:
                done[name] = res
                seconds[name], cpu_seconds[name] = wall, cpu
                planner.add_counts(counts)
        strategies.extend(res for res in (done[s.name] for s in chosen) if res is not None)
    else:
        for i, strat in enumerate(chosen):
            if progress:
                progress(i, len(chosen), f"strategy {strat.name}")
            res = strat.run(planner, strategy_start(strat, w, best_w))
            lap(strat.name)
            if res is not None:
                strategies.append(res)
    bundle, applied, applicable_error = None, dict[str, float](), None
    if applicable:
        t, c = time.perf_counter(), time.process_time()  # the strategies may have run in worker processes
        bundle, applied, applicable_error = _applicable(planner, PlanResult(w, strategies, 0, 0.0, best_w),
                                                        applicable_of, target, progress)
        if bundle is not None:
            assert bundle.applicable is not None  # _applicable's bundles are built with the step simulated
            strategies.append(bundle.applicable)
        lap(APPLICABLE)
    sims = planner.simulations + planner.graph_simulations
    stats = {**planner.stats(), "seconds": seconds, "cpu_seconds": cpu_seconds,
             "screen_microbatches": planner.screened(w).batch.microbatches(w.parallel.dp) if planner.screening(w) else None,
             "extrapolated_from": planner.steady_state(w), "applicable_error": applicable_error}
    return PlanResult(workload=w, strategies=strategies, simulations=sims, seconds=time.perf_counter() - t0,
                      best_workload=best_w, stats=stats, emit_bundle=bundle, applied_s=applied)


def _applicable(planner: Planner, result: PlanResult, of: str | None, target: str,
                progress: ProgressFn | None) -> tuple[EmitBundle | None, dict[str, float], str | None]:
    """The settings of row ``of`` for ``target``, with the ``applicable`` row simulated
    (:func:`~ccoverlap.planning.emit.build_emit`), and ``{row: applicable step time}`` of the
    rows checked. Default ``of``: the recommended row - the candidates are checked fastest
    first (each at most one simulation) until the fastest applicable step is a checked row's,
    so a strategy that cannot be set in full is recommended only if what can be set of it
    still beats the others. When a row's settings cannot be built: (None, the rows checked,
    the reason), so the plan's other rows still stand."""
    bundles: dict[str, EmitBundle] = {}
    applied: dict[str, float] = {}
    while True:
        row = result.strategy(of) if of else min(result.candidates(),
                                                 key=lambda s: applied.get(s.name, s.step_time_s))
        if row.name in bundles:
            return bundles[row.name], applied, None
        if progress:
            progress(0, 1, f"applicable {row.name}")
        try:
            b = build_emit(row, result.workload, planner, target=target)
        except ConfigError as exc:
            return None, applied, str(exc)
        bundles[row.name] = b
        assert b.applicable is not None  # build_emit simulates it unless told not to
        applied[row.name] = b.applicable.step_time_s
        if of:
            return b, applied, None


def _run_group(planner: Planner, group: list[Strategy], as_given: Workload, best: Workload
               ) -> list[tuple[str, StrategyResult | None, float, float, dict[str, int]]]:
    """Run the strategies of ``group`` one after the other on ``planner`` (in a worker process),
    each from :func:`strategy_start`: ``(name, result without its timeline, wall s, CPU s,
    counter increments)`` each."""
    out = []
    for strat in group:
        before = planner.stats()
        t, c = time.perf_counter(), time.process_time()
        res = strat.run(planner, strategy_start(strat, as_given, best))
        if res is not None:
            res.timeline = None
        after = planner.stats()
        out.append((strat.name, res, time.perf_counter() - t, time.process_time() - c,
                    {k: after[k] - before[k] for k in after}))
    return out


def recommendation(result: PlanResult) -> str:
    """The recommendation in one short line: what to use and the step it predicts."""
    given, best, row = result.as_given, result.best(), result.best_row()
    gain = given.step_time_s / row.step_time_s if row.step_time_s > 0 else 1.0
    if best.name != "as-given" and gain > 1.005:
        return (f"use {best.name}: {gain:.2f}x faster ({given.step_time_s * 1e3:.1f} -> "
                f"{row.step_time_s * 1e3:.1f} ms per step)")
    if not given.fits_memory:
        return (f"change parallelism, recomputation or micro-batch: as given needs "
                f"{given.peak_memory_bytes / 2**30:.1f} GiB per GPU, more than there is")
    return "keep the configuration as given: no strategy gains 0.5% or more"


def recommendation_details(result: PlanResult) -> list[str]:
    """What stands behind :func:`recommendation`, one sentence each: what can be applied of
    the recommended strategy, memory, the compute-to-communication ratio R."""
    given, best, row = result.as_given, result.best(), result.best_row()
    r = given.compute_comm_ratio
    lines = []
    gain = given.step_time_s / row.step_time_s if row.step_time_s > 0 else 1.0
    if best.name != "as-given" and gain > 1.005:
        if row is not best:
            lines.append(f"'{best.name}' cannot be set in full with {row.decision.get('target', 'the framework')} "
                         f"and stock NCCL ({len(row.decision['not_applied'])} change(s) not applied): the "
                         f"'applicable' row is what runs ({row.step_time_s * 1e3:.1f} ms; its ideal "
                         f"{best.step_time_s * 1e3:.1f} ms); --emit DIR writes the settings and lists the rest")
        else:
            lines.append(f"'{best.name}' predicts MFU {given.mfu:.1%} -> {best.mfu:.1%}; --emit DIR writes its "
                         f"settings")
    target = row.decision.get("target") if row.decision else None
    for s in result.candidates():
        app = result.applied_s.get(s.name)
        if s is not best and app is not None and s.step_time_s < row.step_time_s:
            lines.append(f"'{s.name}' is faster in full ({s.step_time_s * 1e3:.1f} ms), but what "
                         f"{target or 'the framework'} and stock NCCL can set of it runs {app * 1e3:.1f} ms")
    if best.name != "as-given" and gain <= 1.005:
        lines.append(f"the fastest strategy, '{best.name}', gains under 0.5% ({row.step_time_s * 1e3:.1f} ms)")
    if not given.fits_memory and best.name != "as-given" and gain > 1.005:
        lines.append(f"the configuration as given does not fit in GPU memory "
                     f"({given.peak_memory_bytes / 2**30:.1f} GiB needed)")
    if r < 1:
        lines.append(f"communication-bound (R = {r:.2f} < 1): even perfect overlap leaves "
                     f"{(given.comm_s - given.compute_s) * 1e3:.1f} ms of communication exposed per step; "
                     f"reduce communication volume (larger micro-batch, less sharding across nodes, "
                     f"hierarchical/HSDP groups) before tuning overlap")
    elif given.exposed_comm_s > 0.05 * given.step_time_s:
        lines.append(f"{given.exposed_comm_s * 1e3:.1f} ms of communication per step is exposed while "
                     f"compute could hide it (R = {r:.2f}): overlap is the lever here")
    return lines
