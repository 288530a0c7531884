"""One layer's fused TP pairs of a published run under each ``tp_overlap`` mode.

For the run (default: torchtitan's Llama 3.1 70B "2D + AsyncTP" row), build and simulate the
step with ``tp_overlap`` set to ``none``, ``chunked`` and ``symm_mem`` (everything else as the
runs file says) and print, for one layer / micro-batch on the first simulated rank, each TP
pair's span (first op start to last op end, milliseconds) and the summed duration of its GEMMs:
forward AG + qkv, proj + RS, AG + fc1, fc2 + RS, and the backward output-gradient AG + dgrad of
proj and fc2. Nothing here is timed: the numbers are model outputs, identical on any machine::

    .venv/bin/python benchmarks/tp_overlap_pairs.py
    .venv/bin/python benchmarks/tp_overlap_pairs.py --run torchtitan-llama3.1-405b-fsdp8-tp8-pp8-1f1b-h100x512 --layer 2
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace

PAIRS = (  # (label, phase, op-name pattern); FP8 cast kernels excluded
    ("AG + qkv", "fwd", r"^qkv(_ag|_symm|\d|$)"),
    ("proj + RS", "fwd", r"^proj(_rs|_symm|\d|$)"),
    ("AG + fc1", "fwd", r"^mlp_fc1(_ag|_symm|\d|$)"),
    ("fc2 + RS", "fwd", r"^mlp_fc2(_rs|_symm|\d|$)"),
    ("bwd: dY AG + proj dgrad", "bwd", r"^proj_(grad|dgrad)"),
    ("bwd: dY AG + fc2 dgrad", "bwd", r"^mlp_fc2_(grad|dgrad)"),
)
MODES = ("none", "chunked", "symm_mem")


def pair_times(run, mode: str, layer: int) -> tuple[float, dict[str, tuple[float, float]]]:
    """(step seconds, {pair label: (span ms, GEMM ms)}) for ``run`` simulated with ``tp_overlap=mode``."""
    from ccoverlap.cost import CostModel
    from ccoverlap.predict.evaluate import build_workload_step
    from ccoverlap.sim.simulator import simulate
    from ccoverlap.specs import GemmSpec
    from ccoverlap.validation.predict import cost_params_for, workload_for

    w, _ = workload_for(run)
    w = replace(w, knobs=replace(w.knobs, tp_overlap=mode))
    step = build_workload_step(w)
    tl = simulate(step.graph, CostModel(w.cluster, cost_params_for(run)))
    rank0 = min(o.rank for o in step.graph.ops)
    out = {}
    for label, phase, pat in PAIRS:
        idx = [i for i, o in enumerate(step.graph.ops)
               if o.rank == rank0 and o.layer == layer and o.microbatch == 0 and o.phase == phase
               and re.match(pat, o.name) and "fp8_cast" not in o.name]
        if not idx:
            continue
        span = max(tl.end_s[i] for i in idx) - min(tl.start_s[i] for i in idx)
        gemm = sum(tl.end_s[i] - tl.start_s[i] for i in idx if isinstance(step.graph.ops[i].spec, GemmSpec))
        out[label] = (span * 1e3, gemm * 1e3)
    return float(tl.end_s.max()), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="published", help="runs file (default: the shipped published set)")
    ap.add_argument("--run", default="torchtitan-llama3.1-70b-fsdp32-tp8-fp8-asynctp-h100x256")
    ap.add_argument("--layer", type=int, default=5, help="layer index to read (default 5)")
    a = ap.parse_args(argv)
    from ccoverlap.errors import ConfigError
    from ccoverlap.validation.reader import load_runs, runs_path
    try:
        runs = {r.name: r for r in load_runs(runs_path(a.runs)).runs}
        if a.run not in runs:
            raise ConfigError(f"no run named {a.run!r} in {a.runs}")
        rows = {m: pair_times(runs[a.run], m, a.layer) for m in MODES}
    except ConfigError as e:
        print(f"tp_overlap_pairs: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.run}, layer {a.layer}, micro-batch 0; span / GEMM time in ms (model outputs)\n")
    print("| fused pair | " + " | ".join(MODES) + " |")
    print("| :-- | " + " | ".join("--:" for _ in MODES) + " |")
    for label, _, _ in PAIRS:
        cells = [f"{rows[m][1][label][0]:.2f} / {rows[m][1][label][1]:.2f}" if label in rows[m][1] else "-"
                 for m in MODES]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("| step (s) | " + " | ".join(f"{rows[m][0]:.3f}" for m in MODES) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
