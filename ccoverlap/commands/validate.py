"""``ccoverlap validate RUNS_FILE``: predicted vs measured step time of real training runs.

Per run: the measured step time (converted from what the source reports by its own FLOP rule),
the predicted one, the error, and the predicted compute / communication / exposed
communication; then mean |error|, mean signed error and the worst run, and the same for the
predicted peak memory per GPU over the runs that state a measured one (``memory_gib``). ``--fit PARAMS
--fit-on SUBSET`` fits named physical cost parameters on the runs of that declared subset,
reports the error on the others (held out) and writes the calibration file that
``plan`` / ``simulate --calibration`` read. The published set shipped with ccoverlap is
``ccoverlap validate published``. ``ccoverlap validate collectives`` judges the communication
model on the shipped collective measurement tables instead, ``ccoverlap validate kernels`` the
compute model on the kernel measurement corpus (per GPU and kernel class); both take
``--split fit|held-out|all``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ccoverlap.commands.options import Subparsers, add_json, add_quiet
from ccoverlap.config import short, suggest
from ccoverlap.console import make_console, print_wrapped
from ccoverlap.errors import ConfigError
from ccoverlap.outputs import check_out_file
from ccoverlap.validation.reader import runs_path

if TYPE_CHECKING:
    from rich.console import Console

    from ccoverlap.cost.params import CostParams
    from ccoverlap.validation.compare import Row, Summary
    from ccoverlap.validation.reader import RunsFile, RunSpec

#: where ``--fit`` writes its calibration unless ``--write-calibration`` says
DEFAULT_CALIBRATION = "ccoverlap-out/validate/calibration.json"
#: the measurement corpora ``validate`` judges a model on instead of a runs file
CORPORA = ("collectives", "kernels")


class ParamsFor(Protocol):
    """``params_for(run, overrides)``: the cost parameters a run is predicted with (its GPU's,
    with the calibration files' values and then ``overrides`` applied)."""

    def __call__(self, run: RunSpec, overrides: dict[str, float] | None = None, /) -> CostParams: ...


def register(sub: Subparsers) -> None:
    """Add the ``validate`` subparser."""
    p = sub.add_parser("validate", help="predicted vs measured step time of real training runs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_file", metavar="RUNS_FILE",
                   help="runs file (YAML/JSON/TOML, see docs/validation.md), 'published' for the shipped set, "
                        "'collectives' for the communication model against the collective corpus, "
                        "or 'kernels' for the compute model against the kernel corpus")
    add_json(p)
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    p.add_argument("--details", action="store_true", help="per run: source, conversion, assumptions, breakdown")
    p.add_argument("--run", dest="only", action="append", default=[], metavar="NAME", help="only this run (repeatable)")
    p.add_argument("--subset", help="only the runs of this declared subset (fit / held-out)")
    p.add_argument("--calibration", action="append", default=[], metavar="FILE",
                   help="calibration file(s) to predict with (applied to runs on the file's 'gpu', or to all)")
    p.add_argument("--fit", metavar="PARAMS", help="comma-separated physical cost parameters to fit "
                   "(recommended: sustained_clock_fraction, one number per GPU; docs/validation.md)")
    p.add_argument("--fit-on", metavar="SUBSET", help="declared subset to fit on (the runs' 'subset:' value)")
    p.add_argument("--write-calibration", metavar="PATH", default=None,
                   help="where --fit writes its calibration (default " + DEFAULT_CALIBRATION + "; one file "
                        "per GPU: PATH with the GPU name inserted when several)")
    p.add_argument("--jobs", type=int, default=1, help="simulate runs in this many processes")
    p.add_argument("--split", choices=("held-out", "fit", "all"), default=None,
                   help="collectives and kernels only: the tables' half to judge on (default held-out)")
    add_quiet(p)
    p.set_defaults(run=run)


def _load_calibrations(paths: list[str]) -> dict[str, dict[str, float]]:
    """``{gpu name or "*": {param: value}}`` from calibration files; only the parameters a
    file sets override the GPU's defaults (a file without ``gpu`` applies to every GPU)."""
    from ccoverlap.cost.params import CostParams

    out: dict[str, dict[str, float]] = {}
    for path in paths:
        params = CostParams.load(path).to_dict()  # checks the file (one line on any problem)
        raw = json.loads(Path(path).read_text())
        set_here = raw.get("params", raw)
        out[raw.get("gpu") or "*"] = {k: params[k] for k in set_here}
    return out


def _calibration_paths(path: str, gpus: list[str]) -> dict[str, Path]:
    p = Path(path)
    if len(gpus) == 1:
        return {gpus[0]: p}
    return {g: p.with_name(f"{p.stem}.{g}{p.suffix or '.json'}") for g in gpus}


def run(args: argparse.Namespace) -> int:
    """Predict the runs that pass the checks, list the ones that do not; exit 2 only when no
    run is predicted. ``--json`` prints one object in every case (``error`` when the file
    cannot be used at all)."""
    from ccoverlap.errors import CCOverlapError

    if args.runs_file in CORPORA:
        _check_corpus_options(args)
        return _run_collectives(args) if args.runs_file == "collectives" else _run_kernels(args)
    if args.split is not None:
        raise ConfigError("--split is for 'ccoverlap validate collectives' and 'ccoverlap validate kernels'")
    try:
        return _run(args)
    except CCOverlapError as exc:
        if args.json:
            json.dump({"runs_file": str(args.runs_file), "error": str(exc), "summary": None, "runs": [],
                       "invalid_runs": []}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        raise


def _check_corpus_options(args: argparse.Namespace) -> None:
    """The options of a runs file that a measurement corpus does not take are an error."""
    used = [o for o, v in (("--fit", args.fit), ("--fit-on", args.fit_on), ("--run", args.only),
                           ("--subset", args.subset), ("--calibration", args.calibration),
                           ("--write-calibration", args.write_calibration),
                           ("--details", args.details), ("--markdown", args.markdown)) if v]
    if used:
        raise ConfigError(f"{used[0]} does not apply to 'ccoverlap validate {args.runs_file}'")


def _run_kernels(args: argparse.Namespace) -> int:
    """``validate kernels``: per-GPU, per-class errors of the compute model on the kernel corpus."""
    from ccoverlap.validation.kernels import report, text_lines

    rep = report(args.split or "held-out")
    if args.json:
        json.dump(rep, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(text_lines(rep)) + "\n")
    return 0


def _run_collectives(args: argparse.Namespace) -> int:
    """``validate collectives``: the model's errors on every collective table's split."""
    from ccoverlap.validation.collectives import report, report_lines, validate_corpus

    split = args.split or "held-out"
    try:
        groups = validate_corpus(split)
    except ConfigError as exc:
        if args.json:  # one object in every case
            json.dump({"split": split, "error": str(exc), "groups": []}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        raise
    if args.json:
        json.dump(report(groups, split), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(report_lines(groups, split)) + "\n")
    return 0


def _run(args: argparse.Namespace) -> int:
    """Check the options, predict every selected run, print the table or JSON; 2 when no run could be predicted."""
    from ccoverlap.validation.compare import summarize, summarize_groups, summarize_memory
    from ccoverlap.validation.reader import load_runs

    path = runs_path(args.runs_file)
    names = _check_options(args)
    rf = load_runs(path, keep_going=True)
    runs = _select_runs(args, path, rf)
    rows, fit_report = _predict_runs(args, path, runs, names)
    summary = summarize(rows)
    parts = _subset_summaries(args, rows, names)
    groups = summarize_groups(rows)
    if len(groups) < 2:
        groups = {}  # one group says nothing the all-runs line does not
    memory = summarize_memory(rows)
    if args.json:
        _print_json(args, path, rows, names, summary, parts, groups, fit_report, rf.problems, memory)
    else:
        _print_text(args, path, rows, names, summary, parts, groups, fit_report, rf.problems, memory)
    if not any(r.ok for r in rows):
        sys.stderr.write(f"ccoverlap validate: error: no run of {path} could be predicted "
                         f"(first problem: {rows[0].run.name}: {rows[0].problem})\n")
        return 2
    return 0


def _check_options(args: argparse.Namespace) -> list[str] | None:
    """Check --fit / --fit-on and --subset (compare_runs checks --jobs); the parameters to fit
    (None without --fit)."""
    from ccoverlap.validation.reader import SUBSETS

    if bool(args.fit) != bool(args.fit_on):
        raise ConfigError("--fit and --fit-on go together: name the parameters and the subset to fit them on")
    if args.write_calibration is not None and not args.fit:  # nothing would be written
        raise ConfigError("--write-calibration writes fitted parameters: give --fit and --fit-on too")
    args.write_calibration = args.write_calibration or DEFAULT_CALIBRATION
    names = None
    if args.fit:
        from ccoverlap.validation.fit import parse_fit_params

        names = parse_fit_params(args.fit)
        check_out_file(args.write_calibration, "--write-calibration")  # before the fit's minutes
        if args.fit_on not in SUBSETS:
            raise ConfigError(f"--fit-on must be one of the declared subsets {SUBSETS}, got {short(args.fit_on)}")
    if args.subset is not None and args.subset not in SUBSETS:
        raise ConfigError(f"--subset must be one of {SUBSETS}, got {short(args.subset)}")
    return names


def _select_runs(args: argparse.Namespace, path: Path, rf: RunsFile) -> list[RunSpec]:
    """The runs of ``rf`` that passed its checks, narrowed to --run and --subset (a clear error when none is left)."""
    runs = rf.runs
    if not runs:
        raise ConfigError(f"no run of {path} passed the checks; first problem: {rf.problems[0]}")
    if args.only:
        known = {r.name for r in runs}
        missing = [n for n in args.only if n not in known]
        if missing:
            names = sorted(known)
            shown = ", ".join(names[:8]) + (f", ... ({len(names)} runs)" if len(names) > 8 else "")
            raise ConfigError(f"{path}: no run named {short(missing[0])}{suggest(missing[0], known)}; runs: {shown}")
        runs = [r for r in runs if r.name in args.only]
    if args.subset:
        runs = [r for r in runs if r.subset == args.subset]
        if not runs:
            raise ConfigError(f"{path}: no run declares subset {args.subset!r}")
    return runs


def _predict_runs(args: argparse.Namespace, path: Path, runs: list[RunSpec], names: list[str] | None
                  ) -> tuple[list[Row], dict[str, Any] | None]:
    """Predict every run (fitting ``names`` on --fit-on first, when given): the comparison rows and the fit report."""
    from ccoverlap.console import Progress
    from ccoverlap.validation.compare import compare_runs
    from ccoverlap.validation.predict import cost_params_for

    calib = _load_calibrations(args.calibration) if args.calibration else None
    progress = Progress("validate", enabled=not args.quiet, delay=0)

    def params_for(r: RunSpec, overrides: dict[str, float] | None = None) -> CostParams:
        return cost_params_for(r, overrides, calib)

    if not names:
        return compare_runs(runs, params_for=params_for, progress=progress, jobs=args.jobs), None
    fit_runs = [r for r in runs if r.subset == args.fit_on]
    if not fit_runs:
        raise ConfigError(f"{path}: no run declares subset {args.fit_on!r} to fit on")
    fit_report = _fit(args, names, fit_runs, params_for)
    fitted = fit_report["values"]
    rows = compare_runs(runs, params_for=lambda r: params_for(r, fitted.get(r.gpu_name)),
                        progress=progress, jobs=args.jobs)
    return rows, fit_report


def _subset_summaries(args: argparse.Namespace, rows: list[Row], names: list[str] | None) -> dict[str, Summary]:
    """Summaries per subset: fitted-on vs held out with --fit, else each declared subset that is not every run."""
    from ccoverlap.validation.compare import summarize
    from ccoverlap.validation.reader import SUBSETS

    parts: dict[str, Summary] = {}
    if names:
        parts = {f"{args.fit_on} (fitted on)": summarize(r for r in rows if r.run.subset == args.fit_on),
                 "held out (every other run)": summarize(r for r in rows if r.run.subset != args.fit_on)}
    else:
        for s in SUBSETS:
            sel = [r for r in rows if r.run.subset == s]
            if sel and len(sel) < len(rows):
                parts[s] = summarize(sel)
    return parts


def _print_json(args: argparse.Namespace, path: Path, rows: list[Row], names: list[str] | None, summary: Summary,
                parts: dict[str, Summary], groups: dict[str, Summary], fit_report: dict[str, Any] | None,
                problems: list[str], memory: Summary | None = None) -> None:
    """The ``--json`` report: one JSON object on stdout (``memory``: the peak-memory summary
    over the runs that state a measured peak, when any does)."""
    payload: dict[str, Any] = {"runs_file": str(path), "parameters": "fitted" if names else
               ("calibration " + ", ".join(args.calibration) if args.calibration else "defaults (nothing fitted)"),
               "summary": summary.to_dict(), "subsets": {k: v.to_dict() for k, v in parts.items()},
               "groups": {k: v.to_dict() for k, v in groups.items()},
               "runs": [r.to_dict() for r in rows], "invalid_runs": problems}
    if memory is not None:
        payload["memory_summary"] = memory.to_dict()
    if fit_report:
        payload["fit"] = fit_report
    json.dump(payload, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _say(con: Console | None, line: str = "") -> None:
    """One line of the text report: as is for Markdown (``con`` None), else wrapped at word
    boundaries to the console, keeping its indent."""
    if con is None:
        print(line)
        return
    body = line.lstrip(" ")
    if body:
        print_wrapped(con, body, indent=len(line) - len(body))
    else:
        con.print()


def _print_text(args: argparse.Namespace, path: Path, rows: list[Row], names: list[str] | None, summary: Summary,
                parts: dict[str, Summary], groups: dict[str, Summary], fit_report: dict[str, Any] | None,
                problems: list[str], memory: Summary | None = None) -> None:
    """The text (or ``--markdown``) report: the per-run table, the summaries (``memory``: the
    peak memory per GPU against the runs that state it), the fit and the runs of the file not
    read."""
    from ccoverlap.validation.compare import format_details, markdown_table, print_runs

    md = args.markdown
    con = None if md else make_console(highlight=False)
    what = ("parameters fitted on subset " + repr(args.fit_on) if names else
            "calibration " + ", ".join(args.calibration) if args.calibration else
            "default cost parameters (nothing fitted)")
    _say(con, f"{'**' if md else ''}{path.name}: {len(rows)} runs, {what}{'**' if md else ''}")
    _say(con)
    if md:
        print(markdown_table(rows))
    else:
        assert con is not None  # made whenever the report is not Markdown
        print_runs(rows, con)
    _say(con)
    bullet = "* " if md else ""
    _say(con, bullet + summary.line("all runs"))
    for label, s in parts.items():
        _say(con, bullet + s.line(label))
    if groups:
        _say(con)
        _say(con, f"{'**' if md else ''}by group{'**' if md else ''} (a bias one framework or cluster shares shows here)")
        for label, s in groups.items():
            _say(con, bullet + s.line(label))
    if memory is not None:
        _say(con)
        _say(con, f"{'**' if md else ''}peak memory per GPU{'**' if md else ''} (predicted total against the "
                  "measured peak the source reports; nothing fitted)")
        _say(con, bullet + memory.line("memory"))
    if fit_report:
        _say(con)
        for gpu, vals in fit_report["values"].items():
            dflt = fit_report["defaults"][gpu]
            _say(con, bullet + f"fitted on {gpu} ({fit_report['fit_runs'][gpu]} runs): " + ", ".join(
                f"{k} {dflt[k]:.4g} -> {v:.4g}" for k, v in vals.items())
                + f"; calibration written to {fit_report['written'][gpu]}")
    if problems:
        _say(con)
        _say(con, f"{len(problems)} run(s) of the file not read (fix them to include them):")
        for line in problems:
            _say(con, f"{'* ' if md else '  '}{line}")
    if args.details:
        _say(con)
        for r in rows:
            for line in format_details(r).split("\n"):
                _say(con, line)


def _fit(args: argparse.Namespace, names: list[str], fit_runs: list[RunSpec], params_for: ParamsFor) -> dict[str, Any]:
    """Fit ``names`` per GPU on ``fit_runs``; write one calibration file per GPU."""
    from ccoverlap.console import Progress
    from ccoverlap.validation.compare import compare_runs
    from ccoverlap.validation.fit import fit_params

    steps: dict[str, Any] = {}  # built once per run, re-simulated with each candidate (single process)

    def loss_fn(group: list[RunSpec], overrides: dict[str, float]) -> float:
        rows = compare_runs(group, params_for=lambda r: params_for(r, overrides), jobs=args.jobs,
                            step_cache=steps if args.jobs == 1 else None)
        ok = [r for r in rows if r.ok]
        if not ok:
            raise ConfigError(f"--fit: no run of subset {args.fit_on!r} on {group[0].gpu_name} could be predicted "
                              f"({rows[0].run.name}: {rows[0].problem})")
        return sum((r.error_pct / 100.0) ** 2 for r in ok) / len(ok)

    def say(msg: str) -> None:
        if not args.quiet:
            sys.stderr.write(f"validate: {msg}\n")
            sys.stderr.flush()

    # Runs this build cannot predict take no part in the fit.
    say(f"fitting {', '.join(names)} on {len(fit_runs)} runs of subset {args.fit_on!r} (one simulation each first)")
    usable = [r for r in compare_runs(fit_runs, params_for=params_for, jobs=args.jobs,
                                      progress=Progress("validate: fit check", enabled=not args.quiet, delay=0))
              if r.ok]
    if not usable:
        raise ConfigError(f"--fit: no run of subset {args.fit_on!r} could be predicted")
    res = fit_params([r.run for r in usable], names, loss_fn=loss_fn, progress=say)
    gpus = list(res.values)
    paths = _calibration_paths(args.write_calibration, gpus)
    written: dict[str, str] = {}
    for gpu in gpus:
        group = [r.run for r in usable if r.run.gpu_name == gpu]
        params = params_for(group[0], res.values[gpu])
        out = paths[gpu]
        rms = res.loss_after[gpu] ** 0.5
        params.save(out, gpu=gpu, fit_error=rms,
                    source=f"ccoverlap validate --fit {','.join(names)} --fit-on {args.fit_on} "
                           f"on {len(group)} runs of {args.runs_file}")
        written[gpu] = str(out)
    return {"parameters": names, "fit_on": args.fit_on, "values": res.values, "defaults": res.defaults,
            "loss_before": res.loss_before, "loss_after": res.loss_after, "evaluations": res.evaluations,
            "fit_runs": {g: sum(1 for r in usable if r.run.gpu_name == g) for g in gpus}, "written": written}
