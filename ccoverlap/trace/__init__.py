"""Trace analyser: overlap metrics from real torch.profiler (Kineto) traces.

``ccoverlap analyze`` is :func:`ccoverlap.trace.analyze.analyze` plus a report. Modules, one
topic each: :mod:`~ccoverlap.trace.load` (streaming loader over :mod:`~.jsonstream`), :mod:`~.classify`
(kernel kinds, collective args, Timeline), :mod:`~.steps` (profiler-step windows, HTA's
defaults), :mod:`~.collectives` (bandwidths), :mod:`~.ranks` (cross-rank matching,
stragglers), :mod:`~.contention` (compute slowdown under overlap), :mod:`~.dimensions`
(overlap per parallelism dimension), :mod:`~.verdict`, :mod:`~.result` (the
:class:`~.result.Analysis` and its JSON form), :mod:`~.report` (table / JSON / PNG). torch is never imported.
"""
