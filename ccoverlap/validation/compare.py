"""Predicted vs measured, per run and in summary, as a terminal table, Markdown or JSON.

Error = (predicted - measured) / measured, in percent: negative means the model predicts a
faster step than was measured. The summary gives the mean absolute error, the mean signed
error (the bias) and the worst run, over the runs that could be predicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ccoverlap.config import Count, check_value
from ccoverlap.console import Col, print_table, print_wrapped
from ccoverlap.errors import CCOverlapError
from ccoverlap.types import ProgressFn
from ccoverlap.validation.predict import Prediction, Unsupported, cost_params_for, predict_run, workload_for
from ccoverlap.validation.reader import RunSpec

if TYPE_CHECKING:
    from rich.console import Console

    from ccoverlap.cost.params import CostParams


@dataclass
class Row:
    """One run's comparison: the prediction, or the problem that prevented it."""

    run: RunSpec
    measured_s: float
    prediction: Prediction | None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.prediction is not None

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured x 100; NaN without a prediction."""
        if self.prediction is None:
            return math.nan
        return (self.prediction.step_time_s - self.measured_s) / self.measured_s * 100.0

    @property
    def memory_error_pct(self) -> float:
        """(predicted - measured) / measured peak memory per GPU x 100; NaN without a prediction
        or a measured ``memory_gib``."""
        mem = self.run.measurement.memory_gib
        if self.prediction is None or not mem:
            return math.nan
        return (self.prediction.peak_memory_bytes / 2**30 - mem) / mem * 100.0

    def to_dict(self) -> dict:
        r, p = self.run, self.prediction
        d: dict[str, Any] = {
            "name": r.name, "source": r.source, "assumptions": list(r.assumptions), "subset": r.subset,
            "group": r.group, "gpu": r.gpu_name, "gpus": r.gpus, "layout": {k: r.degree(k) for k in ("tp", "cp", "pp", "dp")},
            "framework": r.framework, "measured": {"kind": r.measurement.kind, "value": r.measurement.value,
                                                  "flop_rule": r.measurement.flop_rule,
                                                  "peak_tflops": r.measurement.peak_tflops,
                                                  "memory_gib": r.measurement.memory_gib},
            "measured_step_time_s": self.measured_s, "problem": self.problem or None,
        }
        if p is not None:
            d.update(predicted_step_time_s=p.step_time_s, error_pct=self.error_pct, compute_s=p.compute_s,
                     comm_s=p.comm_s, exposed_comm_s=p.exposed_comm_s, predicted_mfu=p.mfu,
                     predicted_peak_memory_gib=p.peak_memory_bytes / 2**30, fits_memory=p.fits_memory,
                     memory_error_pct=None if math.isnan(self.memory_error_pct) else self.memory_error_pct,
                     simulation_s=p.seconds, notes=list(p.notes))
        return d


@dataclass
class Summary:
    """Error statistics over the predicted rows (percent)."""

    n: int
    total: int
    mean_abs_pct: float
    mean_signed_pct: float
    worst_name: str
    worst_pct: float

    def line(self, label: str = "") -> str:
        head = f"{label}: " if label else ""
        if not self.n:
            return f"{head}no run of {self.total} could be predicted"
        return (f"{head}mean |error| {self.mean_abs_pct:.1f}%, mean signed error {self.mean_signed_pct:+.1f}%, "
                f"worst {self.worst_pct:+.1f}% ({self.worst_name}) over {self.n} of {self.total} runs")

    def to_dict(self) -> dict:
        return {"runs_predicted": self.n, "runs": self.total, "mean_abs_error_pct": self.mean_abs_pct,
                "mean_signed_error_pct": self.mean_signed_pct, "worst_run": self.worst_name,
                "worst_error_pct": self.worst_pct}


def _summary_of(rows: list[Row], error: Callable[[Row], float]) -> Summary:
    """The :class:`Summary` of ``error(row)`` (percent) over the predicted ``rows``."""
    ok = [r for r in rows if r.ok]
    if not ok:
        return Summary(0, len(rows), math.nan, math.nan, "", math.nan)
    errs = [error(r) for r in ok]
    worst = max(ok, key=lambda r: abs(error(r)))
    return Summary(len(ok), len(rows), sum(abs(e) for e in errs) / len(errs), sum(errs) / len(errs),
                   worst.run.name, error(worst))


def summarize(rows: Iterable[Row]) -> Summary:
    """Mean |error|, mean signed error and the worst run over ``rows`` that have a prediction."""
    return _summary_of(list(rows), lambda r: r.error_pct)


def summarize_memory(rows: Iterable[Row]) -> Summary | None:
    """Mean |error|, mean signed error and the worst run of the predicted peak memory per GPU
    (:func:`ccoverlap.parallel.memory.estimate_memory`) against the runs' measured
    ``memory_gib``, over the predicted runs that state one; None when none does. ``total``
    counts the runs that state a measured peak."""
    stated = [r for r in rows if r.run.measurement.memory_gib]
    return _summary_of(stated, lambda r: r.memory_error_pct) if stated else None


def summarize_groups(rows: Iterable[Row]) -> dict[str, Summary]:
    """:func:`summarize` per declared ``group`` of the runs (in the order groups first appear),
    so a bias shared by one framework or cluster shows as that group's mean signed error.
    Runs without a group are listed under ``(no group)``; empty when no run declares one."""
    rows = list(rows)
    if not any(r.run.group for r in rows):
        return {}
    by: dict[str, list[Row]] = {}
    for r in rows:
        by.setdefault(r.run.group or "(no group)", []).append(r)
    return {g: summarize(sel) for g, sel in by.items()}


def _one(args: tuple[RunSpec, CostParams | None], step_cache: dict[str, Any] | None = None) -> Row:
    run, params = args
    measured = run.measured_step_time_s
    try:
        if step_cache is not None and run.name in step_cache:
            return Row(run, measured, predict_run(run, params=params, step_cache=step_cache))
        wl = workload_for(run)
        return Row(run, measured, predict_run(run, params=params, workload=wl, step_cache=step_cache))
    except Unsupported as exc:
        return Row(run, measured, None, f"not supported by this build: {exc}")
    except CCOverlapError as exc:
        return Row(run, measured, None, f"cannot build: {exc}")
    except Exception as exc:  # a simulator bug on one run must not hide the others
        return Row(run, measured, None, f"prediction failed: {type(exc).__name__}: {exc}")


def compare_runs(runs: list[RunSpec], *, params_for: Callable[[RunSpec], Any] | None = None,
                 progress: ProgressFn | None = None, jobs: int = 1, step_cache: dict | None = None) -> list[Row]:
    """Predict every run (cost parameters from ``params_for(run)``, default: the GPU's
    defaults) and compare with its measurement. ``jobs`` > 1 simulates runs in that many
    processes; otherwise ``step_cache`` (a dict the caller keeps) reuses built step graphs
    across calls. A run that cannot be predicted becomes a row with a ``problem``."""

    check_value("jobs", jobs, Count)
    params_for = params_for or cost_params_for
    work = [(r, params_for(r)) for r in runs]
    rows: list[Row] = []
    if jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            for i, row in enumerate(ex.map(_one, work)):
                rows.append(row)
                if progress:
                    progress(i, len(work), f"{row.run.name} (done)")
    else:
        for i, item in enumerate(work):
            if progress:
                progress(i, len(work), item[0].name)
            rows.append(_one(item, step_cache))
        if progress:
            progress(len(work), len(work), "done")
    return rows


# ----------------------------------------------------------------------------- formatting

def _cells(r: Row) -> list[str]:
    p = r.prediction
    base = [r.run.name, r.run.gpu_name, str(r.run.gpus), r.run.layout, r.run.subset or "-", f"{r.measured_s:.3f}"]
    if p is None:
        return base + ["-", "-", "-", "-", "-"]
    return base + [f"{p.step_time_s:.3f}", f"{r.error_pct:+.1f}", f"{p.compute_s:.3f}", f"{p.comm_s:.3f}",
                   f"{p.exposed_comm_s:.3f}"]


COLUMNS = [Col("run", "left"), Col("GPU", "left", drop=6), Col("GPUs", drop=4), Col("TPxCPxPPxDP", drop=5),
           Col("subset", "left"), Col("measured (s)"), Col("predicted (s)"), Col("error %"),
           Col("compute (s)", drop=3), Col("comm (s)", drop=2), Col("exposed comm (s)", drop=1)]
HEADER = [c.header for c in COLUMNS]


def markdown_table(rows: list[Row]) -> str:
    """The per-run table as Markdown, then the runs that could not be predicted."""
    out = ["| " + " | ".join(HEADER) + " |",
           "| " + " | ".join([":--", ":--", "--:", "--:", ":--"] + ["--:"] * (len(HEADER) - 5)) + " |"]
    out.extend("| " + " | ".join(_cells(r)) + " |" for r in rows)
    problems = [r for r in rows if not r.ok]
    if problems:
        out += ["", f"{len(problems)} run(s) not predicted:"] + [f"* {r.run.name}: {r.problem}" for r in problems]
    return "\n".join(out)


def print_runs(rows: list[Row], console: Console) -> None:
    """The per-run table on a rich console (every cell whole at any width,
    :func:`ccoverlap.console.print_table`), then the runs that could not be predicted."""
    print_table(console, COLUMNS, [_cells(r) for r in rows])
    problems = [r for r in rows if not r.ok]
    if problems:
        console.print()
        print_wrapped(console, f"{len(problems)} run(s) not predicted:")
        for r in problems:
            print_wrapped(console, f"{r.run.name}: {r.problem}", indent=2)


def format_details(r: Row) -> str:
    """Everything about one run: source, measurement and its conversion, assumptions,
    the predicted breakdown and any notes."""
    run, p = r.run, r.prediction
    lines = [f"\n## {run.name}", f"  source: {run.source}",
             f"  measured: {run.measurement.describe()} -> {r.measured_s:.4f} s per step "
             f"({run.batch['global_batch']} x {run.batch.get('seq_len', 2048)} tokens on {run.gpus} GPUs)"]
    if run.measurement.memory_gib:
        lines.append(f"  measured peak memory: {run.measurement.memory_gib:g} GiB")
    lines += [f"  assumption: {a}" for a in run.assumptions]
    if p is None:
        lines.append(f"  NOT PREDICTED: {r.problem}")
    else:
        lines.append(f"  predicted: {p.step_time_s:.4f} s ({r.error_pct:+.1f}%), compute {p.compute_s:.4f} s, "
                     f"comm {p.comm_s:.4f} s, exposed comm {p.exposed_comm_s:.4f} s, MFU {p.mfu:.1%}, "
                     f"peak memory {p.peak_memory_bytes / 2**30:.1f} GiB{'' if p.fits_memory else ' (does not fit)'}"
                     + ("" if math.isnan(r.memory_error_pct) else f" ({r.memory_error_pct:+.1f}% of the measured)")
                     + ", "
                     f"simulated in {p.seconds:.2f} s")
        lines += [f"  note: {n}" for n in p.notes]
    return "\n".join(lines)
