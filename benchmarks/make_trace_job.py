"""Write an N-rank torch.profiler job built from one real rank's trace.

Every rank gets the source rank's events (so its kernels, launches, CPU ops and collectives keep a
real trace's shape), its own ``distributedInfo`` (rank, world size ``N``), a clock offset of its
own (0-200 µs, the skew between hosts) and, on every communication kernel, a start jitter of up to
20 µs (ranks reach a collective at slightly different moments; the kernel's end stays put, as every
member of a collective finishes together). Collectives keep their order and sizes on every rank, so
they match across ranks by sequence and size as in a real job. Deterministic (``--seed``).

    .venv/bin/python benchmarks/make_trace_job.py SOURCE.json.gz OUT_DIR --ranks 256
"""

from __future__ import annotations

import argparse
import gzip
import random
import sys
from pathlib import Path

import msgspec


def make_job(src: Path, out: Path, ranks: int, seed: int = 0, level: int = 1) -> list[Path]:
    """Write ``ranks`` gzip traces to ``out`` (see the module docstring); returns their paths."""
    with gzip.open(src, "rb") as fh:
        doc = msgspec.json.decode(fh.read())
    events = doc.pop("traceEvents")
    comm = [i for i, e in enumerate(events) if e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()]
    timed = [i for i, e in enumerate(events) if isinstance(e.get("ts"), (int, float))]
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    enc = msgspec.json.Encoder()
    paths = []
    for r in range(ranks):
        offset = rng.uniform(0, 200)
        evs = [dict(e) for e in events]
        for i in timed:
            evs[i]["ts"] = round(evs[i]["ts"] + offset, 3)
        for i in comm:
            j = rng.uniform(0, 20)
            e = evs[i]
            e["ts"] = round(e["ts"] + j, 3)
            e["dur"] = max(round(e.get("dur", 0) - j, 3), 0)
        head = dict(doc, distributedInfo=dict(doc.get("distributedInfo") or {}, rank=r, world_size=ranks))
        path = out / f"rank-{r}.json.gz"
        with gzip.open(path, "wb", compresslevel=level) as fh:
            fh.write(enc.encode(head)[:-1] + b', "traceEvents": ' + enc.encode(evs) + b"}")
        paths.append(path)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    make_job(args.source, args.out, args.ranks, args.seed)
    print(f"wrote {args.ranks} ranks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
