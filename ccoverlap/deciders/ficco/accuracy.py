"""FiCCO's heuristic against the estimator: the paper's 16 scenarios, a synthetic sweep, and
how often the §V-C pick is the estimator's fastest schedule (FiCCO §VI-D), with the speedup lost
when it is not. Re-exported by :mod:`ccoverlap.deciders.ficco.schedules`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ccoverlap.catalog.hardware import ClusterSpec
from ccoverlap.deciders.ficco.heuristic import FICCO_SCHEDULES
from ccoverlap.deciders.ficco.schedules import (
    SCHEDULES,
    FiccoCase,
    ScheduleEstimate,
    best_schedule,
    estimate_all,
    heuristic_pick,
    machine,
)
from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    from ccoverlap.sim.simulator import SupportsDuration

__all__ = ["PAPER_SCENARIOS", "per_rank_gemm", "SWEEP_M", "SWEEP_N", "SWEEP_K", "paper_cases", "synthetic_cases", "CaseVerdict",
           "AccuracyReport", "RUN_TO_RUN_VARIATION", "judge", "accuracy", "rejudge", "fit_heuristic", "FIT_REFERENCE_TIMES_S",
           "FIT_UNFUSED_FACTORS"]


#: FiCCO §IV-B, Table I, verbatim: (name, parallelism, model, (M, N, K)). N is the layer's full
#: width (llama-3-405b: QKV 18432 = 16384 + 2 x 8 KV heads x 128, fused gate+up 106496 = 2 x 53248;
#: llama-2-70b: QKV 10240, gate+up 57344), not what one GPU computes: see :func:`per_rank_gemm`.
PAPER_SCENARIOS: tuple[tuple[str, str, str, tuple[int, int, int]], ...] = (
    ("g1", "SP+TP", "llama-3-405b", (16384, 16384, 131072)),
    ("g2", "SP+TP", "llama-3-405b", (131072, 16384, 16384)),
    ("g3", "SP+TP", "llama-3-405b", (53248, 16384, 131072)),
    ("g4", "SP+TP", "llama-3-405b", (131072, 53248, 16384)),
    ("g5", "SP+TP", "llama-2-70b", (8192, 8192, 262144)),
    ("g6", "SP+TP", "llama-2-70b", (262144, 8192, 8192)),
    ("g7", "SP+TP", "llama-2-70b", (28672, 8192, 262144)),
    ("g8", "SP+TP", "llama-2-70b", (262144, 28672, 8192)),
    ("g9", "SP+TP", "llama-3-405b", (196608, 18432, 16384)),
    ("g10", "SP+TP", "llama-3-405b", (196608, 106496, 16384)),
    ("g11", "SP+TP", "llama-2-70b", (1048576, 10240, 8192)),
    ("g12", "SP+TP", "llama-2-70b", (1048576, 57344, 8192)),
    ("g13", "EP", "DeepSeek", (1607680, 57344, 8192)),
    ("g14", "EP", "Mixtral", (147456, 28672, 4096)),
    ("g15", "EP", "Mixtral", (327680, 28672, 4096)),
    ("g16", "EP", "Mixtral", (229376, 28672, 4096)),
)


def per_rank_gemm(parallelism: str, mnk: tuple[int, int, int], world: int) -> tuple[int, int, int]:
    """The GEMM one GPU runs for a Table I row, ``(M, N, K)`` in elements.

    SP+TP (tensor-sequence parallelism, §II-B, Fig. 3(a)): every GPU holds a row slice of the
    input and a *column slice* of the weight, so after the all-gather it multiplies all ``M``
    rows by ``N / world`` columns. Table I lists the layers' full widths (the QKV width 18432 of
    llama-3-405b is the whole projection), so a TP-8 rank runs ``N / 8``. This is also the only
    reading under which Table I's GEMM/communication time ratios fall on both sides of 1, as the
    bell curve of Fig. 13 (§VI-B) needs. EP (§IV-B2): tokens are exchanged all-to-all and each
    GPU runs whole experts, so ``N`` is the expert's full width and ``M`` the rows it receives.
    Raises ConfigError when ``N`` does not split evenly over ``world`` ranks.
    """
    m, n, k = mnk
    if parallelism == "EP":
        return m, n, k
    if parallelism != "SP+TP":
        raise ConfigError(f"Table I parallelism must be 'SP+TP' or 'EP', got {parallelism!r}")
    if n % world:
        raise ConfigError(f"N={n} does not split over {world} tensor-parallel ranks")
    return m, n // world, k


def paper_cases(cluster: ClusterSpec | None = None, engine: str = "dma", world: int = 8) -> list[FiccoCase]:
    """The 16 scenarios of FiCCO Table I (§IV-B) as the GEMM each GPU runs (:func:`per_rank_gemm`):
    SP+TP ones as all-gather + GEMM, EP ones as all-to-all + GEMM; by default on the paper's
    machine (8 x MI300X, full mesh, DMA communication, §IV-B1)."""
    cl = cluster or machine("MI300X", "full_mesh", world)
    out = []
    for name, par, _model, mnk in PAPER_SCENARIOS:
        m, n, k = per_rank_gemm(par, mnk, world)
        out.append(FiccoCase(m=m, n=n, k=k, world=world, cluster=cl, engine=engine, name=name,
                             pattern="a2a-gemm" if par == "EP" else "ag-gemm"))
    return out


#: The synthetic sweep's sizes: a log grid spanning Table I's OTB and memory-traffic range.
SWEEP_M = (8192, 32768, 131072, 524288)
SWEEP_N = (4096, 16384, 57344)
SWEEP_K = (4096, 16384, 65536)


def synthetic_cases(cluster: ClusterSpec | None = None, engine: str = "dma", world: int = 8,
                    pattern: str = "ag-gemm") -> list[FiccoCase]:
    """A synthetic sweep (FiCCO §VI-D evaluates 16 unseen shapes "with diverse OTB and MT";
    here the 36-point grid ``SWEEP_M x SWEEP_N x SWEEP_K``), on the paper machine by default."""
    cl = cluster or machine("MI300X", "full_mesh", world)
    return [FiccoCase(m=m, n=n, k=k, world=world, cluster=cl, engine=engine, pattern=pattern,
                      name=f"s{m // 1024}k-{n // 1024}k-{k // 1024}k")
            for m in SWEEP_M for n in SWEEP_N for k in SWEEP_K]


#: FiCCO §IV-A: "We observe variations in execution times of the same operation within the same
#: GPU and across GPUs. However, we find that this variation is within 6%". A pick whose loss is
#: below it cannot be told from the best by a measurement like the paper's.
RUN_TO_RUN_VARIATION = 0.06


@dataclass(frozen=True, kw_only=True)
class CaseVerdict:
    """The heuristic against the estimator on one case (times in seconds).

    ``best`` is the estimator's fastest among the schedules the heuristic chooses from
    (the four FiCCO schedules; all six when the heuristic answers ``serial`` or ``ring``);
    ``loss`` = 1 - best time / picked time: the fraction of the best schedule's speedup lost
    by following the heuristic (FiCCO §VI-D reports ~14% on its misses).
    """

    case: FiccoCase
    pick: str
    reason: str
    best: str
    best_overall: str
    pick_time_s: float
    best_time_s: float
    serial_time_s: float
    estimates: tuple[ScheduleEstimate, ...] = field(repr=False)

    @property
    def match(self) -> bool:
        """True when the heuristic picked the estimator's best schedule."""
        return self.pick == self.best

    @property
    def loss(self) -> float:
        """Fraction of the best speedup lost by the pick: ``1 - best time / pick time``."""
        return 1.0 - self.best_time_s / self.pick_time_s if self.pick_time_s > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class AccuracyReport:
    """Heuristic accuracy over a set of cases: matches / cases, and the loss on the misses."""

    label: str
    verdicts: tuple[CaseVerdict, ...]

    @property
    def cases(self) -> int:
        """Number of cases judged."""
        return len(self.verdicts)

    @property
    def matches(self) -> int:
        """Cases where the pick is the estimator's best."""
        return sum(v.match for v in self.verdicts)

    @property
    def rate(self) -> float:
        """matches / cases."""
        return self.matches / self.cases if self.cases else 0.0

    def matches_within(self, tolerance: float | None = None) -> int:
        """Cases whose pick is within ``tolerance`` of the best (loss <= tolerance; default
        :data:`RUN_TO_RUN_VARIATION`, the spread FiCCO §IV-A measures between runs of one op)."""
        tol = RUN_TO_RUN_VARIATION if tolerance is None else tolerance
        return sum(v.loss <= tol + 1e-12 for v in self.verdicts)

    @property
    def mean_loss_on_miss(self) -> float:
        """Mean :attr:`CaseVerdict.loss` over the misses (0 when there are none)."""
        miss = [v.loss for v in self.verdicts if not v.match]
        return sum(miss) / len(miss) if miss else 0.0

    @property
    def max_loss(self) -> float:
        """Largest loss over all cases."""
        return max((v.loss for v in self.verdicts), default=0.0)

    @property
    def mean_loss(self) -> float:
        """Mean loss over all cases (matches count as 0)."""
        return sum(v.loss for v in self.verdicts) / self.cases if self.cases else 0.0


