"""Fit the cost model's parameters to measurements, and check it on held-back ones (numpy, scipy).

The model functions here *are* the cost model: each predicts a measured quantity with the
functions of :mod:`ccoverlap.cost` (``gemm_time_s``, ``compute_time_under_s``, ...) under a
candidate :class:`~ccoverlap.cost.params.CostParams`, so what is fitted is exactly what
``plan`` / ``simulate`` use. No torch: this runs on any machine, on a calibration file's
raw measurements.

Observations (one record of :mod:`.microbench` gives one or two), fitted as
``log(predicted) − log(measured)`` by bounded least squares (:func:`least_squares`, scipy's
trust-region reflective solver):

===============  ==========================================  ================================
group            quantity (model)                              fitted CostParams fields
===============  ==========================================  ================================
copy_sm          SM copy time: bytes / (B̄·mem_bw_fraction)    mem_bw_fraction,
                 + launch overhead                              kernel_launch_overhead_s
copy_ce          copy-engine copy time (comm.copy_time_s)       dma_engine_bytes_per_s,
                                                                host_link_bytes_per_s,
                                                                dma_copy_latency_s
gemm             GEMM time: tiles, waves (lagom eq. 5), per-    gemm_peak_fraction,
                 wave max(θ, D/B) (eq. 6), K-step prologue,     gemm_small_tile_efficiency,
                 smaller tiles (size-dependent efficiency)      gemm_tile_overhead_ksteps,
                                                                gemm_mem_overlap, tile shape
sm_victim        victim slowdown beside the NC/NT/C copy:       comm_sm_fraction_per_channel,
                 λ − NC·f SMs (eq. 5), B̄ − V (eq. 6),           nt_contention_coeff,
                 L2 pollution by NC·C in-flight bytes           comm_hbm_bytes_per_wire_byte,
                                                                l2_inflight_chunks,
                                                                l2_pollution_penalty,
                                                                mem_sm_saturation_fraction
sm_copy          copy slowdown beside the victim (1 + κ·u)      comm_compute_interference
ce_victim        victim slowdown beside copy-engine copies      dma_hbm_bytes_per_wire_byte,
                 (no SMs taken; ficco §IV-D, Fig. 9 left)       dma_l2_pollution_fraction
ce_copy          copy slowdown beside the victim (Fig. 9 right) dma_compute_interference
split            decomposition loss (ficco §IV-C1, Fig. 7):     fitted with ``gemm`` (the
                 split time / whole time                        pieces are GEMMs too)
channel          channel-copy throughput over NC, NT, C        reported, not written to
                 (comm.py's channel model, HBM as the link)     ``params`` (NCCL's rate over
                                                                NVLink needs nccl-tests)
===============  ==========================================  ================================

Records are split deterministically (:func:`ccoverlap.calibrate.grids.is_held_out`); the
fit uses the training part and :func:`heldout_errors` reports the error on the rest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares as scipy_least_squares

from ccoverlap.calibrate.grids import DTYPE_BYTES, is_held_out
from ccoverlap.calibrate.sustained import sustained_fraction
from ccoverlap.catalog.hardware import ClusterSpec, GPUSpec, LinkSpec
from ccoverlap.cost import comm as cm
from ccoverlap.cost import contention as ct
from ccoverlap.cost.compute import gemm_profile, gemm_time_s, memory_time_s, split_gemm
from ccoverlap.cost.params import CostParams
from ccoverlap.errors import ConfigError
from ccoverlap.specs import CommConfig, CopySpec, GemmSpec, MemorySpec, P2PSpec

_T = TypeVar("_T")
#: a fit stage: (name, observation groups it fits, {CostParams field: (lower, upper)})
Stage = tuple[str, tuple[str, ...], dict[str, tuple[float, float]]]


@dataclass(frozen=True)
class Context:
    """The GPU the measurements come from (catalog peaks) as a one-GPU cluster, and a memo
    of stand-alone predictions keyed by (spec, params) — pure functions, so safe to reuse."""

    gpu: GPUSpec
    cluster: ClusterSpec
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def cached(self, key: tuple[Any, ...], fn: Callable[[], _T]) -> _T:
        """``fn()`` memoised under ``key`` (cleared when it grows past 200k entries)."""
        try:
            return self.memo[key]
        except KeyError:
            if len(self.memo) > 200_000:
                self.memo.clear()
            val = self.memo[key] = fn()
            return val

    def of_record(self, what: str, rec: dict[str, Any], build: Callable[[dict[str, Any]], _T]) -> _T:
        """``build(rec)`` memoised per record (by identity: records are dicts, not hashable):
        the specs a record describes are rebuilt at every step of a fit otherwise."""
        key = (what, id(rec))
        hit = self.memo.get(key)
        if hit is not None and hit[0] is rec:
            return hit[1]
        if len(self.memo) > 200_000:
            self.memo.clear()
        val = build(rec)
        self.memo[key] = (rec, val)
        return val


def make_context(gpu: GPUSpec) -> Context:
    """A :class:`Context` for ``gpu`` (the links are placeholders; nothing here crosses them)."""
    link = LinkSpec(fabric="nvswitch", bandwidth_bytes_per_s=1e11, latency_s=0.0)
    return Context(gpu, ClusterSpec(name="calibration", gpu=gpu, nodes=1, gpus_per_node=1, intra=link, inter=link))


# ----------------------------------------------------------------------------- model functions

def _victim(rec: dict[str, Any]) -> GemmSpec | MemorySpec:
    v = rec["victim"]
    if v["op"] == "gemm":
        return GemmSpec(m=int(v["m"]), n=int(v["n"]), k=int(v["k"]), dtype_bytes=DTYPE_BYTES[v["dtype"]])
    return MemorySpec(bytes=float(v["bytes"]))


def _victim_alone(spec: GemmSpec | MemorySpec, p: CostParams, ctx: Context) -> tuple[float, float]:
    """(seconds, HBM bytes/s) of a victim alone, as CostModel.profile computes them."""

    def compute() -> tuple[float, float]:
        if isinstance(spec, GemmSpec):
            t, d = gemm_profile(spec, ctx.gpu, p)
            return t, d / t
        t = memory_time_s(spec, ctx.gpu, p)
        return t, spec.bytes / t

    return ctx.cached(("alone", spec, p), compute)


def _sm_comm(rec: dict) -> P2PSpec:
    """The channel-copy kernel as the cost model's SM-driven transfer with its NC, NT, C."""
    return P2PSpec(bytes=float(rec["copy_bytes"]), inter_node=False, transport="sm",
                   config=CommConfig(channels=int(rec["nc"]), threads=int(rec["nt"]),
                                     chunk_bytes=int(rec["chunk_bytes"])))


