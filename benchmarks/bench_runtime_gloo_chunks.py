"""How gloo's all-gather time depends on message size: one whole all-gather vs the same data in pieces.

Usage: ``python benchmarks/bench_runtime_gloo_chunks.py [--rows 8192] [--k 1024] [--pieces 4]``

Spawns 2 and 4 local gloo ranks; each gathers ``rows/P x k`` fp32 rows per rank, once whole,
then as ``--pieces`` all-gathers issued one after another (no compute in between), then as
pieces issued all at once; prints the median of 8 calls (rank 0's clock, after a barrier).
Explains part of what ``ccoverlap bench`` measures on CPU: a schedule that cuts the
all-gather into pieces can win on gloo even without any overlap.
"""

from __future__ import annotations

import argparse
import time


def _worker(rank, world, rows, k, pieces):
    import torch

    from ccoverlap.runtime import comm

    torch.set_num_threads(1)
    x = torch.randn(rows // world, k)
    out = torch.empty(rows, k)
    parts = [p.contiguous() for p in torch.tensor_split(x, pieces)]
    bufs = [torch.empty(world * p.shape[0], k) for p in parts]

    def whole():
        comm.all_gather_into(out, x).wait()

    def sequential():
        for p, b in zip(parts, bufs):
            comm.all_gather_into(b, p).wait()

    def concurrent():
        for h in [comm.all_gather_into(b, p) for p, b in zip(parts, bufs)]:
            h.wait()

    res = {}
    for name, fn in (("whole", whole), (f"{pieces} pieces, one after another", sequential),
                     (f"{pieces} pieces, all issued at once", concurrent)):  # fmt: skip
        fn()
        ts = []
        for _ in range(8):
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        res[name] = sorted(ts)[len(ts) // 2]
    return res


def main(argv=None) -> int:
    """Print the median all-gather times for 2 and 4 ranks."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--pieces", type=int, default=4)
    args = ap.parse_args(argv)
    from ccoverlap.runtime.launch import spawn

    mb = args.rows * args.k * 4 / 2**20
    for world in (2, 4):
        res = spawn(_worker, world, (args.rows, args.k, args.pieces), backend="gloo", timeout_s=600)[0]
        print(f"{world} ranks, gathered tensor {args.rows}x{args.k} fp32 ({mb:.0f} MiB):")
        for name, t in res.items():
            print(f"  {name:<34} {t * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