def _verdict(case: FiccoCase, ests: Sequence[ScheduleEstimate], **tuning: float) -> CaseVerdict:
    by = {e.schedule: e for e in ests}
    pick, reason = heuristic_pick(case, **tuning)
    among = FICCO_SCHEDULES if pick in FICCO_SCHEDULES else SCHEDULES
    best = best_schedule(ests, among)
    overall = best_schedule(ests)
    return CaseVerdict(case=case, pick=pick, reason=reason, best=best.schedule, best_overall=overall.schedule,
                       pick_time_s=by[pick].time_s, best_time_s=best.time_s, serial_time_s=by["serial"].time_s,
                       estimates=tuple(ests))


def judge(case: FiccoCase, cost: SupportsDuration, **tuning: float) -> CaseVerdict:
    """Estimate every schedule of ``case`` and compare the §V-C heuristic's pick with the best
    (``tuning``: optional heuristic constants, as :func:`heuristic_pick`)."""
    return _verdict(case, estimate_all(case, cost), **tuning)


def accuracy(cases: Sequence[FiccoCase], cost: SupportsDuration, label: str = "", **tuning: float) -> AccuracyReport:
    """How often the §V-C heuristic picks the estimator's best schedule (FiCCO §VI-D) over
    ``cases``, with the speedup lost where it does not."""
    return AccuracyReport(label=label, verdicts=tuple(judge(c, cost, **tuning) for c in cases))


