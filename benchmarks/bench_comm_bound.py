"""What the verdict's critical-path bound (``ccoverlap.trace.critical``) costs ``analyze``.

Paired, in one process: each round reads the same rank file with
:func:`ccoverlap.trace.summary.summarize_rank` twice, once as shipped and once with the bound
replaced by a constant (the order alternating), and times the bound's own call. Prints the
median CPU time of each and the median of the paired ratios.

    .venv/bin/python benchmarks/bench_comm_bound.py                  # nccl_parser_config from ../shared/traces
    .venv/bin/python benchmarks/bench_comm_bound.py --file rank0.json.gz --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import ccoverlap.trace.summary as summary

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "traces" / "nccl_parser_config" / "nccl_data.json.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", type=Path, default=DEFAULT, help="one rank's trace")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    real = summary.comm_bound_s
    inside: list[float] = []

    def timed(*a, **k):
        t = time.process_time()
        out = real(*a, **k)
        inside.append(time.process_time() - t)
        return out

    def run(bound) -> float:
        summary.comm_bound_s = bound
        t = time.process_time()
        summary.summarize_rank(args.file)
        return time.process_time() - t

    with_b, without, ratios = [], [], []
    for i in range(args.rounds):
        pair = [(timed, with_b), (lambda *a, **k: 0.0, without)]
        for bound, out in (pair if i % 2 == 0 else pair[::-1]):
            out.append(run(bound))
        ratios.append(with_b[-1] / without[-1])
    summary.comm_bound_s = real
    print(f"{args.file.name}: summarize_rank CPU median {statistics.median(with_b) * 1e3:.1f} ms with the bound, "
          f"{statistics.median(without) * 1e3:.1f} ms without (paired ratio median {statistics.median(ratios):.3f}); "
          f"the bound itself {statistics.median(inside) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
