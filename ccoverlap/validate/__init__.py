"""Validate the step-time model on measured training runs (``ccoverlap validate``).

* :mod:`~ccoverlap.validate.reader`  — the runs file, checked (one line per problem);
* :mod:`~ccoverlap.validate.measure` — published throughput -> step time, by FLOP rule;
* :mod:`~ccoverlap.validate.predict` — one run's predicted step;
* :mod:`~ccoverlap.validate.compare` — per-run errors, summary, tables;
* :mod:`~ccoverlap.validate.fit`     — fit physical cost parameters on a declared subset.
"""