def rejudge(report: AccuracyReport, label: str | None = None, **tuning: float) -> AccuracyReport:
    """The same cases and estimates judged with other heuristic constants (no re-simulation)."""
    return AccuracyReport(label=report.label if label is None else label,
                          verdicts=tuple(_verdict(v.case, v.estimates, **tuning) for v in report.verdicts))


#: Grid searched by :func:`fit_heuristic`: the reference time that turns the machine's peak
#: FLOP/s into the uniform/hetero threshold (seconds), and the hetero-unfused factor (§V-C: 5).
FIT_REFERENCE_TIMES_S = tuple(10.0 ** (e / 4.0) for e in range(-20, 2))
FIT_UNFUSED_FACTORS = (2.0, 5.0, 10.0, 20.0, 50.0)


def fit_heuristic(report: AccuracyReport) -> dict:
    """Retune the §V-C thresholds to the estimator on ``report``'s cases (the "one-time tuning
    cost for thresholds" of FiCCO §VIII-C): the grid point of ``FIT_REFERENCE_TIMES_S`` x
    ``FIT_UNFUSED_FACTORS`` with the most matches, ties broken by the smaller mean loss.
    Returns ``{"reference_time_s": .., "hetero_unfused_factor": .., "matches": ..}``."""
    best: tuple | None = None
    for t in FIT_REFERENCE_TIMES_S:
        for h in FIT_UNFUSED_FACTORS:
            r = rejudge(report, reference_time_s=t, hetero_unfused_factor=h)
            key = (-r.matches, r.mean_loss, abs(math.log10(t)), h)
            if best is None or key < best[0]:
                best = (key, {"reference_time_s": t, "hetero_unfused_factor": h, "matches": r.matches})
    assert best is not None
    return best[1]
