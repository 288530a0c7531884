"""Validate the step-time model on measured training runs (``ccoverlap validate``).

* :mod:`~ccoverlap.validation.reader`  — the runs file, checked (one line per problem);
* :mod:`~ccoverlap.validation.measure` — published throughput -> step time, by FLOP rule;
* :mod:`~ccoverlap.validation.predict` — one run's predicted step;
* :mod:`~ccoverlap.validation.compare` — per-run errors, summary, tables;
* :mod:`~ccoverlap.validation.fit`     — fit physical cost parameters on a declared subset.
"""
