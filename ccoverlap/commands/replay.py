"""``ccoverlap replay``: rebuild a measured step from its traces, replay it, ask what-ifs.

One torch.profiler (Kineto) trace per rank. Prints, per rank and step, the replayed vs the
measured step time (the fidelity check), then each what-if (a graph edit re-simulated with
the measured durations): step time, exposed communication, overlap and gain, ranked, why
``analyze``'s exposed communication and the replay's bound differ when they do, and a
recommendation. ``--out DIR`` writes a Chrome trace per scenario (``DIR/<scenario>/``) that
``ccoverlap analyze`` reads back. Exit code 2 only when nothing could be replayed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ccoverlap.commands.options import Subparsers, add_common, check_outputs, png_path
from ccoverlap.console import make_console, print_wrapped

DEFAULT_OUT = "ccoverlap-out/replay"


def register(sub: Subparsers) -> None:
    """Add the ``replay`` subparser."""
    p = sub.add_parser("replay", help="replay measured traces and predict overlap what-ifs",
                       description=__doc__)
    p.add_argument("traces", nargs="+", help="trace files or directories (*.json, *.json.gz), one file per rank")
    p.add_argument("--whatif", action="append", metavar="NAMES",
                   help="what-ifs to run, comma-separated, the option repeatable (default all): no-comm, "
                        "comm-hidden, no-contention, copy-engine, lagom, centauri, network-<F>x (e.g. network-2x), "
                        "all, none")
    p.add_argument("--steps", default="hta", help="profiler steps as in `ccoverlap analyze` (default 'hta')")
    p.add_argument("--cluster", help="catalog cluster for the cost-model what-ifs (default: from the GPU name)")
    add_common(p, out=None, png=True)  # --out DIR: a Chrome trace per scenario under DIR/<scenario>/
    p.set_defaults(run=run)


def whatif_names(values: list[str] | None, traces: list[str]) -> list[str] | None:
    """The ``--whatif`` names (None: the default, all); a ConfigError when a trace argument is
    a what-if name that is not a file (``--whatif no-comm network-2x DIR`` instead of
    ``--whatif no-comm,network-2x DIR``)."""
    from ccoverlap.errors import ConfigError
    from ccoverlap.replayer.whatif import DEFAULT_WHATIFS, NET

    for t in traces:
        if (t in DEFAULT_WHATIFS or NET.match(t) or t in ("all", "none")) and not Path(t).exists():
            raise ConfigError(f"{t!r} is a what-if, not a trace: give several what-ifs as --whatif A,B "
                              f"(comma-separated) or repeat --whatif")
    if values is None:
        return None
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def run(args: argparse.Namespace) -> int:
    """Replay, print, write; 0 on success (TraceError/ConfigError -> exit 2 in the CLI)."""
    from ccoverlap.errors import ConfigError
    from ccoverlap.replayer.report import print_report, to_dict, write_chrome, write_png
    from ccoverlap.replayer.run import replay
    from ccoverlap.trace.report_json import print_problems

    names = whatif_names(args.whatif, args.traces)
    check_outputs(args, "replay", out=args.out or DEFAULT_OUT)
    res = replay(args.traces, steps=args.steps, whatifs=names, cluster=args.cluster, keep_times=bool(args.out))
    if not args.quiet:
        print_problems(res.job.problems, sys.stderr, "replay")
    extra: dict[str, Any] = {}
    try:
        png = png_path(args, "replay", out=args.out or DEFAULT_OUT)
        if png is not None:
            extra["png"] = str(write_png(res, png))
        if args.out:
            extra["chrome_traces"] = {s.name: [str(p) for p in write_chrome(res, s, Path(args.out) / s.name)]
                                      for s in [res.replay] + res.whatifs}
    except OSError as exc:
        raise ConfigError(f"cannot write output: {exc}") from None
    if args.json:
        json.dump(to_dict(res, extra), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print_report(res)
    con = make_console(highlight=False)
    if "png" in extra:
        print_wrapped(con, f"picture: {extra['png']}")
    if "chrome_traces" in extra:
        from ccoverlap.trace.steps import StepRanges

        job_spec = res.job.spec  # a selection too long to list stays StepRanges: its str is the --steps text
        spec = str(job_spec) if isinstance(job_spec, (str, StepRanges)) else ",".join(map(str, job_spec))
        print_wrapped(con, f"Chrome traces: {args.out}/<scenario>/rank-*.json.gz "
                           f"({', '.join(extra['chrome_traces'])}); read back with `ccoverlap analyze --steps {spec} DIR`")
    return 0
