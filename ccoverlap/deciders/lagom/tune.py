"""Lagom: co-tune the NCCL configurations of the collectives in an overlap group (lagom §3).

For an overlap group (``M`` computations, ``N`` collectives on two streams, see
:mod:`ccoverlap.nccl.groups`) Lagom chooses ``s_j = (algorithm, protocol, NC, NT, C)`` for every
collective to minimise the makespan ``Z = max(X, Y)`` of eq. (1) — not each collective's own
time. Communication resources speed communication up but slow the computation beside it
(eqs. 4-6: NC SMs taken from the GEMM's waves, NC x C bytes in flight taking memory
bandwidth), so in a computation-bound group the best configuration gives communication
*fewer* resources than NCCL's default.

The search (§3.3-3.4), all on a :class:`~ccoverlap.nccl.profile.Profiler` (simulated or live):

* implementation parameters (algorithm, protocol) are fixed first per collective, as in
  AutoCCL's divide and conquer (§2.2, §3.4 "we integrate the proposed algorithms into
  AutoCCL's framework"): the fastest for that collective at its starting resources;
* **Algorithm 1** (cost-effectiveness): while some collective is unfinished, take the one
  with the smallest priority ``H`` (eq. 7, all initialised to 0.01) and give it one step of
* **Algorithm 2** (resource-efficient tuning): the first time, NC, NT, C go to their minimums;
  afterwards each grows by a learning rate ``lr`` = relative improvement of the collective's
  own time at the last step. The collective is finished when its time stops improving
  (it reached its optimum) or when the group's communication time drops below its
  computation time (``X' < Y'``, §3.4 conditions).

Baselines on the same group and profiler: NCCL's defaults, AutoCCL-style tuning (every
collective tuned for its own speed by coordinate descent, §2.2 / eq. 2) and exhaustive
search over a discretised space where ``k^N`` is small.

What the paper leaves open and how it is read here (each is a parameter):

* "NC <- NC + lr" with ``lr`` a relative improvement (a fraction) is read on a logarithmic
  scale normalised per knob: ``lr = 1`` doubles NC and moves NT and C by the same fraction of
  their ranges (:func:`step_config`); every step changes the configuration (NC by at least one
  channel while below its maximum), so the search always terminates.
* On the first step from the minimums there is no previous time of that configuration to
  compare with, so ``lr`` is ``initial_lr`` (1) and ``H`` keeps its initial 0.01.
* "Reached its optimum" is a relative improvement at or below ``min_gain`` (0.5 %; the paper
  uses > 0, which a deterministic model turns into endless sub-percent steps).
* When a collective finishes, the better (lower ``Z``) of its last two profiled configurations
  is kept — the previous one when communication got slower (Alg. 1 line 8 appends ``s_j``),
  the new one when it just brought ``X`` under ``Y``. Both were already profiled.
* Every profile changes exactly one collective's configuration from the current accepted
  set, so ``Y' - Y`` and ``x_j - x_j'`` in eq. 7 are the effect of that change alone.
* Ties in H (all start at 0.01) go to collectives not yet initialised, so every collective
  starts from its minimums before H ranks them.

Beyond the paper (on by default, off with ``refine_steps=0, polish=False``; the tune command
reports both): bisection of the ``X = Y`` crossing, a final local polish on ``Z``, and never
returning a configuration set worse than the best one profiled. On the simulated groups in
the tests, Algorithms 1-2 alone land up to ~8 % above the exhaustive optimum when one
collective grows while another dominates ``X``; with the finishing moves, within ~1 %.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ccoverlap.deciders.lagom.profiler import SimulatedProfiler
from ccoverlap.deciders.lagom.space import (
    ProfileCounter,
    ProgressFn,
    TuneResult,
    TuneStep,
    TuningSpace,
    autoccl_tune,
    choose_implementations,
    config_dict,
    exhaustive_grid,
    exhaustive_tune,
    nccl_default_configs,
    start_configs,
    with_config,
)
from ccoverlap.nccl.groups import OverlapGroup, require_group
from ccoverlap.nccl.profile import Profiler, ProfileResult
from ccoverlap.specs import CommConfig

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.sim.simulator import SupportsDuration
    from ccoverlap.specs import CollectiveSpec

__all__ = [
    "INITIAL_H",
    "metric_h",
    "minimum_config",
    "step_config",
    "lagom_tune",
    "GroupTuning",
    "tune_group",
]

#: Algorithm 1 line 3: "Initialize all H to 0.01".
INITIAL_H = 0.01


# ----------------------------------------------------------------------------- Lagom (Alg. 1 + 2)

def metric_h(y_before_s: float, y_after_s: float, x_before_s: float, x_after_s: float) -> float:
    """Priority metric ``H_j = (Y' - Y) / (x_j^{s_j} - x_j^{s'_j})`` (lagom eq. 7): seconds of
    computation added per second of communication saved by moving collective j from s_j to
    s'_j (dimensionless). Smaller is better; ``inf`` when communication did not improve
    (eq. 7's "negative denominator": the collective is already optimal)."""
    gain = x_before_s - x_after_s
    if gain <= 0:
        return math.inf
    return (y_after_s - y_before_s) / gain


def minimum_config(cfg: CommConfig, space: TuningSpace) -> CommConfig:
    """Algorithm 2 line 3: NC, NT, C at their minimums; algorithm and protocol kept."""
    return replace(cfg, channels=space.nc_min, threads=space.nt_min, chunk_bytes=space.chunk_min)


def _knobs(cfg: CommConfig) -> tuple[int, int, int]:
    """NC, NT and C of a configuration the search holds (every knob set: :meth:`TuningSpace.clamp`)."""
    assert cfg.channels is not None and cfg.threads is not None and cfg.chunk_bytes is not None
    return cfg.channels, cfg.threads, cfg.chunk_bytes


def step_config(cfg: CommConfig, lr: float, space: TuningSpace, *, min_lr: float = 0.25) -> CommConfig:
    """Algorithm 2 lines 12-14, ``NC, NT, C <- NC, NT, C + lr``, on a normalised log scale:
    each knob's position ``u = log(v / min) / log(max / min)`` grows by ``lr / log2(nc_max /
    nc_min)``, so ``lr = 1`` doubles NC and moves NT and C by the same fraction of their
    ranges. ``lr`` below ``min_lr`` counts as ``min_lr`` (a quarter of an NC doubling), and NC
    grows by at least one channel while below ``nc_max``, so every step changes the
    configuration and minimum to maximum takes at most ~``4 log2(nc_max / nc_min)`` steps;
    at the maximum of every knob the configuration is returned unchanged."""
    cfg = space.clamp(cfg)
    nc, nt, chunk = _knobs(cfg)
    du = max(min_lr, lr) / space.nc_octaves
    new: dict[str, float] = {}
    for name, lo, hi in (("channels", space.nc_min, space.nc_max), ("threads", space.nt_min, space.nt_max),
                         ("chunk_bytes", space.chunk_min, space.chunk_max)):
        v = getattr(cfg, name)
        new[name] = space._val(space._pos(v, lo, hi) + du, lo, hi)
    out = space.with_knobs(cfg, **new)
    if out.channels == nc and nc < space.nc_max:
        out = replace(out, channels=nc + 1)
    if out == cfg:
        if chunk < space.chunk_max:
            out = replace(out, chunk_bytes=min(space.chunk_max, chunk + space.chunk_quantum))
        elif nt < space.nt_max:
            out = replace(out, threads=min(space.nt_max, nt + 32))
    return out


def _midpoint(lo: CommConfig, hi: CommConfig, space: TuningSpace) -> CommConfig:
    """Geometric midpoint of two configurations, knob by knob (for the crossing bisection)."""
    (lo_nc, lo_nt, lo_c), (hi_nc, hi_nt, hi_c) = _knobs(lo), _knobs(hi)
    return space.with_knobs(hi, math.sqrt(lo_nc * hi_nc), math.sqrt(lo_nt * hi_nt), math.sqrt(lo_c * hi_c))


def _scaled(cfg: CommConfig, knob: str, factor: float, space: TuningSpace) -> CommConfig:
    """``cfg`` with one knob multiplied by ``factor`` (NC moves by at least one channel)."""
    nc, nt, chunk = _knobs(cfg)
    knobs: dict[str, float] = {"channels": nc, "threads": nt, "chunk_bytes": chunk}
    knobs[knob] *= factor
    out = space.with_knobs(cfg, **knobs)
    if knob == "channels" and out.channels == nc:
        out = space.with_knobs(cfg, nc + (1 if factor > 1 else -1), nt, chunk)
    return out


def lagom_tune(group: OverlapGroup, profiler: Profiler, *, start: Sequence[CommConfig] | None = None,
               space: TuningSpace | None = None, search_implementations: bool = True,
               initial_lr: float = 1.0, max_lr: float = 1.0, min_gain: float = 0.005,
               refine_steps: int = 3, polish: bool = True,
               progress: ProgressFn | None = None) -> TuneResult:
    """Lagom's search (Algorithms 1 and 2, lagom §3.4) on ``group`` through ``profiler``.

    ``start`` is the configuration set S the job runs today (default: NCCL's defaults); a
    collective stays there until Algorithm 1 first picks it (ties in H go to collectives not
    yet initialised, so every collective starts from its minimums before H ranks them).
    Returns the chosen configurations, their profile (x_j, Y, Z in seconds) and the number of
    profiling steps, linear in the number of collectives N: per collective the
    implementation pre-pass (one profile per (algorithm, protocol) candidate), about
    ``log2(nc_max)`` resource steps, and at most ``refine_steps`` or a bounded polish.

    ``max_lr`` caps a step at one NC doubling (a larger step overshoots the X = Y crossing).
    Three finishing moves go beyond the paper's pseudo-code, aimed at its stated optimum
    conditions (§3.4); ``refine_steps=0, polish=False`` gives Algorithms 1-2 alone:

    * ``refine_steps``: when a step brings X under Y (condition 3, "until the two are
      equal"), the crossing lies between the last two configurations; bisect between them
      (geometric midpoints) that many times and keep the lowest-Z profile.
    * ``polish``: after Algorithm 1, a local pattern search on Z for each collective in turn
      (NC, C, NT up/down by x2 then x1.41, one knob at a time; AutoCCL's coordinate method,
      but on the makespan): Algorithm 1 only ever adds resources, so a collective that grew
      while another one dominated X can end with more than it needs.
    * the configuration set returned is never worse than the best one profiled (every
      profile measured a whole set; the start, i.e. NCCL's defaults, included).
    """
    t0 = time.perf_counter()
    space = space or TuningSpace()
    configs = start_configs("lagom", group, profiler, start, space)
    n = group.n_collectives
    count = ProfileCounter(profiler, progress, "lagom", total=n * 12)
    steps: list[TuneStep] = []
    current = count(configs)
    steps.append(TuneStep(-1, None, current, decision="start"))
    if search_implementations:
        configs, current = choose_implementations(group, count, configs, current, space, steps)
    search = _LagomSearch(space, count, steps, configs, current, refine_steps=refine_steps, min_gain=min_gain,
                          max_lr=max_lr, h=[INITIAL_H] * n, lr=[initial_lr] * n, initialized=[False] * n,
                          done=[False] * n)
    while not all(search.done):
        # Algorithm 1 line 5: the unfinished collective with the smallest H (ties: not yet
        # initialised first, then the first in stream order)
        j = min((i for i in range(n) if not search.done[i]),
                key=lambda i: (search.initialized[i], search.h[i], i))
        search.advance(j)
    if polish:
        for j in range(n):
            search.configs[j], search.current = search.pattern_search(j, search.configs[j], search.current)
    configs, current = search.configs, search.current
    note = ""
    if count.best is not None and count.best[1].makespan_s < current.makespan_s * (1 - 1e-12):
        # every profile measured a whole configuration set: never return worse than the best seen
        configs, current = list(count.best[0]), count.best[1]
        note = "returned the best configuration set profiled during the search"
    return TuneResult("lagom", configs, current, count.n, steps, time.perf_counter() - t0, note=note)


@dataclass
class _LagomSearch:
    """What the steps of :func:`lagom_tune` share: the accepted set S and its profile, H, lr, progress."""

    space: TuningSpace
    count: ProfileCounter
    steps: list[TuneStep]
    configs: list[CommConfig]  # the accepted configuration set S
    current: ProfileResult  # its profile
    refine_steps: int
    min_gain: float
    max_lr: float
    h: list[float]
    lr: list[float]
    initialized: list[bool]
    done: list[bool]

    def advance(self, j: int) -> None:
        """One move of Algorithm 1 on collective ``j``: Algorithm 2's step, then finished or stepped."""
        first = not self.initialized[j]
        cur = self.configs[j]
        cand = minimum_config(cur, self.space) if first else step_config(cur, self.lr[j], self.space)
        if cand == cur and not first:  # every knob at its maximum: nothing left to give
            self.done[j] = True
            self.steps.append(TuneStep(j, cand, self.current, self.h[j], self.lr[j], "done: knobs at maximum"))
            return
        res = self.current if cand == cur else self.count(with_config(self.configs, j, cand))
        self.initialized[j] = True
        x_old, x_new = self.current.comm_times_s[j], res.comm_times_s[j]
        hidden = res.comm_busy_s < res.compute_time_s  # X' < Y' (§3.4 condition 2)
        gain = (x_old - x_new) / x_new if x_new > 0 else 0.0
        if first:
            self._from_minimums(j, cand, res, hidden)
        elif hidden:
            self._finish_hidden(j, cand, res)
        elif gain <= self.min_gain:
            self._finish_stalled(j, cand, res, gain)
        else:
            # Algorithm 2 line 11: lr from the relative improvement; Algorithm 1 line 11: update H
            self.h[j] = metric_h(self.current.compute_time_s, res.compute_time_s, x_old, x_new)
            self.lr[j] = min(self.max_lr, gain)
            self.configs[j], self.current = cand, res
            self.steps.append(TuneStep(j, cand, res, self.h[j], self.lr[j], "stepped"))

    def _from_minimums(self, j: int, cand: CommConfig, res: ProfileResult, hidden: bool) -> None:
        """Algorithm 2 lines 2-3: start from the minimums (no previous time to compare)."""
        if hidden:
            self.done[j] = True
            keep_new = res.makespan_s <= self.current.makespan_s * (1 + 1e-12)
            decision = "done: X < Y at minimum resources" + ("" if keep_new else " (kept start: lower Z)")
        else:
            keep_new, decision = True, "initialised to minimums"
        if keep_new:
            self.configs[j], self.current = cand, res
        self.steps.append(TuneStep(j, cand, res, self.h[j], self.lr[j], decision))

    def _finish_hidden(self, j: int, cand: CommConfig, res: ProfileResult) -> None:
        """Algorithm 2 lines 7-8, condition X' < Y': finished at the crossing."""
        self.done[j] = True
        was_hidden = self.current.comm_busy_s < self.current.compute_time_s
        self.steps.append(TuneStep(j, cand, res, self.h[j], self.lr[j], "done: X < Y"))
        if was_hidden:  # X was already under Y (another collective's move): keep lower Z
            if res.makespan_s < self.current.makespan_s * (1 - 1e-12):
                self.configs[j], self.current = cand, res
        else:
            self.configs[j], self.current = self.bisect(j, self.configs[j], cand, self.current, res)

    def _finish_stalled(self, j: int, cand: CommConfig, res: ProfileResult, gain: float) -> None:
        """Algorithm 2 lines 7-8, "reached its optimum": keep the lower-Z of the last two profiled configurations."""
        self.done[j] = True
        keep_new = res.makespan_s < self.current.makespan_s * (1 - 1e-12)
        why = "communication stopped improving" if gain <= 0 else f"gain {gain:.2%} <= {self.min_gain:.1%}"
        self.steps.append(TuneStep(j, cand, res, self.h[j], self.lr[j],
                                   f"done: {why}; kept {'new' if keep_new else 'previous'} (lower Z)"))
        if keep_new:
            self.configs[j], self.current = cand, res

    def bisect(self, j: int, lo: CommConfig, hi: CommConfig, lo_res: ProfileResult,
               hi_res: ProfileResult) -> tuple[CommConfig, ProfileResult]:
        """Between lo (X >= Y) and hi (X < Y): the lowest-Z configuration found."""
        best = min(((lo, lo_res), (hi, hi_res)), key=lambda t: t[1].makespan_s)
        for _ in range(self.refine_steps):
            mid = _midpoint(lo, hi, self.space)
            if mid in (lo, hi):
                break
            res = self.count(with_config(self.configs, j, mid))
            self.steps.append(TuneStep(j, mid, res, decision="refine: bisect the X = Y crossing"))
            if res.makespan_s < best[1].makespan_s * (1 - 1e-12):
                best = (mid, res)
            if res.comm_busy_s < res.compute_time_s:
                hi = mid
            else:
                lo = mid
        return best

    def pattern_search(self, j: int, cfg: CommConfig, res: ProfileResult,
                       budget: int = 48) -> tuple[CommConfig, ProfileResult]:
        """Local search on Z around cfg, one knob at a time (at most ``budget`` profiles)."""
        stop = self.count.n + budget
        for factor in (2.0, math.sqrt(2.0)):
            improved = True
            while improved and self.count.n < stop:
                improved = False
                for knob in ("channels", "chunk_bytes", "threads"):
                    for f in (factor, 1.0 / factor):
                        cand = _scaled(cfg, knob, f, self.space)
                        if cand == cfg:
                            continue
                        r = self.count(with_config(self.configs, j, cand))
                        if r.makespan_s < res.makespan_s * (1 - 1e-9):
                            cfg, res, improved = cand, r, True
                            self.steps.append(TuneStep(j, cand, r, decision=f"polish: {knob} x{f:.2f} kept"))
                            break
        return cfg, res

# ----------------------------------------------------------------------------- all methods on one group

@dataclass
class GroupTuning:
    """Lagom and its baselines on one overlap group; ``results`` by method name in the order
    nccl-default, [as-given], autoccl, lagom, lagom-alg12 (the paper's algorithms without
    this module's finishing moves), [exhaustive]."""

    group: OverlapGroup
    results: dict[str, TuneResult]
    seconds: float

    def speedup(self, method: str, over: str) -> float:
        """Makespan of ``over`` / makespan of ``method`` (> 1: ``method`` is faster)."""
        return self.results[over].makespan_s / self.results[method].makespan_s

    def to_dict(self) -> dict:
        """Plain-data form for ``--json``: the group, and every method's result (seconds)."""
        return {
            "group": self.group.describe(),
            "collectives": [c.name for c in self.group.collectives],
            "results": {k: v.to_dict() for k, v in self.results.items()},
            "seconds": self.seconds,
        }


def tune_group(group: OverlapGroup, cost: SupportsDuration | None = None, *, profiler: Profiler | None = None,
               space: TuningSpace | None = None,
               default_fn: Callable[[CollectiveSpec, ClusterSpec], CommConfig] | None = None,
               exhaustive: bool | None = None, max_exhaustive_profiles: int = 20000,
               progress: ProgressFn | None = None) -> GroupTuning:
    """Run NCCL's defaults, AutoCCL-style tuning, Lagom and (``exhaustive=None``: when it fits
    ``max_exhaustive_profiles``) exhaustive search on ``group``; makespans in seconds.

    ``profiler`` defaults to a :class:`SimulatedProfiler` under ``cost`` (default: the cost
    model of the group's cluster). Each method gets a fresh profile count.
    """
    t0 = time.perf_counter()
    space = space or TuningSpace()
    require_group(group, "tune_group")
    if profiler is None:
        if cost is None:
            from ccoverlap.predict.evaluate import cost_model_for_cluster

            cost = cost_model_for_cluster(group.cluster)
        profiler = SimulatedProfiler(group, cost)
    defaults = [space.clamp(c) for c in nccl_default_configs(group, default_fn)]
    results: dict[str, TuneResult] = {}
    results["nccl-default"] = TuneResult("nccl-default", defaults, profiler.profile(defaults), 0,
                                         note="NCCL's default configuration")
    given = group.given_configs()
    if any(c != type(c)() for c in given):
        filled = [space.clamp(replace(d, **{k: v for k, v in config_dict(g).items() if v not in (None, "auto")}))
                  for g, d in zip(given, defaults)]
        results["as-given"] = TuneResult("as-given", filled, profiler.profile(filled), 0,
                                         note="the configuration in the group file")
    start = defaults
    results["autoccl"] = autoccl_tune(group, profiler, start=start, space=space, progress=progress)
    results["lagom"] = lagom_tune(group, profiler, start=start, space=space, progress=progress)
    alg12 = lagom_tune(group, profiler, start=start, space=space, refine_steps=0, polish=False)
    alg12.method = "lagom-alg12"
    alg12.note = "Algorithms 1-2 alone (no crossing bisection, no polish)"
    results["lagom-alg12"] = alg12
    if exhaustive is None:
        exhaustive = exhaustive_grid(space, group.n_collectives, max_exhaustive_profiles) is not None
    if exhaustive:
        base = [replace(d, algorithm=l.algorithm, protocol=l.protocol)
                for d, l in zip(defaults, results["lagom"].configs)]
        results["exhaustive"] = exhaustive_tune(group, profiler, base=base, space=space,
                                                max_profiles=max_exhaustive_profiles, progress=progress)
    return GroupTuning(group, results, time.perf_counter() - t0)