def _ce_comm(rec: dict[str, Any]) -> P2PSpec | CopySpec:
    """A copy-engine copy: d2d as a DMA transfer (so ``dma_hbm_bytes_per_wire_byte`` applies, as
    for DMA collectives), h2d / d2h as the cost model's CopySpec (one HBM byte per byte)."""
    if rec["direction"] == "d2d":
        return P2PSpec(bytes=float(rec["bytes"]), inter_node=False, transport="dma")
    return CopySpec(bytes=float(rec["bytes"]), direction=rec["direction"])


def _comm_pressure(comm: P2PSpec | CopySpec, rate: float, p: CostParams, ctx: Context) -> tuple[float, float, float]:
    """(SMs held, HBM bytes/s V, L2 fraction) of a copy moving ``rate`` bytes/s (lagom eqs. 5–6)."""
    if isinstance(comm, CopySpec):
        return 0.0, rate, ct.l2_footprint_fraction(comm, ctx.cluster, p)
    return (ct.comm_sms(comm, ctx.cluster, p), rate * ct.hbm_bytes_per_wire_byte(comm, p),
            ct.l2_footprint_fraction(comm, ctx.cluster, p))


def _gemm(rec: dict[str, Any]) -> GemmSpec:
    return GemmSpec(m=int(rec["m"]), n=int(rec["n"]), k=int(rec["k"]), dtype_bytes=DTYPE_BYTES[rec["dtype"]])


def predict_gemm(rec: dict, p: CostParams, ctx: Context) -> float:
    """Seconds of a GEMM alone (lagom eqs. 4–6 via ``cost.compute.gemm_time_s``)."""
    spec = ctx.of_record("gemm", rec, _gemm)
    return ctx.cached(("gemm", spec, p), lambda: gemm_time_s(spec, ctx.gpu, p))


def split_time_s(spec: GemmSpec, ways: int, dim: str, gpu: GPUSpec, p: CostParams) -> float:
    """``cost.compute.split_gemm_time_s`` evaluated once per distinct piece: the pieces of an
    even split are equal (up to a remainder), so a 64-way split costs a few model calls."""
    return sum(n * gemm_time_s(piece, gpu, p, accumulate=acc) for (piece, acc), n in _pieces(spec, ways, dim))


