"""Time and peak memory per rank of ``ccoverlap analyze`` from 8 to N ranks, and a scaling plot.

A job of ``--max-ranks`` ranks is generated from one real rank (:mod:`make_trace_job`: real shape,
collectives matching across ranks by sequence and size, skew), or an already generated one is
read (``--job DIR``); the first 8, 16, ... ranks (a folder of links each) are analysed by the
command line in fresh processes (``ccoverlap analyze DIR --json``, whole process: wall, CPU of the
tree, peak memory of the tree - summed PSS and RSS - sampled every 20 ms, see
:func:`bench_analyze_vs_hta.run`). ``--ray`` also analyses the largest job with ``--engine ray`` on
a local Ray cluster of 2 CPUs started by this script and checks that its ``--json`` is identical
to the local run's (the Ray row's memory is the driver process's only; Ray's workers are not its
children). Prints a table with the load average and draws ``--plot`` with ``--machine`` named.

    nice .venv/bin/python benchmarks/make_trace_job.py control.json.gz /tmp/job256 --ranks 256
    nice .venv/bin/python benchmarks/bench_analyze_ranks.py control.json.gz --job /tmp/job256 --ray \\
        --plot docs/analyze-scaling.png --machine "2-core CPU VM"
"""

from __future__ import annotations

import argparse
import filecmp
import logging
import os
import platform
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_analyze_vs_hta import run  # noqa: E402
from make_trace_job import make_job  # noqa: E402


def machine() -> str:
    """CPU model and count of this machine, in words."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs"


def _measure(ours: str, files: list[Path], sizes: list[int], tmp: Path, events: int, want_ray: bool) -> list[dict]:
    rows = []
    for n in sizes:
        d = tmp / f"n{n}"
        d.mkdir()
        for f in files[:n]:
            (d / f.name).symlink_to(f.resolve())
        with open(tmp / f"n{n}.json", "wb") as out:
            r = run([ours, "analyze", str(d), "--json"], stdout=out)
        r.update(ranks=n, events=n * events, load=os.getloadavg()[0], engine="local")
        rows.append(r)
        _print(r)
    if want_ray:
        import ray

        n = sizes[-1]
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        try:
            address = ray.get_runtime_context().gcs_address
            with open(tmp / "ray.json", "wb") as out:
                r = run([ours, "analyze", str(tmp / f"n{n}"), "--json", "--engine", "ray", "--address", address],
                        stdout=out)
        finally:
            ray.shutdown()
        r.update(ranks=n, events=n * events, load=os.getloadavg()[0], engine="ray (2 CPUs)",
                 identical=filecmp.cmp(tmp / "ray.json", tmp / f"n{n}.json", shallow=False))
        rows.append(r)
        _print(r)
        print(f"--engine ray --json identical to the local run's: {r['identical']}")
    return rows


def _print(r: dict) -> None:
    n = r["ranks"]
    print(f"{r['engine']:>12} {n:5d} ranks {r['events'] / 1e6:6.1f} M events: wall {r['wall_s']:7.1f} s, "
          f"CPU {r['cpu_s']:7.1f} s, {1e3 * r['wall_s'] / n:6.0f} ms wall / rank, {1e3 * r['cpu_s'] / n:6.0f} ms CPU / rank, "
          f"peak tree PSS {r['pss_mib']:6.0f} MiB (RSS {r['rss_mib']:6.0f}), load {r['load']:.1f}", flush=True)


def _plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    local = [r for r in rows if r["engine"] == "local"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    ns = [r["ranks"] for r in local]
    ax.plot(ns, [1e3 * r["wall_s"] / r["ranks"] for r in local], "o-", label="wall / rank")
    ax.plot(ns, [1e3 * r["cpu_s"] / r["ranks"] for r in local], "s-", label="CPU / rank")
    for i, r in enumerate(local):
        ax.annotate(f"load {r['load']:.0f}", (r["ranks"], 1e3 * r["wall_s"] / r["ranks"]), fontsize=7,
                    textcoords="offset points", xytext=(0, 6 if i % 2 else -12), ha="center")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("ms per rank")
    ax.set_ylim(bottom=0)
    ax.legend()
    bx.plot(ns, [r["pss_mib"] for r in local], "o-", label="PSS, summed over the process tree")
    bx.plot(ns, [r["rss_mib"] for r in local], "s--", label="RSS, summed (shared pages counted per process)")
    bx.set_xscale("log", base=2)
    bx.set_xlabel("ranks")
    bx.set_ylabel("peak memory (MiB)")
    bx.set_ylim(bottom=0)
    bx.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="the real rank the job was (or is) generated from")
    p.add_argument("--job", type=Path, help="an already generated job (rank-*.json.gz); default: generate one")
    p.add_argument("--max-ranks", type=int, default=256)
    p.add_argument("--sizes", type=int, nargs="+")
    p.add_argument("--ray", action="store_true", help="also run the largest size with --engine ray (2 CPUs)")
    p.add_argument("--plot", type=Path)
    p.add_argument("--machine", default=None, help="the machine, in words, for the figure (default: CPU model)")
    p.add_argument("--ours", default=str(HERE.parent / ".venv" / "bin" / "ccoverlap"))
    args = p.parse_args(argv)
    sizes = args.sizes or [n for n in (8, 16, 32, 64, 128, 256, 512, 1024) if n <= args.max_ranks]
    with tempfile.TemporaryDirectory(prefix="ccoverlap-ranks-") as tmp:
        if args.job:
            files = sorted(args.job.glob("rank-*.json.gz"), key=lambda f: int(f.name.split("-")[1].split(".")[0]))
            if len(files) < max(sizes):
                raise SystemExit(f"{args.job} holds {len(files)} ranks, fewer than {max(sizes)}")
        else:
            files = make_job(args.source, Path(tmp) / "all", max(sizes))
        from ccoverlap.trace.load import load_trace

        events = load_trace(files[0]).n_events
        rows = _measure(args.ours, files, sizes, Path(tmp), events, args.ray)
    local = [r for r in rows if r["engine"] == "local"]
    base, last = local[0], local[-1]
    where = args.machine or machine()
    print(f"per-rank CPU time at {last['ranks']} vs {base['ranks']} ranks: "
          f"{(last['cpu_s'] / last['ranks']) / (base['cpu_s'] / base['ranks']):.2f}x; per-rank wall: "
          f"{(last['wall_s'] / last['ranks']) / (base['wall_s'] / base['ranks']):.2f}x; machine: {where} ({machine()})")
    if args.plot:
        _plot(rows, args.plot, f"ccoverlap analyze --json, {events:,} events per rank (generated from "
                               f"{args.source.name}), whole process; {where}; load average at each point")
    return 0


if __name__ == "__main__":
    sys.exit(main())
