"""``ccoverlap plan``: compare the configuration as given, no overlap, the best overlap knobs
and the deciders' strategies on one simulated training step."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ccoverlap.commands.options import (
    Subparsers,
    add_common,
    add_workload_arguments,
    check_outputs,
    png_path,
    workload_from_args,
)
from ccoverlap.config import short, suggest
from ccoverlap.outputs import check_out_dir
from ccoverlap.workers.pool import ENGINES, make_engine

if TYPE_CHECKING:
    from ccoverlap.planning.strategies import PlanResult
    from ccoverlap.sim.timeline import Timeline

#: Layout flags ``--search`` takes as constraints (ParallelConfig fields), and those it refuses.
SEARCH_CONSTRAINTS = ("tp", "pp", "ep", "cp", "dp", "data_parallel", "recompute", "pp_schedule")
SEARCH_REFUSED = ("sequence_parallel", "virtual_stages")


def register(sub: Subparsers) -> None:
    """Add the ``plan`` subparser."""
    p = sub.add_parser("plan", help="predict step time under overlap strategies and recommend one",
                       description=__doc__)
    add_workload_arguments(p)
    add_common(p, out="ccoverlap-out/plan", png=True)
    p.add_argument("--exact", action="store_true",
                   help="judge every knob value and decider candidate on the full step and simulate every "
                        "reported row in full (slower); default: judge them on a step with fewer micro-batches and, "
                        "for 1F1B / interleaved / no pipeline, extrapolate the reported full steps from two "
                        "short ones (as-given and best-knobs are always simulated in full)")
    p.add_argument("--strategies", help="comma-separated decider strategies to add (default: all available)")
    e = p.add_argument_group("settings to apply (--emit)")
    e.add_argument("--emit", metavar="DIR",
                   help="write the strategy's settings into DIR: nccl.env, the NCCL tuner plugin's CSV, per-group "
                        "NCCL options, framework settings, the TP plan and a README (docs/emit.md)")
    e.add_argument("--strategy", metavar="NAME",
                   help="the row --emit writes and the 'applicable' row re-simulates (default: the recommended one)")
    e.add_argument("--target", metavar="NAME", default="pytorch",
                   help="framework the 'applicable' row assumes: pytorch (default: FSDP2 / DDP and ccoverlap's TP "
                        "styles), torchtitan or megatron-lm")
    s = p.add_argument_group("layout search (--search)")
    s.add_argument("--search", action="store_true",
                   help="search layouts (TP/PP/CP/DP, FSDP vs DDP vs HSDP, EP for MoE models, micro-batch, recompute, "
                        "PP schedule 1F1B/interleaved/GPipe/DualPipe, knobs) "
                        "for the model, cluster and global batch; rank those that fit by predicted step time; "
                        "--tp/--pp/--ep/--cp/--dp/--data-parallel/--recompute/--pp-schedule/--micro-batch "
                        "given are kept fixed")
    s.add_argument("--max-simulations", type=int, default=24, help="most layouts simulated (default 24)")
    s.add_argument("--top", type=int, default=3, help="layouts that get the best-knobs search (default 3)")
    s.add_argument("--show", type=int, default=15, help="rows of the ranked table (default 15)")
    s.add_argument("--engine", choices=ENGINES, default="local",
                   help="where layouts are simulated: 'local' (default) or 'ray' (a Ray cluster's workers; "
                        "pip install 'ccoverlap[ray]'); the result is the same")
    s.add_argument("--address", help="with --engine ray: the cluster's head, host:port or 'auto' (default: start "
                                     "Ray on this machine)")
    p.set_defaults(run=run)


def run_search(args: argparse.Namespace) -> int:
    """``plan --search``: ranked table (or JSON) and the frontier picture."""
    from ccoverlap.console import Progress
    from ccoverlap.errors import ConfigError
    from ccoverlap.planning.search import save_frontier, search

    if args.max_simulations < 1 or args.top < 0 or args.show < 1:
        raise ConfigError("--max-simulations and --show must be >= 1, --top >= 0")
    if args.emit or args.strategy:
        raise ConfigError("--emit and --strategy take a plan's rows: plan the layout --search picks, then --emit")
    refused = [f"--{k.replace('_', '-')}" for k in SEARCH_REFUSED if getattr(args, k) is not None]
    if refused:
        raise ConfigError(f"--search chooses {', '.join(refused)} itself (sequence parallelism with TP, 2 virtual "
                          f"stages when interleaved); drop {' and '.join(refused)}, or plan without --search")
    check_outputs(args, "search", out_used=False)
    constraints = {k: getattr(args, k) for k in SEARCH_CONSTRAINTS if getattr(args, k) is not None}
    enum_kw = {"micro_batches": (args.micro_batch,)} if args.micro_batch is not None else {}
    # the search chooses the layout: start from a plain data-parallel one that fills the cluster
    for dim in ("tp", "pp", "ep", "cp"):
        setattr(args, dim, 1)
    args.dp = None
    args.data_parallel = args.pp_schedule = args.recompute = None
    w = workload_from_args(args)
    engine = make_engine(args.engine, address=args.address) if args.engine != "local" else None
    with Progress("searching", enabled=not args.quiet) as progress:
        result = search(w, progress=progress, max_simulations=args.max_simulations, top=args.top,
                        constraints=constraints, engine=engine, **enum_kw)
    files: dict[str, str] = {}
    png = png_path(args, "search")
    if png is not None:
        files["png"] = save_frontier(png, result)
    payload = result.to_dict()
    payload["files"] = files
    if args.json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    from ccoverlap.planning.report import search_table

    search_table(payload, show=args.show)
    return 0


def run(args: argparse.Namespace) -> int:
    """Plan (or, with ``--search``, search layouts), print, write; 0 on success, 2 when ``--emit`` failed."""
    if args.search:
        return run_search(args)
    if args.engine != "local" or args.address:
        from ccoverlap.errors import ConfigError

        raise ConfigError("--engine and --address are for --search")
    from ccoverlap.console import Progress
    from ccoverlap.planning import strategies
    from ccoverlap.planning.emit import TARGETS
    from ccoverlap.planning.report import plan_table
    from ccoverlap.sim.chrome_trace import write_chrome_traces

    if args.target not in TARGETS:
        from ccoverlap.errors import ConfigError

        raise ConfigError(f"--target must be one of {', '.join(TARGETS)}, got {short(args.target)}")
    check_outputs(args, "plan")
    check_out_dir(args.emit, "--emit")
    w = workload_from_args(args)
    registry = strategies.default_registry()
    extra = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    if extra:
        registry.select(extra)  # ConfigError naming the unknown one and the available ones
    if args.strategy:  # known before the minutes of planning
        rows = ["as-given", "no-overlap", "best-knobs", *(s.name for s in registry.select(extra))]
        if args.strategy not in rows:
            from ccoverlap.errors import ConfigError

            raise ConfigError(f"--strategy {short(args.strategy)} is not a row of this plan{suggest(args.strategy, rows)}; "
                              f"rows: {', '.join(rows)}")
    with Progress("planning", enabled=not args.quiet) as progress:
        result = strategies.plan(w, progress=progress, extra=extra, registry=registry, exact=args.exact,
                              applicable_of=args.strategy, target=args.target)
    out = Path(args.out)
    files: dict[str, str] = {}
    given_tl = result.as_given.timeline
    assert given_tl is not None  # the as-given row keeps its timeline
    best_res = result.best()
    best_tl = next((s.timeline for s in result.strategies if s.name == "best-knobs"), None)
    files["chrome_trace_as_given"] = str(out / "as-given")
    write_chrome_traces(given_tl, out / "as-given", world_size=w.cluster.world_size, gpu_name=w.cluster.gpu.name)
    if best_tl is not None:
        files["chrome_trace_best_knobs"] = str(out / "best-knobs")
        write_chrome_traces(best_tl, out / "best-knobs", world_size=w.cluster.world_size, gpu_name=w.cluster.gpu.name)
    png = png_path(args, "plan")
    if png is not None:
        from ccoverlap.plots import save_plan_figure

        tls: list[tuple[str, Timeline]] = [("as-given", given_tl)] + ([("best-knobs", best_tl)] if best_tl is not None else [])
        files["png"] = save_plan_figure(png, tls, [s.to_dict() for s in result.strategies])
    emitted, emit_error = _emit(result, args)
    if emitted:
        files["emit"] = str(Path(args.emit) / "README.md")
    payload = {
        "workload": w.describe(),
        "source": w.source,
        "world_size": w.cluster.world_size,
        "compute_comm_ratio": result.as_given.compute_comm_ratio,
        "recommendation": strategies.recommendation(result),
        "recommendation_details": strategies.recommendation_details(result),
        "best": best_res.name,
        "best_row": result.best_row().name,
        "best_step_time_s": result.best_row().step_time_s,
        "strategies": result.rows(),
        "simulations": result.simulations,
        "screen_microbatches": result.stats.get("screen_microbatches"),
        "extrapolated_from": result.stats.get("extrapolated_from"),
        "search_seconds": result.seconds,
        "files": files,
        "emitted": emitted,
        "applicable_error": result.stats.get("applicable_error"),
        "emit_error": emit_error,
    }
    if args.json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        plan_table(payload)
    if payload["applicable_error"] and not args.quiet and not emit_error:
        sys.stderr.write(f"ccoverlap plan: warning: no 'applicable' row: {payload['applicable_error']}\n")
    if emit_error:  # the plan above stands; what --emit asked for was not written
        sys.stderr.write(f"ccoverlap plan: error: {emit_error}\n")
        return 2
    return 0


def _emit(result: PlanResult, args: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    """``--emit``: the files written, or ({}, one line saying why not); the plan is printed
    either way, and a failed ``--emit`` leaves its directory as it was."""
    from ccoverlap.config import clip_line
    from ccoverlap.errors import CCOverlapError
    from ccoverlap.outputs import path_name

    if not args.emit:
        return {}, None
    try:
        return result.emit(args.emit, strategy=args.strategy, target=args.target), None
    except CCOverlapError as exc:
        return {}, (f"--emit {path_name(args.emit)}: settings not written ({clip_line(str(exc), 300)}); "
                    f"the plan above is complete and {path_name(args.emit)} was left as it was")