@lru_cache(maxsize=4096)
def _pieces(spec: GemmSpec, ways: int, dim: str) -> tuple[tuple[tuple[GemmSpec, bool], int], ...]:
    counts: dict[tuple, int] = {}
    for i, piece in enumerate(split_gemm(spec, ways, dim)):
        key = (piece, dim == "k" and i > 0)  # K pieces after the first accumulate into C
        counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())


def predict_split(rec: dict, p: CostParams, ctx: Context) -> float:
    """Decomposition loss (ficco §IV-C1, Fig. 7): time of the ``ways`` pieces split along
    ``dim`` (M rows, or K accumulating) over the time of the whole GEMM."""
    spec = ctx.of_record("gemm", rec, _gemm)
    whole = ctx.cached(("gemm", spec, p), lambda: gemm_time_s(spec, ctx.gpu, p))
    return split_time_s(spec, int(rec["ways"]), rec["dim"], ctx.gpu, p) / whole


def predict_copy(rec: dict, p: CostParams, ctx: Context) -> float:
    """Seconds of one copy alone: SM-driven as a memory-bound kernel moving 2× the bytes
    (read + write) from HBM (the suite cycles through buffers of 4x the L2, so nothing is left
    in it), copy-engine via ``cost.comm.copy_time_s``."""
    if rec["engine"] == "sm":
        return memory_time_s(MemorySpec(bytes=2.0 * float(rec["bytes"])), ctx.gpu, p, warm_l2=False)
    return cm.copy_time_s(CopySpec(bytes=float(rec["bytes"]), direction=rec["direction"]), ctx.cluster, p)


def predict_channel(rec: dict, p: CostParams, ctx: Context) -> float:
    """Seconds of the channel-copy kernel alone, with comm.py's channel model (NC channels of
    ``channel_bytes_per_s`` soft-saturating, NT exponent, chunk efficiency) and HBM copy
    bandwidth (B̄·mem_bw_fraction / 2) standing in for the link (lagom §3.2, Fig. 3b/c)."""
    nc, nt, c, nbytes = int(rec["nc"]), int(rec["nt"]), int(rec["chunk_bytes"]), float(rec["bytes"])
    line = ctx.gpu.hbm_bytes_per_s * p.mem_bw_fraction / 2.0 / p.link_efficiency("nvswitch")
    bw = cm.effective_link_bandwidth(line, "nvswitch", nc, nt, "simple", p)
    eta = cm.chunk_efficiency(nbytes / nc, c, bw / nc, "simple", p)
    return nbytes / (bw * eta) + p.kernel_launch_overhead_s


def predict_sm_victim(rec: dict, p: CostParams, ctx: Context) -> float:
    """Victim slowdown beside the channel copy (lagom eqs. 4–6): ``compute_time_under_s`` with
    the copy's SMs, its HBM demand (measured copy rate × bytes per wire byte) and L2 share,
    over the victim's time alone."""
    victim = ctx.of_record("victim", rec, _victim)
    comm = ctx.of_record("sm_comm", rec, _sm_comm)
    sms, hbm, l2 = _comm_pressure(comm, float(rec["copy_bytes"]) / float(rec["copy_alone_s"]), p, ctx)
    under = ct.compute_time_under_s(victim, ctx.gpu, p, sms_taken=sms, hbm_taken=hbm, l2_fraction=l2, sharers=1)
    return under / _victim_alone(victim, p, ctx)[0]


def predict_ce_victim(rec: dict, p: CostParams, ctx: Context) -> float:
    """Victim slowdown beside copy-engine copies (ficco §IV-D1, Fig. 9 left): no SMs taken,
    bandwidth and (less) L2 still shared."""
    victim = ctx.of_record("victim", rec, _victim)
    sms, hbm, l2 = _comm_pressure(ctx.of_record("ce_comm", rec, _ce_comm), float(rec["bytes"]) / float(rec["copy_alone_s"]), p, ctx)
    under = ct.compute_time_under_s(victim, ctx.gpu, p, sms_taken=sms, hbm_taken=hbm, l2_fraction=l2, sharers=1)
    return under / _victim_alone(victim, p, ctx)[0]


def _copy_slowdown(rec: dict[str, Any], comm: P2PSpec | CopySpec, nbytes: float, p: CostParams, ctx: Context, dma: bool) -> float:
    _, hbm, _ = _comm_pressure(comm, nbytes / float(rec["copy_alone_s"]), p, ctx)
    other = _victim_alone(ctx.of_record("victim", rec, _victim), p, ctx)[1]
    return ct.comm_time_under_s(1.0, hbm, other, 1, ctx.gpu, p, dma=dma)


