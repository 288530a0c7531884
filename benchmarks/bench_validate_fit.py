"""What the step cache of `ccoverlap validate --fit` saves: re-simulating each fit run's step
graph with new cost parameters vs rebuilding the step for every candidate, A/B interleaved.

    .venv/bin/python benchmarks/bench_validate_fit.py [--repeats 3]

Prints wall seconds for 5 candidate values of gemm_peak_fraction over two published runs
(Megatron-Core 70B on 768 H100, PTD-P 39B on 512 A100), median of the repeats, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ccoverlap.validation.compare import compare_runs
from ccoverlap.validation.predict import cost_params_for
from ccoverlap.validation.reader import PUBLISHED, load_runs

RUNS = ("mcore-gpt-70b-h100x768", "ptdp-gpt-39b-a100x512")
VALUES = (0.6, 0.65, 0.7, 0.75, 0.8)


def one_fit_sweep(runs, cache):
    t = time.perf_counter()
    for v in VALUES:
        compare_runs(runs, params_for=lambda r, v=v: cost_params_for(r, {"gemm_peak_fraction": v}), step_cache=cache)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    runs = [r for r in load_runs(PUBLISHED).runs if r.name in RUNS]
    rebuild, cached = [], []
    for _ in range(args.repeats):  # interleaved A/B
        rebuild.append(one_fit_sweep(runs, None))
        cached.append(one_fit_sweep(runs, {}))
    print("| variant | runs (s) | median (s) |")
    print("| :-- | :-- | --: |")
    print(f"| rebuild the step per candidate | {', '.join(f'{x:.2f}' for x in rebuild)} | {statistics.median(rebuild):.2f} |")
    print(f"| build once, re-simulate (validate --fit) | {', '.join(f'{x:.2f}' for x in cached)} | "
          f"{statistics.median(cached):.2f} |")
    print(f"\nratio rebuild / cached: {statistics.median(rebuild) / statistics.median(cached):.2f}x")


if __name__ == "__main__":
    main()
