"""Does ``tune`` pick the fastest schedule? N repetitions of ``ccoverlap bench`` on two documented shapes.

Each repetition is a fresh ``ccoverlap bench --json`` run (fresh processes, so ``tune``
measures from scratch). In every run we compare the median of the schedule ``tune`` picked
with the median of the measured-fastest concrete schedule *of the same run* (both timed
round-robin with every other schedule after tune decided): the pick counts as good when it
is within ``--tolerance`` (5%) of the fastest. A second, paired judgement divides, repetition
by repetition, the pick's time by every other schedule's time in the same repetition and takes
the median over repetitions (the worst over schedules): a repetition's background load then
cancels. Prints one line per run and both tallies; ``--out`` keeps every run's JSON.

The judge has its own noise, shown per run as "same": the ``tune`` row over the row of the
concrete schedule it ran - the same schedule timed twice in one run, so anything but 1.000
is the bench's own measurement error at this ``--iters``. On the 2-core CPU machine a call's
time varies by 8-14% (sigma of log time) from call to call even when the machine is quiet, so
in quiet 20-call runs the same schedule's two medians differed by up to 7.7%
(``--rejudge`` below): a 5% judgement needs more calls than
that, hence many calls per row (the spread of a median falls as 1/sqrt(calls)): at 60 the
judge still erred by more than 5% in 2 of 10 quiet runs, at 120 (the default) in none.

    python benchmarks/bench_runtime_tune.py --reps 10

``--context N`` instead tests whether the *context* of a call changes its time - what
``tune`` and the bench could disagree about systematically - on the comm-heavy all-gather
shape in one 2-rank process group, N interleaved repetitions: (a) a target schedule timed
right after one predecessor vs right after another (order effect), (b) the same schedule
called through the public op with the per-call check vs through the schedule kernel
directly (what ``tune`` used to time). Each line is the median over repetitions of the
per-repetition ratio, with its interquartile range; 1.000 means no effect.

    python benchmarks/bench_runtime_tune.py --context 40

``--rejudge DIR`` reads the JSON files a run kept (``--out DIR``) and asks how good the judge
can be: for each concrete schedule, in how many runs *always picking that schedule* would
have passed (ratio of medians, and paired). If no fixed pick reaches 9 of 10, the runs'
own noise, not ``tune``, is what limits the tally.

    python benchmarks/bench_runtime_tune.py --rejudge /tmp/tune_json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

SHAPES = {
    "ag-comm-heavy": ["--m", "8192", "--n", "128", "--k", "1024"],
    "rs": ["--op", "matmul_reduce_scatter", "--m", "8192", "--n", "1024", "--k", "128"],
}


CONTEXT_PAIRS = [  # (what runs first, untimed; what is timed)
    ("serial", "ring"), ("hetero-fused-1d", "ring"),
    ("uniform-fused-1d", "hetero-fused-1d"), ("ring", "hetero-fused-1d"),
    ("hetero-fused-1d", "hetero-unfused-1d"), ("ring", "hetero-unfused-1d"),
]  # fmt: skip
CONTEXT_DIRECT = ("ring", "hetero-fused-1d")


def _context_worker(rank: int, world: int, reps: int):
    """One rank of ``--context``: per repetition, every (predecessor, target) pair and every
    schedule of CONTEXT_DIRECT through the op and directly, in a rotating order; seconds, MAX over ranks."""
    import time as _time

    import torch
    import torch.distributed as dist

    from ccoverlap.runtime import all_gather_matmul, comm
    from ccoverlap.runtime.schedules import ag_matmul

    torch.set_num_threads(1)
    m, n, k = 8192, 128, 1024
    g = torch.Generator().manual_seed(rank)
    x, w = torch.randn(m // world, k, generator=g) / 32, torch.randn(n, k, generator=g) / 32
    b = w.t()
    cases = [("after", pred, tgt) for pred, tgt in CONTEXT_PAIRS]
    cases += [(how, None, s) for s in CONTEXT_DIRECT for how in ("op", "direct")]

    def run(how, sched):
        if how == "direct":
            ag_matmul(x, b, None, sched)
        else:
            all_gather_matmul(x, w, schedule=sched)

    times = [[] for _ in cases]
    with torch.no_grad():
        for _how, _pred, tgt in cases:
            run("op", tgt)
            run("direct", tgt)
        for it in range(reps):
            for j in range(len(cases)):
                i = (j + it) % len(cases)
                how, pred, tgt = cases[i]
                if pred is not None:
                    comm.barrier()
                    run("op", pred)
                comm.barrier()
                t0 = _time.perf_counter()
                run("op" if how == "after" else how, tgt)
                times[i].append(_time.perf_counter() - t0)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return (cases, t.tolist()) if rank == 0 else None


def _context(reps: int) -> int:
    import statistics

    from ccoverlap.runtime.launch import spawn

    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    t0 = time.process_time()
    cases, times = spawn(_context_worker, 2, (reps,), backend="gloo", timeout_s=3600)[0]
    by = {(how, pred, tgt): v for (how, pred, tgt), v in zip(cases, times)}

    def line(label, num, den):
        r = [a / b for a, b in zip(num, den) if b > 0]
        q = statistics.quantiles(r, n=4)
        print(f"{label:<72} {statistics.median(r):.3f}  (IQR {q[0]:.3f}-{q[2]:.3f}, n={len(r)})")

    print(f"all_gather_matmul M=8192 N=128 K=1024 fp32, gloo, 2 ranks, {reps} interleaved repetitions; "
          "median of per-repetition ratios")
    for i in range(0, len(CONTEXT_PAIRS), 2):
        (p1, tgt), (p2, _) = CONTEXT_PAIRS[i], CONTEXT_PAIRS[i + 1]
        line(f"{tgt}: after {p1} / after {p2}", by[("after", p1, tgt)], by[("after", p2, tgt)])
    for s in CONTEXT_DIRECT:
        line(f"{s}: through the op (check on) / schedule kernel directly", by[("op", None, s)], by[("direct", None, s)])
    a, b = CONTEXT_DIRECT
    line(f"{a} / {b}, both through the op", by[("op", None, a)], by[("op", None, b)])
    line(f"{a} / {b}, both directly", by[("direct", None, a)], by[("direct", None, b)])
    print(f"load average at end: {os.getloadavg()[0]:.1f}; parent CPU {time.process_time() - t0:.1f} s")
    return 0


def _rejudge(folder: str, shapes: list[str], tolerance: float) -> int:
    import glob
    import statistics

    for name in shapes:
        files = sorted(glob.glob(os.path.join(folder, f"{name}-*.json")),
                       key=lambda f: int(f.rsplit("-", 1)[1].split(".")[0]))
        if not files:
            continue
        runs = []
        for f in files:
            with open(f, encoding="utf-8") as fh:
                runs.append(json.load(fh))
        concrete = [r["schedule"] for r in runs[0]["results"] if not r["reference"] and r["schedule"] not in ("auto", "tune")]
        medians_ok = dict.fromkeys(concrete, 0)
        paired_ok = dict.fromkeys(concrete, 0)
        same, sigma = [], []
        for res in runs:
            by = {r["schedule"]: r for r in res["results"]}
            fastest = min(by[c]["median_s"] for c in concrete)
            for c in concrete:
                medians_ok[c] += by[c]["median_s"] / fastest <= 1.0 + tolerance
                worst = max(statistics.median(a / b for a, b in zip(by[c]["times_s"], by[o]["times_s"]) if b > 0)
                            for o in concrete)
                paired_ok[c] += worst <= 1.0 + tolerance
            ran = by.get(by["tune"]["runs"]) if "tune" in by else None
            if ran:
                same.append(by["tune"]["median_s"] / ran["median_s"])
                logs = [math.log(a / b) for a, b in zip(by["tune"]["times_s"], ran["times_s"]) if a > 0 and b > 0]
                if len(logs) >= 4:  # one call's spread: the IQR of a difference of two calls / (1.349 * sqrt 2)
                    q = statistics.quantiles(logs, n=4)
                    sigma.append((q[2] - q[0]) / (1.349 * math.sqrt(2)))
        print(f"{name}: {len(runs)} runs in {folder}, {runs[0]['iters']} calls per schedule")
        print(f"  {'always picking':<20} {'ok (medians)':>12} {'ok (paired)':>12}")
        for c in concrete:
            print(f"  {c:<20} {medians_ok[c]:>12} {paired_ok[c]:>12}")
        if same:
            print(f"  tune row / row of the schedule it ran (the judge's own error): "
                  f"{min(same):.3f} .. {max(same):.3f}, beyond {tolerance:.0%} in "
                  f"{sum(abs(x - 1) > tolerance for x in same)} of {len(same)}")
        if sigma:
            print(f"  call-to-call spread of one schedule (sigma of log time, from those paired rows): "
                  f"{min(sigma):.3f} .. {max(sigma):.3f}, median {statistics.median(sigma):.3f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=120, help="timed calls per schedule in each bench run (default 120)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=None, help="directory for each run's JSON")
    ap.add_argument("--context", type=int, default=0, metavar="N",
                    help="instead: N repetitions of the order-effect / check-on-off experiment (see above)")
    ap.add_argument("--rejudge", metavar="DIR", help="instead: re-read the JSON files of a run kept with --out DIR")
    args = ap.parse_args(argv)
    if args.rejudge:
        return _rejudge(args.rejudge, args.shapes.split(","), args.tolerance)
    if args.context:
        return _context(args.context)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    tally, tally_paired, noisy = {}, {}, {}
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"{'shape':<14} {'rep':>3} {'tune picked':<18} {'fastest':<18} {'pick/fastest':>12} {'ok':>3} {'paired':>6} {'ok':>3} "
          f"{'same':>6} {'rounds':>6} {'tune s':>6} {'load':>9}")
    for name in args.shapes.split(","):
        good = good_p = bad_same = 0
        for rep in range(args.reps):
            cmd = [sys.executable, "-m", "ccoverlap", "bench", *SHAPES[name], "--nproc", str(args.nproc),
                   "--iters", str(args.iters), "--warmup", str(args.warmup), "--json", "--no-reference-rows",
                   "--seed", str(rep)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                print(f"{name} rep {rep}: bench failed:\n{proc.stderr[-2000:]}")
                return 1
            res = json.loads(proc.stdout)
            if args.out:
                with open(os.path.join(args.out, f"{name}-{rep}.json"), "w", encoding="utf-8") as f:
                    json.dump(res, f)
            s = res["summary"]
            ratio = s["tune_pick_vs_fastest"]
            ok = ratio <= 1.0 + args.tolerance
            good += ok
            paired = s.get("tune_pick_vs_fastest_paired", ratio)
            ok_p = paired <= 1.0 + args.tolerance
            good_p += ok_p
            tune_row = next(r for r in res["results"] if r["schedule"] == "tune")
            info = tune_row["tune"] or {}
            ran = next((r for r in res["results"] if r["schedule"] == tune_row["runs"]), None)
            same = tune_row["median_s"] / ran["median_s"] if ran and ran["median_s"] > 0 else float("nan")
            bad_same += not abs(same - 1.0) <= args.tolerance
            la = res["loadavg_1m_before_after"]
            print(f"{name:<14} {rep:>3} {s['tune_pick']:<18} {s['fastest_schedule']:<18} {ratio:>12.3f} "
                  f"{'yes' if ok else 'no':>3} {paired:>6.3f} {'yes' if ok_p else 'no':>3} {same:>6.3f} {info.get('rounds', 0):>6} {info.get('elapsed_s', 0):>6.1f} "
                  f"{la[0]:>4.1f}>{la[1]:<4.1f}  ({time.perf_counter() - t0:.0f}s)", flush=True)
        tally[name] = good
        tally_paired[name] = good_p
        noisy[name] = bad_same
    print()
    for name, good in tally.items():
        print(f"{name}: tune's pick within {args.tolerance:.0%} of the measured fastest in {good} of {args.reps} runs "
              f"(ratio of medians); {tally_paired[name]} of {args.reps} paired per repetition; the judge's own error: "
              f"the same schedule's two rows differed by more than {args.tolerance:.0%} in {noisy[name]} of {args.reps}")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
