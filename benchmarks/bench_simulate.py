"""How long one simulated training step takes, through the planner's public path, against a baseline.

Targets: one step of

* GPT-3 175B on 64 A100 (8 x DGX-A100), TP 8 x PP 8, interleaved 1F1B with 3 virtual stages,
  64 micro-batches of 1 x 2048 tokens — goal <= 0.5 s;
* Llama-3-70B on 1024 H100 (128 x DGX-H100), TP 8 x PP 8 x DP 16, 1F1B, 16 micro-batches of
  1 x 8192 tokens — goal <= 0.2 s.

Each timed run is ``ccoverlap.predict.evaluate.simulate_workload(workload)`` — build the op graph, make
the cost model, simulate — in a fresh subprocess per sample after one untimed warm-up run
(imports and first-call caches are not a simulation's cost). Samples of this tree and of the
baseline are interleaved A/B so both see the same machine load. The baseline is, by default,
the last commit (``HEAD``: the working tree's changes against it) exported with ``git archive``
into a temporary directory (``--baseline-commit REV`` for another), or any source tree
(``--baseline PATH``, e.g. a second checkout); its package is imported through ``PYTHONPATH``. Prints medians of wall and CPU seconds, the op count, the
simulated ranks, the simulated step times (they must agree) and the speed-up, plus the load
average: on a shared machine the wall time includes waiting for a core.

    python benchmarks/bench_simulate.py [--runs 5] [--baseline-commit REV | --baseline PATH | --no-baseline]
                                        [--target NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)

TARGETS = {
    "gpt3-175b-64xa100": {
        "label": "GPT-3 175B, 64 A100, TP8 PP8, interleaved x3, 64 mb",
        "goal_s": 0.5,
        "workload": {
            "model": "gpt3-175b", "cluster": "dgx-a100", "nodes": 8,
            "parallel": {"tp": 8, "pp": 8, "dp": 1, "pp_schedule": "interleaved", "virtual_stages": 3},
            "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 2048},
        },
    },
    "llama3-70b-1024xh100": {
        "label": "Llama-3-70B, 1024 H100, TP8 PP8 DP16, 1F1B, 16 mb",
        "goal_s": 0.2,
        "workload": {
            "model": "llama-3-70b", "cluster": "dgx-h100", "nodes": 128,
            "parallel": {"tp": 8, "pp": 8, "dp": 16, "pp_schedule": "1f1b"},
            "batch": {"global_batch": 256, "micro_batch": 1, "seq_len": 8192},
        },
    },
}


def worker(target: str, runs: int) -> int:
    """Time ``runs`` simulations of ``target`` (after one warm-up) in this process; print JSON."""
    from ccoverlap.predict.evaluate import simulate_workload
    from ccoverlap.predict.workload import workload_from_mapping
    from ccoverlap.sim.timeline import step_time_s

    w = workload_from_mapping(TARGETS[target]["workload"], source=target)
    step, tl = simulate_workload(w)  # warm-up: imports, first-call caches
    wall, cpu = [], []
    for _ in range(runs):
        del step, tl
        w0, c0 = time.perf_counter(), time.process_time()
        step, tl = simulate_workload(w)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    import ccoverlap
    print(json.dumps({"wall": wall, "cpu": cpu, "ops": len(step.graph), "ranks": len(step.simulated_ranks),
                      "step_s": step_time_s(tl), "module": ccoverlap.__file__}))
    return 0


def _sample(tree: str, target: str, runs: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", target, "--runs", str(runs)],
                         env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark worker failed in {tree}:\n{out.stderr}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    if not data["module"].startswith(os.path.abspath(tree)):
        raise SystemExit(f"worker for {tree} imported ccoverlap from {data['module']}")
    return data


def _commit(tree: str) -> str:
    try:
        return subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main(argv=None) -> int:
    """Run the A/B benchmark and print its table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed samples per tree and target (>= 5 for the table)")
    ap.add_argument("--baseline-commit", default="HEAD",
                    help="commit of this repository to compare with (exported with git archive; default HEAD)")
    ap.add_argument("--baseline", help="source tree to compare with instead (its ccoverlap package)")
    ap.add_argument("--no-baseline", action="store_true", help="time this tree only")
    ap.add_argument("--target", choices=sorted(TARGETS), action="append", help="only these targets")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.runs)

    trees = [("this", TREE)]
    tmp = None
    if args.no_baseline:
        pass
    elif args.baseline:
        if not os.path.isdir(os.path.join(args.baseline, "ccoverlap")):
            raise SystemExit(f"--baseline {args.baseline}: no ccoverlap package there")
        trees.append(("baseline", os.path.abspath(args.baseline)))
    else:
        tmp = tempfile.mkdtemp(prefix="ccoverlap-baseline-")
        archive = subprocess.run(["git", "-C", TREE, "archive", args.baseline_commit, "ccoverlap"],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise SystemExit(f"git archive {args.baseline_commit}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        trees.append(("baseline", tmp))
    try:
        return _run(args, trees)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(args, trees) -> int:
    """Sample every target on every tree (interleaved) and print the table."""
    targets = args.target or list(TARGETS)
    results: dict = {(t, name): {"wall": [], "cpu": []} for t in targets for name, _ in trees}
    for t in targets:
        for _ in range(args.runs):  # interleaved A/B: one sample of each tree in turn
            for name, tree in trees:
                d = _sample(tree, t, 1)
                r = results[(t, name)]
                r["wall"] += d["wall"]
                r["cpu"] += d["cpu"]
                r.update(ops=d["ops"], ranks=d["ranks"], step_s=d["step_s"])

    med = statistics.median
    print(f"one simulated step through ccoverlap.predict.evaluate.simulate_workload (build + cost model + simulate); "
          f"median of {args.runs} samples, interleaved A/B")
    print("trees: " + ", ".join(f"{name} = {tree} @ {_commit(tree) if name == 'this' or args.baseline else args.baseline_commit}"
                                for name, tree in trees))
    print(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    header = (f"{'target':<52} {'tree':<8} {'ops':>7} {'sim ranks':>9} {'wall (s)':>9} {'CPU (s)':>8} "
              f"{'min wall':>8} {'goal (s)':>8} {'met wall/CPU':>12} {'speed-up wall/CPU':>17} {'simulated step (s)':>18}")
    print(header)
    print("-" * len(header))
    for t in targets:
        base = results.get((t, "baseline"))
        for name, _ in trees:
            r = results[(t, name)]
            w = med(r["wall"])
            speed = (f"{med(base['wall']) / w:.2f}x/{med(base['cpu']) / med(r['cpu']):.2f}x"
                     if base and name == "this" else "")  # baseline time / this time
            goal = TARGETS[t]["goal_s"]
            met = f"{'yes' if w <= goal else 'no'}/{'yes' if med(r['cpu']) <= goal else 'no'}"
            print(f"{TARGETS[t]['label']:<52} {name:<8} {r['ops']:>7} {r['ranks']:>9} {w:>9.3f} {med(r['cpu']):>8.3f} "
                  f"{min(r['wall']):>8.3f} {goal:>8.2f} {met:>12} {speed:>17} "
                  f"{r['step_s']:>18.6f}")
        if base:
            a, b = results[(t, "this")]["step_s"], base["step_s"]
            if abs(a - b) > 1e-6 * abs(b):
                print(f"  !! {t}: simulated step differs from the baseline's ({a!r} vs {b!r})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
