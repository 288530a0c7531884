"""Measured vs predicted *differences* between published runs that change one thing.

Absolute errors mix every cost of a step; the difference between two runs of the same source
that change one setting (sequence length with context parallelism, the pipeline schedule)
isolates what that setting costs. For each pair ``A:B`` this prints the measured and the
predicted step times of both runs, the measured and predicted increment B - A and their ratio
B / A. An increment the model gets right while the absolute error is large points at a cost
both runs share; a wrong increment points at the setting itself. Nothing here is timed and
nothing is fitted; the numbers are model outputs with default parameters::

    .venv/bin/python benchmarks/run_pair_increments.py            # the default pairs below
    .venv/bin/python benchmarks/run_pair_increments.py RUN_A:RUN_B --runs my_runs.yaml
    .venv/bin/python benchmarks/run_pair_increments.py RUN_A:RUN_B --calibration calib/clock.H100-SXM.json

``--calibration FILE`` (repeatable) predicts with a calibration file as ``ccoverlap validate
--calibration`` does (applied to the runs on the file's GPU).
"""

from __future__ import annotations

import argparse
import sys

# Pairs of the shipped published set that change one thing (same source, same model):
DEFAULT_PAIRS = (
    # torchtitan Table 2, Llama 3.1 8B on 8 H100: per-rank tokens constant (32K), attention x2 per step
    "torchtitan-llama3.1-8b-fsdp8-cp1-seq32k-h100x8:torchtitan-llama3.1-8b-fsdp4-cp2-seq64k-h100x8",
    "torchtitan-llama3.1-8b-fsdp4-cp2-seq64k-h100x8:torchtitan-llama3.1-8b-fsdp2-cp4-seq128k-h100x8",
    # torchtitan Table 6, Llama 3.1 405B on 512 H100: the same per-rank tokens, attention x2
    "torchtitan-llama3.1-405b-fsdp8-cp1-tp8-pp8-seq32k-h100x512:torchtitan-llama3.1-405b-fsdp4-cp2-tp8-pp8-seq64k-h100x512",
    # torchtitan Table 5: the pipeline schedule alone (1F1B -> interleaved 1F1B)
    "torchtitan-llama3.1-405b-fsdp8-tp8-pp8-1f1b-h100x512:torchtitan-llama3.1-405b-fsdp8-tp8-pp8-interleaved-h100x512",
    # torchtitan Table 4: async TP alone
    "torchtitan-llama3.1-70b-fsdp32-tp8-fp8-h100x256:torchtitan-llama3.1-70b-fsdp32-tp8-fp8-asynctp-h100x256",
    # torchtitan Table 1: Float8 alone, on 8 and on 128 GPUs
    "torchtitan-llama3.1-8b-fsdp-h100x8:torchtitan-llama3.1-8b-fsdp-fp8-h100x8",
    "torchtitan-llama3.1-8b-fsdp-h100x128:torchtitan-llama3.1-8b-fsdp-fp8-h100x128",
)


def increments(runs, pairs: list[tuple[str, str]], params_for=None) -> list[dict]:
    """Per pair: measured / predicted step of A and B (s), increments B - A (s), ratios B / A.
    ``params_for(run)`` gives a run's cost parameters (default: its GPU's defaults)."""
    from ccoverlap.validation.compare import compare_runs

    by_name = {r.name: r for r in runs}
    names = sorted({n for p in pairs for n in p})
    rows = {r.run.name: r for r in compare_runs([by_name[n] for n in names], params_for=params_for)}
    out = []
    for a, b in pairs:
        ra, rb = rows[a], rows[b]
        if not (ra.ok and rb.ok):
            raise SystemExit(f"run_pair_increments: {a if not ra.ok else b} could not be predicted: "
                             f"{(ra if not ra.ok else rb).problem}")
        ma, mb = ra.measured_s, rb.measured_s
        pa, pb = ra.prediction.step_time_s, rb.prediction.step_time_s
        out.append({"a": a, "b": b, "measured_a": ma, "measured_b": mb, "predicted_a": pa, "predicted_b": pb,
                    "measured_increment": mb - ma, "predicted_increment": pb - pa,
                    "measured_ratio": mb / ma, "predicted_ratio": pb / pa})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="*", metavar="RUN_A:RUN_B", help="pairs of run names (default: the list above)")
    ap.add_argument("--runs", default="published", help="runs file (default: the shipped published set)")
    ap.add_argument("--calibration", action="append", default=[], metavar="FILE",
                    help="calibration file(s) to predict with, as ccoverlap validate --calibration")
    args = ap.parse_args(argv)
    from ccoverlap.commands.validate import _load_calibrations
    from ccoverlap.validation.predict import cost_params_for
    from ccoverlap.validation.reader import load_runs

    params_for = None
    if args.calibration:
        calib = _load_calibrations(args.calibration)

        def params_for(r):
            return cost_params_for(r, None, calib)

    runs = load_runs(args.runs).runs
    known = {r.name for r in runs}
    pairs = []
    for item in args.pairs or DEFAULT_PAIRS:
        a, sep, b = item.partition(":")
        if not sep or a not in known or b not in known:
            sys.exit(f"run_pair_increments: expected RUN_A:RUN_B with two run names of {args.runs}, got {item!r}")
        pairs.append((a, b))
    print("| A -> B | measured A / B (s) | predicted A / B (s) | measured B-A (s) | predicted B-A (s) "
          "| measured B/A | predicted B/A |")
    print("| :-- | --: | --: | --: | --: | --: | --: |")
    for r in increments(runs, pairs, params_for):
        print(f"| {r['a']} -> {r['b']} | {r['measured_a']:.3f} / {r['measured_b']:.3f} | "
              f"{r['predicted_a']:.3f} / {r['predicted_b']:.3f} | {r['measured_increment']:+.3f} | "
              f"{r['predicted_increment']:+.3f} | {r['measured_ratio']:.3f} | {r['predicted_ratio']:.3f} |")


if __name__ == "__main__":
    main()
