"""The step simulator: operations ordered on GPU streams (:mod:`~ccoverlap.sim.graph`), played under a
cost model with processor-sharing contention (:mod:`~ccoverlap.sim.simulator`), the resulting timeline
and its overlap metrics (:mod:`~ccoverlap.sim.timeline`), graph rewrites and Chrome-trace output."""
