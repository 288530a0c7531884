"""How much of its clock a GPU keeps through a long GEMM loop: the ``sustained`` section of
``ccoverlap calibrate`` and the value it gives the cost model's ``sustained_clock_fraction``.

The GEMM sweep is measured in short loops on a cool GPU; a training step runs for seconds at
the power limit, where the SM clock settles lower (NVIDIA quotes the A100's HPL Rpeak at the
1305 MHz it sustains at its power limit, not its 1410 MHz boost). This section runs one large
bf16 GEMM back to back for a fixed time, in windows of about :data:`WINDOW_S` seconds, and
records each window's time per call and, where ``torch.cuda.clock_rate`` can read it (pynvml),
the SM clock. The fraction is the per-call time of the first windows (the state the sweep saw)
over that of the last third of the run: ``min(1, early / late)``. One GPU alone in its node
runs cooler than eight in a training job, so this is an upper bound on the fraction a full
node sustains (docs/calibrate.md).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from ccoverlap.calibrate import microbench as mb

if TYPE_CHECKING:
    from types import ModuleType

    import torch


WINDOW_S = 0.25                     # seconds of back-to-back GEMMs per timed window
SECONDS = {True: 20.0, False: 40.0}  # length of the loop: quick / full plan
SHAPE = (8192, 8192, 8192)          # M, N, K: compute-bound, ~1.1 TFLOP per call
EARLY_WINDOWS = 3                   # windows that stand for the short-loop (cool) state
MIN_WINDOWS = 3 * EARLY_WINDOWS     # fewer and the early and late parts overlap


def sustained_section(bench: mb.Bench, notes: list[str], *, seconds: float | None = None) -> list[dict]:
    """Run :data:`SHAPE` (bf16) back to back for ``seconds`` (default :data:`SECONDS` of the
    plan) and return one ``sustained`` record: per-call seconds of each window, the SM clock
    (MHz, or None) read after each window, and the loop's settings. CUDA only."""

    torch = bench.torch
    seconds = SECONDS[bench.grid.quick] if seconds is None else float(seconds)
    m, n, k = SHAPE
    try:
        fn = mb.make_gemm(bench, "bf16", m, n, k)
    except getattr(torch.cuda, "OutOfMemoryError", RuntimeError):
        notes.append(f"sustained clock: a {m}x{n}x{k} bf16 GEMM does not fit in memory; not measured")
        return []
    iters = bench.iters_for(fn, WINDOW_S)
    bench.log(f"sustained clock: {m}x{n}x{k} bf16 back to back for {seconds:.0f} s "
              f"({iters} calls per {WINDOW_S} s window)")
    times, clocks = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        times.append(bench.timed_calls(fn, iters) / iters)
        clocks.append(_sm_clock_mhz(torch, bench.dev))
    del fn
    torch.cuda.empty_cache()
    return [{"kind": "sustained", "dtype": "bf16", "m": m, "n": n, "k": k, "seconds": seconds,
             "iters_per_window": iters, "window_time_s": times, "sm_clock_mhz": clocks}]


def _sm_clock_mhz(torch: ModuleType, dev: torch.device) -> float | None:
    """The SM clock nvidia-smi reports for ``dev`` (MHz), or None where it cannot be read."""
    try:
        return float(torch.cuda.clock_rate(dev))
    except Exception:  # no pynvml, no NVML, an older torch: the clock is optional
        return None


def sustained_fraction(records: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[str]]:
    """``({"sustained_clock_fraction": f, ...evidence}, notes)`` from the ``sustained`` record
    of ``records`` (None when there is none or it is too short). ``f = min(1, early / late)``
    with ``late`` the median per-call time of the last third of the windows and ``early`` the
    state the sweep saw: the same GEMM's time in the sweep's short loops (a ``gemm`` record of
    the same dtype and shape) where there is one, else the median of the first
    :data:`EARLY_WINDOWS` windows (a GPU at its power limit can settle within the first
    window, so those may already be slow). The clock readings, where present, are reported
    beside it (median MHz of the first and last windows), not used."""
    recs = [r for r in records if r.get("kind") == "sustained"]
    if not recs:
        return None, []
    rec = recs[-1]
    times = [float(t) for t in rec.get("window_time_s") or [] if t and t > 0]
    if len(times) < MIN_WINDOWS:
        return None, [f"sustained: {len(times)} timed window(s), fewer than {MIN_WINDOWS}; "
                      "sustained_clock_fraction kept at its default"]
    third = max(EARLY_WINDOWS, len(times) // 3)
    first, late = statistics.median(times[:EARLY_WINDOWS]), statistics.median(times[-third:])
    swept = [float(r["time_s"]) for r in records if r.get("kind") == "gemm" and r.get("time_s")
             and all(r.get(f) == rec.get(f) for f in ("dtype", "m", "n", "k"))]
    early = statistics.median(swept) if swept else first
    clocks = [c for c in rec.get("sm_clock_mhz") or [] if c]
    info = {"sustained_clock_fraction": min(1.0, early / late), "early_s": early, "late_s": late,
            "early_from": "the sweep's short loops" if swept else "the first windows", "first_windows_s": first,
            "windows": len(times), "seconds": rec.get("seconds"),
            "clock_early_mhz": statistics.median(clocks[:EARLY_WINDOWS]) if len(clocks) >= MIN_WINDOWS else None,
            "clock_late_mhz": statistics.median(clocks[-third:]) if len(clocks) >= MIN_WINDOWS else None}
    notes = []
    if early / late > 1.0:
        notes.append(f"sustained: the last windows ran {early / late - 1:.1%} faster than "
                     f"{info['early_from']}; sustained_clock_fraction set to 1")
    return info, notes
