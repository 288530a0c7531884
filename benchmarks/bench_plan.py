"""How long planning takes: the README's 70B plan, two single simulations, and the search.

Cases (each run in a fresh subprocess, so imports and caches do not carry over):

* ``plan-70b``: ``ccoverlap plan`` of the README (Llama-3-70B on 4 x 8 H100, TP8 x PP2 x DP2
  FSDP, SP, 1F1B, global batch 64 x 4096, micro-batch 1) with every strategy;
* ``plan-70b-exact``: the same plan with ``exact=True`` (every candidate judged on the full
  step, as before screening; run it next to ``plan-70b``, which is interleaved with it);
* ``sim-gpt3-175b``: one step of GPT-3 175B on 64 A100 (8 x DGX A100), TP8 x PP8, interleaved
  with 3 virtual stages, 64 micro-batches (global batch 64, micro-batch 1, 2048 tokens),
  built and simulated;
* ``sim-70b-1024``: one step of Llama-3-70B on 1024 H100, TP8 x PP8 x DP16, 1F1B, 16
  micro-batches (global batch 256, micro-batch 1, 8192 tokens), built and simulated;
* ``search-70b-64``: ``ccoverlap plan --search`` for Llama-3-70B on 64 H100 (global batch 64 x
  4096).

Prints the median wall and CPU seconds of ``--runs`` runs per case (wall includes waiting for
a core on a shared machine: quote it with the load average). ``--baseline DIR`` runs the same
cases against another checkout (e.g. of the last commit), interleaved with ours, and adds the
ratio; cases the baseline lacks are shown as ``-``.

    python benchmarks/bench_plan.py [--runs 3] [--cases plan-70b,sim-gpt3-175b,...] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CASES = ("plan-70b", "plan-70b-exact", "sim-gpt3-175b", "sim-70b-1024", "search-70b-64")
TARGETS = {"plan-70b": 10.0, "plan-70b-exact": 10.0, "sim-gpt3-175b": 0.5, "sim-70b-1024": 0.2, "search-70b-64": 60.0}


def _workload(case: str):
    from ccoverlap.predict.workload import workload_from_mapping

    if case.startswith("plan-70b"):
        data = {"model": "llama-3-70b", "cluster": "dgx-h100", "nodes": 4,
                "parallel": {"tp": 8, "pp": 2, "dp": 2, "data_parallel": "fsdp", "sequence_parallel": True,
                             "pp_schedule": "1f1b"},
                "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 4096}}
    elif case == "sim-gpt3-175b":
        data = {"model": "gpt3-175b", "cluster": "dgx-a100", "nodes": 8,
                "parallel": {"tp": 8, "pp": 8, "dp": 1, "pp_schedule": "interleaved", "virtual_stages": 3},
                "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 2048}}
    elif case == "sim-70b-1024":
        data = {"model": "llama-3-70b", "cluster": "dgx-h100", "nodes": 128,
                "parallel": {"tp": 8, "pp": 8, "dp": 16, "pp_schedule": "1f1b"},
                "batch": {"global_batch": 256, "micro_batch": 1, "seq_len": 8192}}
    else:
        data = {"model": "llama-3-70b", "cluster": "dgx-h100", "nodes": 8,
                "parallel": {"dp": 64, "data_parallel": "fsdp"},
                "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 4096}}
    return workload_from_mapping(data, source=f"bench {case}")


def run_case(case: str) -> dict:
    """Run ``case`` once in this process; returns wall / CPU seconds (this process and its worker
    processes) and what was predicted."""
    w = _workload(case)
    from ccoverlap.planning import strategies as planmod

    w0, c0 = time.perf_counter(), time.process_time()
    if case.startswith("plan-70b"):
        import inspect

        if hasattr(planmod, "load_decider_strategies"):  # checkouts before the Planner object
            planmod.load_decider_strategies()
        if case == "plan-70b-exact" and "exact" not in inspect.signature(planmod.plan).parameters:
            return {"missing": True}  # checkouts before screening: plan-70b is already exact
        res = planmod.plan(w, exact=True) if case == "plan-70b-exact" else planmod.plan(w)
        info = {s.name: round(s.step_time_s * 1e3, 1) for s in res.strategies}
    elif case.startswith("sim-"):
        from ccoverlap.parallel import build_step
        from ccoverlap.predict.evaluate import cost_model_for
        from ccoverlap.sim.simulator import simulate
        from ccoverlap.sim.timeline import step_time_s

        cost = cost_model_for(w)
        step = build_step(w.model, w.parallel, w.batch, w.cluster, w.knobs)
        tl = simulate(step.graph, cost)
        info = {"step_ms": round(step_time_s(tl) * 1e3, 1), "ops": len(step.graph.ops)}
    else:
        try:
            from ccoverlap.planning.search import search
        except ImportError:  # checkouts before plan --search
            return {"missing": True}
        res = search(w)
        best = res.ranked[0] if res.ranked else None
        info = {"layouts": res.enumerated, "fit": res.fitting, "simulated": res.simulated,
                "best": best.label if best else None, "best_ms": round(best.step_time_s * 1e3, 1) if best else None}
    kids = os.times()
    return {"wall_s": time.perf_counter() - w0,
            "cpu_s": time.process_time() - c0 + kids.children_user + kids.children_system, "info": info}


def _spawn(case: str, repo: str) -> dict:
    env = dict(os.environ, PYTHONPATH=repo)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", case], env=env, cwd=repo,
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    """Run the cases ``--runs`` times (interleaved with ``--baseline`` if given) and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--baseline", help="another checkout to time the same cases with (e.g. one of the last commit)")
    ap.add_argument("--baseline-runs", type=int, help="runs of the baseline (default: --runs)")
    ap.add_argument("--baseline-cases", help="cases to run on the baseline too (default: all of --cases)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_case(args.child)))
        return 0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"unknown case(s) {bad}; choose from {', '.join(CASES)}")
    b_runs = args.baseline_runs if args.baseline_runs is not None else args.runs
    b_cases = set(c.strip() for c in args.baseline_cases.split(",")) if args.baseline_cases else set(cases)
    ours: dict[str, list[dict]] = {c: [] for c in cases}
    base: dict[str, list[dict]] = {c: [] for c in cases}
    for i in range(max(args.runs, b_runs if args.baseline else 0)):
        for c in cases:
            if i < args.runs:
                ours[c].append(_spawn(c, REPO))
                print(f"run {i + 1}: {c}: {json.dumps(ours[c][-1])}", file=sys.stderr, flush=True)
            if args.baseline and i < b_runs and c in b_cases:
                base[c].append(_spawn(c, os.path.abspath(args.baseline)))
                print(f"run {i + 1}: {c} (baseline): {json.dumps(base[c][-1])}", file=sys.stderr, flush=True)

    def med(rs: list[dict], key: str):
        vals = [r[key] for r in rs if key in r]
        return statistics.median(vals) if vals else None

    def fmt(x):
        return "-" if x is None else f"{x:.2f}"

    head = ["case", "target (s)", "wall (s)", "CPU (s)", "runs"]
    if args.baseline:
        head += ["baseline wall (s)", "baseline CPU (s)", "wall speed-up", "CPU speed-up"]
    head.append("prediction / notes")
    rows = []
    for c in cases:
        wall, cpu = med(ours[c], "wall_s"), med(ours[c], "cpu_s")
        info = next((r.get("info") or r.get("error") or ("missing" if r.get("missing") else "") for r in ours[c]), "")
        row = [c, f"{TARGETS[c]:g}", fmt(wall), fmt(cpu), str(len([r for r in ours[c] if "wall_s" in r]))]
        if args.baseline:
            bw, bc = med(base[c], "wall_s"), med(base[c], "cpu_s")
            row += [fmt(bw), fmt(bc), f"{bw / wall:.1f}x" if bw and wall else "-", f"{bc / cpu:.1f}x" if bc and cpu else "-"]
            binfo = next((r.get("info") for r in base[c] if r.get("info")), None)
            if binfo is not None and binfo != info:
                info = f"{info}  | baseline: {binfo}"
        row.append(json.dumps(info) if not isinstance(info, str) else info)
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load:
        print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs (medians of runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
