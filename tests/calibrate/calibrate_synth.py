"""Synthetic calibration measurements: the cost model under known parameters, plus noise.

Records have exactly the layout :mod:`ccoverlap.calibrate.suite` writes, so the fit and the
file format are exercised as on a GPU, with known answers.
"""

from __future__ import annotations

import numpy as np

from ccoverlap.calibrate import fit as F
from ccoverlap.calibrate import grids
from ccoverlap.cost.params import CostParams

MiB = 1 << 20

TRUE = dict(
    gemm_peak_fraction=0.74, gemm_small_tile_efficiency=0.9, gemm_tile_overhead_ksteps=3.5,
    gemm_mem_overlap=0.7, gemm_tile_m=256, gemm_tile_n=128, gemm_tiles_per_sm=1,
    mem_bw_fraction=0.85, kernel_launch_overhead_s=4e-6,
    dma_engine_bytes_per_s=150e9, host_link_bytes_per_s=50e9, dma_copy_latency_s=1e-5,
    comm_sm_fraction_per_channel=0.8, nt_contention_coeff=0.1, comm_hbm_bytes_per_wire_byte=2.5,
    l2_inflight_chunks=3.0, l2_pollution_penalty=2.0, mem_sm_saturation_fraction=0.4,
    comm_compute_interference=0.2, dma_hbm_bytes_per_wire_byte=1.6, dma_l2_pollution_fraction=0.4,
    dma_compute_interference=0.15,
    channel_bytes_per_s=30e9, channel_saturation_sharpness=3.0, threads_bw_exponent=0.2,
    chunk_step_overhead_s=2e-6, chunk_pipeline_depth=1.0,
)

VICTIMS = ({"op": "gemm", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192},
           {"op": "gemm", "dtype": "bf16", "m": 32768, "n": 4096, "k": 1024},
           {"op": "gemm", "dtype": "bf16", "m": 65536, "n": 512, "k": 512},
           {"op": "memory", "bytes": 1536 * MiB})


def true_params(base: CostParams, **over) -> CostParams:
    return base.with_overrides(**{**TRUE, **over})


def records(gpu, p: CostParams, *, noise: float = 0.03, seed: int = 0, quick: bool = False) -> list[dict]:
    """Records of every kind from the model under ``p``, each measured value × exp(N(0, noise))."""
    rng = np.random.default_rng(seed)
    ctx = F.make_context(gpu)

    def jitter(x: float) -> float:
        return float(x * np.exp(rng.normal(0.0, noise)))

    out: list[dict] = []
    for dtype, m, n, k in grids.gemm_sweep(quick):
        r = {"kind": "gemm", "dtype": dtype, "m": m, "n": n, "k": k}
        out.append({**r, "time_s": jitter(F.predict_gemm(r, p, ctx))})
    grid = grids.make_grid(quick)
    for name, m, n, k, s in grids.ficco_shapes(grid)[:4]:
        whole = F.predict_gemm({"dtype": "bf16", "m": m, "n": n, "k": k}, p, ctx)
        for dim in ("m", "k"):
            for ways in (8, 64):
                r = {"kind": "gemm_split", "name": name, "dtype": "bf16", "m": m, "n": n, "k": k, "scale": s,
                     "dim": dim, "ways": ways}
                out.append({**r, "whole_s": whole, "time_s": jitter(whole * F.predict_split(r, p, ctx))})
    for mib in (1, 4, 16, 64, 256, 1024):
        for engine, d in (("sm", "d2d"), ("ce", "d2d"), ("ce", "h2d"), ("ce", "d2h")):
            r = {"kind": "copy", "engine": engine, "direction": d, "bytes": mib * MiB}
            out.append({**r, "time_s": jitter(F.predict_copy(r, p, ctx))})
    for nc, nt, c in grids.contention_points(grid):
        nbytes = max(64 * MiB, 4 * nc * c)
        r = {"kind": "channel_copy", "nc": nc, "nt": nt, "chunk_bytes": c, "bytes": nbytes}
        copy_alone = jitter(F.predict_channel(r, p, ctx))
        out.append({**r, "time_s": copy_alone})
        for v in VICTIMS:
            rec = {"kind": "sm_contention", "victim": v, "nc": nc, "nt": nt, "chunk_bytes": c, "copy_bytes": nbytes,
                   "copy_alone_s": copy_alone}
            alone = jitter(F._victim_alone(F._victim(rec), p, ctx)[0])
            rec.update(victim_alone_s=alone, victim_s=jitter(alone * F.predict_sm_victim(rec, p, ctx)),
                       copy_s=jitter(copy_alone * F.predict_sm_copy(rec, p, ctx)),
                       covered_victim=True, covered_copy=True)
            out.append(rec)
    for d in ("d2d", "h2d", "d2h"):
        nbytes = 256 * MiB
        copy_alone = jitter(F.predict_copy({"engine": "ce", "direction": d, "bytes": nbytes}, p, ctx))
        for v in VICTIMS:
            rec = {"kind": "ce_contention", "victim": v, "direction": d, "bytes": nbytes, "copy_alone_s": copy_alone}
            alone = jitter(F._victim_alone(F._victim(rec), p, ctx)[0])
            rec.update(victim_alone_s=alone, victim_s=jitter(alone * F.predict_ce_victim(rec, p, ctx)),
                       copy_s=jitter(copy_alone * F.predict_ce_copy(rec, p, ctx)),
                       covered_victim=True, covered_copy=True)
            out.append(rec)
    return out
