"""NCCL's side of a decision: configurations per communication and how stock NCCL takes them.

- :mod:`ccoverlap.nccl.plan` — :class:`~ccoverlap.nccl.plan.CommPlan`, the rows a decider
  hands on (process group, collective type, message-size range → configuration);
- :mod:`ccoverlap.nccl.apply` — what stock NCCL can set and where (process environment,
  per-communicator CTA bounds, the example tuner plugin's CSV rows), and what it cannot.

Used by the deciders, by ``plan --emit`` and by the runtime; no torch.
"""