def predict_sm_copy(rec: dict, p: CostParams, ctx: Context) -> float:
    """Channel-copy slowdown beside the victim (ficco §IV-D2): ``comm_time_under_s`` ratio."""
    return _copy_slowdown(rec, ctx.of_record("sm_comm", rec, _sm_comm), float(rec["copy_bytes"]), p, ctx, dma=False)


def predict_ce_copy(rec: dict, p: CostParams, ctx: Context) -> float:
    """Copy-engine copy slowdown beside the victim (ficco §IV-D2, Fig. 9 right)."""
    return _copy_slowdown(rec, ctx.of_record("ce_comm", rec, _ce_comm), float(rec["bytes"]), p, ctx, dma=True)


@dataclass(frozen=True)
class Observation:
    """One measured quantity of one record: ``group``, ``value`` (seconds or a ratio),
    the function predicting it, the record and whether it is held out."""

    group: str
    value: float
    predict: Callable[[dict, CostParams, Context], float]
    record: dict
    held_out: bool


def observations(records: Iterable[dict], *, every: int = 4) -> list[Observation]:
    """The fit/check observations of measurement records (uncovered overlap runs and
    non-positive values are dropped). ``every``: 1 in ``every`` records is held out."""
    out: list[Observation] = []
    for rec in records:
        kind = rec.get("kind")
        ho = is_held_out(rec, every=every)

        def add(group: str, value: float | None, fn: Callable[[dict[str, Any], CostParams, Context], float]) -> None:
            if value is not None and math.isfinite(value) and value > 0:
                out.append(Observation(group, float(value), fn, rec, ho))

        if kind == "gemm":
            add("gemm" if rec["dtype"] == "bf16" else f"gemm_{rec['dtype']}", rec["time_s"], predict_gemm)
        elif kind == "gemm_split":
            add("split", rec["time_s"] / rec["whole_s"], predict_split)
        elif kind == "copy" and rec["direction"] in ("d2d", "h2d", "d2h"):  # peer copies: kept, not modelled
            add("copy_sm" if rec["engine"] == "sm" else "copy_ce", rec["time_s"], predict_copy)
        elif kind == "channel_copy":
            add("channel", rec["time_s"], predict_channel)
        elif kind in ("sm_contention", "ce_contention"):
            pre = "sm" if kind == "sm_contention" else "ce"
            if rec.get("covered_victim", True):
                add(f"{pre}_victim", rec["victim_s"] / rec["victim_alone_s"],
                    predict_sm_victim if pre == "sm" else predict_ce_victim)
            if rec.get("covered_copy", True):
                add(f"{pre}_copy", rec["copy_s"] / rec["copy_alone_s"],
                    predict_sm_copy if pre == "sm" else predict_ce_copy)
    return out


# ----------------------------------------------------------------------------- least squares

@dataclass
class LSQResult:
    """Result of :func:`least_squares`: ``x`` (best point), ``cost`` (½Σr²), ``stderr``
    (linearised standard errors of x, NaN where not identifiable), ``iterations``."""

    x: np.ndarray
    cost: float
    stderr: np.ndarray
    iterations: int


def least_squares(residuals: Callable[[np.ndarray], np.ndarray], x0: npt.ArrayLike, lo: npt.ArrayLike,
                  hi: npt.ArrayLike, *,
                  max_iter: int = 60, tol: float = 1e-9) -> LSQResult:
    """Minimise ½‖r(x)‖² for ``lo ≤ x ≤ hi`` (each bound finite) with scipy's bounded
    trust-region reflective solver (``scipy.optimize.least_squares``, method ``trf``).

    The parameters span 1e-8 s overheads to 1e12 B/s bandwidths, so the solver works on
    z = (x − lo) / (hi − lo) in the unit box, where finite-difference steps and the trust
    region mean the same for every parameter. ``max_iter``: Jacobian evaluations at most;
    ``tol``: the relative change of the cost (and of z) that stops it."""
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    span = hi - lo

    def fz(z: np.ndarray) -> np.ndarray:
        return np.asarray(residuals(lo + span * z), dtype=float)

    z0 = np.clip((np.asarray(x0, float) - lo) / span, 0.0, 1.0)
    res = scipy_least_squares(fz, z0, bounds=(0.0, 1.0), method="trf", diff_step=1e-6,
                              ftol=tol, xtol=tol, gtol=tol, max_nfev=max_iter * (z0.size + 1))
    x = lo + span * res.x
    jac = np.atleast_2d(res.jac)
    dof = max(1, res.fun.size - z0.size)
    s2 = 2.0 * float(res.cost) / dof
    # linearised covariance; pinv so one flat direction does not hide the others' errors
    cov_z = np.linalg.pinv(jac.T @ jac) * s2
    stderr = np.sqrt(np.clip(np.diag(cov_z), 0, None)) * span
    stderr[np.abs(jac).sum(axis=0) == 0] = np.nan
    return LSQResult(x=x, cost=float(res.cost), stderr=stderr, iterations=int(res.njev or res.nfev))


