"""Instructions executed to build and to simulate one step, counted by valgrind's callgrind:
a load-independent A/B check for simulator speed work on a shared machine.

Wall and CPU times on a loaded 2-core machine move by 10-30% between runs, more than most
single speed changes; the number of instructions the process executes does not depend on the
load (it moves by well under 0.1% between identical runs). For each source tree the script runs
``python`` under ``valgrind --tool=callgrind`` three times on the target workload: (a) imports
and workload only, (b) + build the step, (c) + build and simulate it. It prints b - a (the
builder's instructions) and c - b (the simulator's: static tables, event loop, Timeline), in
millions, for this tree and the baselines, and their ratio. Instructions are not seconds
(a cache miss costs more than an add), so the speed figures themselves still come from
``bench_simulate.py``; this script says whether a change removes work.

    python benchmarks/sim_instructions.py [--target gpt3-175b-64xa100] [--baseline PATH ...]

Needs ``valgrind`` on the PATH; takes about a minute per run (3 runs per tree).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)

_CHILD = r"""
import sys
sys.path.insert(0, {bench!r})
from bench_simulate import TARGETS
from ccoverlap.predict.evaluate import build_workload_step, cost_model_for
from ccoverlap.sim.simulator import simulate
from ccoverlap.predict.workload import workload_from_mapping
import ccoverlap
assert ccoverlap.__file__.startswith({tree!r}), ccoverlap.__file__
w = workload_from_mapping(TARGETS[{target!r}]["workload"], source={target!r})
cost = cost_model_for(w)
if {stage} >= 1:
    step = build_workload_step(w)
    if {stage} >= 2:
        simulate(step.graph, cost)
"""


def count(tree: str, target: str, stage: int) -> int:
    """Instructions (callgrind's ``I refs``) of one child process at ``stage`` (0: imports and
    workload, 1: + build, 2: + build and simulate)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = _CHILD.format(bench=HERE, tree=os.path.abspath(tree), target=target, stage=stage)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
                              sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True,
                             check=False)
    m = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or not m:
        raise SystemExit(f"callgrind run failed in {tree} (stage {stage}):\n{out.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main(argv=None) -> int:
    """Count and print the table."""
    sys.path.insert(0, HERE)
    from bench_simulate import TARGETS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=sorted(TARGETS), default="gpt3-175b-64xa100")
    ap.add_argument("--baseline", action="append", default=[], help="another source tree (its ccoverlap package)")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("sim_instructions: valgrind is not on the PATH", file=sys.stderr)
        return 2
    trees = [("this", TREE)]
    for b in args.baseline:
        if not os.path.isdir(os.path.join(b, "ccoverlap")):
            print(f"sim_instructions: --baseline {b}: no ccoverlap package there", file=sys.stderr)
            return 2
        trees.append((b, os.path.abspath(b)))
    rows = []
    for name, tree in trees:
        a, b, c = (count(tree, args.target, s) for s in (0, 1, 2))
        rows.append((name, b - a, c - b))
    print(f"instructions (millions, callgrind) for one step of {args.target}")
    print(f"{'tree':<40} {'build':>10} {'simulate':>10} {'both':>10} {'vs this':>8}")
    base_total = rows[0][1] + rows[0][2]
    for name, build, sim in rows:
        total = build + sim
        print(f"{name:<40} {build / 1e6:>10.1f} {sim / 1e6:>10.1f} {total / 1e6:>10.1f} {total / base_total:>7.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
