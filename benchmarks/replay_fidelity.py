"""Fidelity of ``ccoverlap replay`` on the real traces: replayed vs measured step time per rank
and step, and which dependencies were found / inferred (a markdown table for docs/replay.md).

    .venv/bin/python benchmarks/replay_fidelity.py [--shared ../shared/traces]

Traces with GPU kernels and at least one complete profiler step are replayed with the
default step window (``--steps hta``: the last, often cut-off, step dropped).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ccoverlap.errors import TraceError  # noqa: E402
from ccoverlap.replayer.run import replay  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "traces")
    args = ap.parse_args(argv)
    print("| trace | rank | step | measured ms | replayed ms | error | structure only ms | error (structure) |")
    print("|---|---|---|---|---|---|---|---|")
    deps = []
    worst = worst_s = 0.0
    for d in sorted(p for p in args.shared.iterdir() if p.is_dir()):
        try:
            res = replay([str(d)], whatifs=["none"])
        except TraceError as exc:
            deps.append(f"| {d.name} | not replayed: {str(exc)[:100]}… | | | | |")
            continue
        for r in res.fidelity:
            worst = max(worst, abs(r["error_pct"]))
            worst_s = max(worst_s, abs(r["structure_error_pct"]))
            print(f"| {d.name} | {r['rank']} | {r['step']} | {r['measured_s'] * 1e3:.3f} | {r['replayed_s'] * 1e3:.3f} "
                  f"| {r['error_pct']:+.3f}% | {r['structure_s'] * 1e3:.3f} | {r['structure_error_pct']:+.2f}% |")
        for g in res.job.graph.ranks:
            i = g.inferred
            deps.append(f"| {d.name} | {g.rank} | {g.n_gpu} | {i['runtime_calls']} ({i['runtime_calls_in_graph']}) | "
                        f"{i['cross_stream_from_args']} | "
                        f"{i['cross_stream_inferred_from_timing']} | {i['host_sync_blocking_calls']} | {i['launch_queue_waits']} | "
                        f"{len(res.job.graph.collectives)} | {i['launch_latency_us']:.1f} |")
    print(f"\nmax |error| {worst:.3f}% (replayed), {worst_s:.2f}% (structure only)\n")
    print("| trace | rank | device events | runtime calls (in the graph) | cross-stream from args | cross-stream inferred from "
          "timing | blocking host calls | launch-queue waits | collectives matched across ranks | launch latency µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in deps:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
