"""Fit the communication model's physical parameters, one value per GPU type, on the declared
``fit`` half of the collective corpus tables, and print them with the errors on both halves.

Usage::

    python benchmarks/fit_collectives.py [--gpu A40] [--json]

Which parameters are fitted per GPU is ``ccoverlap.validation.collectives.FIT`` (only those the GPU's tables measure:
PCIe efficiency only where a ring crosses PCIe, the network only where rows span nodes,
NVLS latency only on GPUs with NVLS; H100's NVLink and the network's efficiencies are cited
large-message measurements, NVIDIA/nccl-tests#212 and #290, and are not refitted). The start point is the GPU's current defaults, so a
second run after copying the values into ``ccoverlap/cost/params.py`` returns the same
numbers (the fit is deterministic). The values in ``_GPU_OVERRIDES`` were written from this
script's output.
"""

from __future__ import annotations

import argparse
import json
import statistics

from ccoverlap.catalog.hardware import get_gpu
from ccoverlap.corpus.tables import load_kind
from ccoverlap.cost.params import default_params
from ccoverlap.validation.collectives import FIT, KIND, NOT_FITTED, errors, fit_params, table_cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="append", help="only this GPU (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tables = load_kind(KIND)
    out = {}
    for gpu_name in args.gpu or list(FIT):
        gpu = get_gpu(gpu_name)
        mine = [t for t in tables if t.gpu == gpu.name and t.name not in NOT_FITTED]
        fit_cases = [c for t in mine for c in table_cases(t, "fit")]
        held = [c for t in mine for c in table_cases(t, "held-out")]
        base = default_params(gpu)
        values = fit_params(fit_cases, FIT[gpu.name], base)
        fitted = base.with_overrides(**values)

        def med(cases, p=fitted):
            return statistics.median(abs(e) for e in errors(cases, lambda c, p=p: p))

        out[gpu.name] = {"params": values, "tables": [t.name for t in mine], "fit_rows": len(fit_cases),
                         "median_abs_error_fit": med(fit_cases), "median_abs_error_held_out": med(held),
                         "median_abs_error_held_out_before": med(held, base)}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for gpu_name, r in out.items():
        print(f"{gpu_name}: {r['fit_rows']} fit rows of {', '.join(r['tables'])}")
        for k, v in r["params"].items():
            print(f"  {k} = {v:.4g}")
        print(f"  median |error|: fit {r['median_abs_error_fit']:.1%}, held-out {r['median_abs_error_held_out']:.1%} "
              f"(with the values it started from: {r['median_abs_error_held_out_before']:.1%})")


if __name__ == "__main__":
    main()
