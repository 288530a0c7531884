"""``ccoverlap plan``: compare the configuration as given, no overlap, the best overlap knobs
and the deciders' strategies on one simulated training step."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ccoverlap.predict.workload import add_workload_arguments, workload_from_args
from ccoverlap.trace.engine import ENGINES, make_engine


def register(sub) -> None:
    p = sub.add_parser("plan", help="predict step time under overlap strategies and recommend one",
                       description=__doc__)
    add_workload_arguments(p)
    p.add_argument("--out", default="ccoverlap-out/plan", help="directory for the PNG and Chrome traces")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--no-png", action="store_true", help="skip the timeline picture")
    p.add_argument("--exact", action="store_true",
                   help="judge every knob value and decider candidate on the full step and simulate every "
                        "reported row in full (slower); default: judge them on a step with fewer micro-batches and, "
                        "for 1F1B / interleaved / no pipeline, extrapolate the reported full steps from two "
                        "short ones (as-given and best-knobs are always simulated in full)")
    p.add_argument("--strategies", help="comma-separated decider strategies to add (default: all available)")
    s = p.add_argument_group("layout search (--search)")
    s.add_argument("--search", action="store_true",
                   help="search layouts (TP/PP/CP/DP, FSDP vs DDP vs HSDP, EP for MoE models, micro-batch, recompute, "
                        "PP schedule 1F1B/interleaved/GPipe/DualPipe, knobs) "
                        "for the model, cluster and global batch; rank those that fit by predicted step time")
    s.add_argument("--max-simulations", type=int, default=24, help="most layouts simulated (default 24)")
    s.add_argument("--top", type=int, default=3, help="layouts that get the best-knobs search (default 3)")
    s.add_argument("--show", type=int, default=15, help="rows of the ranked table (default 15)")
    s.add_argument("--engine", choices=ENGINES, default="local",
                   help="where layouts are simulated: 'local' (default) or 'ray' (a Ray cluster's workers; "
                        "pip install 'ccoverlap[ray]'); the result is the same")
    s.add_argument("--address", help="with --engine ray: the cluster's head, host:port or 'auto' (default: start "
                                     "Ray on this machine)")
    p.set_defaults(run=run)


def _progress_reporter(enabled: bool, label: str = "planning"):
    """A progress bar on stderr, shown only once a search has run for more than a second.
    Redrawn from the caller's updates (at most 10 times a second), not by rich's refresh thread:
    the planner forks worker processes, and forking a process that runs threads may deadlock
    the child (Python 3.12 warns about it)."""
    if not enabled:
        return None, lambda: None
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    state = {"bar": None, "task": None, "t0": time.perf_counter(), "drawn": 0.0}

    def update(done: int, total: int, what: str) -> None:
        if state["bar"] is None:
            if time.perf_counter() - state["t0"] < 1.0:
                return
            from rich.console import Console

            state["bar"] = Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                    TextColumn("{task.description}"), TimeElapsedColumn(),
                                    console=Console(stderr=True), transient=True, auto_refresh=False)
            state["bar"].start()
            state["task"] = state["bar"].add_task(what, total=total)
        state["bar"].update(state["task"], completed=done, total=total, description=what)
        now = time.perf_counter()
        if now - state["drawn"] >= 0.1 or done >= total:
            state["drawn"] = now
            state["bar"].refresh()

    def close() -> None:
        if state["bar"] is not None:
            state["bar"].stop()

    return update, close


def run_search(args: argparse.Namespace) -> int:
    """``plan --search``: ranked table (or JSON) and the frontier picture."""
    from ccoverlap.errors import ConfigError
    from ccoverlap.planning.search import save_frontier, search

    if args.max_simulations < 1 or args.top < 0 or args.show < 1:
        raise ConfigError("--max-simulations and --show must be >= 1, --top >= 0")
    # the search chooses the layout: start from a plain data-parallel one that fills the cluster
    for dim in ("tp", "pp", "ep"):
        setattr(args, dim, 1)
    args.dp = None
    args.data_parallel = args.pp_schedule = args.virtual_stages = args.recompute = None
    args.sequence_parallel = None
    w = workload_from_args(args)
    engine = make_engine(args.engine, address=args.address) if args.engine != "local" else None
    update, close = _progress_reporter(True, label="searching")
    try:
        result = search(w, progress=update, max_simulations=args.max_simulations, top=args.top, engine=engine)
    finally:
        close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    if not args.no_png:
        files["png"] = save_frontier(out / "search.png", result)
    payload = result.as_dict()
    payload["files"] = files
    if args.json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    from ccoverlap.planning.report import search_table

    search_table(payload, show=args.show)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.search:
        return run_search(args)
    if args.engine != "local" or args.address:
        from ccoverlap.errors import ConfigError

        raise ConfigError("--engine and --address are for --search")
    from ccoverlap.planning import strategies as planner
    from ccoverlap.sim.chrome_trace import write_chrome_traces
    from ccoverlap.planning.report import plan_table

    w = workload_from_args(args)
    registry = planner.default_registry()
    extra = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    if extra:
        registry.select(extra)  # ConfigError naming the unknown one and the available ones
    update, close = _progress_reporter(sys.stderr.isatty() or not args.json)
    try:
        result = planner.plan(w, progress=update, extra=extra, registry=registry, exact=args.exact)
    finally:
        close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    given_tl = result.as_given.timeline
    best_res = result.best()
    best_tl = next((s.timeline for s in result.strategies if s.name == "best-knobs"), None)
    files["chrome_trace_as_given"] = str(out / "as-given")
    write_chrome_traces(given_tl, out / "as-given", world_size=w.cluster.world_size, gpu_name=w.cluster.gpu.name)
    if best_tl is not None:
        files["chrome_trace_best_knobs"] = str(out / "best-knobs")
        write_chrome_traces(best_tl, out / "best-knobs", world_size=w.cluster.world_size, gpu_name=w.cluster.gpu.name)
    if not args.no_png:
        from ccoverlap.plots import save_plan_figure

        tls = [("as-given", given_tl)] + ([("best-knobs", best_tl)] if best_tl is not None else [])
        files["png"] = save_plan_figure(out / "plan.png", tls, [s.as_dict() for s in result.strategies])
    payload = {
        "workload": w.describe(),
        "source": w.source,
        "world_size": w.cluster.world_size,
        "compute_comm_ratio": result.as_given.compute_comm_ratio,
        "recommendation": planner.recommendation(result),
        "best": best_res.name,
        "strategies": [s.as_dict() for s in result.strategies],
        "simulations": result.simulations,
        "screen_microbatches": result.stats.get("screen_microbatches"),
        "extrapolated_from": result.stats.get("extrapolated_from"),
        "search_seconds": result.seconds,
        "files": files,
    }
    if args.json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        plan_table(payload)
    return 0
