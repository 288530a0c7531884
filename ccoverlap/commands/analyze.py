"""``ccoverlap analyze``: measure overlap in real torch.profiler (Kineto) traces.

One trace file per rank (``.json`` / ``.json.gz``), given as files or directories. Prints
per-rank and per-step compute / communication / overlap (HolisticTraceAnalysis' definition)
/ exposed communication / idle time, per-collective bandwidths, cross-rank skew and
stragglers, the slowdown overlap causes compute, and a verdict; ``--json`` prints one JSON
object instead; ``--png`` also draws one step (never with ``--json``). The ranks are read in
parallel worker processes (one per CPU) when that pays, or on a Ray cluster's workers with
``--engine ray [--address ADDR]``; traces may be fsspec URLs (s3://, gs://, hdfs://, file://).
``--vs B`` compares with another run (for example a ``ccoverlap simulate`` output). Exit code 2
only when nothing could be analysed.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ccoverlap.commands.options import Subparsers, add_common, check_outputs, png_path
from ccoverlap.workers.pool import ENGINES

if TYPE_CHECKING:
    from ccoverlap.trace.result import Analysis

DEFAULT_OUT = "ccoverlap-out/analyze"


def register(sub: Subparsers) -> None:
    """Add the ``analyze`` subparser."""
    p = sub.add_parser("analyze", help="measure overlap in torch.profiler traces (one file per rank)",
                       description=__doc__)
    p.add_argument("traces", nargs="+", help="trace files or directories (*.json, *.json.gz), local or "
                                             "fsspec URLs (s3://bucket/job/, file:///data/job/)")
    p.add_argument("--steps", default="hta",
                   help="profiler steps to analyse: 'hta' (default: HolisticTraceAnalysis' window, the last "
                        "step dropped), 'all', or numbers like '3,4' / '3-5'")
    p.add_argument("--time-resolution", choices=("hta", "exact"), default="hta",
                   help="'hta' (default) rounds sub-microsecond timestamps inward to whole µs like HTA; "
                        "'exact' keeps the trace's ns resolution")
    add_common(p, out=DEFAULT_OUT, png=True)  # --png: one step's timeline (not with --json)
    p.add_argument("--png-step", type=int, help="profiler step drawn in the picture (default: first analysed)")
    p.add_argument("--vs", nargs="+", metavar="TRACE", help="compare with these traces (e.g. a simulated run)")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes reading the ranks on this machine, this one included (default: one per CPU "
                        "when there are two or more files totalling 2 MiB or more)")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="where the per-rank work runs: 'local' (default: this machine) or 'ray' (a Ray "
                        "cluster's workers; pip install 'ccoverlap[ray]')")
    p.add_argument("--address", help="with --engine ray: the cluster's head, host:port or 'auto' (default: "
                                     "start Ray on this machine)")
    p.add_argument("--groups", metavar="FILE",
                   help="JSON mapping of process groups to parallelism dimensions, e.g. "
                        "{\"0\": \"DP\", \"tp_group\": \"TP\"} (keys: group name, description or "
                        "'ranks:0,1'); default: inferred from the groups' names, descriptions and ranks")
    p.set_defaults(run=run)


def _check_after(args: argparse.Namespace, a: Analysis, b: Analysis | None, groups: dict[str, str] | None,
                 picture: bool) -> None:
    """ConfigError for what only the traces tell: a ``--groups`` key that matches no process
    group, a ``--png-step`` that is not an analysed step."""
    from ccoverlap.errors import ConfigError
    from ccoverlap.outputs import path_name
    from ccoverlap.trace.dimensions import check_group_keys

    if groups:
        jobs = [a] + ([b] if b is not None else [])
        seen = {g for x in jobs for d in x.dimensions for g in d.groups}
        check_group_keys(groups, [r for x in jobs for r in x.ranks], seen, where=f"--groups {path_name(args.groups)}")
    if picture and args.png_step is not None and args.png_step not in a.analysed_steps:
        steps = a.analysed_steps
        have = (f"{steps[0]}-{steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1)) else
                ", ".join(map(str, steps))) if steps else "none"
        raise ConfigError(f"--png-step {args.png_step}: not an analysed step; the analysed steps are {have}"
                          + ("" if args.steps == "all" else " (--steps all analyses every step)"))


def run(args: argparse.Namespace) -> int:
    """Analyse, print (table or JSON), draw; 0 on success (TraceError/ConfigError -> exit 2 in the CLI)."""
    from ccoverlap.errors import CCOverlapError, ConfigError
    from ccoverlap.trace.analyze import analyze, compare
    from ccoverlap.trace.dimensions import load_groups
    from ccoverlap.trace.report_json import print_problems, write_json  # rich only for the tables and picture

    if args.png is not None and not args.json:
        check_outputs(args, "analyze", out_used=False)
    try:
        groups = load_groups(args.groups) if getattr(args, "groups", None) else None
        picture = args.png is not None and not args.json
        where = {"engine": args.engine, "address": args.address, "jobs": args.jobs}
        a = analyze(args.traces, steps=args.steps, time_resolution=args.time_resolution, groups=groups,
                    picture=picture, png_step=args.png_step, **where)
        b = None
        if args.vs:
            b = analyze(args.vs, steps=args.steps if args.steps in ("hta", "all") else "hta",
                        time_resolution=args.time_resolution, groups=groups, **where)
        _check_after(args, a, b, groups, picture)
    except CCOverlapError as exc:
        if args.json:   # --json always prints one object, also when nothing could be analysed
            import json

            doc = {"tool": "ccoverlap analyze", "error": str(exc), "files": getattr(exc, "files", []),
                   "problems": getattr(exc, "problems", [str(exc)]), "ranks": [], "summary": None}
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
        raise
    if not args.quiet:
        print_problems(a.problems, sys.stderr)
        if b is not None:
            print_problems([f"(--vs) {p}" for p in b.problems], sys.stderr)
    png = None
    if args.png is not None and args.json and not args.quiet:
        print_problems(["--png is not drawn with --json (one JSON object on stdout)"], sys.stderr)
    if picture:
        from ccoverlap.trace.report import write_png

        picture_file = png_path(args, "analyze")
        assert picture_file is not None  # picture: --png was given
        try:
            png = write_png(a, picture_file, step=args.png_step)
        except OSError as exc:
            raise ConfigError(f"cannot write the picture: {exc}") from None
    extra: dict[str, Any] = {"png": str(png) if png else None}
    if b is not None:
        extra["vs"] = {"files": b.files, "comparison": compare(a, b), "summary": b.to_dict()["summary"]}
    if args.json:
        write_json(a, sys.stdout, extra)
        return 0
    from ccoverlap.trace.report import print_comparison, print_report

    print_report(a)
    if b is not None:
        print_comparison(extra["vs"]["comparison"], " ".join(args.traces), " ".join(args.vs))
    if png:
        print(f"picture: {png}")
    return 0