# ----------------------------------------------------------------------------- stages

# (group(s) fitted, {CostParams field: (lower, upper)}) in fit order; later stages see the
# earlier stages' values. Bounds are physical ranges, not priors.
STAGES: tuple[Stage, ...] = (
    ("copy_sm", ("copy_sm",), {"mem_bw_fraction": (0.2, 1.0), "kernel_launch_overhead_s": (1e-8, 5e-5)}),
    ("copy_ce", ("copy_ce",), {"dma_engine_bytes_per_s": (1e9, 5e12), "host_link_bytes_per_s": (1e9, 5e11),
                               "dma_copy_latency_s": (1e-8, 1e-4)}),
    ("gemm", ("gemm", "split"), {"gemm_peak_fraction": (0.1, 1.0), "gemm_small_tile_efficiency": (0.3, 1.0),
                         "gemm_tile_overhead_ksteps": (0.0, 16.0), "gemm_mem_overlap": (0.0, 1.0)}),
    ("sm_contention", ("sm_victim",), {"comm_sm_fraction_per_channel": (0.0, 4.0),
                                       "nt_contention_coeff": (0.0, 2.0),
                                       "comm_hbm_bytes_per_wire_byte": (0.0, 8.0),
                                       # the traffic growth is bounded by losing all reuse between
                                       # thread blocks (~9-11x for 128-256-wide tiles on 84-132 SMs)
                                       "l2_inflight_chunks": (0.0, 16.0), "l2_pollution_penalty": (0.0, 12.0),
                                       "mem_sm_saturation_fraction": (0.02, 1.0)}),
    ("sm_copy", ("sm_copy",), {"comm_compute_interference": (0.0, 5.0)}),
    ("ce_contention", ("ce_victim",), {"dma_hbm_bytes_per_wire_byte": (0.0, 8.0),
                                       "dma_l2_pollution_fraction": (0.0, 1.0)}),
    ("ce_copy", ("ce_copy",), {"dma_compute_interference": (0.0, 5.0)}),
)
# Reported but not written to ``params`` (see the module docstring).
INFO_STAGES = (
    ("channel", ("channel",), {"channel_bytes_per_s": (1e8, 1e12), "channel_saturation_sharpness": (0.5, 20.0),
                               "threads_bw_exponent": (0.0, 2.0), "chunk_step_overhead_s": (0.0, 1e-4),
                               "chunk_pipeline_depth": (0.0, 8.0)}),
)
# Fields chosen by search over candidates inside their stage (see _fit_stage).
STAGE_GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    "sm_contention": {"comm_sm_fraction_per_channel": tuple(round(0.05 * i, 2) for i in range(41)),
                      "nt_contention_coeff": (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)},
}
# Tile shapes (tile_m, tile_n) and CTAs per SM tried by the GEMM stage.
TILE_CHOICES = tuple((tm, tn, t) for tm in (64, 128, 256) for tn in (64, 128, 256) if tm * tn >= 64 * 128
                     for t in (1, 2))


