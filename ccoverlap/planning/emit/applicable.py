"""From a strategy's ideal decision to what can be applied, and the step that then runs.

:func:`build_emit` takes one strategy's result and:

1. finds how a target framework sets each change the strategy makes
   (:func:`~ccoverlap.planning.emit.frameworks.framework_settings`); changes it cannot make go
   back to their values as given;
2. builds that step and, for each of its communications, the NCCL configuration the strategy
   wants and the one it would run as given (every knob resolved by the cost model);
3. turns them into stock NCCL's settings (environment, the example tuner plugin's CSV,
   per-group min / max CTAs: :func:`~ccoverlap.nccl.apply.stock_nccl_settings`) and
   what each communication then runs with;
4. simulates that step with those configurations: the **applicable** row. When nothing was
   dropped it is the strategy's own result (no extra simulation).

Times in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from ccoverlap.nccl.apply import NcclSettings, Resolver, stock_nccl_settings
from ccoverlap.nccl.plan import CommKey, CommPlan, comm_keys
from ccoverlap.predict.evaluate import StrategyResult
from ccoverlap.predict.strategy import Planner
from ccoverlap.specs import Collective, CollectiveSpec, CommConfig, GroupSpec

from .decision import Decision
from .frameworks import FrameworkSettings, applied_knobs, framework_settings

if TYPE_CHECKING:
    from ccoverlap.cost.model import CostModel
    from ccoverlap.predict.workload import Workload

__all__ = ["EmitBundle", "build_emit", "build_comm_emit", "APPLICABLE"]

#: the plan row of a strategy re-simulated with only what can be applied
APPLICABLE = "applicable"


@dataclass
class EmitBundle:
    """Everything the emitted files say, computed once: the decision, how ``target`` and the
    other frameworks set it, stock NCCL's settings, the configuration each communication of
    the applicable step wants / runs as given / runs with the settings (``wanted``, ``given``,
    ``nccl.applied``), the ideal result and the applicable one (None when not simulated)."""

    strategy: str
    description: str  # what the settings are for (the workload, or the overlap groups tuned)
    target: str
    nccl: NcclSettings
    weights: dict[CommKey, float]
    wanted: dict[CommKey, CommConfig]
    given: dict[CommKey, CommConfig]
    plan: CommPlan  # the configurations stock NCCL runs, as a plan over every communication
    decision: Decision | None = None  # None: NCCL configurations only (``tune``)
    framework: FrameworkSettings | None = None
    workload: Workload | None = None  # the applicable step's workload
    ideal: StrategyResult | None = None
    applicable: StrategyResult | None = None

    @property
    def everything_applies(self) -> bool:
        """Whether the target and stock NCCL can set every change the strategy makes."""
        return not (self.framework.dropped() if self.framework else []) and not self.nccl.dropped

    def dropped_lines(self) -> list[str]:
        """One line per change the target or stock NCCL cannot make, with why."""
        fw = self.framework.dropped() if self.framework else []
        lines = [f"{c.what}: {c.wanted} -> {o.applied} ({o.why})" for c, o in fw]
        return lines + [d.describe() for d in self.nccl.dropped]

    def note(self) -> str:
        """The applicable row's note."""
        head = f"{self.strategy} with what {self.target} and stock NCCL can set"
        if self.everything_applies:
            return head + ": everything applies"
        lines = self.dropped_lines()
        more = f"; ... {len(lines) - 2} more (--emit DIR lists them)" if len(lines) > 2 else ""
        return f"{head}; {len(lines)} not applied: " + "; ".join(lines[:2]) + more


def _resolver(cost: CostModel) -> Resolver:
    """``resolve(key, config)``: ``config`` with every knob the cost model resolves for the communication ``key``."""
    def resolve(key: CommKey, config: CommConfig) -> CommConfig:
        # a CommKey's collective is a CollectiveSpec's (CommKey.of): one of the Collective names
        spec = CollectiveSpec(collective=cast(Collective, key.collective), bytes=key.nbytes,
                              group=GroupSpec(name=key.group, size=key.group_size, local_size=key.local_size),
                              config=config)
        return cost.comm_config(spec)
    return resolve


def build_emit(result: StrategyResult | Mapping[str, Any], given: Workload, planner: Planner | None = None, *, target: str = "pytorch",
               simulate: bool = True) -> EmitBundle:
    """The :class:`EmitBundle` of ``result`` (a StrategyResult of a plan of the workload
    ``given``) for ``target``. ``planner``: the plan's (its caches are reused), default a new
    one for ``given``. ``simulate``: also simulate the applicable step (the ``applicable`` row)."""
    planner = planner if planner is not None else Planner(given)
    d = Decision.of(result, given)
    fs = framework_settings(d, target)
    knobs, parallel = applied_knobs(d, fs)
    w = d.workload(knobs=knobs, parallel=parallel)
    weights = comm_keys(planner.step(w).graph, planner.cost)
    resolve = _resolver(planner.cost)
    wanted = {k: resolve(k, d.wanted_config(k)) for k in weights}
    given_cfg = {k: resolve(k, d.given_config(k)) for k in weights}
    nccl = stock_nccl_settings(wanted, given_cfg, weights, resolve)
    plan = CommPlan.from_configs(nccl.applied, universe=list(weights), sources={k: "stock NCCL" for k in weights})
    ideal = result if isinstance(result, StrategyResult) else None
    b = EmitBundle(d.strategy, given.describe(), target, nccl, weights, wanted, given_cfg, plan, d, fs, w, ideal)
    if simulate:
        b.applicable = _applicable_result(planner, b)
    return b


def build_comm_emit(strategy: str, description: str, cost: CostModel, weights: dict[CommKey, float],
                    wanted: dict[CommKey, CommConfig], given: dict[CommKey, CommConfig]) -> EmitBundle:
    """An :class:`EmitBundle` of NCCL configurations alone (no framework knobs, nothing
    simulated): ``wanted`` / ``given`` per communication (unresolved; resolved here with
    ``cost``), ``weights`` its seconds (``ccoverlap tune --emit``)."""
    resolve = _resolver(cost)
    want = {k: resolve(k, wanted.get(k, given[k])) for k in weights}
    giv = {k: resolve(k, given[k]) for k in weights}
    nccl = stock_nccl_settings(want, giv, weights, resolve)
    plan = CommPlan.from_configs(nccl.applied, universe=list(weights), sources={k: "stock NCCL" for k in weights})
    return EmitBundle(strategy, description, "pytorch", nccl, dict(weights), want, giv, plan)


def _applicable_result(planner: Planner, b: EmitBundle) -> StrategyResult:
    """The ``applicable`` row: the ideal result when everything applies, else the applicable
    step simulated (extrapolated from two short steps where the planner does so)."""
    extra = {"of": b.strategy, "target": b.target, "not_applied": b.dropped_lines()}
    if b.everything_applies and b.ideal is not None:
        return replace(b.ideal, name=APPLICABLE, note=b.note(), timeline=None, decision=extra)
    w = b.workload
    assert w is not None  # build_emit's bundles, the only ones simulated, carry their step's workload
    if b.plan.rules:
        plan = b.plan
        metrics = planner.rewritten_metrics(w, lambda st: plan.apply(st.graph), key=("applicable", plan))
    else:
        metrics = planner.metrics(w)
    res = planner.summarize_metrics(APPLICABLE, w, metrics, note=b.note())
    res.decision = extra
    return res
