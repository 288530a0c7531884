"""Predicted vs published iteration times of real training runs (issue 2, "Must show").

For each case of :mod:`published_runs` this builds the workload exactly as the run was
described (knobs as the run used them), predicts one training step with
``ccoverlap.plan.evaluate`` using the *default* cost parameters of the GPU (nothing here is
fitted to these cases), and prints: case, measured iteration time, predicted, error.

    .venv/bin/python benchmarks/validate_published.py              # plain table
    .venv/bin/python benchmarks/validate_published.py --markdown   # markdown table
    .venv/bin/python benchmarks/validate_published.py --case "MCore-GPT-1.7B H100x48" --details
    .venv/bin/python benchmarks/validate_published.py --sensitivity --markdown   # other assumptions
    .venv/bin/python benchmarks/validate_published.py --compute-derate 0.75    # an experiment, see docs

Error = (predicted - measured) / measured; the summary line gives the mean absolute error
(MAE, in %) and the mean signed error (bias).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from published_runs import CASES, CUSTOM_CLUSTERS, SENSITIVITY, PublishedRun, case_by_name, with_changes  # noqa: E402


def cluster_for(case: PublishedRun):
    """The ClusterSpec of ``case``: a catalog cluster, or a catalog cluster with the changes of
    :data:`published_runs.CUSTOM_CLUSTERS` applied, with as many 8-GPU nodes as the run used."""
    from ccoverlap.hardware import get_cluster

    spec = CUSTOM_CLUSTERS.get(case.cluster)
    base = get_cluster(spec["base"] if spec else case.cluster)
    if base.gpus_per_node <= 0 or case.gpus % base.gpus_per_node:
        raise ValueError(f"{case.name}: {case.gpus} GPUs is not a whole number of {base.gpus_per_node}-GPU nodes")
    c = base.with_nodes(case.gpus // base.gpus_per_node)
    if spec:
        changes = {}
        if "gpu" in spec:
            changes["gpu"] = replace(c.gpu, **spec["gpu"])
        for link in ("intra", "inter"):
            if link in spec:
                changes[link] = replace(getattr(c, link), **spec[link])
        c = replace(c, name=case.cluster, **changes)
    return c


# Framework profile of each group of cases (ccoverlap/data/frameworks, docs/model.md). Llama 3's
# framework is Meta's own; its fused kernels (flash attention, no dropout) are closest to
# megatron-core's profile (an assumption).
FRAMEWORK_OF_GROUP = {
    "Megatron-Core r0.8.0 weak scaling (H100)": "megatron-core",
    "Megatron-LM PTD-P 2021 weak scaling (A100)": "megatron-lm-2021",
    "torchtitan FSDP2": "torchtitan",
    "Llama 3 405B pre-training": "megatron-core",
}


def workload_for(case: PublishedRun):
    """The ccoverlap Workload of ``case`` (validated by ``workload_from_mapping``)."""
    from ccoverlap.workload import workload_from_mapping

    c = cluster_for(case)
    base = CUSTOM_CLUSTERS.get(case.cluster, {}).get("base", case.cluster)
    w = workload_from_mapping({
        "model": case.model,
        "cluster": base,
        "nodes": c.nodes,
        "parallel": dict(case.parallel),
        "batch": dict(case.batch),
        "knobs": dict(case.knobs),
        "framework": FRAMEWORK_OF_GROUP.get(case.group, "megatron-core"),
    }, source=case.name)
    if c != w.cluster:
        w = replace(w, cluster=c)
        w.parallel.validate(w.model, w.cluster, w.batch)
    return w


def evaluate_case(case: PublishedRun, *, compute_derate: float | None = None):
    """The planner's StrategyResult for ``case`` with the default cost parameters of its GPU.

    ``compute_derate`` (an experiment for docs/validation.md, never the default) multiplies
    ``gemm_peak_fraction`` and ``attention_peak_fraction`` by that factor."""
    from ccoverlap.plan import evaluate

    w = workload_for(case)
    cost = None
    if compute_derate is not None:
        from ccoverlap.cost import CostModel
        from ccoverlap.cost.params import default_params

        p = default_params(w.cluster.gpu)
        p = p.with_overrides(gemm_peak_fraction=min(1.0, p.gemm_peak_fraction * compute_derate),
                             attention_peak_fraction=min(1.0, p.attention_peak_fraction * compute_derate))
        cost = CostModel(w.cluster, p)
    return evaluate(w, "as-published", cost=cost)


def predict(case: PublishedRun) -> float:
    """Predicted iteration time (s) of ``case``."""
    return evaluate_case(case).step_time_s


def _fmt_row(cells, widths):
    return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def run(cases, *, markdown: bool = False, details: bool = False, out=sys.stdout,
        labels: list[str] | None = None, compute_derate: float | None = None) -> list[dict]:
    """Evaluate ``cases``, print the table (plain or markdown) and return the rows.
    ``labels``: an extra "assumption" column (the sensitivity table)."""
    rows = []
    for case in cases:
        t0 = time.perf_counter()
        try:
            res = evaluate_case(case, compute_derate=compute_derate)
            pred, err_msg = res.step_time_s, ""
        except Exception as exc:  # report, keep going: one broken case must not hide the others
            res, pred, err_msg = None, float("nan"), f"{type(exc).__name__}: {exc}"
        meas = case.measured_step_time_s
        err = (pred - meas) / meas * 100.0 if pred == pred else float("nan")
        rows.append({"case": case, "measured": meas, "predicted": pred, "error_pct": err, "result": res,
                     "failure": err_msg, "sim_s": time.perf_counter() - t0})
        if details and res is not None:
            print(f"# {case.name}: compute {res.compute_s:.3f}s, comm {res.comm_s:.3f}s, exposed comm "
                  f"{res.exposed_comm_s:.3f}s, overlap {res.overlap_ratio:.2f}, MFU {res.mfu:.3f}, "
                  f"fits memory {res.fits_memory} ({res.peak_memory_bytes / 2**30:.1f} GiB), "
                  f"simulated in {rows[-1]['sim_s']:.1f}s", file=sys.stderr)
        if err_msg:
            print(f"# {case.name}: FAILED: {err_msg}", file=sys.stderr)

    ok = [r for r in rows if r["predicted"] == r["predicted"]]
    mae = sum(abs(r["error_pct"]) for r in ok) / len(ok) if ok else float("nan")
    bias = sum(r["error_pct"] for r in ok) / len(ok) if ok else float("nan")

    header = ["case", "GPUs", "TPxPPxDP", "measured (s)", "predicted (s)", "error %", "pred. MFU"]
    if labels:
        header.insert(1, "assumption changed")

    def cells(i, r):
        c, d = r["case"], r["case"].degrees
        mfu = f"{r['result'].mfu * 100:.1f}%" if r["result"] is not None else "-"
        pred = f"{r['predicted']:.3f}" if r["predicted"] == r["predicted"] else "FAILED"
        err = f"{r['error_pct']:+.1f}" if r["error_pct"] == r["error_pct"] else "-"
        row = [c.name, c.gpus, f"{d['tp']}x{d['pp']}x{d['dp']}", f"{r['measured']:.3f}", pred, err, mfu]
        if labels:
            row.insert(1, labels[i])
        return row

    body = [cells(i, r) for i, r in enumerate(rows)]
    summary = f"mean absolute error: {mae:.1f}% over {len(ok)} of {len(rows)} cases (mean signed error {bias:+.1f}%)"
    if markdown:
        print("| " + " | ".join(header) + " |", file=out)
        left = 2 if labels else 1
        print("| " + " | ".join([":--"] * left + ["--:"] * (len(header) - left)) + " |", file=out)
        for b in body:
            print("| " + " | ".join(str(x) for x in b) + " |", file=out)
        print(f"\n**{summary}**", file=out)
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
        print(_fmt_row(header, widths), file=out)
        print("-" * (sum(widths) + 2 * (len(widths) - 1)), file=out)
        for b in body:
            print(_fmt_row(b, widths), file=out)
        print(summary, file=out)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    ap.add_argument("--details", action="store_true", help="per-case breakdown on stderr")
    ap.add_argument("--sensitivity", action="store_true",
                    help="the cases again under the alternative assumptions of published_runs.SENSITIVITY")
    ap.add_argument("--compute-derate", type=float, metavar="ALPHA",
                    help="experiment: multiply gemm_peak_fraction and attention_peak_fraction by ALPHA")
    args = ap.parse_args(argv)
    if args.sensitivity:
        chosen = [s for s in SENSITIVITY if not args.case or s[0] in args.case]
        cases = [with_changes(case_by_name(n), ch) for n, _, ch in chosen]
        labels = [lab for _, lab, _ in chosen]
    else:
        cases = [case_by_name(n) for n in args.case] if args.case else list(CASES)
        labels = None
    rows = run(cases, markdown=args.markdown, details=args.details, labels=labels,
               compute_derate=args.compute_derate)
    return 1 if any(r["failure"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
