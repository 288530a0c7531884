"""Lagom (co-tuning the NCCL resources of overlapped collectives): the paper's decision procedure.

- :mod:`~ccoverlap.deciders.lagom.profiler` — ``ProfileTime(s)`` of Algorithm 2 on the simulator;
- :mod:`~ccoverlap.deciders.lagom.space` — the configuration space and the baselines (NCCL's
  defaults, AutoCCL, exhaustive search; lagom §2.2, §4);
- :mod:`~ccoverlap.deciders.lagom.tune` — Algorithms 1-2 on one overlap group (lagom §3.3-3.4);
- :mod:`~ccoverlap.deciders.lagom.step` — the planner strategies ``lagom`` / ``autoccl`` on a
  whole training step.

The overlap groups it tunes and the profile interface it searches with are NCCL's side of the
decision, shared with the live profiler of the runtime: :mod:`ccoverlap.nccl.groups`,
:mod:`ccoverlap.nccl.profile`.
"""
