"""What one training step computes under each framework profile (docs/model.md).

For one workload (flags as ``ccoverlap simulate``; default: Llama-3-8B, FSDP over one DGX H100,
seq 8192, micro-batch 1) this simulates the step once per framework profile and prints, per
profile, the step time and the busy time of the first simulated rank's compute stream split
into GEMMs, attention kernels and memory-bound kernels, plus the largest ops. Nothing here is
timed: the numbers are the model's predictions, identical on any machine.

    .venv/bin/python benchmarks/model_profiles.py
    .venv/bin/python benchmarks/model_profiles.py --model gpt-3-175b --cluster dgx-a100 --nodes 8 \\
        --tp 8 --pp 8 --global-batch 64 --seq-len 2048 --recompute selective
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import Counter
from dataclasses import replace

from ccoverlap.specs import AttentionSpec, GemmSpec, MemorySpec

DEFAULT = ["--model", "llama-3-8b", "--cluster", "dgx-h100", "--nodes", "1", "--dp", "8", "--data-parallel", "fsdp",
           "--global-batch", "8", "--micro-batch", "1", "--seq-len", "8192"]


def breakdown(w):
    """(step seconds, {category: busy seconds}, Counter of op name -> seconds) for rank 0."""
    from ccoverlap.predict.evaluate import simulate_workload
    from ccoverlap.sim.timeline import step_time_s

    step, tl = simulate_workload(w)
    cats: Counter = Counter()
    names: Counter = Counter()
    for o in step.graph.ops:
        if o.rank != 0 or o.stream != "compute":
            continue
        d = float(tl.end_s[o.op_id] - tl.start_s[o.op_id])
        kind = ("GEMM" if isinstance(o.spec, GemmSpec) else "attention" if isinstance(o.spec, AttentionSpec)
                else "memory-bound" if isinstance(o.spec, MemorySpec) else "comm (blocking)")
        cats[kind] += d
        names[o.name.rstrip("0123456789")] += d
    return step_time_s(tl), cats, names


def main(argv=None) -> int:
    from ccoverlap.catalog.frameworks import builtin_frameworks
    from ccoverlap.commands.options import add_workload_arguments, workload_from_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(ap)
    ap.add_argument("--top", type=int, default=6, help="largest ops listed per profile")
    args = ap.parse_args(argv if argv is not None else (sys.argv[1:] or DEFAULT))
    w = workload_from_args(args)
    print(f"# {w.describe()}")
    rows = []
    for fw in builtin_frameworks():
        wf = replace(copy.copy(w), framework=fw)
        try:
            t, cats, names = breakdown(wf)
        except Exception as exc:  # a profile that cannot run this workload (e.g. CP with unfused attention)
            print(f"{fw}: {type(exc).__name__}: {exc}")
            continue
        rows.append((fw, t, cats, names))
    header = ["profile", "step (ms)", "GEMM (ms)", "attention (ms)", "memory-bound (ms)", "largest ops (ms)"]
    print("| " + " | ".join(header) + " |")
    print("| :-- | --: | --: | --: | --: | :-- |")
    for fw, t, cats, names in rows:
        top = ", ".join(f"{n} {s * 1e3:.1f}" for n, s in names.most_common(args.top))
        print(f"| {fw} | {t * 1e3:.1f} | {cats['GEMM'] * 1e3:.1f} | {cats['attention'] * 1e3:.1f} | "
              f"{cats['memory-bound'] * 1e3:.1f} | {top} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
