"""Predict one measured run: build its workload from the checked :class:`RunSpec` and simulate
one training step with the planner's definitions (:func:`ccoverlap.predict.evaluate.evaluate`).

Whatever this build of the simulator cannot express (a parallel field its ``ParallelConfig``
lacks, e.g. context parallelism before it lands) is an :class:`Unsupported` problem of that run
only; the other runs are still validated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

from ccoverlap.cost import CostModel
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.errors import CCOverlapError
from ccoverlap.parallel.config import ParallelConfig
from ccoverlap.predict.evaluate import build_workload_step, summarize
from ccoverlap.predict.workload import Workload, workload_from_mapping
from ccoverlap.sim.simulator import simulate
from ccoverlap.validation.reader import EXTRA_PARALLEL, RunSpec


class Unsupported(CCOverlapError):
    """A run this build of the simulator cannot build (named feature missing)."""


@dataclass
class Prediction:
    """The predicted step of one run (times in seconds, memory in bytes)."""

    step_time_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    mfu: float
    peak_memory_bytes: float
    fits_memory: bool
    seconds: float  # wall time the simulation took
    notes: tuple = ()


def _has_field(cls: type, name: str) -> bool:
    return name in {f.name for f in fields(cls)}


def workload_for(run: RunSpec, *, calibration: str | None = None) -> tuple[Workload, tuple[str, ...]]:
    """The :class:`~ccoverlap.predict.workload.Workload` of ``run``, through the same loader as
    ``plan --config``. Returns (workload, notes); raises :class:`Unsupported` for parallel
    fields this build lacks and :class:`ConfigError` for anything else."""

    notes: list[str] = []
    par = dict(run.parallel)
    for key, (_typ, default) in EXTRA_PARALLEL.items():
        if key in par and not _has_field(ParallelConfig, key):
            if par[key] == default:
                del par[key]  # the default means what this build does anyway
            else:
                raise Unsupported(f"parallel.{key}={par[key]!r} (this build's ParallelConfig has no field {key!r})")
    from dataclasses import asdict

    # The run's own cluster as a mapping (catalog clusters with changes included), so the
    # loader checks the layout against exactly the GPUs the run used.
    data = {"model": run.model.to_dict(), "cluster": asdict(run.cluster), "parallel": par,
            "batch": dict(run.batch), "knobs": dict(run.knobs)}
    if calibration:
        data["calibration"] = calibration
    if run.framework and _has_field(Workload, "framework"):
        data["framework"] = run.framework  # the loader checks the profile against model and layout
    w = workload_from_mapping(data, source=run.name)
    if run.framework and not _has_field(Workload, "framework"):
        notes.append(f"framework profile {run.framework!r} not applied: this build has no framework profiles")
    return w, tuple(notes)


def cost_params_for(run: RunSpec, overrides: dict[str, float] | None = None,
                    calibration: dict[str, dict[str, Any]] | None = None) -> CostParams:
    """The CostParams the prediction of ``run`` uses: the GPU's defaults, then ``calibration``
    (``{gpu name: {param: value}}``, an entry ``"*"`` for every GPU), then ``overrides``."""

    p = default_params(run.cluster.gpu)
    if calibration:
        for key in ("*", run.gpu_name):
            if key in calibration:
                p = CostParams.from_dict(calibration[key], base=p, where=f"calibration for {key}")
    if overrides:
        p = p.with_overrides(**overrides)
    return p


def predict_run(run: RunSpec, *, params: CostParams | None = None,
                workload: tuple[Workload, tuple[str, ...]] | None = None, step_cache: dict[str, Any] | None = None,
                ) -> Prediction:
    """Simulate one step of ``run`` with cost parameters ``params`` (default: the GPU's
    defaults, nothing fitted); summary as the planner's :class:`StrategyResult`.
    ``step_cache`` (run name -> (workload, notes, step)) keeps built steps across calls, so a
    fit re-simulates the same step graph with new parameters instead of rebuilding it."""

    t0 = time.perf_counter()
    cached = step_cache.get(run.name) if step_cache is not None else None
    if cached is None:
        w, notes = workload if workload is not None else workload_for(run)
        step = build_workload_step(w)
        if step_cache is not None:
            step_cache[run.name] = (w, notes, step)
    else:
        w, notes, step = cached
    cost = CostModel(w.cluster, params if params is not None else cost_params_for(run))
    res = summarize("as-measured", w, step, simulate(step.graph, cost), keep_timeline=False)
    return Prediction(step_time_s=res.step_time_s, compute_s=res.compute_s, comm_s=res.comm_s,
                      exposed_comm_s=res.exposed_comm_s, mfu=res.mfu, peak_memory_bytes=res.peak_memory_bytes,
                      fits_memory=res.fits_memory, seconds=time.perf_counter() - t0, notes=tuple(notes))
