"""Deciders: choose an overlap strategy by the papers' rules, one subpackage per paper.

- :mod:`ccoverlap.deciders.lagom` — co-tuned NCCL resources of overlapped collectives;
- :mod:`ccoverlap.deciders.centauri` — communication partitioning and three-tier scheduling;
- :mod:`ccoverlap.deciders.ficco` — finer-grain collective + GEMM schedules.

Each decides on the cost model and simulator; none imports torch. How a decision reaches NCCL
is :mod:`ccoverlap.nccl`; running one on GPUs is :mod:`ccoverlap.runtime`.
"""
