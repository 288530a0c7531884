"""``ccoverlap replay``: rebuild a measured step from its traces, replay it, ask what-ifs.

One torch.profiler (Kineto) trace per rank. Prints, per rank and step, the replayed vs the
measured step time (the fidelity check), then each what-if (a graph edit re-simulated with
the measured durations): step time, exposed communication, overlap and gain, ranked, with a
recommendation. ``--out DIR`` writes a Chrome trace per scenario (``DIR/<scenario>/``) that
``ccoverlap analyze`` reads back. Exit code 2 only when nothing could be replayed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ccoverlap.commands.options import add_common, png_path

DEFAULT_OUT = "ccoverlap-out/replay"


def register(sub) -> None:
    """Add the ``replay`` subparser."""
    p = sub.add_parser("replay", help="replay measured traces and predict overlap what-ifs",
                       description=__doc__)
    p.add_argument("traces", nargs="+", help="trace files or directories (*.json, *.json.gz), one file per rank")
    p.add_argument("--whatif", nargs="+", metavar="NAME",
                   help="what-ifs to run (default all): no-comm, comm-hidden, no-contention, copy-engine, "
                        "lagom, centauri, network-<F>x (e.g. network-2x), all, none")
    p.add_argument("--steps", default="hta", help="profiler steps as in `ccoverlap analyze` (default 'hta')")
    p.add_argument("--cluster", help="catalog cluster for the copy-engine cost model (default: from the GPU name)")
    add_common(p, out=None, png=True)  # --out DIR: a Chrome trace per scenario under DIR/<scenario>/
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Replay, print, write; 0 on success (TraceError/ConfigError -> exit 2 in the CLI)."""
    from ccoverlap.errors import ConfigError
    from ccoverlap.replay.report import print_report, to_dict, write_chrome, write_png
    from ccoverlap.replay.run import replay

    res = replay(args.traces, steps=args.steps, whatifs=args.whatif, cluster=args.cluster)
    if not args.quiet:
        for p in res.job.problems:
            sys.stderr.write(f"ccoverlap replay: warning: {p}\n")
    extra: dict = {}
    try:
        png = png_path(args, "replay", out=args.out or DEFAULT_OUT)
        if png is not None:
            extra["png"] = str(write_png(res, png))
        if args.out:
            traces = {}
            for s in [res.replay] + res.whatifs:
                traces[s.name] = [str(p) for p in write_chrome(res, s, Path(args.out) / s.name)]
            extra["chrome_traces"] = traces
    except OSError as exc:
        raise ConfigError(f"cannot write output: {exc}") from None
    if args.json:
        json.dump(to_dict(res, extra), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print_report(res)
    if "png" in extra:
        print(f"picture: {extra['png']}")
    if "chrome_traces" in extra:
        print(f"Chrome traces: {args.out}/<scenario>/rank-*.json.gz "
              f"({', '.join(extra['chrome_traces'])}); read back with `ccoverlap analyze --steps {res.job.spec if isinstance(res.job.spec, str) else ','.join(map(str, res.job.spec))} DIR`")
    return 0