@dataclass
class CalibrationFit:
    """Fitted parameters (``params``: only the fields a stage fitted), the full
    :class:`CostParams` (``cost_params``), per-stage details and the observations."""

    params: dict
    cost_params: CostParams
    stages: dict = field(default_factory=dict)
    observations: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def _residual_fn(obs: list[Observation], names: list[str], base: CostParams,
                 ctx: Context) -> Callable[[Iterable[float]], np.ndarray]:
    logs = np.log([o.value for o in obs])

    def fn(x: Iterable[float]) -> np.ndarray:
        try:
            p = base.with_overrides(**dict(zip(names, (float(v) for v in x))))
            pred = np.array([o.predict(o.record, p, ctx) for o in obs])
        except Exception:  # a parameter combination the cost model rejects
            return np.full(len(obs), 1e3)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(pred) - logs
        return np.where(np.isfinite(r), r, 1e3)

    return fn


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _sensitivity(obs: list[Observation], name: str, value: float, bounds: tuple[float, float],
                 p: CostParams, ctx: Context, candidates: Sequence[float] | None = None) -> float:
    """RMS change of the log residuals when ``name`` moves ±5 % (of its value, or of its range
    at 0), or to the neighbouring ``candidates`` of a searched field: ~0 means the
    measurements do not constrain it."""
    lo, hi = bounds
    d = 0.05 * (abs(value) if value != 0 else (hi - lo))
    trial: tuple[float, ...] = (max(lo, value - d), min(hi, value + d))
    if candidates is not None:
        c = sorted(candidates)
        i = c.index(value) if value in c else int(np.argmin([abs(x - value) for x in c]))
        trial = tuple(c[j] for j in (i - 1, i + 1) if 0 <= j < len(c))
    fn = _residual_fn(obs, [name], p, ctx)
    r0 = fn([value])
    worst = 0.0
    for v in trial:
        if v != value:
            worst = max(worst, float(np.sqrt(np.mean((fn([v]) - r0) ** 2))))
    return worst


def _fit_stage(obs: list[Observation], bounds: dict[str, tuple[float, float]], base: CostParams, ctx: Context,
               grid: dict[str, tuple[float, ...]] | None = None, n_starts: int = 4) -> tuple[CostParams, dict[str, Any]]:
    """Fit one stage. Fields in ``grid`` (name -> candidate values) enter the model through
    ceilings (e.g. SMs per channel in eq. 5's wave count), where gradients are useless: they
    are chosen by search over every combination of their candidates. The continuous fields are
    fitted by bounded least squares, from the base values and ``n_starts`` seeded random points,
    under the best combination for each of the four best values of the first field; then the two alternate until the choices settle."""
    grid = dict(grid or {})
    names = [n for n in bounds if n not in grid]
    lo = np.array([bounds[n][0] for n in names])
    hi = np.array([bounds[n][1] for n in names])

    def continuous(p: CostParams, starts: list[np.ndarray]) -> tuple[CostParams, LSQResult | None]:
        if not names:
            return p, None
        fn = _residual_fn(obs, names, p, ctx)
        best = None
        for x0 in [np.clip([float(getattr(p, n)) for n in names], lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo)),
                   *starts]:
            res = least_squares(fn, x0, lo, hi)
            if best is None or res.cost < best.cost:
                best = res
        assert best is not None  # the loop ran at least once, from the base values
        return p.with_overrides(**{n: float(v) for n, v in zip(names, best.x)}), best

    def cost(p: CostParams) -> float:
        return float(np.sum(_residual_fn(obs, [], p, ctx)([]) ** 2))

    # kinks (max, min over tiles, ceilings) make local minima: round 0 tries several starts of
    # the continuous fields under each of the best few grid choices and keeps the best
    rng = np.random.default_rng(12345)
    starts = [lo + f * (hi - lo) for f in rng.uniform(0.1, 0.9, size=(n_starts, len(names)))] if names else []
    p, best = base, None
    tried = []
    for choice in _grid_choices(obs, grid, base, ctx, keep=4):
        cand, res = continuous(base.with_overrides(**choice), starts)
        tried.append((cost(cand), cand, res))
    _, p, best = min(tried, key=lambda t: t[0])
    for _ in range(3):  # then alternate until the grid choices settle
        choice = _grid_choices(obs, grid, p, ctx, keep=1)[0]
        if all(getattr(p, g) == v for g, v in choice.items()):
            break
        p, res = continuous(p.with_overrides(**choice), [])
        best = res if res is not None else best
    r = _residual_fn(obs, [], p, ctx)([])
    fitted = {n: float(getattr(p, n)) for n in bounds}
    stderr = {n: (_finite(s) if best is not None else None) for n, s in
              zip(names, best.stderr if best is not None else [])}
    stderr.update({g: None for g in grid})
    unconstrained = [n for n in bounds if _sensitivity(obs, n, fitted[n], bounds[n], p, ctx, grid.get(n)) < 1e-4]
    # the data say nothing about these: keep the base values, leave them out of ``values``
    p = p.with_overrides(**{n: getattr(base, n) for n in unconstrained})
    fitted = {n: v for n, v in fitted.items() if n not in unconstrained}
    info = {"values": fitted, "stderr": stderr, "unconstrained": unconstrained,
            "rms_log_error": float(np.sqrt(np.mean(r ** 2))) if r.size else 0.0,
            "observations": len(obs), "iterations": best.iterations if best is not None else 0}
    return p, info


