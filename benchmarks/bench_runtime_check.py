"""Cost of the per-call cross-rank check: fingerprint first vs the full descriptor table, A/B interleaved.

Usage: ``python benchmarks/bench_runtime_check.py [--m 8192 --n 128 --k 1024] [--nproc 2] [--iters 30]``

Spawns ``--nproc`` gloo ranks and times, round-robin in every iteration (so background load
hits all alike), the ``serial`` all-gather + GEMM with the check off, with the fingerprint
check (the default: one 8-byte-per-rank all-gather, the full table only on a mismatch) and
with the full-table check (the first version: one 512-byte-per-rank all-gather every call),
plus each check alone. A call's time is the slowest rank's; prints medians, the check's share
of serial (check alone / serial unchecked) and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _worker(rank, world, m, n, k, iters, warmup):
    import torch

    from ccoverlap.runtime import all_gather_matmul, checks, comm
    from ccoverlap.runtime.ops import check_call

    torch.manual_seed(rank)
    x, w = torch.randn(m // world, k), torch.randn(n, k)

    def with_mode(fast, fn):
        def run():
            checks.FINGERPRINT_FIRST = fast
            try:
                fn()
            finally:
                checks.FINGERPRINT_FIRST = True
        return run

    rows = {
        "serial, unchecked": lambda: all_gather_matmul(x, w, schedule="serial", check_shapes="never"),
        "serial, fingerprint check": with_mode(True, lambda: all_gather_matmul(x, w, schedule="serial")),
        "serial, full-table check": with_mode(False, lambda: all_gather_matmul(x, w, schedule="serial")),
        "check alone, fingerprint": with_mode(True, lambda: check_call("all_gather_matmul", x, w, None, "serial", "sm", 0, "always")),
        "check alone, full table": with_mode(False, lambda: check_call("all_gather_matmul", x, w, None, "serial", "sm", 0, "always")),
    }
    times = {r: [] for r in rows}
    with torch.no_grad():
        for it in range(warmup + iters):
            names = list(rows)
            names = names[it % len(names):] + names[: it % len(names)]
            local = torch.zeros(len(rows), dtype=torch.float64)
            for name in names:
                comm.barrier(None)
                t0 = time.perf_counter()
                rows[name]()
                local[list(rows).index(name)] = time.perf_counter() - t0
            comm.all_reduce(local, op=torch.distributed.ReduceOp.MAX, async_op=False)
            if it >= warmup:
                for i, name in enumerate(rows):
                    times[name].append(local[i].item())
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    from ccoverlap.runtime.launch import spawn

    before = os.getloadavg()[0]
    res = spawn(_worker, args.nproc, args=(args.m, args.n, args.k, args.iters, args.warmup), threads=1)[0]
    after = os.getloadavg()[0]
    print(f"all_gather_matmul M={args.m} N={args.n} K={args.k} fp32, gloo, {args.nproc} ranks, "
          f"{args.iters} interleaved iterations, load average {before:.1f} -> {after:.1f}")
    base = res["serial, unchecked"]
    print(f"| {'row':<27} | {'median ms':>9} | {'vs serial unchecked':>19} |")
    print(f"|{'-' * 29}|{'-' * 10}:|{'-' * 20}:|")
    for name, t in res.items():
        share = t / base if name.startswith("check") else t / base - 1.0
        print(f"| {name:<27} | {t * 1e3:>9.3f} | {100 * share:>18.2f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
