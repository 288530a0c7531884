"""Lagom and AutoCCL on a whole training step: one NCCL configuration per communication.

A step holds many collectives; a tuner tells them apart as NCCL's tuner interface does, by
process group, collective type and message size (a :class:`~ccoverlap.nccl.plan.CommKey`). Both
methods decide a :class:`~ccoverlap.nccl.plan.CommPlan` (one row per key) from the step's overlap
groups (lagom §3.1: the computations of one (phase, layer, micro-batch) window and the
collectives beside them, :func:`~ccoverlap.nccl.groups.overlap_groups_from_step`):

* every main overlap group is tuned collective by collective (``lagom``: Algorithms 1-2 on
  the group's makespan, lagom §3.3-3.4; ``autoccl``: each collective for its own time,
  lagom §2.2 / eq. 2);
* a communication that no computation hides (exposed: on the compute stream, or beside no
  window) is tuned as a communication-only group, where the makespan is its own time
  (eq. 2), so Lagom's Algorithm 2 grows its resources until it stops getting faster: the
  configuration a communication-bound collective needs;
* the same key can occur in several groups (an FSDP all-gather beside forward and beside
  backward computations; a TP all-reduce exposed in forward, hidden in backward), each with
  its own best configuration. ``autoccl`` keeps, per key, the configuration chosen where the
  key spends the most communication time, and applies the plan as AutoCCL would live.
  ``lagom`` keeps the configuration set that makes the step fastest: keys in order of their
  communication time, each key's candidates (the configurations its groups chose) tried in
  the simulated step with the other keys' current choices, the fastest kept (Lagom's "keep
  the best profiled configuration", with the step as the profile). It never returns a plan
  slower than the step as given.

Candidates are judged on the planner's screened step (fewer micro-batches unless the
planner is exact); the plan chosen is simulated on the full step. Times in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, cast

from ccoverlap.config import short
from ccoverlap.deciders.lagom.profiler import SimulatedProfiler
from ccoverlap.deciders.lagom.space import TuneResult, autoccl_tune
from ccoverlap.errors import ConfigError
from ccoverlap.nccl.groups import COMM_STREAM, OverlapCollective, OverlapGroup, overlap_groups_from_step
from ccoverlap.nccl.plan import CommKey, CommPlan, comm_keys
from ccoverlap.nccl.profile import Profiler
from ccoverlap.predict.strategy import FunctionStrategy, Planner, planner_workload, workload_key
from ccoverlap.specs import CollectiveSpec, CommConfig

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.parallel.step import StepGraph
    from ccoverlap.predict.evaluate import StrategyResult
    from ccoverlap.predict.workload import Workload
    from ccoverlap.sim.graph import OpGraph
    from ccoverlap.specs import Collective

__all__ = ["StepTuning", "tune_step", "LAGOM", "AUTOCCL", "LAGOM_WITH_KNOBS"]

#: overlap groups of a step that are tuned (the heaviest by window time)
TOP_GROUPS = 4
#: keys tuned at most, the heaviest by stand-alone communication time
MAX_KEYS = 10
#: keys carrying less than this share of the step's communication time are left as given
MIN_KEY_SHARE = 0.01
#: passes of the step-level choice over the keys
MAX_PASSES = 3


@dataclass
class StepTuning:
    """What :func:`tune_step` decided: the plan, per key the candidates it had and the one it
    kept, the groups tuned, profiles (group simulations) and step simulations used, and the
    full step's result (a :class:`~ccoverlap.predict.evaluate.StrategyResult`)."""

    method: str
    plan: CommPlan
    result: StrategyResult
    groups: list[OverlapGroup]
    candidates: dict[CommKey, list[CommConfig]] = field(default_factory=dict)
    profiles: int = 0
    step_simulations: int = 0
    kept_as_given: bool = False
    how: str = ""


def _tuner(method: str) -> Callable[[OverlapGroup, Profiler], TuneResult]:
    from ccoverlap.deciders.lagom.tune import lagom_tune

    if method not in ("lagom", "autoccl"):
        raise ConfigError(f"unknown tuning method {short(method)}; expected 'lagom' or 'autoccl'")
    return lagom_tune if method == "lagom" else autoccl_tune


def step_groups(planner: Planner, w: Workload, top: int = TOP_GROUPS
                ) -> tuple[list[OverlapGroup], dict[CommKey, float]]:
    """The main overlap groups of ``w``'s simulated step and every communication key of the
    step with its total stand-alone time (seconds), both shared through ``planner.memo``."""
    def make() -> tuple[list[OverlapGroup], dict[CommKey, float]]:
        step, tl = planner.simulate(w)
        groups = overlap_groups_from_step(step.graph, tl, w.cluster, top=top, label=w.model.name)
        return groups, comm_keys(step.graph, planner.cost)

    return planner.memo(("lagom-step-groups", workload_key(w), top), make)