def _grid_choices(obs: list[Observation], grid: dict, p: CostParams, ctx: Context, keep: int) -> list[dict]:
    """The ``keep`` best combinations of the searched fields' candidates under ``p`` (every
    combination tried jointly: one field at a time can stall where two trade off, e.g. SMs per
    channel against the NT factor), each with a different value of the first field, so that
    the continuous fit gets to start from distinct choices; ``[{}]`` when nothing is searched."""
    if not grid:
        return [{}]
    gnames = list(grid)
    combos = list(itertools.product(*(grid[g] for g in gnames)))
    fn = _residual_fn(obs, gnames, p, ctx)
    costs = np.array([float(np.sum(fn(c) ** 2)) for c in combos])
    out, seen = [], set()
    for i in np.argsort(costs, kind="stable"):  # the best combination per value of the first field
        if combos[i][0] not in seen:
            seen.add(combos[i][0])
            out.append({g: float(v) for g, v in zip(gnames, combos[i])})
        if len(out) == keep:
            break
    return out


def _fit_gemm(obs: list[Observation], bounds: dict[str, tuple[float, float]], base: CostParams, ctx: Context,
              tile_choices: Iterable[tuple[int, int, int]]) -> tuple[CostParams, dict[str, Any]]:
    """The GEMM stage, on GEMMs alone and split ones (the pieces are GEMMs too): every tile
    shape / CTAs-per-SM choice, continuous fields fitted for each (a coarse pre-fit ranks the
    choices; the three best are refined). The pre-fit fits the per-tile overhead with the peak:
    ranked with the base's overhead, a tile shape can lose to one whose wave count suits a
    wrong overhead (the true tile of a GPU 3.5 K steps from an H100 default of 8.1)."""
    coarse = []
    limits = {"gemm_peak_fraction": (0.1, 1.0), "gemm_tile_overhead_ksteps": (0.0, 16.0), **bounds}
    pre = ["gemm_peak_fraction"] + [n for n in ("gemm_tile_overhead_ksteps",) if n in bounds]
    lo, hi = [limits[n][0] for n in pre], [limits[n][1] for n in pre]
    for tm, tn, t in tile_choices:
        p0 = base.with_overrides(gemm_tile_m=tm, gemm_tile_n=tn, gemm_tiles_per_sm=t)
        fn = _residual_fn(obs, pre, p0, ctx)
        x0 = [min(max(float(getattr(p0, n)), a), b) for n, a, b in zip(pre, lo, hi)]
        res = least_squares(fn, x0, lo, hi, max_iter=15)
        coarse.append((res.cost, (tm, tn, t)))
    coarse.sort()
    best = None
    for _, (tm, tn, t) in coarse[:3]:
        p0 = base.with_overrides(gemm_tile_m=tm, gemm_tile_n=tn, gemm_tiles_per_sm=t)
        p, info = _fit_stage(obs, bounds, p0, ctx)
        if best is None or info["rms_log_error"] < best[1]["rms_log_error"]:
            info["values"].update(gemm_tile_m=tm, gemm_tile_n=tn, gemm_tiles_per_sm=t)
            best = (p, info)
    if best is None:
        raise ConfigError("tile_choices: no (tile_m, tile_n, tiles_per_sm) choice to fit the GEMM stage with")
    return best


def _per_dtype_peak(obs: list[Observation], p: CostParams, ctx: Context) -> dict:
    """gemm_peak_fraction refitted per non-bf16 dtype with the bf16 structure fixed (CostParams
    has one fraction for all dtypes; this shows how far fp16 / fp32 are from it)."""
    out = {}
    for group in sorted({o.group for o in obs if o.group.startswith("gemm_")}):
        sel = [o for o in obs if o.group == group and not o.held_out]
        if len(sel) >= 2:
            res = least_squares(_residual_fn(sel, ["gemm_peak_fraction"], p, ctx), [p.gemm_peak_fraction], [0.02], [1.0])
            out[group.removeprefix("gemm_")] = float(res.x[0])
    return out


