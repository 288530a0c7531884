"""The profile interface of an overlap group: what running it under candidate NCCL
configurations returns (``ProfileTime(s)`` of lagom Algorithm 2, line 6).

``profile(configs)`` runs an overlap group (:mod:`ccoverlap.nccl.groups`) once with
``configs[j]`` for collective ``j`` and returns the per-collective communication times
``x_j^{s_j}``, the computation time ``Y = sum_i y_i`` and the makespan ``Z`` (lagom eq. 1), all
measured *during* the overlap, so contention (eqs. 4-6) is in every number. Two profilers
implement it: Lagom's simulated one (:class:`ccoverlap.deciders.lagom.profiler.SimulatedProfiler`)
and the live one on GPUs (:class:`ccoverlap.runtime.profiler.LiveNCCLProfiler`).

No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ccoverlap.nccl.groups import Computation, ComputeSpec, OverlapGroup, equivalent_spec
from ccoverlap.sim.simulator import SupportsDuration
from ccoverlap.specs import CommConfig

__all__ = ["ProfileResult", "Profiler", "computation_spec"]


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


def computation_spec(c: Computation, cost: SupportsDuration) -> ComputeSpec:
    """``c``'s kernel spec, or for a duration-only computation the spec of that isolated
    duration under ``cost`` (:func:`equivalent_spec`)."""
    if c.spec is not None:
        return c.spec
    assert c.duration_s is not None  # a Computation holds exactly one of spec and duration
    return equivalent_spec(c.duration_s, cost, bound=c.bound)
