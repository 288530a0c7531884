"""NCCL's side of a decision: configurations per communication and how stock NCCL takes them.

- :mod:`ccoverlap.nccl.plan` — :class:`~ccoverlap.nccl.plan.CommPlan`, the rows a decider
  hands on (process group, collective type, message-size range → configuration);
- :mod:`ccoverlap.nccl.apply` — what stock NCCL can set and where (process environment,
  per-communicator CTA bounds, the example tuner plugin's CSV rows), and what it cannot;
- :mod:`ccoverlap.nccl.groups` — overlap groups, collectives overlapped with computations: the
  unit whose configurations are tuned together (lagom §3.1);
- :mod:`ccoverlap.nccl.profile` — what profiling a group under candidate configurations
  returns, implemented on the simulator (Lagom's decider) and live on GPUs (the runtime).

Used by the deciders, by ``plan --emit`` and by the runtime; no torch.
"""