def alone_group(key: CommKey, cluster: ClusterSpec) -> OverlapGroup:
    """A communication-only group of one collective of ``key`` (eq. 2: Z = its own time)."""
    from ccoverlap.specs import GroupSpec

    # a key's collective is a CollectiveSpec's (CommKey.of), checked again by CollectiveSpec
    spec = CollectiveSpec(collective=cast("Collective", key.collective), bytes=key.nbytes,
                          group=GroupSpec(name=key.group, size=key.group_size, local_size=key.local_size))
    return OverlapGroup(name=f"exposed {key.describe()}", computations=(),
                        collectives=(OverlapCollective(name=key.collective, spec=spec, stream=COMM_STREAM),),
                        cluster=cluster, source="exposed collective")


def _tuned_keys(groups: list[OverlapGroup], keys: dict[CommKey, float]) -> list[CommKey]:
    """Keys worth tuning, heaviest first: those carrying at least :data:`MIN_KEY_SHARE` of the
    step's communication time (in an overlap group or exposed), :data:`MAX_KEYS` at most."""
    total = sum(keys.values()) or 1.0
    ranked = sorted(keys, key=lambda k: -keys[k])
    return [k for k in ranked if keys[k] >= MIN_KEY_SHARE * total][:MAX_KEYS]


def group_candidates(planner: Planner, groups: list[OverlapGroup], keys: list[CommKey], method: str
                     ) -> tuple[dict[CommKey, list[tuple[CommConfig, float]]], int, list[OverlapGroup]]:
    """Per key, the configurations ``method`` chose for it in each group it occurs in, each
    with the communication time it spent there (seconds x occurrences); the profile count;
    and the groups tuned (the overlap groups, then communication-only groups: for Lagom one
    per key, for AutoCCL one per key that is in no overlap group)."""
    tuner = _tuner(method)
    wanted = set(keys)
    in_groups = {CommKey.of(c.spec) for g in groups for c in g.collectives}
    cluster = groups[0].cluster if groups else planner.workload.cluster
    # Lagom also tunes every key as a communication-only group: the configuration it needs
    # where nothing hides it (eq. 2); AutoCCL tunes keys where they occur, alone if nowhere
    alone = [alone_group(k, cluster) for k in keys if method == "lagom" or k not in in_groups]
    out: dict[CommKey, list[tuple[CommConfig, float]]] = {}
    profiles = 0
    for g in [*groups, *alone]:
        gk = (g.name, g.weight, len(g.computations), tuple(CommKey.of(c.spec) for c in g.collectives))
        prof = planner.memo(("simulated-profiler", gk), partial(SimulatedProfiler, g, planner.cost))
        r = planner.memo((method + "-group", gk), partial(tuner, g, prof))
        profiles += r.profiles
        for coll, cfg, x in zip(g.collectives, r.configs, r.result.comm_times_s):
            k = CommKey.of(coll.spec)
            if k in wanted:
                out.setdefault(k, []).append((cfg, x * g.weight))
    return out, profiles, [*groups, *alone]


def _rewrite(plan: CommPlan) -> Callable[[StepGraph], OpGraph]:
    return lambda st: plan.apply(st.graph)


def _step_time(planner: Planner, w: Workload, plan: CommPlan) -> float:
    if not plan.rules:
        return planner.metrics(w).step_time_s
    return planner.rewritten_metrics(w, _rewrite(plan), key=("comm-plan", plan)).step_time_s


def _greedy(planner: Planner, w: Workload, order: list[CommKey], cands: dict[CommKey, list[CommConfig]],
            universe: list[CommKey], passes: int = MAX_PASSES) -> tuple[dict[CommKey, CommConfig], int]:
    """Lagom's step-level choice: keys in ``order``, each key's candidates tried with the
    others' current choices and the fastest step kept (none kept when none is faster);
    repeated while a pass changes something (a key's best configuration can depend on
    another's, e.g. an all-gather's on the reduce-scatter beside it), ``passes`` at most."""
    chosen: dict[CommKey, CommConfig] = {}
    best = _step_time(planner, w, CommPlan())
    sims = 0
    tried: set[CommPlan] = set()
    for _ in range(passes):
        changed = False
        for k in order:
            options = [c for c in cands.get(k, []) if chosen.get(k) != c]
            plans = [CommPlan.from_configs({**chosen, k: c}, universe=universe) for c in options]
            fresh = [i for i, p in enumerate(plans) if p not in tried]
            tried.update(plans)
            times = planner.map(lambda i: _step_time(planner, w, plans[fresh[i]]), len(fresh))
            sims += len(fresh)
            for i, t in zip(fresh, times):
                if t < best * (1 - 1e-9):
                    best, chosen[k], changed = t, options[i], True
        if not changed:
            break
    return chosen, sims


