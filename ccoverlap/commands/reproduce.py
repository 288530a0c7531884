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

from ccoverlap.commands.options import add_json, add_quiet

PAPER_NAMES = ("centauri", "ficco", "lagom")  # the papers of ccoverlap.reproduce.suite.PAPERS (checked by a test)


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="the papers' headline experiments, ours against theirs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paper", action="append", choices=PAPER_NAMES, help="only this paper (repeatable)")
    p.add_argument("--case", action="append", metavar="ID", help="only this case (repeatable)")
    add_json(p)
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--jobs", type=int, default=None, help="evaluate cases in this many processes "
                   "(default: up to 4, one per core)")
    add_quiet(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ccoverlap.console import Progress, make_console
    from ccoverlap.reproduce.report import markdown, print_table
    from ccoverlap.reproduce.suite import default_jobs, run_suite

    jobs = default_jobs() if args.jobs is None else args.jobs  # run_suite checks it

    with Progress("reproduce", enabled=not args.quiet) as progress:
        result = run_suite(args.paper, ids=args.case, jobs=jobs, progress=progress)
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.markdown:
        sys.stdout.write(markdown(result))
    else:
        print_table(result, make_console())
    return 0
