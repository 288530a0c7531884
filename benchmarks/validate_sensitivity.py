"""Which cost parameter moves which group of published runs: per-group mean signed error of
`ccoverlap validate` with one physical parameter scaled at a time.

For each ``NAME=FACTOR`` given, every run is predicted with that cost parameter multiplied by
FACTOR (on top of its GPU's defaults, nothing else changed), and the table shows the mean
|error| and mean signed error over all runs and the mean signed error of each declared run
group, beside the defaults. A parameter whose change moves every group alike is a candidate
for a common bias; one that moves only some groups says where the model's physics differs.
This is a diagnostic, not a fit: it never chooses a value. Nothing here is timed; the numbers
are model outputs, the same on any machine (about 15 s per row on 2 cores)::

    .venv/bin/python benchmarks/validate_sensitivity.py mem_bw_fraction=0.85 gemm_peak_fraction=0.9
    .venv/bin/python benchmarks/validate_sensitivity.py --runs my_runs.yaml attention_fa2_bwd_peak_fraction=0.8
"""

from __future__ import annotations

import argparse
import sys


def parse_scalings(items: list[str]) -> list[tuple[str, float]]:
    """``["a=0.9", ...]`` -> ``[("a", 0.9), ...]``; exits with one line on a malformed item or
    an unknown / non-numeric cost parameter."""
    from dataclasses import fields

    from ccoverlap.cost.params import CostParams

    known = {f.name for f in fields(CostParams)}
    out = []
    for it in items:
        name, sep, val = it.partition("=")
        try:
            factor = float(val)
        except ValueError:
            factor = float("nan")
        if not sep or name not in known or not factor > 0:
            sys.exit(f"validate_sensitivity: expected NAME=FACTOR with a cost parameter name and a positive "
                     f"factor, got {it!r}")
        out.append((name, factor))
    return out


def table(runs, scalings: list[tuple[str, float]]) -> list[tuple[str, dict]]:
    """(label, {"all": Summary, group: Summary, ...}) for the defaults and each scaling."""
    from ccoverlap.validation.compare import compare_runs, summarize, summarize_groups
    from ccoverlap.validation.predict import cost_params_for

    cache: dict = {}
    out = []
    for name, factor in [("", 1.0)] + scalings:
        def params_for(r, name=name, factor=factor):
            p = cost_params_for(r)
            return p.with_overrides(**{name: getattr(p, name) * factor}) if name else p
        rows = compare_runs(runs, params_for=params_for, step_cache=cache)
        label = f"{name} x{factor:g}" if name else "defaults"
        out.append((label, {"all": summarize(rows), **summarize_groups(rows)}))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scalings", nargs="*", metavar="NAME=FACTOR", help="cost parameter and the factor to scale it by")
    ap.add_argument("--runs", default="published", help="runs file (default: the shipped published set)")
    args = ap.parse_args(argv)
    from ccoverlap.validation.reader import load_runs

    scalings = parse_scalings(args.scalings)
    runs = load_runs(args.runs).runs
    rows = table(runs, scalings)
    groups = [g for g in rows[0][1] if g != "all"]
    print("| variant | mean abs error % | mean signed error % | " + " | ".join(f"{g} (signed %)" for g in groups) + " |")
    print("| :-- | --: | --: | " + " | ".join("--:" for _ in groups) + " |")
    for label, s in rows:
        print(f"| {label} | {s['all'].mean_abs_pct:.1f} | {s['all'].mean_signed_pct:+.1f} | "
              + " | ".join(f"{s[g].mean_signed_pct:+.1f}" for g in groups) + " |")


if __name__ == "__main__":
    main()