def tune_step(planner: Planner, w: Workload | None, method: str) -> StepTuning | None:
    """Decide a :class:`CommPlan` for workload ``w`` with ``method`` (``"lagom"`` or
    ``"autoccl"``; see the module docstring) and simulate it on the full step. None when
    the step has no communication to tune."""
    w = planner_workload("tune_step", planner, w)
    _tuner(method)  # an unknown method before any simulation
    w_full, w = w, planner.screened(w)
    groups, keys = step_groups(planner, w)
    order = _tuned_keys(groups, keys)
    if not order:
        return None
    found, profiles, tuned = group_candidates(planner, groups, order, method)
    cands = {k: _unique([c for c, _ in found.get(k, [])]) for k in order}
    universe = list(keys)
    sims = 0
    if method == "autoccl":
        chosen = {k: max(found[k], key=lambda t: t[1])[0] for k in order if found.get(k)}
    else:
        chosen, sims = _greedy(planner, w, order, cands, universe)
    plan = CommPlan.from_configs(chosen, universe=universe, sources={k: method for k in chosen})
    metrics = planner.rewritten_metrics(w_full, _rewrite(plan), key=("comm-plan", plan)) if plan.rules \
        else planner.metrics(w_full)
    kept = False
    if method == "lagom" and plan.rules and metrics.step_time_s >= planner.metrics(w_full).step_time_s:
        plan, metrics, kept = CommPlan(), planner.metrics(w_full), True  # never slower than as given
    res = planner.summarize_metrics(method, w_full, metrics)
    if plan.rules:
        res.decision = {"comm_plan": plan.to_dict()}  # what ccoverlap.planning.emit writes out
    how = ""
    if w is not w_full:
        how = (f"chosen on {w.batch.microbatches(w.parallel.dp)} micro-batches, the full step "
               f"{planner.full_step_how(w_full)}")
    return StepTuning(method, plan, res, tuned, cands, profiles, sims + 1, kept, how)


def _unique(configs: list[CommConfig]) -> list[CommConfig]:
    out: list[CommConfig] = []
    for c in configs:
        if c not in out:
            out.append(c)
    return out


# ----------------------------------------------------------------------------- planner strategies

def _note(t: StepTuning, start: str) -> str:
    what = "NCCL tuning alone (knobs as given)" if start == "as-given" else "both levers (best-knobs' knobs)"
    head = f"{what}, {t.profiles} profiles, {t.step_simulations} step simulations" + (f", {t.how}" if t.how else "")
    if t.kept_as_given or not t.plan.rules:
        return head + "; NCCL's defaults kept: no tuned configuration made the step faster"
    return f"{head}; {len(t.plan.rules)} plan rows: " + t.plan.describe(limit=2)


def _tuned_as_given(planner: Planner, method: str) -> StrategyResult | None:
    """:func:`tune_step` by ``method`` from the workload's own framework knobs, noted
    against ``as-given``; None when the step has nothing to tune."""
    t = tune_step(planner, planner.workload, method)
    if t is None:
        return None
    t.result.note = _note(t, "as-given")
    return t.result


def lagom_strategy(planner: Planner, start: Workload) -> StrategyResult | None:
    """The ``lagom`` planner strategy: Lagom per communication (:func:`tune_step`) from the
    workload's own framework knobs (``planner.workload``), so its row against ``as-given``
    is what co-tuning NCCL alone buys."""
    return _tuned_as_given(planner, "lagom")


def autoccl_strategy(planner: Planner, start: Workload) -> StrategyResult | None:
    """The ``autoccl`` planner baseline: each communication tuned for its own speed
    (lagom §2.2, eq. 2) from the workload's own framework knobs, as AutoCCL would apply it."""
    return _tuned_as_given(planner, "autoccl")


def lagom_with_knobs_strategy(planner: Planner, start: Workload) -> StrategyResult | None:
    """``knobs+lagom``: Lagom from the best framework knobs (``start``), the combination
    of both levers; None when the best knobs are the knobs as given (the ``lagom`` row)."""
    if start.knobs == planner.workload.knobs:
        return None
    t = tune_step(planner, start, "lagom")
    if t is None:
        return None
    t.result.name = "knobs+lagom"
    t.result.note = _note(t, "best-knobs")
    return t.result


# Strategies registered by ccoverlap.planning.strategies.default_registry. ``lagom`` and
# ``autoccl`` start from the knobs as given (``start="as-given"``, read by plan), the
# combination from the best knobs. All share the overlap groups and their profiles
# (Planner.memo), so they run in one process ("group"); ``weight`` is a scheduling hint.
@dataclass(frozen=True)
class _Strategy(FunctionStrategy):
    start: str = "best-knobs"


LAGOM = _Strategy("lagom", lagom_strategy,
                  "Lagom (lagom §3.4, Algorithms 1-2): NCCL configurations per communication co-tuned for the "
                  "makespan, from the knobs as given", group="nccl-tuning", weight=2.2, start="as-given")
AUTOCCL = _Strategy("autoccl", autoccl_strategy,
                    "AutoCCL-style baseline (lagom §2.2, eq. 2): each communication tuned for its own speed, "
                    "from the knobs as given", group="nccl-tuning", weight=0.5, start="as-given")
LAGOM_WITH_KNOBS = _Strategy("knobs+lagom", lagom_with_knobs_strategy,
                             "Lagom from the best framework knobs: both levers together",
                             group="nccl-tuning", weight=2.2)
