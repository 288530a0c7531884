"""Overlap ratio: ccoverlap analyze vs HolisticTraceAnalysis' get_comm_comp_overlap.

For every trace folder under ``--shared`` (default ../shared/traces) that holds
communication kernels, both tools compute the per-rank overlap ratio on the same step
window, twice: HTA's default (``include_last_profiler_step=False`` vs our ``--steps hta``)
and with the last step (``True`` vs ``--steps all``). Ours is also shown with
``--time-resolution exact`` (no rounding of ns timestamps) to show what HTA's rounding does.
Exits 1 when any difference exceeds ``--tol`` percentage points (default 0.1).

    .venv/bin/pip install traceinsight        # HTA, for this script only
    .venv/bin/python benchmarks/compare_hta.py
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def hta_overlap(trace_dir: Path, include_last: bool) -> dict[int, float]:
    """HTA's comp_comm_overlap_pctg per rank (HTA rounds it to 2 decimals)."""
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=include_last)
    df = ta.get_comm_comp_overlap(visualize=False)
    return {int(r): float(p) for r, p in zip(df["rank"], df["comp_comm_overlap_pctg"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=next((d / "shared" / "traces" for d in ROOT.parents[:2]
                                                        if (d / "shared" / "traces").is_dir()),
                                                       ROOT.parent / "shared" / "traces"))
    p.add_argument("--tol", type=float, default=0.1, help="allowed difference, percentage points")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = p.parse_args(argv)
    try:
        import hta  # noqa: F401
    except ImportError:
        print("HTA is not installed: .venv/bin/pip install traceinsight", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    from ccoverlap.errors import TraceError
    from ccoverlap.trace.analyze import analyze

    rows = []
    for d in sorted(x for x in args.shared.iterdir() if x.is_dir()):
        try:
            probe = analyze([d])
        except TraceError:
            continue
        if any(rt.mode != "gpu" for rt in probe.ranks) or \
                not any((rt.timeline.kind == "comm").any() for rt in probe.ranks):
            continue
        for steps, include_last in (("hta", False), ("all", True)):
            ours = analyze([d], steps=steps)
            exact = analyze([d], steps=steps, time_resolution="exact")
            ref = hta_overlap(d, include_last)
            ex = {m.rank: 100 * m.overlap_ratio for m in exact.metrics}
            for m in ours.metrics:
                got = 100 * m.overlap_ratio
                rows.append((d.name, m.rank, steps, ", ".join(map(str, ours.analysed_steps)), ref[m.rank], got,
                             got - ref[m.rank], ex[m.rank]))
    worst = max((abs(r[6]) for r in rows), default=0.0)
    if args.markdown:
        print("| trace | rank | window (ours / HTA) | steps | HTA % | ours % | diff (pp) | ours, exact ns % |")
        print("|---|---|---|---|---|---|---|---|")
        for name, rank, steps, got_steps, ref, got, diff, ex in rows:
            hta_arg = "include_last=False" if steps == "hta" else "include_last=True"
            print(f"| {name} | {rank} | `--steps {steps}` / `{hta_arg}` | {got_steps} | {ref:.2f} | {got:.3f} | "
                  f"{diff:+.3f} | {ex:.3f} |")
    else:
        print(f"{'trace':22} {'rank':>4} {'steps':>6} {'analysed':>12} {'HTA %':>8} {'ours %':>8} {'diff pp':>8} "
              f"{'exact %':>8}")
        for name, rank, steps, got_steps, ref, got, diff, ex in rows:
            print(f"{name:22} {rank:4d} {steps:>6} {got_steps:>12} {ref:8.2f} {got:8.3f} {diff:+8.3f} {ex:8.3f}")
    print(f"\n{len(rows)} comparisons, max |ours - HTA| = {worst:.3f} percentage points (tolerance {args.tol})")
    if not rows:
        print("no trace with communication kernels found", file=sys.stderr)
        return 2
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
