"""Time and peak memory per rank of ``ccoverlap analyze`` from 8 to N ranks, and a scaling plot.

A job of ``--max-ranks`` ranks is generated from one real rank (:mod:`make_trace_job`: real shape,
collectives matching across ranks by sequence and size, skew); the first 8, 16, ... ranks (a folder
of links each) are analysed by the command line in fresh processes (``ccoverlap analyze DIR --json``,
whole process: wall, CPU of the tree, peak resident memory of the tree sampled every 20 ms). Prints a
table with the load average and draws ``--plot`` (machine named in the figure).

    nice .venv/bin/python benchmarks/bench_analyze_ranks.py SOURCE.json.gz --max-ranks 256 --plot docs/analyze-scaling.png
"""

from __future__ import annotations

import argparse
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path)
    p.add_argument("--max-ranks", type=int, default=256)
    p.add_argument("--sizes", type=int, nargs="+")
    p.add_argument("--plot", type=Path)
    p.add_argument("--ours", default=str(HERE.parent / ".venv" / "bin" / "ccoverlap"))
    args = p.parse_args(argv)
    sizes = args.sizes or [n for n in (8, 16, 32, 64, 128, 256, 512, 1024) if n <= args.max_ranks]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ccoverlap-ranks-") as tmp:
        full = Path(tmp) / "all"
        files = make_job(args.source, full, max(sizes))
        events = None
        for n in sizes:
            d = Path(tmp) / f"n{n}"
            d.mkdir()
            for f in files[:n]:
                (d / f.name).symlink_to(f)
            r = run([args.ours, "analyze", str(d), "--json"])
            if events is None:
                from ccoverlap.trace.load import load_trace
                events = load_trace(files[0]).n_events
            r.update(ranks=n, events=n * events, load=os.getloadavg()[0])
            rows.append(r)
            print(f"{n:5d} ranks {n * events / 1e6:7.1f} M events: wall {r['wall_s']:7.1f} s, CPU {r['cpu_s']:7.1f} s, "
                  f"{1e3 * r['wall_s'] / n:6.0f} ms wall / rank, {1e3 * r['cpu_s'] / n:6.0f} ms CPU / rank, "
                  f"peak tree {r['peak_mib']:6.0f} MiB, load {r['load']:.1f}", flush=True)
    base = rows[0]
    print(f"per-rank CPU time at {rows[-1]['ranks']} vs {base['ranks']} ranks: "
          f"{(rows[-1]['cpu_s'] / rows[-1]['ranks']) / (base['cpu_s'] / base['ranks']):.2f}x; "
          f"per-rank wall: {(rows[-1]['wall_s'] / rows[-1]['ranks']) / (base['wall_s'] / base['ranks']):.2f}x; "
          f"machine: {machine()}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
        ns = [r["ranks"] for r in rows]
        ax.plot(ns, [1e3 * r["wall_s"] / r["ranks"] for r in rows], "o-", label="wall / rank")
        ax.plot(ns, [1e3 * r["cpu_s"] / r["ranks"] for r in rows], "s-", label="CPU / rank")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks")
        ax.set_ylabel("ms per rank")
        ax.set_ylim(bottom=0)
        ax.legend()
        bx.plot(ns, [r["peak_mib"] for r in rows], "o-")
        bx.set_xscale("log", base=2)
        bx.set_xlabel("ranks")
        bx.set_ylabel("peak memory, whole process tree (MiB)")
        bx.set_ylim(bottom=0)
        fig.suptitle(f"ccoverlap analyze, {events} events per rank ({args.source.name}); {machine()}", fontsize=9)
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=100)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
