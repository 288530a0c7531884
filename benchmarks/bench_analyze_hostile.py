"""Time and peak memory of ``load_trace`` on hostile files, each in a fresh process.

Cases: 1 MB of nested ``[`` (rejected at Python's recursion limit), a 200 MB string inside an
event (rejected once 32 Mi characters were read), and a valid 30k-event trace with one NaN
and one broken event (both skipped, the rank kept). Prints seconds, the process's peak RSS
(``getrusage``, interpreter and imports included) and the message.

``--kernels N`` and ``--blank-gib G`` also write, at full size, a file of N GPU kernel events (two
compute kernels and an NCCL kernel repeating, each with its launch args) and one with G GiB of
blanks inside ``traceEvents`` between three events (plain text), and run ``ccoverlap analyze FILE --json`` on
each as a whole process (wall, CPU, peak memory of the process tree, see
:func:`bench_analyze_vs_hta.run`), with the load average. The files are deleted afterwards.

    .venv/bin/python benchmarks/bench_analyze_hostile.py
    nice .venv/bin/python benchmarks/bench_analyze_hostile.py --kernels 3000000 --blank-gib 1
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import resource, sys, time
from ccoverlap.trace import load
from ccoverlap.errors import TraceError
t = time.perf_counter()
try:
    r = load.load_trace(sys.argv[1])
    msg = "; ".join(r.warnings) or "ok"
except TraceError as e:
    msg = str(e)
print(f"{time.perf_counter() - t:.3f}\t{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}\t{msg}")
"""


HERE = Path(__file__).resolve().parent
KERNEL = ('{"ph": "X", "cat": "kernel", "name": "%s", "pid": 0, "tid": %d, "ts": %d.5, "dur": %d, "args": '
          '{"device": 0, "stream": %d, "correlation": %d, "grid": [128, 1, 1], "block": [256, 1, 1]}}')
NAMES = ("ampere_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4>",
         "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)")


def write_kernels(path: Path, n: int) -> None:
    """``n`` GPU kernel events (every third an NCCL kernel on its own stream), gzipped."""
    with gzip.open(path, "wt", compresslevel=6) as f:
        f.write('{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [\n')
        for i in range(n):
            k = i % 3
            stream = 13 if k == 2 else 7
            f.write(("" if i == 0 else ",\n") + KERNEL % (NAMES[k], stream, 1000 + 3 * i, 2 + i % 5, stream, i))
        f.write("\n]}")


def write_blanks(path: Path, gib: float) -> None:
    """``gib`` GiB of blanks inside ``traceEvents`` between three kernel events, plain text (gzipped,
    blanks compress ~1000x: the reader refuses that as a decompression bomb)."""
    with open(path, "wb") as f:
        f.write(b'{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [')
        f.write((KERNEL % (NAMES[0], 7, 100, 5, 7, 1)).encode() + b", ")
        chunk = b" " * (1 << 20)
        for _ in range(int(gib * 1024)):
            f.write(chunk)
        f.write((KERNEL % (NAMES[2], 13, 102, 5, 13, 2)).encode() + b", " +
                (KERNEL % (NAMES[0], 7, 110, 5, 7, 3)).encode() + b"]}")


def full_size(kernels: int, blank_gib: float) -> None:
    """The whole-process runs of ``--kernels`` / ``--blank-gib`` (see the module docstring)."""
    sys.path.insert(0, str(HERE))
    from bench_analyze_vs_hta import run

    ours = str(HERE.parent / ".venv" / "bin" / "ccoverlap")
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        if kernels:
            cases.append((f"{kernels:,} kernels", Path(tmp) / "kernels.json.gz", lambda p: write_kernels(p, kernels)))
        if blank_gib:
            cases.append((f"{blank_gib:g} GiB blanks", Path(tmp) / "blanks.json", lambda p: write_blanks(p, blank_gib)))
        for name, path, write in cases:
            write(path)
            with open(Path(tmp) / "out.json", "wb") as out:
                r = run([ours, "analyze", str(path), "--json"], stdout=out)
            doc = json.loads((Path(tmp) / "out.json").read_text())
            print(f"{name}: {path.stat().st_size / 2**20:.1f} MiB on disk; wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, "
                  f"peak RSS {r['maxrss_mib']:.0f} MiB (tree PSS {r['pss_mib']:.0f} MiB); ranks analysed "
                  f"{len(doc['ranks'])}, kernels {sum(x['rows'] for x in doc['ranks'])}; problems {doc['problems']}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            path.unlink()


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=0, help="also analyse a file of this many GPU kernel events")
    p.add_argument("--blank-gib", type=float, default=0, help="also analyse a file with this many GiB of blanks")
    args = p.parse_args(argv)
    if args.kernels or args.blank_gib:
        full_size(args.kernels, args.blank_gib)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "deep.json").write_text("[" * 500_000 + "]" * 500_000)
        with open(d / "long.json", "w") as f:
            f.write('{"traceEvents": [{"ph": "X", "name": "')
            for _ in range(200):
                f.write("x" * (1 << 20))
            f.write('", "ts": 1, "dur": 1}]}')
        evs = [json.dumps({"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1})
               for i in range(30_000)]
        evs[1000] = '{"ph": "X", "cat": "cpu_op", "name": "x", "ts": NaN, "dur": 1, "pid": 1, "tid": 1}'
        evs[2000] = '{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1 "dur": 1}'
        (d / "one_bad.json").write_text('{"traceEvents": [' + ",\n".join(evs) + "]}")
        print(f"{'case':14} {'seconds':>8} {'peak MiB':>9}  message        (load average {os.getloadavg()[0]:.1f})")
        for name in ("deep.json", "long.json", "one_bad.json"):
            out = subprocess.run([sys.executable, "-c", PROBE, str(d / name)], capture_output=True, text=True)
            sec, mib, msg = (out.stdout.strip().split("\t") + ["", "", out.stderr[-200:]])[:3]
            print(f"{name:14} {sec:>8} {mib:>9}  {msg[-150:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
