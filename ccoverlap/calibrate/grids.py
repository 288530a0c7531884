"""What ``ccoverlap calibrate`` measures: GEMM shapes, the ficco paper's shapes scaled to fit,
the (NC, NT, C) grid of the channel-copy kernel, and the deterministic train / held-out split.

Pure Python (no torch), so the plan of a run can be inspected and tested anywhere.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

KiB = 1 << 10
MiB = 1 << 20

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# the plan's sections in measuring order (``sustained`` last: the heat it leaves)
SECTIONS = ("gemm", "split", "copy", "contention", "sustained")

# ficco Table I: (name, M, N, K) of the GEMMs whose decomposition loss Fig. 7 reports.
FICCO_GEMMS: tuple[tuple[str, int, int, int], ...] = (
    ("g1", 16384, 16384, 131072), ("g2", 131072, 16384, 16384),
    ("g3", 53248, 16384, 131072), ("g4", 131072, 53248, 16384),
    ("g5", 8192, 8192, 262144), ("g6", 262144, 8192, 8192),
    ("g7", 28672, 8192, 262144), ("g8", 262144, 28672, 8192),
    ("g9", 196608, 18432, 16384), ("g10", 196608, 106496, 16384),
    ("g11", 1048576, 10240, 8192), ("g12", 1048576, 57344, 8192),
    ("g13", 1607680, 57344, 8192), ("g14", 147456, 28672, 4096),
    ("g15", 327680, 28672, 4096), ("g16", 229376, 28672, 4096),
)


@dataclass(frozen=True)
class Grid:
    """One run's plan. Sizes in bytes, budgets in FLOPs and bytes."""

    quick: bool
    reps: int
    warmup: int
    min_window_s: float        # each timed loop lasts at least this long (event resolution ~µs)
    gemm_flop_budget: float    # a scaled ficco GEMM has at most this many FLOPs
    gemm_mem_budget: float     # ... and its A, B, C at most this many bytes
    copy_buffer_bytes: int     # channel-copy / memcpy buffers (larger than L2: traffic hits HBM)
    channels: tuple[int, ...]  # NC values of the main contention grid
    chunks: tuple[int, ...]    # C values (bytes)
    threads: int               # NT of the main grid
    nt_sweep: tuple[int, ...]  # NT values tried at a few (NC, C) points
    nt_points: tuple[tuple[int, int], ...]  # those (NC, C) points
    ce_chunks: tuple[int, ...] = ()  # C of the chunked copy-engine copies (d2d, one memcpy per chunk)


def make_grid(quick: bool = False, *, memory_bytes: float | None = None) -> Grid:
    """The measurement plan: ``quick`` runs in a few minutes, the full one in roughly 15–30
    minutes on an H100. ``memory_bytes`` (free GPU memory) caps the scaled GEMMs."""
    mem_cap = 16e9 if memory_bytes is None else max(1e9, 0.4 * memory_bytes)
    if quick:
        return Grid(quick=True, reps=3, warmup=2, min_window_s=0.003, gemm_flop_budget=4e12,
                    gemm_mem_budget=min(mem_cap, 4e9), copy_buffer_bytes=256 * MiB,
                    channels=(1, 2, 4, 8, 16, 32, 64, 128),
                    chunks=(16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB), threads=512,
                    nt_sweep=(128, 512), nt_points=((16, 256 * KiB),),
                    ce_chunks=(64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB))
    return Grid(quick=False, reps=7, warmup=3, min_window_s=0.005, gemm_flop_budget=2e13,
                gemm_mem_budget=min(mem_cap, 16e9), copy_buffer_bytes=512 * MiB,
                channels=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128),
                chunks=(16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB), threads=512,
                nt_sweep=(64, 128, 256, 512, 1024),
                nt_points=((4, 1 * MiB), (16, 64 * KiB), (16, 1 * MiB), (64, 1 * MiB)),
                ce_chunks=(16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB))


