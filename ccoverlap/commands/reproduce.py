"""``ccoverlap reproduce``: the papers' headline experiments (Lagom, Centauri, FiCCO) as
ccoverlap comparisons, each against the paper's own figure.

Per case: the setting, the paper's table / figure / section, the method and the baseline the
paper names, the paper's speedup, ccoverlap's for the same comparison, the gain ratio
(ours - 1) / (paper - 1) and a verdict (match: the gain within 30% of the paper's). The cases
live in ccoverlap/data/reproduce/<paper>.yaml; docs/seeds.md explains each miss.
"""

from __future__ import annotations

import argparse
import json
import sys

from ccoverlap.commands.options import Subparsers, add_json, add_quiet
from ccoverlap.errors import ConfigError

PAPER_NAMES = ("centauri", "ficco", "lagom")  # the papers of ccoverlap.reproduction.suite.PAPERS (checked by a test)
CONTENTION = "contention"  # the public contention figures (ccoverlap.reproduction.contention), not a paper


def register(sub: Subparsers) -> None:
    """Add the ``reproduce`` subparser."""
    p = sub.add_parser("reproduce", help="the papers' headline experiments, ours against theirs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paper", action="append", choices=PAPER_NAMES + (CONTENTION,),
                   help="only this paper (repeatable); 'contention': the public figures of compute and "
                        "communication slowing each other, measured against the cost model")
    p.add_argument("--case", action="append", metavar="ID", help="only this case (repeatable)")
    add_json(p)
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--jobs", type=int, default=None, help="evaluate cases in this many processes "
                   "(default: up to 4, one per core)")
    add_quiet(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the cases (or show the contention figures), print the table, JSON or Markdown; 0."""
    from ccoverlap.console import Progress, make_console
    from ccoverlap.reproduction.report import markdown, print_table
    from ccoverlap.reproduction.suite import default_jobs, run_suite

    jobs = default_jobs() if args.jobs is None else args.jobs  # run_suite checks it
    papers = [p for p in args.paper or () if p != CONTENTION]
    if args.paper and CONTENTION in args.paper:
        if args.case:
            raise ConfigError("--case selects paper cases; the contention figures are shown whole")
        if papers and (args.json or args.markdown):
            raise ConfigError("--paper contention prints its own table: ask for it alone with --json or --markdown")
        _contention(args)
        if not papers:
            return 0
    with Progress("reproduce", enabled=not args.quiet) as progress:
        result = run_suite(papers or None, ids=args.case, jobs=jobs, progress=progress)
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.markdown:
        sys.stdout.write(markdown(result))
    else:
        print_table(result, make_console())
    return 0


def _contention(args: argparse.Namespace) -> None:
    """Print the public contention figures: measured, modelled, error, verdict."""
    from ccoverlap.console import Col, make_console, print_table, print_wrapped
    from ccoverlap.reproduction.contention import TOLERANCE, figure_rows, summary

    rows = figure_rows()
    if args.json:
        json.dump({"summary": summary(rows), "rows": [
            {"table": r.table, "source": r.source, "id": r.id, "role": r.role, "side": r.side, "gpu": r.gpu,
             "measured": r.measured, "modelled": r.modelled, "error": r.error, "verdict": r.verdict}
            for r in rows]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return

    def num(v: float | None) -> str:
        return "—" if v is None else (f"{v:.3g}" if v >= 100 else f"{v:.3f}")

    body = [[r.table, r.id, r.side, r.gpu, num(r.measured), num(r.modelled),
             "—" if r.error is None else f"{r.error:+.0%}", r.verdict] for r in rows]
    cols = [Col("table", "left"), Col("figure", "left"), Col("side", "left"), Col("GPU", "left"), Col("measured", "right"),
            Col("modelled", "right"), Col("error", "right"), Col("verdict", "left")]
    console = make_console()
    if args.markdown:
        head = "| " + " | ".join(c.header for c in cols) + " |"
        sys.stdout.write("\n".join([head, "|" + "---|" * len(cols)] + ["| " + " | ".join(b) + " |" for b in body]) + "\n")
    else:
        print_table(console, cols, body)
    s = summary(rows)
    sources = "; ".join(f"{k} {v['matches']}/{v['judged']}" for k, v in s["tables"].items())
    print_wrapped(console, f"contention: {s['matches']} of {s['judged']} judged figures within {TOLERANCE:.0%} "
                           f"of the measured time ratio ({sources}); 'fit' rows sized a parameter, "
                           "'not stated' rows lack the setting (sources in ccoverlap/data/corpus/contention/)")
