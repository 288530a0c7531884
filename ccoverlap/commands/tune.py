"""``ccoverlap tune``: choose NCCL's NC / NT / C / protocol / algorithm per collective for an
overlap group with Lagom, and predict its makespan against NCCL's defaults, AutoCCL-style
tuning and (for small groups) exhaustive search.

The group comes from a file (``--group FILE``, JSON / TOML / YAML; see
docs/deciders-lagom.md) or from a workload's simulated step (the same flags as ``plan``):
its main overlap groups, e.g. one FSDP layer's backward GEMMs with the all-gather and
reduce-scatter beside them. Profiling is simulated on the cost model; the live NCCL
profiler (``ccoverlap.runtime.nccl.live_profiler``) runs inside a torchrun job on GPUs.
``--emit DIR`` writes Lagom's choices as stock NCCL takes them (docs/emit.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from ccoverlap.commands.options import Subparsers, add_common, add_workload_arguments
from ccoverlap.config import clip_line
from ccoverlap.console import Progress
from ccoverlap.errors import CCOverlapError, ConfigError
from ccoverlap.outputs import check_out_dir, path_name

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.cost.model import CostModel
    from ccoverlap.deciders.lagom.tune import GroupTuning
    from ccoverlap.nccl.groups import OverlapGroup
    from ccoverlap.nccl.plan import CommKey
    from ccoverlap.predict.workload import Workload
    from ccoverlap.specs import CommConfig


def register(sub: Subparsers) -> None:
    """Add the ``tune`` parser to the CLI's subparsers."""
    p = sub.add_parser("tune", help="tune NCCL configurations of an overlap group with Lagom",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--group", metavar="FILE", help="overlap group file (JSON/TOML/YAML); else the workload's groups")
    p.add_argument("--top", type=int, default=2, help="how many of the workload's main overlap groups to tune (default 2)")
    p.add_argument("--exhaustive", choices=["auto", "yes", "no"], default="auto",
                   help="run exhaustive search: auto = when the grid fits --max-exhaustive (default)")
    p.add_argument("--max-exhaustive", type=int, default=20000, metavar="N",
                   help="largest number of profiles exhaustive search may use (default 20000)")
    add_common(p)
    p.add_argument("--steps", action="store_true", help="also print Lagom's profiling steps")
    p.add_argument("--emit", metavar="DIR",
                   help="write Lagom's configurations as stock NCCL takes them into DIR: nccl.env, the tuner "
                        "plugin's CSV, per-group options, a README (docs/emit.md)")
    add_workload_arguments(p)
    p.set_defaults(run=run)


def _cost_model(cluster: ClusterSpec, calibration: str | None) -> CostModel:
    from ccoverlap.predict.evaluate import cost_model_for_cluster

    return cost_model_for_cluster(cluster, calibration)


def _groups(args: argparse.Namespace) -> tuple[list[OverlapGroup], CostModel, str, Workload | None]:
    """(groups, cost model, description of where they came from, the workload or None)."""
    from ccoverlap.nccl.groups import load_overlap_group, overlap_groups_from_workload

    if args.group:
        cluster = None
        if args.cluster:
            from ccoverlap.predict.workload import resolve_cluster

            cluster = resolve_cluster(args.cluster, args.nodes)
        group = load_overlap_group(args.group, cluster=cluster)
        return [group], _cost_model(group.cluster, args.calibration), args.group, None
    from ccoverlap.commands.options import workload_from_args

    if args.top < 1:
        raise ConfigError(f"--top must be >= 1, got {args.top}")
    w = workload_from_args(args)
    cost = _cost_model(w.cluster, w.calibration)
    groups = overlap_groups_from_workload(w, cost, top=args.top)
    if not groups:
        raise ConfigError(f"{w.describe()}: no collective overlaps computation in the simulated step "
                          f"(nothing for Lagom to tune; is overlap enabled in the knobs?)")
    return groups, cost, w.describe(), w


def _kib(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:g} MiB" if n >= 2**20 and n % 2**18 == 0 else f"{n / 1024:g} KiB"


def _cfg(c: CommConfig) -> str:
    return f"{c.channels}/{c.threads}/{_kib(c.chunk_bytes)} {c.protocol}"


def _print(payload: dict[str, Any], tunings: list[GroupTuning], show_steps: bool) -> None:
    from ccoverlap.console import Col, make_console, print_table, print_wrapped

    con = make_console()
    con.print(f"[bold]Lagom tuning[/bold] — {payload['source']} (simulated profiling on the cost model)")
    for t, g in zip(tunings, payload["groups"]):
        con.print()
        regime = "compute-bound" if g["regime_R"] >= 1 else "communication-bound"
        con.print(f"[bold]{t.group.name}[/bold]: {len(t.group.computations)} computations, "
                  f"{t.group.n_collectives} collectives on {t.group.cluster.name}"
                  + (f", x{t.group.weight} per step" if t.group.weight > 1 else "")
                  + f"; at NCCL defaults Y/X = {g['regime_R']:.2f} ({regime})")
        methods = ("nccl-default", "autoccl", "lagom")
        rows = [[f"{c.name} ({c.spec.collective}, {c.spec.group.name}{c.spec.group.size})",
                 f"{c.spec.bytes / 2**20:.1f}", *[_cfg(t.results[m].configs[j]) for m in methods]]
                for j, c in enumerate(t.group.collectives)]
        print_table(con, [Col("collective", "left", wrap=True), Col("MiB"), Col("nccl-default", "left"),
                          Col("autoccl", "left"), Col("lagom", "left", style="bold green")], rows,
                    title="chosen configuration per collective: NC channels / NT threads / C chunk, protocol")
        algs = sorted({c.algorithm for m in methods for c in t.results[m].configs})
        con.print(f"algorithm: {', '.join(algs)}")
        lag = t.results["lagom"].makespan_s
        rows = [[name, f"{r.makespan_s * 1e3:.3f}", f"{r.result.comm_time_s * 1e3:.3f}",
                 f"{r.result.compute_time_s * 1e3:.3f}", str(r.profiles),
                 "" if name == "lagom" else f"{r.makespan_s / lag:.3f}x"] for name, r in t.results.items()]
        print_table(con, [Col("method", "left"), Col("Z (ms)"), Col("X comm (ms)"), Col("Y compute (ms)"),
                          Col("profiles"), Col("Lagom faster by")], rows, title="predicted overlap (simulated)",
                    styles=["bold green" if name == "lagom" else None for name in t.results])
        for name, r in t.results.items():
            if r.note:
                print_wrapped(con, f"{name}: {r.note}", indent=2)
        if show_steps:
            rows = []
            for i, s in enumerate(t.results["lagom"].steps):
                name = t.group.collectives[s.collective].name if s.collective >= 0 else "-"
                xj = s.result.comm_times_s[s.collective] if s.collective >= 0 else float("nan")
                rows.append([str(i + 1), name, _cfg(s.config) if s.config else "start", f"{xj * 1e3:.3f}",
                             f"{s.result.comm_time_s * 1e3:.3f}", f"{s.result.compute_time_s * 1e3:.3f}",
                             f"{s.result.makespan_s * 1e3:.3f}", "" if s.h is None else f"{s.h:.4g}",
                             "" if s.lr is None else f"{s.lr:.3g}", s.decision])
            print_table(con, [Col("#"), Col("collective", "left"), Col("configuration", "left"),
                              Col("x_j (ms)", drop=3), Col("X (ms)"), Col("Y (ms)"), Col("Z (ms)"), Col("H", drop=2),
                              Col("lr", drop=1), Col("decision", "left", wrap=True)], rows,
                        title="Lagom's profiling steps", label=(0, 1))
    con.print(f"\n{payload['seconds']:.1f} s of search (profiles simulated on the cost model).")
    if payload.get("emitted"):
        con.print(f"settings written: {payload['emitted']['README.md']}")


def _emit(out_dir: str, tunings: list[GroupTuning], cost: CostModel, source: str, workload: Workload | None
          ) -> dict[str, str]:
    """Lagom's configurations of the tuned groups as stock NCCL settings in ``out_dir``: every
    communication of the workload's step (or of the group file) with Lagom's configuration
    where it was tuned (the group where it spends the most time decides), as given elsewhere."""
    from ccoverlap.nccl.plan import CommKey, comm_keys
    from ccoverlap.planning.emit import build_comm_emit, write_emit

    wanted: dict[CommKey, CommConfig] = {}
    spent: dict[CommKey, float] = {}
    given: dict[CommKey, CommConfig] = {}
    weights: dict[CommKey, float] = {}
    for t in tunings:
        res = t.results["lagom"]
        for c, cfg, x in zip(t.group.collectives, res.configs, res.result.comm_times_s):
            k = CommKey.of(c.spec)
            given.setdefault(k, c.spec.config)
            weights[k] = weights.get(k, 0.0) + x * t.group.weight
            if x * t.group.weight > spent.get(k, -1.0):
                wanted[k], spent[k] = cfg, x * t.group.weight
    if workload is not None:
        from ccoverlap.predict.evaluate import build_workload_step

        weights = comm_keys(build_workload_step(workload).graph, cost)
        given = {k: workload.knobs.config_for(k.group) for k in weights}
        wanted = {k: v for k, v in wanted.items() if k in weights}
    bundle = build_comm_emit("lagom", source, cost, weights, wanted, given)
    return write_emit(bundle, out_dir, command="ccoverlap tune --emit")


def run(args: argparse.Namespace) -> int:
    """Tune the group(s) with every method and print tables or JSON; returns the exit code."""
    from ccoverlap.deciders.lagom.tune import tune_group

    if args.max_exhaustive < 1:
        raise ConfigError(f"--max-exhaustive must be >= 1, got {args.max_exhaustive}")
    check_out_dir(args.emit, "--emit")
    t0 = time.perf_counter()
    groups, cost, source, workload = _groups(args)
    exhaustive = {"auto": None, "yes": True, "no": False}[args.exhaustive]
    tunings: list[GroupTuning] = []
    with Progress("profiling", enabled=not args.quiet) as progress:
        for g in groups:
            tunings.append(tune_group(g, cost, exhaustive=exhaustive, max_exhaustive_profiles=args.max_exhaustive,
                                      progress=progress))
    payload_groups = []
    for t in tunings:
        d = t.to_dict()
        base = t.results["nccl-default"].result
        d["name"] = t.group.name
        d["communications"] = [{"group": c.spec.group.name, "collective": c.spec.collective, "bytes": c.spec.bytes,
                                "group_size": c.spec.group.size, "local_size": c.spec.group.local_size}
                               for c in t.group.collectives]
        d["weight"] = t.group.weight
        d["regime_R"] = base.compute_time_s / base.comm_time_s if base.comm_time_s > 0 else float("inf")
        d["lagom_speedup"] = {m: r.makespan_s / t.results["lagom"].makespan_s
                              for m, r in t.results.items() if m != "lagom"}
        payload_groups.append(d)
    payload: dict[str, Any] = {"source": source, "profiler": "simulated", "groups": payload_groups,
               "seconds": time.perf_counter() - t0}
    emit_error = None
    if args.emit:  # a failure is reported after the tables, and leaves DIR as it was
        try:
            payload["emitted"] = _emit(args.emit, tunings, cost, source, workload)
        except CCOverlapError as exc:
            emit_error = (f"--emit {path_name(args.emit)}: settings not written ({clip_line(str(exc), 300)}); "
                          f"{path_name(args.emit)} was left as it was")
            payload["emit_error"] = emit_error
    if args.json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        _print(payload, tunings, args.steps)
    if emit_error:
        sys.stderr.write(f"ccoverlap tune: error: {emit_error}\n")
        return 2
    return 0
