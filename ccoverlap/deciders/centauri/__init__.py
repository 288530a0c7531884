"""Centauri (communication partitioning and hierarchical scheduling): the paper's decision procedure.

- :mod:`~ccoverlap.deciders.centauri.rules` — Algorithm 1, eqs. 1-2 and the §5.4 bound as pure functions;
- :mod:`~ccoverlap.deciders.centauri.partition` — the partitions as rewrites of a step graph (§3.1);
- :mod:`~ccoverlap.deciders.centauri.tiers` — each tier's candidates from cost-model numbers (§3.2);
- :mod:`~ccoverlap.deciders.centauri.decide` — the candidates simulated, the fastest kept
  (the planner strategy ``centauri``).
"""
