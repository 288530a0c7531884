"""Fit named physical cost parameters on the runs of a declared subset, judge them on the rest.

Only efficiencies and overheads of :class:`~ccoverlap.cost.params.CostParams` may be fitted
(names ending in ``_fraction``, ``_efficiency``, ``_overhead_s``, ``_latency_s`` or
``_interference``); tile shapes, bandwidths and shape exponents are refused. A value is fitted
per GPU (each GPU has its own defaults and its own calibration file), shared by every run on
that GPU in the fit subset: no per-run factor.

The objective is the mean squared relative error of the predicted step times, minimised by
coordinate descent with scipy's bounded Brent line search (``minimize_scalar``, method
``bounded``) inside each parameter's physical bounds (the step time is monotone in each
efficiency, so one pass per coordinate nearly suffices). Every evaluation is a simulation of
the fit runs, so the line search's evaluations are capped (``iters``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from scipy.optimize import minimize_scalar

from ccoverlap.config import short
from ccoverlap.cost.params import CostParams
from ccoverlap.errors import ConfigError
from ccoverlap.validation.predict import cost_params_for

if TYPE_CHECKING:
    from ccoverlap.validation.reader import RunSpec

FITTABLE_SUFFIXES = ("_fraction", "_efficiency", "_overhead_s", "_latency_s", "_interference")
# line-search tolerance, as a fraction of a parameter's physical range
LINE_TOLERANCE = 1e-3


def fittable_params() -> list[str]:
    """CostParams fields that are physical efficiencies or overheads (may be fitted)."""

    return [f.name for f in fields(CostParams)
            if f.name.endswith(FITTABLE_SUFFIXES) or f.name.startswith("link_efficiency_")]


def parse_fit_params(text: str) -> list[str]:
    """``a,b,c`` -> checked names; ConfigError for unknown or non-physical parameters."""

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--fit: give one or more cost parameter names, comma-separated")
    known = {f.name for f in fields(CostParams)}
    ok = set(fittable_params())
    for n in names:
        if n not in known:
            raise ConfigError(f"--fit: unknown cost parameter {short(n)}; fittable: {', '.join(sorted(ok))}")
        if n not in ok:
            raise ConfigError(f"--fit: {short(n)} is not a physical efficiency or overhead and may not be fitted "
                              f"(only names ending in {', '.join(FITTABLE_SUFFIXES)} or link_efficiency_*); "
                              f"fittable: {', '.join(sorted(ok))}")
    if len(set(names)) != len(names):
        raise ConfigError("--fit: a parameter is named twice")
    return names


def bounds(name: str, default: float) -> tuple[float, float]:
    """Physical range searched for ``name``: fractions and efficiencies in [0.05, 1];
    overheads and latencies in [0, max(10 x default, 50 us)]; interference in [0, 2]."""
    if name.endswith(("_fraction", "_efficiency")) or name.startswith("link_efficiency_"):
        return 0.05, 1.0
    if name.endswith(("_overhead_s", "_latency_s")):
        return 0.0, max(10.0 * default, 50e-6)
    return 0.0, 2.0


@dataclass
class RunsFit:
    """Fitted values per GPU, the objective before/after and how many simulations it took."""

    values: dict = field(default_factory=dict)        # gpu -> {param: value}
    defaults: dict = field(default_factory=dict)      # gpu -> {param: default}
    loss_before: dict = field(default_factory=dict)   # gpu -> mean squared relative error
    loss_after: dict = field(default_factory=dict)
    evaluations: int = 0


def _line_search(f: Callable[[float], float], lo: float, hi: float, *, iters: int) -> tuple[float, float]:
    """(x, f(x)) minimising ``f`` on [lo, hi]: Brent's bounded method, at most ``iters``
    evaluations, to :data:`LINE_TOLERANCE` of the range."""
    res = minimize_scalar(f, bounds=(lo, hi), method="bounded",
                          options={"xatol": LINE_TOLERANCE * (hi - lo), "maxiter": iters})
    return float(res.x), float(res.fun)


def fit_params(runs: Iterable[RunSpec], names: list[str], *,
               loss_fn: Callable[[list[RunSpec], dict[str, float]], float],
               rounds: int = 2, iters: int = 10, progress: Callable[[str], None] | None = None) -> RunsFit:
    """Fit ``names`` per GPU on ``runs`` (the fit subset). ``loss_fn(runs_of_gpu, overrides)``
    returns the mean squared relative error of those runs' predictions with ``overrides``
    applied (the caller simulates). Coordinate descent, ``rounds`` passes, a line search of at
    most ``iters`` evaluations per coordinate, each kept only if it lowers the loss."""

    out = RunsFit()
    by_gpu: dict[str, list] = {}
    for r in runs:
        by_gpu.setdefault(r.gpu_name, []).append(r)
    for gpu, group in by_gpu.items():
        base = cost_params_for(group[0]).to_dict()
        cur = {n: float(base[n]) for n in names}
        out.defaults[gpu] = dict(cur)
        cache: dict[tuple, float] = {}

        def loss(values: dict) -> float:
            key = tuple(round(values[n], 12) for n in names)
            if key not in cache:
                cache[key] = loss_fn(group, dict(values))
                out.evaluations += 1
                if progress:
                    progress(f"fit {gpu}: evaluation {out.evaluations}: "
                             + ", ".join(f"{n}={values[n]:.4g}" for n in names)
                             + f" -> rms relative error {math.sqrt(cache[key]):.2%}")
            return cache[key]

        best = loss(cur)
        out.loss_before[gpu] = best
        for rnd in range(rounds):
            improved = False
            for n in names:
                lo, hi = bounds(n, out.defaults[gpu][n])

                def along(x: float, n: str = n) -> float:
                    return loss({**cur, n: x})
                x, fx = _line_search(along, lo, hi, iters=iters)
                if progress:
                    progress(f"fit {gpu}: round {rnd + 1}, {n} = {x:.4g} (loss {fx:.5f}, was {best:.5f})")
                if fx < best * (1 - 1e-6):
                    cur[n], best, improved = x, fx, True
            if not improved:
                break
        out.values[gpu] = cur
        out.loss_after[gpu] = best
    return out
