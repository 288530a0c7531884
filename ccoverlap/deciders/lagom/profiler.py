"""The profile interface Lagom searches with: ``ProfileTime(s)`` of lagom Algorithm 2, line 6.

``profile(configs)`` runs an overlap group once with ``configs[j]`` for collective ``j`` and
returns the per-collective communication times ``x_j^{s_j}``, the computation time
``Y = sum_i y_i`` and the makespan ``Z`` (lagom eq. 1), all measured *during* the overlap,
so contention (eqs. 4-6) is in every number. Here :class:`SimulatedProfiler`: the group as an
:class:`~ccoverlap.sim.graph.OpGraph` played by the stream simulator under a cost model
(processor-sharing contention); deterministic. The live one, on GPUs, is
:class:`ccoverlap.runtime.profiler.LiveNCCLProfiler`.

No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ccoverlap.deciders.lagom.group import Computation, ComputeSpec, OverlapGroup, equivalent_spec, require_group
from ccoverlap.errors import ConfigError
from ccoverlap.sim.simulator import SupportsDuration, simulate
from ccoverlap.specs import CommConfig

__all__ = ["ProfileResult", "Profiler", "SimulatedProfiler", "computation_spec"]


@dataclass(frozen=True)
class ProfileResult:
    """One profiled run of an overlap group (seconds).

    ``comm_times_s[j]`` = ``x_j^{s_j}``, collective j's time while overlapped; ``compute_time_s``
    = ``Y`` = sum of the computations' times while overlapped; ``makespan_s`` = ``Z``, first
    start to last end (lagom eq. 1: ``Z = max(X, Y)`` when both streams start together and
    never wait on each other).
    """

    comm_times_s: tuple[float, ...]
    compute_time_s: float
    makespan_s: float
    comm_span_s: float | None = None

    @property
    def comm_time_s(self) -> float:
        """``X = sum_j x_j`` (lagom eq. 1), seconds."""
        return float(sum(self.comm_times_s))

    @property
    def comm_busy_s(self) -> float:
        """How long communication runs, first start to last end (seconds): ``X`` when the
        collectives share one stream (lagom §3.1), less when a framework issues them on
        several streams that run at the same time (FSDP's all-gather and reduce-scatter
        streams). What ``X < Y`` compares in Lagom's stopping conditions (§3.4)."""
        return self.comm_time_s if self.comm_span_s is None else float(self.comm_span_s)


class Profiler(Protocol):
    """Anything that can run the group under a list of configurations and time it."""

    group: OverlapGroup

    def profile(self, configs: Sequence[CommConfig]) -> ProfileResult:
        """Run the group with ``configs[j]`` for collective j; see :class:`ProfileResult`."""
        ...


class SimulatedProfiler:
    """``profile`` by simulation: the group's OpGraph under ``cost`` (lagom eqs. 1, 4-6 as
    the cost model implements them). ``calls`` counts profiles run (cache hits included: a
    live profiler would re-run them too), ``simulations`` the simulations actually done.

    Duration-only computations are modelled by :func:`equivalent_spec`, computed once.
    """

    def __init__(self, group: OverlapGroup, cost: SupportsDuration) -> None:
        require_group(group, "SimulatedProfiler")
        if not callable(getattr(cost, "duration_s", None)):
            raise ConfigError(f"SimulatedProfiler: cost must have a duration_s(spec, concurrent) method (a "
                              f"CostModel), got {type(cost).__name__}")
        self.group = group
        self.cost = cost
        self.calls = 0
        self.simulations = 0
        self._cache: dict[tuple, ProfileResult] = {}
        self._specs = [computation_spec(c, cost) for c in group.computations]

    def profile(self, configs: Sequence[CommConfig]) -> ProfileResult:
        """Simulate the group with ``configs``; returns x_j, Y and Z in seconds (lagom eq. 1)."""

        self.calls += 1
        key = tuple(configs)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        g = self.group.graph(configs, computation_specs=self._specs)
        tl = simulate(g, self.cost)
        self.simulations += 1
        dur = tl.end_s - tl.start_s
        n_comp = len(self.group.computations)
        comm = tuple(float(d) for d in dur[n_comp:])
        y = float(dur[:n_comp].sum())
        z = float(tl.end_s.max() - tl.start_s.min())
        span = float(tl.end_s[n_comp:].max() - tl.start_s[n_comp:].min())
        res = ProfileResult(comm_times_s=comm, compute_time_s=y, makespan_s=z, comm_span_s=span)
        self._cache[key] = res
        return res


def computation_spec(c: Computation, cost: SupportsDuration) -> ComputeSpec:
    """``c``'s kernel spec, or for a duration-only computation the spec of that isolated
    duration under ``cost`` (:func:`equivalent_spec`)."""
    if c.spec is not None:
        return c.spec
    assert c.duration_s is not None  # a Computation holds exactly one of spec and duration
    return equivalent_spec(c.duration_s, cost, bound=c.bound)
