"""How the GEMM cost model's efficiency falls with shape, against published H100 measurements.

Reads ``benchmarks/data/xla_h100_bf16_matmul.csv`` (OpenXLA's published H100 bf16 matmul
table: median kernel time of 5 runs per (b, m, n, k), m, n, k in 256..4096, b in 1, 2, 4) and
prints the model's error (``ccoverlap.cost.compute.gemm_time_s``, H100-SXM defaults, which
include ``kernel_launch_overhead_s``) by measured kernel duration and by K, for every row and
for the unbatched ones, and what ``ccoverlap calibrate``'s ``gemm`` stage fits on the
unbatched rows (its GEMM records have no batch; 1 record in 4 held out by calibrate's CRC rule).

Nothing here is timed; the output is the same on any machine::

    .venv/bin/python benchmarks/gemm_shape_fit.py
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "xla_h100_bf16_matmul.csv"


def rows(path: Path = DATA) -> list[tuple[int, int, int, int, float]]:
    """(b, m, n, k, measured seconds) of every row of the table."""
    out = []
    with open(path) as fh:
        for row in csv.DictReader(line for line in fh if not line.startswith("#")):
            b, m, n, k = (int(row[c]) for c in ("b", "m", "n", "k"))
            out.append((b, m, n, k, 2.0 * b * m * n * k / (float(row["tflops"]) * 1e12)))
    return out


def records(path: Path = DATA) -> list[dict]:
    """``calibrate`` GEMM records of the table's unbatched rows."""
    return [{"kind": "gemm", "dtype": "bf16", "m": m, "n": n, "k": k, "time_s": t}
            for b, m, n, k, t in rows(path) if b == 1]


def _stats(sel: list[float]) -> tuple[int, float, float]:
    return len(sel), statistics.mean(sel), math.sqrt(statistics.mean(e * e for e in sel))


def error_table(table: list[tuple[int, int, int, int, float]], params, gpu) -> list[tuple[str, int, float, float]]:
    """(bin, n, mean log(predicted / measured time), rms) by measured kernel duration and by K;
    positive = the model is slower than the measurement."""
    from ccoverlap.cost.compute import gemm_time_s
    from ccoverlap.specs import GemmSpec

    errs = [(t, k, math.log(gemm_time_s(GemmSpec(m=m, n=n, k=k, batch=b), gpu, params) / t))
            for b, m, n, k, t in table]
    out = []
    for lo, hi in ((0, 10e-6), (10e-6, 20e-6), (20e-6, 40e-6), (40e-6, 80e-6), (80e-6, 1.0)):
        sel = [e for t, _, e in errs if lo <= t < hi]
        if sel:
            name = f"{lo * 1e6:.0f}-{hi * 1e6:.0f} us" if hi < 1 else f">= {lo * 1e6:.0f} us"
            out.append((name, *_stats(sel)))
    for kk in sorted({k for _, k, _ in errs}):
        sel = [e for t, k, e in errs if k == kk and t >= 20e-6]
        if sel:
            out.append((f"K = {kk}, >= 20 us", *_stats(sel)))
    out.append(("all", *_stats([e for _, _, e in errs])))
    return out


def _print(title: str, table) -> None:
    print(f"\n| {title} | n | mean log(pred/meas) | rms |")
    print("| :-- | --: | --: | --: |")
    for name, n, mean, rms in table:
        print(f"| {name} | {n} | {mean:+.3f} | {rms:.3f} |")


def main(argv=None) -> int:
    from ccoverlap.calibrate.fit import STAGES, fit
    from ccoverlap.catalog.hardware import get_gpu
    from ccoverlap.cost.params import default_params

    gpu = get_gpu("H100-SXM")
    base = default_params(gpu)
    table = rows()
    print(f"# {DATA.name}: {len(table)} bf16 GEMMs; model: H100-SXM defaults")
    _print("all rows, measured kernel time", error_table(table, base, gpu))
    _print("unbatched rows (b = 1)", error_table([r for r in table if r[0] == 1], base, gpu))
    recs = records()
    res = fit(recs, gpu, base, stages=tuple(s for s in STAGES if s[0] == "gemm"), info_stages=())
    print("\n# calibrate's gemm stage fitted on 3 in 4 unbatched records")
    for k, v in sorted(res.params.items()):
        print(f"  {k}: {getattr(base, k)} -> {v:.4g}")
    held = {id(o.record) for o in res.observations if o.held_out}
    fitted = base.with_overrides(**res.params)
    _print("held-out unbatched rows, fitted", error_table(
        [(1, r["m"], r["n"], r["k"], r["time_s"]) for r in recs if id(r) in held], fitted, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