def fit(records: list[dict], gpu: GPUSpec, base: CostParams, *, every: int = 4,
        tile_choices: Iterable[tuple[int, int, int]] = TILE_CHOICES, stages: Sequence[Stage] = STAGES,
        info_stages: Sequence[Stage] = INFO_STAGES) -> CalibrationFit:
    """Fit the cost model to ``records`` measured on ``gpu``, stage by stage (:data:`STAGES`),
    starting from ``base`` (e.g. ``default_params(gpu)``), on the records not held out.
    A stage without training observations keeps the base values and adds a note."""
    ctx = make_context(gpu)
    obs = observations(records, every=every)
    p = base
    params: dict = {}
    result = CalibrationFit(params=params, cost_params=base, observations=obs)
    for name, groups, bounds in tuple(stages) + tuple(info_stages):
        train = [o for o in obs if o.group in groups and not o.held_out]
        informational = name in {s[0] for s in info_stages}
        if len(train) < len(bounds) + 1:
            result.notes.append(f"{name}: {len(train)} training observation(s), too few to fit "
                                f"{len(bounds)} parameter(s); kept the defaults")
            continue
        if name == "gemm":
            p_new, info = _fit_gemm(train, bounds, p, ctx, tile_choices)
            info["peak_fraction_by_dtype"] = _per_dtype_peak(obs, p_new, ctx)
        else:
            p_new, info = _fit_stage(train, bounds, p, ctx, STAGE_GRIDS.get(name))
        for n in info.get("unconstrained", []):
            result.notes.append(f"{name}: {n} is not constrained by these measurements; kept {getattr(p, n):.4g}")
        info["written_to_params"] = not informational
        result.stages[name] = info
        if not informational:
            p = p_new
            params.update(info["values"])
    result.cost_params = p

    add_sustained_clock(records, result)
    return result


# ----------------------------------------------------------------------------- checking

def heldout_errors(result: CalibrationFit, gpu: GPUSpec, *, held_out: bool = True) -> list[dict]:
    """Per group, the relative error |pred/meas − 1| of the fitted model on held-out
    observations (``held_out=False``: on the training ones): n, median, 90th percentile, max."""
    ctx = make_context(gpu)
    rows = []
    groups = sorted({o.group for o in result.observations})
    for group in groups:
        sel = [o for o in result.observations if o.group == group and o.held_out == held_out]
        if not sel:
            continue
        params = result.cost_params
        if group == "channel" and "channel" in result.stages:
            params = params.with_overrides(**result.stages["channel"]["values"])
        errs = np.array([abs(o.predict(o.record, params, ctx) / o.value - 1.0) for o in sel])
        rows.append({"group": group, "n": len(sel), "median_rel_err": float(np.median(errs)),
                     "p90_rel_err": float(np.percentile(errs, 90)), "max_rel_err": float(errs.max())})
    return rows


def overall_error(rows: list[dict]) -> float | None:
    """Observation-weighted mean of the groups' median relative errors (one number for the
    file's ``fit_error``), or None without rows."""
    n = sum(r["n"] for r in rows)
    return sum(r["median_rel_err"] * r["n"] for r in rows) / n if n else None


def decomposition_table(result: CalibrationFit, gpu: GPUSpec) -> list[dict]:
    """ficco Fig. 7 rows: measured vs predicted decomposition loss per (shape, dim, ways), and
    whether the row was used by the fit (``set``: ``fit`` or ``held-out``)."""
    ctx = make_context(gpu)
    rows = []
    for o in result.observations:
        if o.group == "split":
            r = o.record
            rows.append({"name": r.get("name", ""), "m": r["m"], "n": r["n"], "k": r["k"], "dim": r["dim"],
                         "ways": r["ways"], "measured": o.value,
                         "predicted": o.predict(r, result.cost_params, ctx),
                         "set": "held-out" if o.held_out else "fit"})
    return rows


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A plain-text table: ``columns`` are (key, header, format spec)."""
    cells = [[h for _, h, _ in columns]] + [[format(r[k], f) if f else str(r[k]) for k, _, f in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c[i].rjust(widths[i]) if i else c[i].ljust(widths[i]) for i in range(len(columns)))
             for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def add_sustained_clock(records: list[dict[str, Any]], result: CalibrationFit) -> None:
    """Put the ``sustained`` section's clock share into a calibration fit's parameters
    (``result``: :class:`ccoverlap.calibrate.fit.CalibrationFit`) and its evidence into
    ``result.stages["sustained"]`` -- not into ``result.cost_params``: the other sections ran
    on a cool GPU, and their held-out check is judged at the clock they were measured at."""
    info, notes = sustained_fraction(records)
    result.notes.extend(notes)
    if info is not None:
        value = info["sustained_clock_fraction"]
        result.stages["sustained"] = {"values": {"sustained_clock_fraction": value}, "evidence": info,
                                      "written_to_params": True}
        result.params["sustained_clock_fraction"] = value