def gemm_sweep(quick: bool = False) -> list[tuple[str, int, int, int]]:
    """(dtype, M, N, K) of the GEMMs timed alone: squares (size-dependent efficiency), an M
    staircase across wave boundaries (wave quantisation, lagom eq. 5), a K sweep (the
    per-tile prologue/epilogue that makes K-split pieces slow, ficco §IV-C1), small-M and
    small-N staircases (tile shape), skinny and LLM-like shapes, in bf16, fp16 and fp32."""
    out: list[tuple[str, int, int, int]] = []
    squares = (512, 1024, 2048, 4096, 8192) if quick else \
        (256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
    out += [("bf16", s, s, s) for s in squares]
    stair = range(1024, 4097, 384 if quick else 128)
    out += [("bf16", m, 4096, 4096) for m in stair]
    ks = (128, 512, 2048, 8192) if quick else (64, 128, 256, 512, 1024, 2048, 8192, 16384, 32768)
    out += [("bf16", 4096, 4096, k) for k in ks]
    # small-M and small-N staircases: tell tile_m from tile_n (row-split pieces are short in M)
    small = (128, 192, 256) if quick else (64, 128, 192, 256, 320, 384, 512)
    out += [("bf16", s, 16384, 8192) for s in small] + [("bf16", 16384, s, 8192) for s in small]
    if not quick:
        out += [("bf16", *s) for s in ((16384, 128, 4096), (128, 16384, 4096), (64, 8192, 8192),
                                       (8192, 64, 8192), (4096, 12288, 4096), (8192, 28672, 8192),
                                       (8192, 8192, 28672), (32768, 4096, 1024), (65536, 512, 512))]
    out += [("fp16", s, s, s) for s in ((1024, 4096) if quick else (512, 1024, 2048, 4096, 8192))]
    if not quick:
        out += [("fp16", m, 4096, 4096) for m in range(1024, 4097, 512)]
    out += [("fp32", s, s, s) for s in ((1024, 2048) if quick else (256, 512, 1024, 2048, 4096))]
    if not quick:
        out += [("fp32", m, 2048, 2048) for m in range(1024, 4097, 512)]
    return list(dict.fromkeys(out))  # without repeats, in first-seen order


def scale_gemm(m: int, n: int, k: int, *, flop_budget: float, mem_budget: float,
               dtype_bytes: int = 2, multiple: int = 512) -> tuple[int, int, int, float]:
    """Scale (M, N, K) by one factor s ≤ 1 so that 2·M·N·K ≤ ``flop_budget`` and
    (MK + KN + MN)·dtype ≤ ``mem_budget``, keeping the aspect ratios (so whether M < K, which
    decides ficco Fig. 7's row- vs column-split loss, is kept). Each dimension is rounded to a
    multiple of ``multiple`` (default 512 = 64 shards × 8 rows), at least ``multiple``.
    Returns (M, N, K, s)."""
    flops = 2.0 * m * n * k
    nbytes = float(m * k + k * n + m * n) * dtype_bytes
    s = min(1.0, (flop_budget / flops) ** (1.0 / 3.0), math.sqrt(mem_budget / nbytes))

    def rnd(x: int) -> int:
        return max(multiple, int(round(x * s / multiple)) * multiple)

    sm, sn, sk = rnd(m), rnd(n), rnd(k)
    # rounding up to `multiple` can overshoot a budget for tiny factors: shrink the largest dim
    while (2.0 * sm * sn * sk > flop_budget * 1.05 or (sm * sk + sk * sn + sm * sn) * dtype_bytes > mem_budget * 1.05) \
            and max(sm, sn, sk) > multiple:
        if sm >= sn and sm >= sk:
            sm -= multiple
        elif sn >= sk:
            sn -= multiple
        else:
            sk -= multiple
    return sm, sn, sk, s


def ficco_shapes(grid: Grid) -> list[tuple[str, int, int, int, float]]:
    """ficco Table I GEMMs scaled to this run's budgets: (name, M, N, K, scale factor).
    The quick plan keeps g1, g2, g5, g6 (two M < K and two M > K shapes)."""
    names = {"g1", "g2", "g5", "g6"} if grid.quick else None
    out = []
    for name, m, n, k in FICCO_GEMMS:
        if names is not None and name not in names:
            continue
        sm, sn, sk, s = scale_gemm(m, n, k, flop_budget=grid.gemm_flop_budget, mem_budget=grid.gemm_mem_budget)
        out.append((name, sm, sn, sk, s))
    return out


def contention_points(grid: Grid) -> list[tuple[int, int, int]]:
    """(NC, NT, C) points of the channel-copy kernel: the NC × C grid at the main NT plus the
    NT sweep at a few (NC, C) points (lagom §3.2 reports NT matters little: this checks it)."""
    pts = [(nc, grid.threads, c) for nc in grid.channels for c in grid.chunks]
    for nc, c in grid.nt_points:
        pts += [(nc, nt, c) for nt in grid.nt_sweep]
    return list(dict.fromkeys(pts))  # without repeats, in first-seen order


def channel_copy_bytes(nc: int, chunk: int) -> int:
    """Bytes one channel-copy launch moves beside a victim: ≥ 64 MiB and ≥ 4 chunks per channel."""
    return max(64 * MiB, 4 * nc * chunk)


def record_key(rec: dict) -> str:
    """A canonical string naming what a measurement record measured (not its result): kind
    and the configuration fields, sorted. Used for the deterministic split."""
    skip = {"time_s", "samples_s", "iters", "victim_s", "victim_alone_s", "copy_s", "copy_alone_s",
            "covered_victim", "covered_copy", "victim_samples_s", "copy_samples_s", "whole_s",
            "backend", "scale", "buffers", "note", "timing"}
    parts = []
    for key in sorted(rec):
        if key in skip:
            continue
        val = rec[key]
        if isinstance(val, dict):
            val = ",".join(f"{k}={val[k]}" for k in sorted(val))
        parts.append(f"{key}={val}")
    return ";".join(parts)


def is_held_out(rec: dict, *, every: int = 4) -> bool:
    """Deterministic split: a record is held back from the fit when CRC-32 of its
    :func:`record_key` is divisible by ``every`` (about 1 in ``every``), independent of
    measurement order and of the measured values."""
    return zlib.crc32(record_key(rec).encode()) % every == 0
