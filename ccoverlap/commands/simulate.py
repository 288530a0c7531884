"""``ccoverlap simulate``: simulate one training step and write its Chrome trace (one file per
simulated rank, the layout torch.profiler writes), ready for Perfetto or ``ccoverlap analyze``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ccoverlap.commands.options import (
    Subparsers,
    add_common,
    add_workload_arguments,
    check_outputs,
    png_path,
    workload_from_args,
)


def register(sub: Subparsers) -> None:
    """Add the ``simulate`` subparser."""
    p = sub.add_parser("simulate", help="simulate one step and write its Chrome trace", description=__doc__)
    add_workload_arguments(p)
    add_common(p, out="ccoverlap-out/simulate", png=True)
    p.add_argument("--gzip", action="store_true", help="write .json.gz")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Simulate, write the Chrome traces (and picture), print the table or JSON; 0."""
    from ccoverlap.predict.evaluate import simulate_workload
    from ccoverlap.sim.chrome_trace import write_chrome_traces
    from ccoverlap.sim.timeline import all_rank_metrics, step_time_s

    check_outputs(args, "simulate")
    w = workload_from_args(args)
    step, tl = simulate_workload(w)
    paths = write_chrome_traces(tl, Path(args.out), world_size=w.cluster.world_size,
                                gpu_name=w.cluster.gpu.name, gzip_output=args.gzip)
    png = png_path(args, "simulate")
    if png is not None:
        from ccoverlap.outputs import save_figure
        from ccoverlap.plots import draw_timeline, pyplot

        plt = pyplot()
        fig, ax = plt.subplots(figsize=(12, 1.0 + 0.35 * len(set(zip(tl.rank.tolist(), tl.stream.tolist())))))
        draw_timeline(ax, tl, title=w.describe())
        fig.tight_layout()
        try:
            save_figure(fig, png, dpi=110)
        finally:
            plt.close(fig)
    metrics = [m.to_dict() for m in all_rank_metrics(tl)]
    payload: dict[str, Any] = {"workload": w.describe(), "step_time_s": step_time_s(tl), "ops": len(step.graph),
               "ranks": metrics, "traces": [str(p) for p in paths],
               "simulated_ranks": [list(x) for x in step.simulated_ranks]}
    if args.json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from ccoverlap.console import Col, make_console, print_table, print_wrapped

        con = make_console(highlight=False)
        print_wrapped(con, w.describe())
        print_wrapped(con, f"simulated step: {payload['step_time_s'] * 1e3:.2f} ms, {len(step.graph)} ops, "
                           f"{len(metrics)} simulated rank(s)")
        rows = [[str(m["rank"]), f"{m['compute_s'] * 1e3:.2f}", f"{m['comm_s'] * 1e3:.2f}", f"{m['overlap_ratio']:.1%}",
                 f"{m['exposed_comm_s'] * 1e3:.2f}", f"{m['idle_s'] * 1e3:.2f}"] for m in metrics]
        print_table(con, [Col("rank"), Col("compute (ms)"), Col("comm (ms)"), Col("overlap"),
                          Col("exposed comm (ms)"), Col("idle (ms)")], rows)
        print_wrapped(con, f"Chrome traces: {Path(args.out)}/ (open in https://ui.perfetto.dev or "
                           f"`ccoverlap analyze {args.out}`)")
    return 0
