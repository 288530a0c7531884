"""Lagom: co-tune the NCCL configurations of the collectives in an overlap group (lagom §3).

For an overlap group (``M`` computations, ``N`` collectives on two streams, see
:mod:`.overlap_group`) Lagom chooses ``s_j = (algorithm, protocol, NC, NT, C)`` for every
collective to minimise the makespan ``Z = max(X, Y)`` of eq. (1) — not each collective's own
time. Communication resources speed communication up but slow the computation beside it
(eqs. 4-6: NC SMs taken from the GEMM's waves, NC x C bytes in flight taking memory
bandwidth), so in a computation-bound group the best configuration gives communication
*fewer* resources than NCCL's default.

The search (§3.3-3.4), all on a :class:`~.profiler.Profiler` (simulated or live):

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

import itertools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from ccoverlap.errors import ConfigError
from ccoverlap.graph import CollectiveSpec, CommConfig

from .overlap_group import OverlapGroup
from .profiler import ProfileResult, Profiler, SimulatedProfiler

__all__ = [
    "TuningSpace",
    "TuneStep",
    "TuneResult",
    "GroupTuning",
    "metric_h",
    "minimum_config",
    "step_config",
    "implementation_candidates",
    "nccl_default_configs",
    "lagom_tune",
    "autoccl_tune",
    "exhaustive_grid",
    "exhaustive_tune",
    "tune_group",
    "INITIAL_H",
]

KiB = 1 << 10
MiB = 1 << 20

#: Algorithm 1 line 3: "Initialize all H to 0.01".
INITIAL_H = 0.01

ProgressFn = Callable[[int, int, str], None]


# ----------------------------------------------------------------------------- search space

@dataclass(frozen=True, kw_only=True)
class TuningSpace:
    """The ranges of NCCL's resource knobs (lagom §2.2, Table 1).

    ``nc`` channels NC in [``nc_min``, ``nc_max``] (NCCL's MAXCHANNELS is 64 in recent
    versions; lagom §4.3 sees AutoCCL reach NC = 61); ``nt`` threads per channel NT in
    [``nt_min``, ``nt_max``], multiples of 32 (NCCL_NTHREADS accepts 64..512); chunk C in
    [``chunk_min``, ``chunk_max``] bytes, rounded to ``chunk_quantum`` (lagom Fig. 3 sweeps C
    from 16 KB; NCCL's Simple default is 2 MiB). ``protocols`` / ``algorithms`` are the
    implementation choices searched (those invalid for a collective are skipped).
    """

    nc_min: int = 1
    nc_max: int = 64
    nt_min: int = 64
    nt_max: int = 512
    chunk_min: int = 16 * KiB
    chunk_max: int = 8 * MiB
    chunk_quantum: int = 4 * KiB
    protocols: tuple[str, ...] = ("simple", "ll128", "ll")
    algorithms: tuple[str, ...] = ("ring", "tree", "pairwise")

    def __post_init__(self) -> None:
        if not 1 <= self.nc_min < self.nc_max:
            raise ConfigError(f"tuning space: need 1 <= nc_min < nc_max, got {self.nc_min}, {self.nc_max}")
        if not 32 <= self.nt_min <= self.nt_max:
            raise ConfigError(f"tuning space: need 32 <= nt_min <= nt_max, got {self.nt_min}, {self.nt_max}")
        if not 0 < self.chunk_min < self.chunk_max:
            raise ConfigError(f"tuning space: need 0 < chunk_min < chunk_max, got {self.chunk_min}, {self.chunk_max}")

    @property
    def nc_octaves(self) -> float:
        """log2(nc_max / nc_min): the number of NC doublings the range holds."""
        return math.log2(self.nc_max / self.nc_min)

    def clamp(self, cfg: CommConfig) -> CommConfig:
        """``cfg`` with NC, NT, C rounded and clipped into the space."""
        return self.with_knobs(cfg, cfg.channels, cfg.threads, cfg.chunk_bytes)

    def with_knobs(self, cfg: CommConfig, channels: float | None, threads: float | None,
                   chunk_bytes: float | None) -> CommConfig:
        """``cfg`` with NC, NT, C set to these (real-valued) amounts, rounded and clipped."""
        return replace(cfg, channels=self._nc(channels), threads=self._nt(threads),
                       chunk_bytes=self._chunk(chunk_bytes))

    def _nc(self, v: float | None) -> int:
        return int(min(self.nc_max, max(self.nc_min, round(v if v is not None else self.nc_min))))

    def _nt(self, v: float | None) -> int:
        v = self.nt_min if v is None else v
        return int(min(self.nt_max, max(self.nt_min, 32 * round(v / 32))))

    def _chunk(self, v: float | None) -> int:
        v = self.chunk_min if v is None else v
        q = self.chunk_quantum
        return int(min(self.chunk_max, max(self.chunk_min, q * round(v / q))))

    def _pos(self, v: float, lo: float, hi: float) -> float:
        return math.log(max(v, lo) / lo) / math.log(hi / lo) if hi > lo else 0.0

    def _val(self, u: float, lo: float, hi: float) -> float:
        return lo * (hi / lo) ** min(1.0, max(0.0, u))


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


def step_config(cfg: CommConfig, lr: float, space: TuningSpace) -> CommConfig:
    """Algorithm 2 lines 12-14, ``NC, NT, C <- NC, NT, C + lr``, on a normalised log scale:
    each knob's position ``u = log(v / min) / log(max / min)`` grows by ``lr / log2(nc_max /
    nc_min)``, so ``lr = 1`` doubles NC and moves NT and C by the same fraction of their
    ranges. The result always differs from ``cfg`` unless every knob is at its maximum: NC
    grows by at least one channel while below ``nc_max`` (else C or NT by one quantum).
    ``lr`` <= 0 is treated as 0 (the minimum step)."""
    cfg = space.clamp(cfg)
    du = max(0.0, lr) / space.nc_octaves
    new = {}
    for name, lo, hi in (("channels", space.nc_min, space.nc_max), ("threads", space.nt_min, space.nt_max),
                         ("chunk_bytes", space.chunk_min, space.chunk_max)):
        v = getattr(cfg, name)
        new[name] = space._val(space._pos(v, lo, hi) + du, lo, hi)
    out = space.with_knobs(cfg, **new)
    if out.channels == cfg.channels and cfg.channels < space.nc_max:
        out = replace(out, channels=cfg.channels + 1)
    if out == cfg:
        if cfg.chunk_bytes < space.chunk_max:
            out = replace(out, chunk_bytes=min(space.chunk_max, cfg.chunk_bytes + space.chunk_quantum))
        elif cfg.threads < space.nt_max:
            out = replace(out, threads=min(space.nt_max, cfg.threads + 32))
    return out


# ----------------------------------------------------------------------------- records

@dataclass(frozen=True)
class TuneStep:
    """One profiling step of a search: which collective changed (``-1``: the starting point),
    to which configuration, what was measured (seconds) and the decision taken."""

    collective: int
    config: CommConfig | None
    result: ProfileResult
    h: float | None = None
    lr: float | None = None
    decision: str = ""


@dataclass
class TuneResult:
    """A search's answer: ``configs[j]`` for collective j, the profile of that set
    (``result``: x_j, Y, Z in seconds), ``profiles`` = profiling steps the search used (the
    cost of tuning live), and the ``steps`` themselves."""

    method: str
    configs: list[CommConfig]
    result: ProfileResult
    profiles: int
    steps: list[TuneStep] = field(default_factory=list, repr=False)
    seconds: float = 0.0
    note: str = ""

    @property
    def makespan_s(self) -> float:
        return self.result.makespan_s

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "makespan_s": self.result.makespan_s,
            "compute_time_s": self.result.compute_time_s,
            "comm_time_s": self.result.comm_time_s,
            "comm_times_s": list(self.result.comm_times_s),
            "profiles": self.profiles,
            "search_seconds": self.seconds,
            "configs": [config_dict(c) for c in self.configs],
            "note": self.note,
        }


def config_dict(c: CommConfig) -> dict:
    """A CommConfig as a plain dict (NC, NT, C in bytes, protocol, algorithm)."""
    return {"channels": c.channels, "threads": c.threads, "chunk_bytes": c.chunk_bytes,
            "protocol": c.protocol, "algorithm": c.algorithm}


class _Counter:
    """Counts profiles, reports progress, and turns cost-model ConfigErrors for invalid
    implementation choices into ``None``."""

    def __init__(self, profiler: Profiler, progress: ProgressFn | None, what: str, total: int) -> None:
        self.profiler = profiler
        self.progress = progress
        self.what = what
        self.total = total
        self.n = 0
        self.best: tuple[list[CommConfig], ProfileResult] | None = None

    def __call__(self, configs: Sequence[CommConfig]) -> ProfileResult:
        self.n += 1
        if self.progress is not None:
            self.progress(self.n, max(self.total, self.n), self.what)
        res = self.profiler.profile(list(configs))
        if self.best is None or res.makespan_s < self.best[1].makespan_s * (1 - 1e-12):
            self.best = (list(configs), res)
        return res

    def maybe(self, configs: Sequence[CommConfig]) -> ProfileResult | None:
        try:
            return self(configs)
        except ConfigError:
            return None


def _with(configs: Sequence[CommConfig], j: int, cfg: CommConfig) -> list[CommConfig]:
    out = list(configs)
    out[j] = cfg
    return out


# ----------------------------------------------------------------------------- defaults / implementations

def nccl_default_configs(group: OverlapGroup, default_fn: Callable | None = None) -> list[CommConfig]:
    """What NCCL would use for each collective of ``group`` (every knob set): the cost
    model's :func:`ccoverlap.cost.default_comm_config` (channels by fabric, 512 threads,
    Simple's 2 MiB chunks, protocol/algorithm as NCCL's tuner picks for the message size),
    or ``default_fn(spec, cluster) -> CommConfig`` if given."""
    out = []
    for c in group.collectives:
        spec = c.spec
        if default_fn is not None:
            cfg = default_fn(spec, group.cluster)
        else:
            from ccoverlap.cost import default_comm_config

            cfg = default_comm_config(spec.collective, spec.group, group.cluster, nbytes=spec.bytes,
                                      transport=spec.transport)
        out.append(cfg)
    return out


def implementation_candidates(spec: CollectiveSpec, cluster, space: TuningSpace) -> list[tuple[str, str]]:
    """(algorithm, protocol) pairs worth profiling for ``spec`` (AutoCCL's implementation
    subspaces, lagom §2.2): NCCL's algorithms valid for the collective (tree only for
    all-reduce, pairwise only for all-to-all, ring otherwise) x protocols, LL128 only on
    NVLink-class fabrics where NCCL enables it."""
    algs = []
    for a in space.algorithms:
        if a == "tree" and spec.collective != "all_reduce":
            continue
        if a == "pairwise" and spec.collective != "all_to_all":
            continue
        if a == "ring" and spec.collective == "all_to_all":
            continue
        algs.append(a)
    if not algs:
        algs = ["auto"]
    nvlink = ("nvswitch", "nvlink_pair", "full_mesh")
    fabrics = [cluster.intra.fabric] if spec.group.local_size > 1 else []
    if spec.group.nodes > 1:
        fabrics.append(cluster.inter.fabric)
    ll128_ok = any(f in nvlink for f in fabrics) and all(f in nvlink or f in ("infiniband", "roce") for f in fabrics)
    protos = [p for p in space.protocols if p != "ll128" or ll128_ok]
    return [(a, p) for a in algs for p in protos]


def _choose_implementations(group: OverlapGroup, count: _Counter, configs: list[CommConfig],
                            current: ProfileResult, space: TuningSpace, steps: list[TuneStep]
                            ) -> tuple[list[CommConfig], ProfileResult]:
    """Per collective, the (algorithm, protocol) with the smallest own time x_j at its
    current resources (AutoCCL's subspace choice, lagom §3.4). One profile per candidate."""
    for j, coll in enumerate(group.collectives):
        best_x = current.comm_times_s[j]
        for alg, proto in implementation_candidates(coll.spec, group.cluster, space):
            cand = replace(configs[j], algorithm=alg, protocol=proto)
            if cand == configs[j]:
                continue
            res = count.maybe(_with(configs, j, cand))
            if res is None:
                continue
            better = res.comm_times_s[j] < best_x * (1 - 1e-9)
            steps.append(TuneStep(j, cand, res, decision="implementation kept" if better else "implementation rejected"))
            if better:
                configs[j], current, best_x = cand, res, res.comm_times_s[j]
    return configs, current


# ----------------------------------------------------------------------------- Lagom (Alg. 1 + 2)

def _midpoint(lo: CommConfig, hi: CommConfig, space: TuningSpace) -> CommConfig:
    """Geometric midpoint of two configurations, knob by knob (for the crossing bisection)."""
    return space.with_knobs(hi, math.sqrt(lo.channels * hi.channels), math.sqrt(lo.threads * hi.threads),
                            math.sqrt(lo.chunk_bytes * hi.chunk_bytes))


def _scaled(cfg: CommConfig, knob: str, factor: float, space: TuningSpace) -> CommConfig:
    """``cfg`` with one knob multiplied by ``factor`` (NC moves by at least one channel)."""
    knobs = {"channels": cfg.channels, "threads": cfg.threads, "chunk_bytes": cfg.chunk_bytes}
    knobs[knob] *= factor
    out = space.with_knobs(cfg, **knobs)
    if knob == "channels" and out.channels == cfg.channels:
        out = space.with_knobs(cfg, cfg.channels + (1 if factor > 1 else -1), cfg.threads, cfg.chunk_bytes)
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
    n = group.n_collectives
    configs = [space.clamp(c) for c in (list(start) if start is not None else nccl_default_configs(group))]
    if len(configs) != n:
        raise ConfigError(f"lagom: {len(configs)} starting configurations for {n} collectives")
    count = _Counter(profiler, progress, "lagom", total=n * 12)
    steps: list[TuneStep] = []
    current = count(configs)
    steps.append(TuneStep(-1, None, current, decision="start"))
    if search_implementations:
        configs, current = _choose_implementations(group, count, configs, current, space, steps)

    def bisect(j: int, lo: CommConfig, hi: CommConfig, lo_res: ProfileResult, hi_res: ProfileResult):
        """Between lo (X >= Y) and hi (X < Y): the lowest-Z configuration found."""
        best = min(((lo, lo_res), (hi, hi_res)), key=lambda t: t[1].makespan_s)
        for _ in range(refine_steps):
            mid = _midpoint(lo, hi, space)
            if mid in (lo, hi):
                break
            res = count(_with(configs, j, mid))
            steps.append(TuneStep(j, mid, res, decision="refine: bisect the X = Y crossing"))
            if res.makespan_s < best[1].makespan_s * (1 - 1e-12):
                best = (mid, res)
            if res.comm_time_s < res.compute_time_s:
                hi = mid
            else:
                lo = mid
        return best

    def pattern_search(j: int, cfg: CommConfig, res: ProfileResult, budget: int = 48):
        """Local search on Z around cfg, one knob at a time (at most ``budget`` profiles)."""
        stop = count.n + budget
        for factor in (2.0, math.sqrt(2.0)):
            improved = True
            while improved and count.n < stop:
                improved = False
                for knob in ("channels", "chunk_bytes", "threads"):
                    for f in (factor, 1.0 / factor):
                        cand = _scaled(cfg, knob, f, space)
                        if cand == cfg:
                            continue
                        r = count(_with(configs, j, cand))
                        if r.makespan_s < res.makespan_s * (1 - 1e-9):
                            cfg, res, improved = cand, r, True
                            steps.append(TuneStep(j, cand, r, decision=f"polish: {knob} x{f:.2f} kept"))
                            break
        return cfg, res

    h = [INITIAL_H] * n
    lr = [initial_lr] * n
    initialized = [False] * n
    done = [False] * n
    while not all(done):
        # Algorithm 1 line 5: the unfinished collective with the smallest H (ties: not yet
        # initialised first, then the first in stream order)
        j = min((i for i in range(n) if not done[i]), key=lambda i: (initialized[i], h[i], i))
        first = not initialized[j]
        cand = minimum_config(configs[j], space) if first else step_config(configs[j], lr[j], space)
        if cand == configs[j] and not first:  # every knob at its maximum: nothing left to give
            done[j] = True
            steps.append(TuneStep(j, cand, current, h[j], lr[j], "done: knobs at maximum"))
            continue
        res = current if cand == configs[j] else count(_with(configs, j, cand))
        initialized[j] = True
        x_old, x_new = current.comm_times_s[j], res.comm_times_s[j]
        hidden = res.comm_time_s < res.compute_time_s  # X' < Y' (§3.4 condition 2)
        gain = (x_old - x_new) / x_new if x_new > 0 else 0.0
        if first:
            # Algorithm 2 lines 2-3: start from the minimums (no previous time to compare)
            if hidden:
                done[j] = True
                keep_new = res.makespan_s <= current.makespan_s * (1 + 1e-12)
                decision = "done: X < Y at minimum resources" + ("" if keep_new else " (kept start: lower Z)")
            else:
                keep_new, decision = True, "initialised to minimums"
            if keep_new:
                configs[j], current = cand, res
            steps.append(TuneStep(j, cand, res, h[j], lr[j], decision))
            continue
        if hidden:
            # Algorithm 2 lines 7-8, condition X' < Y': finished at the crossing
            done[j] = True
            was_hidden = current.comm_time_s < current.compute_time_s
            steps.append(TuneStep(j, cand, res, h[j], lr[j], "done: X < Y"))
            if was_hidden:  # X was already under Y (another collective's move): keep lower Z
                if res.makespan_s < current.makespan_s * (1 - 1e-12):
                    configs[j], current = cand, res
            else:
                configs[j], current = bisect(j, configs[j], cand, current, res)
            continue
        if gain <= min_gain:
            # Algorithm 2 lines 7-8, condition "reached its optimum": keep the lower-Z of the
            # last two profiled configurations
            done[j] = True
            keep_new = res.makespan_s < current.makespan_s * (1 - 1e-12)
            why = "communication stopped improving" if gain <= 0 else f"gain {gain:.2%} <= {min_gain:.1%}"
            steps.append(TuneStep(j, cand, res, h[j], lr[j],
                                  f"done: {why}; kept {'new' if keep_new else 'previous'} (lower Z)"))
            if keep_new:
                configs[j], current = cand, res
            continue
        # Algorithm 2 line 11: lr from the relative improvement; Algorithm 1 line 11: update H
        h[j] = metric_h(current.compute_time_s, res.compute_time_s, x_old, x_new)
        lr[j] = min(max_lr, gain)
        configs[j], current = cand, res
        steps.append(TuneStep(j, cand, res, h[j], lr[j], "stepped"))
    if polish:
        for j in range(n):
            configs[j], current = pattern_search(j, configs[j], current)
    note = ""
    if count.best is not None and count.best[1].makespan_s < current.makespan_s * (1 - 1e-12):
        # every profile measured a whole configuration set: never return worse than the best seen
        configs, current = list(count.best[0]), count.best[1]
        note = "returned the best configuration set profiled during the search"
    return TuneResult("lagom", configs, current, count.n, steps, time.perf_counter() - t0, note=note)


# ----------------------------------------------------------------------------- AutoCCL-style baseline

def _grid(space: TuningSpace, level: int) -> tuple[list[int], list[int], list[int]]:
    """NC, NT, C candidate lists, finest at level 0."""
    nc_all = [v for v in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
              if space.nc_min <= v <= space.nc_max]
    nc_pow = [v for v in nc_all if v & (v - 1) == 0]
    nt_all = [v for v in (64, 128, 256, 512, 640, 1024) if space.nt_min <= v <= space.nt_max]
    ch_all = [space._chunk(v) for v in (16 * KiB * 2**i for i in range(12)) if space.chunk_min <= v <= space.chunk_max]
    if level == 0:
        return nc_all, nt_all, ch_all
    if level == 1:
        return nc_all, [], ch_all
    if level == 2:
        return nc_all, [], ch_all[::2]
    if level == 3:
        return nc_pow, [], ch_all[::2]
    if level == 4:
        return nc_pow, [], ch_all[::4]
    return nc_pow[::2], [], ch_all[::4]


def autoccl_tune(group: OverlapGroup, profiler: Profiler, *, start: Sequence[CommConfig] | None = None,
                 space: TuningSpace | None = None, rounds: int = 3,
                 progress: ProgressFn | None = None) -> TuneResult:
    """AutoCCL-style tuning (lagom §2.2, eq. 2): each collective in turn is tuned for **its own
    time** ``x_j`` (measured online, in the group, so contention is included) by coordinate
    descent: the (algorithm, protocol) subspace, then NC, NT and C over a grid, one knob at a
    time with the others fixed, keeping any strictly faster value; rounds repeat until nothing
    improves. Ignores what the configuration costs the computation (Y) — the behaviour lagom
    §4.2-4.3 shows hurting compute-bound overlap. Returns configs, profile and profile count.
    """
    t0 = time.perf_counter()
    space = space or TuningSpace()
    n = group.n_collectives
    configs = [space.clamp(c) for c in (list(start) if start is not None else nccl_default_configs(group))]
    nc_vals, nt_vals, ch_vals = _grid(space, 0)
    count = _Counter(profiler, progress, "autoccl", total=n * (len(nc_vals) + len(nt_vals) + len(ch_vals) + 4))
    steps: list[TuneStep] = []
    current = count(configs)
    steps.append(TuneStep(-1, None, current, decision="start"))
    for j, coll in enumerate(group.collectives):
        impls = implementation_candidates(coll.spec, group.cluster, space)
        for _ in range(rounds):
            improved = False
            for axis in range(4):
                # each axis is built around the current best (earlier axes may have moved it)
                if axis == 0:
                    cands = [replace(configs[j], algorithm=a, protocol=p) for a, p in impls]
                elif axis == 1:
                    cands = [replace(configs[j], channels=v) for v in nc_vals]
                elif axis == 2:
                    cands = [replace(configs[j], threads=v) for v in nt_vals]
                else:
                    cands = [replace(configs[j], chunk_bytes=v) for v in ch_vals]
                for cand in cands:
                    if cand == configs[j]:
                        continue
                    res = count.maybe(_with(configs, j, cand))
                    if res is None:
                        continue
                    if res.comm_times_s[j] < current.comm_times_s[j] * (1 - 1e-9):
                        configs[j], current, improved = cand, res, True
                        steps.append(TuneStep(j, cand, res, decision="faster: kept"))
            if not improved:
                break
    return TuneResult("autoccl", configs, current, count.n, steps, time.perf_counter() - t0)


# ----------------------------------------------------------------------------- exhaustive

def exhaustive_grid(space: TuningSpace, n_collectives: int, max_profiles: int,
                    base: CommConfig | None = None) -> list[CommConfig] | None:
    """The finest per-collective grid of (NC, NT, C) whose joint size ``k^N`` fits in
    ``max_profiles``, as configurations derived from ``base`` (its algorithm, protocol and
    NT when NT is not gridded); ``None`` when even the coarsest does not fit."""
    base = space.clamp(base or CommConfig())
    for level in range(6):
        nc_vals, nt_vals, ch_vals = _grid(space, level)
        nts = nt_vals or [base.threads]
        k = len(nc_vals) * len(nts) * len(ch_vals)
        if k ** n_collectives <= max_profiles:
            return [replace(base, channels=a, threads=b, chunk_bytes=c)
                    for a in nc_vals for b in nts for c in ch_vals]
    return None


def exhaustive_tune(group: OverlapGroup, profiler: Profiler, *, base: Sequence[CommConfig] | None = None,
                    space: TuningSpace | None = None, max_profiles: int = 20000,
                    progress: ProgressFn | None = None) -> TuneResult:
    """Every combination of a discretised (NC, NT, C) per collective (:func:`exhaustive_grid`),
    keeping the lowest makespan Z (eq. 1) — the ``O(k^N)`` search lagom §2.3/§3.1 calls
    intractable, feasible for 1-3 collectives. Algorithm and protocol stay those of ``base``
    (default: NCCL's defaults). ConfigError if ``k^N`` exceeds ``max_profiles`` even on the
    coarsest grid."""
    t0 = time.perf_counter()
    space = space or TuningSpace()
    n = group.n_collectives
    base = list(base) if base is not None else nccl_default_configs(group)
    grids = [exhaustive_grid(space, n, max_profiles, b) for b in base]
    if any(g is None for g in grids):
        raise ConfigError(f"exhaustive search over {n} collectives does not fit in {max_profiles} profiles")
    total = math.prod(len(g) for g in grids)
    count = _Counter(profiler, progress, "exhaustive", total=total)
    best: tuple[float, list[CommConfig], ProfileResult] | None = None
    for combo in itertools.product(*grids):
        res = count.maybe(combo)
        if res is None:
            continue
        if best is None or res.makespan_s < best[0] * (1 - 1e-12):
            best = (res.makespan_s, list(combo), res)
    if best is None:
        raise ConfigError("exhaustive search: no configuration could be profiled")
    k = len(grids[0])
    return TuneResult("exhaustive", best[1], best[2], count.n, [], time.perf_counter() - t0,
                      note=f"{k} configurations per collective, {total} combinations")


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

    def as_dict(self) -> dict:
        return {
            "group": self.group.describe(),
            "collectives": [c.name for c in self.group.collectives],
            "results": {k: v.as_dict() for k, v in self.results.items()},
            "seconds": self.seconds,
        }


def tune_group(group: OverlapGroup, cost=None, *, profiler: Profiler | None = None,
               space: TuningSpace | None = None, default_fn: Callable | None = None,
               exhaustive: bool | None = None, max_exhaustive_profiles: int = 20000,
               progress: ProgressFn | None = None) -> GroupTuning:
    """Run NCCL's defaults, AutoCCL-style tuning, Lagom and (``exhaustive=None``: when it fits
    ``max_exhaustive_profiles``) exhaustive search on ``group``; makespans in seconds.

    ``profiler`` defaults to a :class:`SimulatedProfiler` under ``cost`` (default: the cost
    model of the group's cluster). Each method gets a fresh profile count.
    """
    t0 = time.perf_counter()
    space = space or TuningSpace()
    if profiler is None:
        if cost is None:
            from ccoverlap.cost import CostModel
            from ccoverlap.cost.params import default_params

            cost = CostModel(group.cluster, default_params(group.cluster.gpu))
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
