"""A strategy's decision as the emitters read it: what it changes against the workload as given.

A :class:`~ccoverlap.predict.evaluate.StrategyResult` carries the framework knobs it ran with
(``knobs``) and, from the deciders, what they chose beyond the knobs (``decision``: an NCCL
:class:`~ccoverlap.nccl.plan.CommPlan`, changed layout fields, step rewrites, TP
overlap schedules per collective + GEMM pair). :class:`Decision` puts that next to the
workload as given, so every emitter asks the same question: what does this strategy change?
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from ccoverlap.errors import ConfigError
from ccoverlap.nccl.plan import CommKey, CommPlan
from ccoverlap.parallel.config import OverlapKnobs
from ccoverlap.specs import CommConfig

if TYPE_CHECKING:
    from ccoverlap.predict.evaluate import StrategyResult
    from ccoverlap.predict.workload import Workload

#: knobs that are NCCL configurations (emitted through NCCL's settings, not a framework's)
COMM_KNOBS = ("comm_config", "comm_config_overrides")


@dataclass(frozen=True)
class Decision:
    """What strategy ``strategy`` runs with, against ``given`` (the workload as given):
    ``knobs`` (its framework knobs), ``comm_plan`` (NCCL configurations per communication),
    ``parallel`` (layout fields it changed), ``rewrites`` (step rewrites no knob expresses)
    and ``tp_schedules`` (a TP overlap schedule per collective + GEMM pair, by the step
    builders' pair names: ``qkv``, ``proj``, ``mlp_fc1``, ``mlp_fc2``, ``lm_head``)."""

    strategy: str
    given: Workload
    knobs: OverlapKnobs
    comm_plan: CommPlan = field(default_factory=CommPlan)
    parallel: dict[str, Any] = field(default_factory=dict)
    rewrites: tuple[str, ...] = ()
    tp_schedules: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, result: StrategyResult | Mapping[str, Any], given: Workload) -> Decision:
        """The decision of ``result`` (a StrategyResult, or its ``to_dict()``) made for the workload ``given``."""
        d = result.to_dict() if hasattr(result, "to_dict") else dict(result)
        name = d.get("name", "?")
        knobs = d.get("knobs")
        if not isinstance(knobs, dict):
            raise ConfigError(f"strategy {name!r}: no knobs to emit")
        dec = d.get("decision") or {}
        plan = CommPlan.from_dict(dec["comm_plan"], f"{name}.decision.comm_plan") if dec.get("comm_plan") \
            else CommPlan()
        return cls(name, given, OverlapKnobs.from_dict(knobs, f"{name}.knobs"), plan,
                   dict(dec.get("parallel") or {}), tuple(dec.get("rewrites") or ()), dict(dec.get("tp_schedules") or {}))

    def knob_changes(self) -> dict[str, tuple[Any, Any]]:
        """``{knob: (as given, this strategy's)}`` for the framework knobs that differ (NCCL
        configurations excluded: :meth:`wanted_config`)."""
        g = self.given.knobs
        return {f.name: (getattr(g, f.name), getattr(self.knobs, f.name)) for f in fields(OverlapKnobs)
                if f.name not in COMM_KNOBS and getattr(g, f.name) != getattr(self.knobs, f.name)}

    def parallel_changes(self) -> dict[str, tuple[Any, Any]]:
        """``{field: (as given, this strategy's)}`` of the layout."""
        was = self.given.parallel.to_dict()
        return {k: (was.get(k), v) for k, v in self.parallel.items() if was.get(k) != v}

    def workload(self, knobs: OverlapKnobs | None = None, parallel: dict[str, Any] | None = None) -> Workload:
        """The workload as given with ``knobs`` (default: this strategy's) and the layout
        fields ``parallel`` (default: this strategy's) changed."""
        w = self.given
        par = self.parallel if parallel is None else parallel
        p = replace(w.parallel, **par) if par else w.parallel
        return replace(w, knobs=self.knobs if knobs is None else knobs, parallel=p)

    def wanted_config(self, key: CommKey) -> CommConfig:
        """The configuration this strategy gives a communication (unresolved): its plan's row
        for it, else its knobs' configuration for the group."""
        for r in self.comm_plan.rules:
            if r.group == key.group and r.collective == key.collective and r.min_bytes <= key.nbytes < r.max_bytes:
                return r.config
        return self.knobs.config_for(key.group)

    def given_config(self, key: CommKey) -> CommConfig:
        """The configuration the workload as given runs a communication with (unresolved)."""
        return self.given.knobs.config_for(key.group)
