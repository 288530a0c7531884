"""The planner: simulate a workload under several overlap strategies and rank them.

Strategies are named, each a set of overlap knobs (plus, from the deciders, communication
configurations and schedules):

* ``as-given``   — exactly the configuration the user described;
* ``no-overlap`` — every collective blocking on the compute stream (the floor);
* ``best-knobs`` — the best framework overlap knobs found by coordinate descent over the
  knobs that matter for the parallelism in use (DDP bucket size, FSDP prefetch depth and
  in-flight all-gather limit, TP chunking, EP micro-batch overlap), keeping only
  configurations whose memory estimate fits.

Further strategies (Lagom, Centauri, FiCCO) register through :data:`EXTRA_STRATEGIES`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from ccoverlap.timeline import Timeline, all_rank_metrics, step_time_s
from ccoverlap.workload import Workload


@dataclass
class StrategyResult:
    """One simulated strategy; times in seconds, memory in bytes."""

    name: str
    knobs: dict
    step_time_s: float
    tokens_per_s: float
    mfu: float
    exposed_comm_s: float
    overlap_ratio: float
    compute_s: float
    comm_s: float
    compute_comm_ratio: float
    peak_memory_bytes: float
    fits_memory: bool
    note: str = ""
    timeline: Timeline | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "knobs": self.knobs,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "exposed_comm_s": self.exposed_comm_s,
            "overlap_ratio": self.overlap_ratio,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "compute_comm_ratio": self.compute_comm_ratio,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits_memory": self.fits_memory,
            "note": self.note,
        }


def cost_model_for(w: Workload):
    """The cost model of the workload's cluster, with its calibration file applied if given."""
    from ccoverlap.cost import CostModel, CostParams
    from ccoverlap.cost.params import default_params

    params = default_params(w.cluster.gpu)
    if w.calibration:
        params = CostParams.load(w.calibration, base=params)
    return CostModel(w.cluster, params)


def simulate_workload(w: Workload, *, cost=None, progress=None):
    """Build and simulate one training step of ``w``; returns (StepGraph, Timeline)."""
    from ccoverlap.parallel import build_step
    from ccoverlap.sim import simulate

    step = build_step(w.model, w.parallel, w.batch, w.cluster, w.knobs)
    tl = simulate(step.graph, cost if cost is not None else cost_model_for(w), progress=progress)
    return step, tl


def evaluate(w: Workload, name: str, *, cost=None, note: str = "", keep_timeline: bool = False) -> StrategyResult:
    """Simulate ``w`` and summarise it as a :class:`StrategyResult`.

    MFU = model FLOPs per step / (world size × peak dense FLOP/s × step time), the PaLM /
    Megatron definition (no recomputation counted). Exposed communication and compute are
    those of the simulated rank with the largest exposed communication (the critical one).
    """
    step, tl = simulate_workload(w, cost=cost)
    t = step_time_s(tl)
    ranks = all_rank_metrics(tl)
    worst = max(ranks, key=lambda m: m.exposed_comm_s)
    comm_total = sum(m.comm_s for m in ranks)
    overlap = sum(m.overlap_s for m in ranks) / comm_total if comm_total > 0 else 0.0
    peak = w.cluster.gpu.flops_for(w.parallel.dtype_bytes) * step.world_size
    mem = step.memory
    return StrategyResult(
        name=name,
        knobs=w.knobs.to_dict(),
        step_time_s=t,
        tokens_per_s=step.tokens_per_step / t if t > 0 else 0.0,
        mfu=step.model_flops_per_step / (peak * t) if t > 0 else 0.0,
        exposed_comm_s=worst.exposed_comm_s,
        overlap_ratio=overlap,
        compute_s=worst.compute_s,
        comm_s=worst.comm_s,
        compute_comm_ratio=worst.compute_comm_ratio,
        peak_memory_bytes=float(mem.total_bytes),
        fits_memory=bool(mem.fits),
        note=note,
        timeline=tl if keep_timeline else None,
    )


def knob_space(w: Workload) -> dict[str, list[Any]]:
    """The overlap knobs worth searching for this workload's parallelism, with candidate values."""
    p = w.parallel
    space: dict[str, list[Any]] = {}
    if p.dp > 1 and p.data_parallel == "ddp":
        space["bucket_cap_mb"] = [5, 10, 25, 50, 100, 200]
    if p.dp > 1 and p.data_parallel == "fsdp":
        space["fsdp_prefetch"] = [0, 1, 2, 3]
        space["fsdp_limit_all_gathers"] = [1, 2, 4]
        space["fsdp_reshard_after_forward"] = [True, False]
    if p.tp > 1:
        space["tp_overlap"] = ["none", "chunked"]
        space["tp_chunks"] = [2, 4, 8]
    if p.ep > 1:
        space["ep_overlap"] = [False, True]
    if p.pp > 1:
        space["pp_p2p_overlap"] = [False, True]
    return space


ProgressFn = Callable[[int, int, str], None]


def _knobs_key(w: Workload) -> str:
    return json.dumps(w.knobs.to_dict(), sort_keys=True, default=str)


