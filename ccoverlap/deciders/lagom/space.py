"""The NCCL configuration space searched by the tuners, search records, and the baselines
Lagom is compared with (lagom §2.2, §4): NCCL's defaults, AutoCCL-style tuning of every
collective for its own speed, and exhaustive search over a discretised space.

A configuration is a :class:`~ccoverlap.specs.CommConfig` ``s_j = (algorithm, protocol, NC,
NT, C)`` (lagom Table 1). Every search here works through a
:class:`~ccoverlap.nccl.profile.Profiler` and counts its profiling steps. No torch.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ccoverlap.config import short
from ccoverlap.cost.comm import ll128_enabled
from ccoverlap.errors import ConfigError
from ccoverlap.nccl.groups import OverlapGroup, require_group
from ccoverlap.nccl.profile import Profiler, ProfileResult
from ccoverlap.specs import CollectiveSpec, CommConfig
from ccoverlap.types import ProgressFn

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.specs import CommProtocol

__all__ = [
    "TuningSpace",
    "TuneStep",
    "TuneResult",
    "config_dict",
    "nccl_default_configs",
    "implementation_candidates",
    "autoccl_tune",
    "exhaustive_grid",
    "exhaustive_tune",
]

KiB = 1 << 10
MiB = 1 << 20



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
    protocols: tuple[CommProtocol, ...] = ("simple", "ll128", "ll")
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
        """Z of the chosen configurations (lagom eq. 1), seconds."""
        return self.result.makespan_s

    def to_dict(self) -> dict:
        """Plain-data form: Z, X, Y, x_j in seconds, profile count, configurations."""
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


class ProfileCounter:
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
        """Profile, or None when the cost model rejects the configuration (ConfigError)."""
        try:
            return self(configs)
        except ConfigError:
            return None


def with_config(configs: Sequence[CommConfig], j: int, cfg: CommConfig) -> list[CommConfig]:
    """A copy of ``configs`` with collective ``j``'s configuration replaced by ``cfg``."""
    out = list(configs)
    out[j] = cfg
    return out


# ----------------------------------------------------------------------------- defaults / implementations

def start_configs(method: str, group: OverlapGroup, profiler: Profiler, start: Sequence[CommConfig] | None,
                  space: TuningSpace) -> list[CommConfig]:
    """The configurations a search (``method``: ``lagom``, ``autoccl``) starts from, clamped to
    ``space``: ``start`` (one CommConfig per collective of ``group``), default NCCL's
    defaults. ConfigError naming what is wrong when ``group`` is not an OverlapGroup,
    ``profiler`` has no ``profile`` method or ``start`` is not one CommConfig per collective."""
    require_group(group, method)
    if not callable(getattr(profiler, "profile", None)):
        raise ConfigError(f"{method}: profiler must have a profile(configs) method (a SimulatedProfiler), "
                          f"got {type(profiler).__name__}")
    if start is not None and (isinstance(start, (str, bytes)) or not isinstance(start, Sequence)
                              or not all(isinstance(c, CommConfig) for c in start)):
        raise ConfigError(f"{method}: start must be a list of CommConfig, one per collective, got {short(start)}")
    configs = list(start) if start is not None else nccl_default_configs(group)
    if len(configs) != group.n_collectives:
        raise ConfigError(f"{method}: {len(configs)} starting configurations for {group.n_collectives} collectives")
    return [space.clamp(c) for c in configs]


def nccl_default_configs(group: OverlapGroup,
                         default_fn: Callable[[CollectiveSpec, ClusterSpec], CommConfig] | None = None
                         ) -> list[CommConfig]:
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


def implementation_candidates(spec: CollectiveSpec, cluster: ClusterSpec, space: TuningSpace
                              ) -> list[tuple[str, CommProtocol]]:
    """(algorithm, protocol) pairs worth profiling for ``spec`` (AutoCCL's implementation
    subspaces, lagom §2.2): NCCL's algorithms valid for the collective (tree only for
    all-reduce, pairwise only for all-to-all, ring otherwise) x protocols, LL128 only where
    NCCL enables it (:func:`ccoverlap.cost.comm.ll128_enabled`: tested GPUs, NVLink rings)."""
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
    ll128_ok = ll128_enabled(spec.group, cluster)
    protos = [p for p in space.protocols if p != "ll128" or ll128_ok]
    return [(a, p) for a in algs for p in protos]


def choose_implementations(group: OverlapGroup, count: ProfileCounter, configs: list[CommConfig],
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
            res = count.maybe(with_config(configs, j, cand))
            if res is None:
                continue
            better = res.comm_times_s[j] < best_x * (1 - 1e-9)
            steps.append(TuneStep(j, cand, res, decision="implementation kept" if better else "implementation rejected"))
            if better:
                configs[j], current, best_x = cand, res, res.comm_times_s[j]
    return configs, current


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
    configs = start_configs("autoccl", group, profiler, start, space)
    n = group.n_collectives
    nc_vals, nt_vals, ch_vals = _grid(space, 0)
    count = ProfileCounter(profiler, progress, "autoccl", total=n * (len(nc_vals) + len(nt_vals) + len(ch_vals) + 4))
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
                    res = count.maybe(with_config(configs, j, cand))
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
    assert base.threads is not None  # clamp sets every knob
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
    grids: list[list[CommConfig]] = []
    for b in base:
        grid = exhaustive_grid(space, n, max_profiles, b)
        if grid is None:
            raise ConfigError(f"exhaustive search over {n} collectives does not fit in {max_profiles} profiles")
        grids.append(grid)
    total = math.prod(len(g) for g in grids)
    count = ProfileCounter(profiler, progress, "exhaustive", total=total)
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
