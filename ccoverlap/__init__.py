"""ccoverlap: measure, predict, decide and apply communication/computation overlap.

The analyser, cost model, simulator and planner are importable without torch;
only :mod:`ccoverlap.runtime` (and the ``bench``/``calibrate`` commands) need it.
"""

__version__ = "0.1.0"