def search_best_knobs(w: Workload, *, cost=None, progress: ProgressFn | None = None,
                      max_rounds: int = 2) -> tuple[Workload, StrategyResult, int]:
    """Coordinate descent over :func:`knob_space`: try each value of one knob with the others
    fixed, keep the fastest configuration that fits in memory, repeat until nothing improves.
    Returns (best workload, its result, number of simulations)."""
    space = knob_space(w)
    best_w = replace(w, knobs=replace(w.knobs, overlap=True))
    best = evaluate(best_w, "best-knobs", cost=cost)
    evaluated = {_knobs_key(best_w): best}
    n_sims = 1
    total = sum(len(v) for v in space.values()) * max_rounds
    done = 0
    for _ in range(max_rounds):
        improved = False
        for knob, values in space.items():
            for value in values:
                done += 1
                if progress:
                    progress(done, total, f"{knob}={value}")
                cand_w = replace(best_w, knobs=replace(best_w.knobs, **{knob: value}))
                key = _knobs_key(cand_w)
                if key in evaluated:
                    continue
                res = evaluate(cand_w, "best-knobs", cost=cost)
                n_sims += 1
                evaluated[key] = res
                better = res.step_time_s < best.step_time_s * (1 - 1e-9)
                if res.fits_memory and (better or not best.fits_memory):
                    best_w, best, improved = cand_w, res, True
        if not improved:
            break
    return best_w, best, n_sims


# Extra strategies from the deciders: name -> function(workload, cost) -> StrategyResult | None
EXTRA_STRATEGIES: dict[str, Callable[[Workload, Any], StrategyResult | None]] = {}


@dataclass
class PlanResult:
    workload: Workload
    strategies: list[StrategyResult]
    simulations: int
    seconds: float
    best_workload: Workload

    @property
    def as_given(self) -> StrategyResult:
        return self.strategies[0]

    def best(self) -> StrategyResult:
        fitting = [s for s in self.strategies if s.fits_memory] or self.strategies
        return min(fitting, key=lambda s: s.step_time_s)


def plan(w: Workload, *, progress: ProgressFn | None = None, extra: Iterable[str] | None = None) -> PlanResult:
    """Simulate the as-given configuration, no overlap, the best knobs, and the deciders'
    strategies; the first entry is always ``as-given``."""
    t0 = time.perf_counter()
    cost = cost_model_for(w)
    as_given = evaluate(w, "as-given", cost=cost, keep_timeline=True)
    no_overlap = evaluate(replace(w, knobs=replace(w.knobs, overlap=False)), "no-overlap", cost=cost,
                          note="every collective blocking on the compute stream")
    best_w, best, n = search_best_knobs(w, cost=cost, progress=progress)
    changed = {k: v for k, v in best_w.knobs.to_dict().items() if w.knobs.to_dict().get(k) != v}
    best.note = ("changed: " + ", ".join(f"{k}={v}" for k, v in changed.items())) if changed else "as given is best"
    best.timeline = evaluate(best_w, "best-knobs", cost=cost, keep_timeline=True).timeline
    strategies = [as_given, no_overlap, best]
    names = list(EXTRA_STRATEGIES) if extra is None else list(extra)
    for name in names:
        res = EXTRA_STRATEGIES[name](best_w, cost)
        if res is not None:
            strategies.append(res)
    return PlanResult(workload=w, strategies=strategies, simulations=n + 2, seconds=time.perf_counter() - t0,
                      best_workload=best_w)


def recommendation(result: PlanResult) -> str:
    """A recommendation in plain words, from the compute-to-communication ratio R and the gains."""
    given = result.as_given
    best = result.best()
    r = given.compute_comm_ratio
    lines = []
    if not given.fits_memory:
        lines.append(f"The configuration as given does not fit in GPU memory "
                     f"({given.peak_memory_bytes / 2**30:.1f} GiB needed): change parallelism, "
                     f"recomputation or micro-batch first.")
    if r < 1:
        lines.append(f"Communication-bound (R = {r:.2f} < 1): even perfect overlap leaves "
                     f"{(given.comm_s - given.compute_s) * 1e3:.1f} ms of communication exposed per step; "
                     f"reduce communication volume (larger micro-batch, less sharding across nodes, "
                     f"hierarchical/HSDP groups) before tuning overlap.")
    gain = given.step_time_s / best.step_time_s if best.step_time_s > 0 else 1.0
    if best.name != "as-given" and gain > 1.005:
        lines.append(f"Use '{best.name}' ({best.note}): predicted {gain:.2f}x faster "
                     f"({given.step_time_s * 1e3:.1f} -> {best.step_time_s * 1e3:.1f} ms per step, "
                     f"MFU {given.mfu:.1%} -> {best.mfu:.1%}).")
    else:
        lines.append("The configuration as given is already the best the planner found.")
    if given.exposed_comm_s > 0.05 * given.step_time_s and r >= 1:
        lines.append(f"{given.exposed_comm_s * 1e3:.1f} ms of communication per step is exposed while "
                     f"compute could hide it (R = {r:.2f}): overlap is the lever here.")
    return " ".join(lines)


# modules that add decider strategies to EXTRA_STRATEGIES when imported
DECIDER_MODULES = ("ccoverlap.deciders.lagom", "ccoverlap.deciders.centauri", "ccoverlap.deciders.ficco")


def load_decider_strategies() -> None:
    """Import the decider modules present in this installation so their strategies register."""
    import importlib

    for name in DECIDER_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
