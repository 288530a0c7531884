"""``ProfileTime(s)`` of lagom Algorithm 2, line 6, on the simulator.

:class:`SimulatedProfiler` implements the profile interface of :mod:`ccoverlap.nccl.profile`:
the overlap group as an :class:`~ccoverlap.sim.graph.OpGraph` played by the stream simulator
under a cost model (processor-sharing contention); deterministic. The live one, on GPUs, is
:class:`ccoverlap.runtime.profiler.LiveNCCLProfiler`.

No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from ccoverlap.errors import ConfigError
from ccoverlap.nccl.groups import OverlapGroup, require_group
from ccoverlap.nccl.profile import ProfileResult, computation_spec
from ccoverlap.sim.simulator import SupportsDuration, simulate
from ccoverlap.specs import CommConfig

__all__ = ["SimulatedProfiler"]


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
