"""Fit the communication model's physical parameters, one value per GPU type, on the declared
``fit`` half of the collective corpus tables, then each catalog cluster's own values (its
nodes' host issue time; a3-mega's inter-node fabric) on its tables' fit half, and print them
with the errors on both halves.

Usage::

    python benchmarks/fit_collectives.py [--gpu A40] [--json]

Which parameters are fitted per GPU is ``ccoverlap.validation.collectives.FIT`` (only those the GPU's tables measure:
PCIe efficiency only where a ring crosses PCIe, the network only where rows span nodes,
NVLS latency only on GPUs with NVLS; H100's NVLink and the network's efficiencies are cited
large-message measurements, NVIDIA/nccl-tests#212 and #290, and are not refitted); the GPU
fit sets each cluster's own host issue time aside (the GPU's value is what a cluster without
one gets). Per cluster: ``FIT_CLUSTER``, with the GPU's values just fitted. The start point
is the current defaults, so a second run after copying the values into
``ccoverlap/cost/params.py`` and ``ccoverlap/catalog/hardware.py`` returns the same numbers
(the fit is deterministic). The values there were written from this script's output.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

from ccoverlap.catalog.hardware import get_gpu
from ccoverlap.corpus.tables import load_kind
from ccoverlap.cost.params import default_params
from ccoverlap.validation.collectives import (
    CLUSTER_FIELDS,
    FIT,
    FIT_CLUSTER,
    KIND,
    NOT_FITTED,
    Case,
    errors,
    fit_params,
    table_cases,
    with_cluster_value,
)


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
        # the GPU's values: every cluster's own host issue time set aside
        fit_cases = [_without_host(c) for t in mine for c in table_cases(t, "fit")]
        held = [_without_host(c) for t in mine for c in table_cases(t, "held-out")]
        base = default_params(gpu)
        values = fit_params(fit_cases, FIT[gpu.name], base)
        gpu_values = {k: v for k, v in values.items() if k not in CLUSTER_FIELDS}
        fitted = base.with_overrides(**gpu_values)
        fit_cases = [_with(c, values) for c in fit_cases]
        held = [_with(c, values) for c in held]

        def med(cases, p=fitted):
            return statistics.median(abs(e) for e in errors(cases, lambda c, p=p: p))

        out[gpu.name] = {"params": values, "tables": [t.name for t in mine], "fit_rows": len(fit_cases),
                         "median_abs_error_fit": med(fit_cases), "median_abs_error_held_out": med(held),
                         "median_abs_error_held_out_before": med(held, base)}
        for cluster, names in FIT_CLUSTER.items():
            cases = [_with(c, values) for t in tables for c in table_cases(t, "fit") if c.cluster.name == cluster]
            if not cases or cases[0].cluster.gpu.name != gpu.name:
                continue
            cv = fit_params(cases, names, fitted)
            out[gpu.name].setdefault("clusters", {})[cluster] = cv
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for gpu_name, r in out.items():
        print(f"{gpu_name}: {r['fit_rows']} fit rows of {', '.join(r['tables'])}")
        for k, v in r["params"].items():
            print(f"  {k} = {v:.4g}")
        print(f"  median |error|: fit {r['median_abs_error_fit']:.1%}, held-out {r['median_abs_error_held_out']:.1%} "
              f"(with the values it started from: {r['median_abs_error_held_out_before']:.1%})")
        for cluster, cv in r.get("clusters", {}).items():
            print(f"  cluster {cluster}: " + ", ".join(f"{k} = {v:.4g}" for k, v in cv.items()))


def _without_host(case: Case) -> Case:
    """``case`` on its cluster without the cluster's own host issue time."""
    return replace(case, cluster=replace(case.cluster, host_issue_s=0.0))


def _with(case: Case, values: dict[str, float]) -> Case:
    """``case`` on its cluster with the fitted cluster fields of ``values`` (GPU-wide ones)."""
    cl = case.cluster
    for k, v in values.items():
        if k in CLUSTER_FIELDS and k != "host_issue_s":
            cl = with_cluster_value(cl, k, v)
    return replace(case, cluster=cl)


if __name__ == "__main__":
    main()
