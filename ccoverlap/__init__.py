"""ccoverlap: measure, predict, decide and apply communication/computation overlap.

The Python API (docs/api.md)::

    import ccoverlap as cc
    w = cc.Workload(model="llama-3-8b", cluster="dgx-h100", tp=2, dp=4)
    print(cc.plan(w))
    print(cc.analyze("traces/").to_dataframe())

``Workload``, ``analyze``, ``replay``, ``simulate``, ``plan``, ``search``, ``validate`` and
``reproduce`` are here; each function imports what it needs when called, so this import is
fast. The analyser, cost model, simulator and planner are importable without torch; only
:mod:`ccoverlap.runtime` (and the ``bench``/``calibrate`` commands) need it.
"""

from typing import TYPE_CHECKING

from ccoverlap.api import analyze, plan, replay, reproduce, search, simulate, validate
from ccoverlap.errors import CCOverlapError, ConfigError, TraceError
from ccoverlap.version import __version__

if TYPE_CHECKING:  # for the type checker only: at run time Workload is imported on first use
    from ccoverlap.predict.workload import Workload

__all__ = ["Workload", "analyze", "replay", "simulate", "plan", "search", "validate", "reproduce",
           "CCOverlapError", "ConfigError", "TraceError", "__version__"]


def __getattr__(name: str) -> "type[Workload]":
    if name == "Workload":  # imported on first use: the catalog is not needed to analyse traces
        from ccoverlap.predict.workload import Workload

        return Workload
    raise AttributeError(f"module 'ccoverlap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Workload"})
