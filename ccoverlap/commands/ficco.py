"""``ccoverlap ficco``: predicted time of every FiCCO schedule for one collective + GEMM, or
how often FiCCO's static heuristic (§V-C) picks the best schedule (``--accuracy``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ccoverlap.commands.options import DTYPE_BYTES, Subparsers, add_common, add_dtype
from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.cost.model import CostModel
    from ccoverlap.deciders.ficco.accuracy import AccuracyReport, CaseVerdict


def register(sub: Subparsers) -> None:
    """Add the ``ficco`` sub-command to ``sub`` (argparse sub-parsers)."""
    p = sub.add_parser("ficco", help="estimate FiCCO overlap schedules for a GEMM with its collective",
                       description=__doc__)
    p.add_argument("--m", type=int, default=131072, help="GEMM rows after the all-gather (M, elements)")
    p.add_argument("--n", type=int, default=2048,
                   help="output columns one GPU computes (N; with tensor parallelism the layer's width / TP)")
    p.add_argument("--k", type=int, default=16384, help="GEMM reduction dimension (K)")
    p.add_argument("--world", type=int, default=8, help="ranks in the group (one node)")
    p.add_argument("--cluster", "--gpu", dest="cluster", default="MI300X",
                   help="catalog cluster (its GPU; `ccoverlap list clusters`) or GPU (MI300X, H100-SXM, H200, ...; "
                        "`ccoverlap list gpus`); default MI300X")
    p.add_argument("--topology", choices=["switch", "full_mesh"], default=None,
                   help="intra-node fabric (default: the GPU's catalog node: MI300X full mesh, NVIDIA switch)")
    p.add_argument("--engine", choices=["sm", "dma"], default="dma",
                   help="communication by SM kernels (NCCL/RCCL) or by copy engines (DMA)")
    p.add_argument("--pattern", choices=["ag-gemm", "gemm-rs", "a2a-gemm"], default="ag-gemm",
                   help="all-gather then GEMM, GEMM then reduce-scatter, or all-to-all then GEMM")
    add_dtype(p, default="bfloat16")
    p.add_argument("--dtype-bytes", type=int, default=None, help=argparse.SUPPRESS)  # before --dtype
    p.add_argument("--accuracy", action="store_true",
                   help="heuristic accuracy over FiCCO's 16 scenarios (Table I, as each GPU runs them) and a "
                        "synthetic sweep, on --cluster/--topology/--engine")
    p.add_argument("--markdown", action="store_true", help="print markdown tables (for docs)")
    add_common(p)
    p.set_defaults(run=run)


def _cost(cluster: ClusterSpec) -> CostModel:
    from ccoverlap.deciders.ficco.schedules import cost_model_for_cluster

    return cost_model_for_cluster(cluster)


def run(args: argparse.Namespace) -> int:
    """Estimate one case (table of schedules) or, with ``--accuracy``, the heuristic's accuracy;
    returns the exit code. Bad input raises ConfigError."""
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.deciders.ficco import accuracy as ficco_accuracy
    from ccoverlap.deciders.ficco import schedules as ficco

    if args.dtype_bytes is None:
        args.dtype_bytes = DTYPE_BYTES[args.dtype]
    for name in ("m", "n", "k", "world", "dtype_bytes"):
        v = getattr(args, name)
        if v is None or v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {v}")
    gpu = get_cluster(args.cluster).gpu.name  # a cluster stands for its GPU, a GPU for itself
    cluster = ficco.machine(gpu, args.topology, args.world)
    cost = _cost(cluster)
    if args.accuracy:
        return _run_accuracy(args, ficco, cluster, cost)
    case = ficco.FiccoCase(m=args.m, n=args.n, k=args.k, world=args.world, cluster=cluster, engine=args.engine,
                           pattern=args.pattern, dtype_bytes=args.dtype_bytes)
    verdict = ficco_accuracy.judge(case, cost)
    if args.json:
        json.dump({"case": case.describe(), "heuristic": verdict.pick, "reason": verdict.reason,
                   "best": verdict.best, "best_overall": verdict.best_overall,
                   "schedules": [e.to_dict() for e in verdict.estimates]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.markdown:
        print(case_markdown(verdict))
        return 0
    _print_case(verdict)
    return 0


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def case_markdown(verdict: CaseVerdict) -> str:
    """One case's schedule table as markdown."""
    lines = [f"{verdict.case.describe()}", "",
             "| schedule | time (ms) | speedup | GEMM (ms) | comm (ms) | copies (ms) | DIL GEMM (ms) | DIL comm (ms) | CIL (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in verdict.estimates:
        mark = (" (best)" if e.schedule == verdict.best_overall else "") + \
               (" (heuristic)" if e.schedule == verdict.pick else "")
        lines.append(f"| {e.schedule}{mark} | {_ms(e.time_s)} | {e.speedup:.3f} | {_ms(e.gemm_s)} | {_ms(e.comm_s)} | "
                     f"{_ms(e.copy_s)} | {_ms(e.dil_gemm_s)} | {_ms(e.dil_comm_s)} | {_ms(e.cil_s)} |")
    lines += ["", f"heuristic (§V-C): **{verdict.pick}** — {verdict.reason}"]
    return "\n".join(lines)


def _print_case(verdict: CaseVerdict) -> None:
    from ccoverlap.console import Col, make_console, print_table

    console = make_console()
    console.print(f"[bold]{verdict.case.describe()}[/bold]")
    rows, styles = [], []
    for e in verdict.estimates:
        tags = (["best"] if e.schedule == verdict.best_overall else []) + \
               (["heuristic"] if e.schedule == verdict.pick else [])
        rows.append([e.schedule, _ms(e.time_s), f"{e.speedup:.3f}", _ms(e.gemm_s), _ms(e.comm_s), _ms(e.copy_s),
                     _ms(e.dil_gemm_s), _ms(e.dil_comm_s), _ms(e.cil_s), ", ".join(tags)])
        styles.append("bold green" if e.schedule == verdict.best_overall else None)
    print_table(console, [Col("schedule", "left"), Col("time (ms)"), Col("speedup"), Col("GEMM (ms)"),
                          Col("comm (ms)"), Col("copies (ms)", drop=4), Col("DIL GEMM (ms)", drop=2),
                          Col("DIL comm (ms)", drop=3), Col("CIL (ms)", drop=1), Col("", "left", wrap=True)],
                rows, styles=styles, everything="--json and --markdown have everything")
    console.print(f"heuristic (§V-C) picks [bold]{verdict.pick}[/bold]: {verdict.reason}")
    if verdict.match:
        console.print("the heuristic's pick is the estimator's best FiCCO schedule")
    else:
        console.print(f"the estimator's best FiCCO schedule is {verdict.best}; following the heuristic loses "
                      f"{verdict.loss:.1%} of its speedup")


def accuracy_reports(cluster: ClusterSpec, cost: CostModel, engine: str, world: int
                     ) -> tuple[tuple[AccuracyReport, AccuracyReport, AccuracyReport, AccuracyReport], dict[str, Any]]:
    """The accuracy reports of ``--accuracy``: FiCCO Table I and the synthetic sweep with the
    paper's thresholds, then both again with thresholds retuned on Table I only (so the sweep
    is held out). Returns (reports, fitted constants)."""
    from ccoverlap.deciders.ficco import accuracy as ficco_accuracy

    n_sweep = len(ficco_accuracy.SWEEP_M) * len(ficco_accuracy.SWEEP_N) * len(ficco_accuracy.SWEEP_K)
    paper = ficco_accuracy.accuracy(ficco_accuracy.paper_cases(cluster, engine, world), cost,
                           label="Table I (16), paper thresholds")
    sweep = ficco_accuracy.accuracy(ficco_accuracy.synthetic_cases(cluster, engine, world), cost,
                           label=f"sweep ({n_sweep}), paper thresholds")
    fit = ficco_accuracy.fit_heuristic(paper)
    tuning = {k: fit[k] for k in ("reference_time_s", "hetero_unfused_factor")}
    paper_t = ficco_accuracy.rejudge(paper, label="Table I (16), retuned on Table I", **tuning)
    sweep_t = ficco_accuracy.rejudge(sweep, label=f"sweep ({n_sweep}), retuned on Table I (held out)", **tuning)
    return (paper, sweep, paper_t, sweep_t), fit


def accuracy_markdown(reports: Sequence[AccuracyReport], fit: dict[str, Any] | None = None) -> str:
    """Summary and per-case markdown tables of accuracy reports (per-case tables for the
    first two; the retuned pick is shown beside the paper-threshold pick)."""
    from ccoverlap.deciders.ficco.accuracy import RUN_TO_RUN_VARIATION

    out = [f"| scenarios | heuristic = estimator's best | within {RUN_TO_RUN_VARIATION:.0%} of the best "
           "| mean loss on misses | worst loss |",
           "|---|---:|---:|---:|---:|"]
    for r in reports:
        out.append(f"| {r.label} | {r.matches}/{r.cases} ({r.rate:.0%}) | {r.matches_within()}/{r.cases} | "
                   f"{r.mean_loss_on_miss:.1%} | {r.max_loss:.1%} |")
    if fit:
        out += ["", f"Retuned constants (fitted on Table I): reference time {fit['reference_time_s']:.3g} s "
                    f"(threshold = peak FLOP/s x this), hetero-unfused factor {fit['hetero_unfused_factor']:g}."]
    for i, r in enumerate(reports[:2]):
        rt = reports[2 + i] if len(reports) >= 4 else None
        out += ["", f"**{r.label}**", "",
                "| case | pattern | M | N | K | heuristic | retuned | best FiCCO | best overall | serial (ms) | best FiCCO (ms) | speedup | loss |",
                "|---|---|---:|---:|---:|---|---|---|---|---:|---:|---:|---:|"]
        for j, v in enumerate(r.verdicts):
            c = v.case
            retuned = rt.verdicts[j].pick if rt is not None else ""
            out.append(f"| {c.name} | {c.pattern} | {c.m} | {c.n} | {c.k} | {v.pick}{'' if v.match else ' ✗'} | "
                       f"{retuned}{'' if rt is None or rt.verdicts[j].match else ' ✗'} | {v.best} | "
                       f"{v.best_overall} | {_ms(v.serial_time_s)} | {_ms(v.best_time_s)} | "
                       f"{v.serial_time_s / v.best_time_s:.2f} | {v.loss:.1%} |")
    return "\n".join(out)


def _run_accuracy(args: argparse.Namespace, ficco: ModuleType, cluster: ClusterSpec, cost: CostModel) -> int:
    reports, fit = accuracy_reports(cluster, cost, args.engine, args.world)
    header = (f"FiCCO heuristic accuracy on {args.world} x {cluster.gpu.name}, "
              f"{'full mesh' if cluster.intra.fabric == 'full_mesh' else cluster.intra.fabric}, {args.engine} communication")
    if args.json:
        json.dump({"machine": header, "retuned": fit, "reports": [
            {"label": r.label, "cases": r.cases, "matches": r.matches, "rate": r.rate,
             "matches_within_run_to_run_variation": r.matches_within(),
             "mean_loss_on_miss": r.mean_loss_on_miss, "max_loss": r.max_loss,
             "verdicts": [{"case": v.case.name, "m": v.case.m, "n": v.case.n, "k": v.case.k,
                           "pattern": v.case.pattern, "pick": v.pick, "best": v.best,
                           "best_overall": v.best_overall, "loss": v.loss,
                           "times_s": {e.schedule: e.time_s for e in v.estimates}} for v in r.verdicts]}
            for r in reports]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.markdown:
        print(header + "\n")
        print(accuracy_markdown(reports, fit))
        return 0
    from ccoverlap.console import Col, make_console, print_table

    console = make_console()
    console.print(f"[bold]{header}[/bold]")
    rows = [[r.label, f"{r.matches}/{r.cases} ({r.rate:.0%})", f"{r.matches_within()}/{r.cases}",
             f"{r.mean_loss_on_miss:.1%}", f"{r.max_loss:.1%}"] for r in reports]
    print_table(console, [Col("scenarios", "left", wrap=True), Col("heuristic = best"), Col("within 6%"),
                          Col("mean loss on misses"), Col("worst loss")], rows,
                title="heuristic (§V-C) vs estimator")
    console.print(f"retuned on Table I: reference time {fit['reference_time_s']:.3g} s, "
                  f"hetero-unfused factor {fit['hetero_unfused_factor']:g}")
    columns = [Col("case", "left"), Col("pattern", "left", drop=2), Col("M"), Col("N"), Col("K"),
               Col("heuristic", "left"), Col("best FiCCO", "left"), Col("best overall", "left", drop=3),
               Col("speedup", drop=1), Col("loss")]
    for r in reports[:2]:
        rows = [[v.case.name, v.case.pattern, str(v.case.m), str(v.case.n), str(v.case.k), v.pick, v.best,
                 v.best_overall, f"{v.serial_time_s / v.best_time_s:.2f}", f"{v.loss:.1%}"] for v in r.verdicts]
        print_table(console, columns, rows, title=r.label, styles=[None if v.match else "yellow" for v in r.verdicts],
                    everything="--json and --markdown have everything")
    return 0
