"""How copy-engine (DMA) traffic slows the GEMMs running beside it (ficco §IV-A, §IV-D1).

Copy engines take no compute units, so the SM competition of :mod:`.contention` (lagom
eq. 5) does not apply to them, and a compute-bound GEMM barely notices the HBM bandwidth
they take (eq. 6's ``B̄ − V``). Yet FiCCO measures GEMMs on 8 x MI300X 11% slower beside a
FiCCO transfer step by copy engines and 7% beside a shard transfer (§IV-D1, Fig. 9, geometric
means over Table I): "while offloading communication to DMA engines can eliminate compute
interference and some portion of cache interference, memory interference still remains"
(§IV-A). On MI300X the copy engines' reads and writes go through the same Infinity Fabric,
256 MB Infinity Cache and HBM controllers as the compute dies' (AMD CDNA 3 whitepaper), and
share the package's power budget with them (FiCCO §VIII-B, citing CompPow, arXiv:2605.21847:
power is re-allocated between compute and memory by what is stressed).

The paper's two figures say how this depends on the traffic: a shard transfer on one link,
moving a seventh of a FiCCO step's bytes per second, still costs the GEMM 7% against the
step's 11%. So most of the loss comes with any copy-engine activity, whatever it moves, and
the rest grows with the bytes it moves. The model: while copy-engine ops (DMA collectives and
peer transfers, copy-engine copies) run beside a GEMM and move a share ``u`` of the
achievable HBM bandwidth, the GEMM takes

    t × (1 + copy_engine_gemm_slowdown + copy_engine_gemm_interference × min(u, 1))

Two coefficients per GPU type (:class:`~ccoverlap.cost.params.CostParams`), both 0 where no
measurement sizes them, which leaves only the bandwidth term of :mod:`.contention`. A part
independent of the bytes fits how the package shares its power (a busy fabric and woken links
draw a step of power that the compute dies, at their limit in a GEMM, give up), but no public
measurement separates the two parts: on MI300X both are fitted on FiCCO's two figures.
SM-driven collectives are not copy-engine traffic and keep the contention of :mod:`.contention`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ccoverlap.catalog.hardware import GPUSpec
from ccoverlap.cost.params import CostParams
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, P2PSpec, Spec

__all__ = ["is_copy_engine_op", "copy_engine_hbm_share", "gemm_slowdown_beside_copy_engines"]


def is_copy_engine_op(spec: Spec) -> bool:
    """True for work copy engines do: DMA collectives and peer transfers, and copies."""
    return isinstance(spec, CopySpec) or (isinstance(spec, (CollectiveSpec, P2PSpec)) and spec.transport == "dma")


def copy_engine_hbm_share(concurrent: Sequence[Spec], hbm_bytes_per_s: Sequence[float], gpu: GPUSpec,
                          params: CostParams) -> float:
    """Share of the GPU's achievable HBM bandwidth (``hbm × mem_bw_fraction``) that the
    copy-engine ops among ``concurrent`` move; ``hbm_bytes_per_s[i]`` is op i's stand-alone
    HBM demand in bytes/s. Dimensionless, not capped."""
    achievable = gpu.hbm_bytes_per_s * params.mem_bw_fraction
    moved = sum(rate for spec, rate in zip(concurrent, hbm_bytes_per_s) if is_copy_engine_op(spec))
    return moved / achievable if achievable > 0 else 0.0


def gemm_slowdown_beside_copy_engines(spec: Spec, share: float, params: CostParams) -> float:
    """Factor (>= 1) on a GEMM's time while copy engines run beside it and move ``share`` of the
    achievable HBM bandwidth (0: none run): ``1 + copy_engine_gemm_slowdown +
    copy_engine_gemm_interference × min(share, 1)``. 1 for any other op, and where the GPU's
    coefficients are 0 (not measured)."""
    if not isinstance(spec, GemmSpec) or share <= 0.0:
        return 1.0
    return 1.0 + params.copy_engine_gemm_slowdown + params.copy_engine_gemm_interference * min(float(share), 1.0)
