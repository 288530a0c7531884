"""Whole-process ``ccoverlap analyze`` vs HolisticTraceAnalysis on N ranks replicated from one real rank.

The job: one rank of a real torch.profiler trace (``--source``, e.g. HolisticTraceAnalysis' test
trace ``tests/data/trace_diff/control/control.json.gz``, A100, 109k events) written ``--ranks``
times with ``distributedInfo.rank`` changed - every rank the same real events. Each run is a fresh
process, ours and HTA's alternating (``--pairs`` pairs):

* ours: ``ccoverlap analyze DIR --json`` (every metric; stdout discarded);
* HTA: ``TraceAnalysis(trace_dir=DIR).get_comm_comp_overlap()`` in its own interpreter
  (``--hta-python``, a separate venv: ``python -m venv .venv-hta && .venv-hta/bin/pip install traceinsight``).

With ``--baseline CMD`` (another ``ccoverlap`` executable, e.g. an older checkout's) each round
also runs ``CMD analyze DIR --json``, and HTA / baseline and baseline / ours are printed as well:
a before/after comparison from the same rounds. Every other round runs the tools in reverse
order, so that the one that runs right after HTA is not always the same.

Per run: wall seconds, CPU seconds of the process and its children (``wait4`` rusage), and the
peak memory of the whole process tree, sampled every 20 ms from ``/proc/PID/smaps_rollup`` (both
tools use worker processes forked from a parent that shares its pages with them): the sum of the
processes' PSS (proportional set size: a page shared by k processes counts 1/k in each, so the
sum is what the tree costs the machine - the figure we compare), of their RSS (a shared page
counted once per process: an overcount for forked workers) and of their USS (pages of one
process only: an undercount), and the largest single process's peak RSS. Medians and the paired
ratios are printed with the load average.

    .venv/bin/python benchmarks/bench_analyze_vs_hta.py --source control.json.gz --hta-python .venv-hta/bin/python
    .venv/bin/python benchmarks/bench_analyze_vs_hta.py --source control.json.gz --breakdown   # ours, stage by stage
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HTA = ("import logging, sys; logging.disable(logging.WARNING)\n"
       "from hta.trace_analysis import TraceAnalysis\n"
       "TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)\n")


def replicate(src: Path, out: Path, ranks: int) -> list[Path]:
    """``ranks`` gzip copies of ``src`` with ``distributedInfo.rank`` set to 0..ranks-1."""
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    events = json.dumps(doc.pop("traceEvents"))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        head = dict(doc, distributedInfo=dict(doc.get("distributedInfo") or {}, rank=r, world_size=ranks))
        path = out / f"rank-{r}.json.gz"
        with gzip.open(path, "wt", compresslevel=6) as fh:
            fh.write(json.dumps(head)[:-1] + ', "traceEvents": ' + events + "}")
        paths.append(path)
    return paths


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants (from /proc)."""
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return out


def _memory(pid: int) -> tuple[int, int, int] | None:
    """Resident, proportional and unique set size of one process, bytes (/proc/PID/smaps_rollup)."""
    vals = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
                    vals[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    if "Rss" not in vals:
        return None
    return vals["Rss"], vals.get("Pss", 0), vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0)


def tree_memory(root: int) -> tuple[int, int, int, int, int]:
    """The process tree's memory now: sums of RSS, PSS and USS over its processes (bytes), the
    number of processes and the largest process's RSS. RSS summed counts a page shared by forked
    processes once per process; PSS divides each shared page among its sharers, so its sum is what
    the tree costs the machine."""
    ms = [m for m in map(_memory, _tree(root)) if m]
    return (sum(m[0] for m in ms), sum(m[1] for m in ms), sum(m[2] for m in ms), len(ms),
            max((m[0] for m in ms), default=0))


def run(cmd: list[str], stdout=None) -> dict:
    """Wall, CPU (self + children), the sampled peaks (every 20 ms) of the process tree's summed
    RSS, PSS and USS and of its largest process's RSS, the most processes at once. (``wait4``'s
    maxrss would count the moment between fork and exec, when the child still maps this
    benchmark's own memory.)"""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0, 0, 0, 0, 0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[:] = [max(a, b) for a, b in zip(peak, tree_memory(proc.pid))]
            done.wait(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    done.set()
    th.join()
    err = proc.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[0]} failed: {err[-2000:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "pss_mib": peak[1] / 2**20,
            "rss_mib": peak[0] / 2**20, "uss_mib": peak[2] / 2**20, "maxrss_mib": peak[4] / 2**20,
            "processes": peak[3]}


def breakdown(files: list[Path], repeats: int = 3) -> None:
    """CPU ms per rank of the per-rank work, stage by stage (each stage includes the ones above it),
    in this process, best of ``repeats`` passes over ``files``."""
    import gc
    import resource

    from ccoverlap.trace.jsonstream import EventStream
    from ccoverlap.trace.load import _open, load_trace
    from ccoverlap.trace.summary import summarize_rank

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def gunzip(p: Path) -> None:
        # the reader's own inflater (ISA-L where installed), as the stages below read
        with _open(p) as fh:
            while fh.read(1 << 18):
                pass

    def decode(p: Path) -> None:
        gc.disable()
        try:
            with _open(p) as fh:
                for _ in EventStream(fh).batches():
                    pass
        finally:
            gc.enable()

    def scan(p: Path) -> None:
        # the same reading with every event kept as raw JSON text: msgspec's scan, no struct built
        import msgspec

        from ccoverlap.trace import jsonstream

        typed = jsonstream._BATCH
        jsonstream._BATCH = msgspec.json.Decoder(list[msgspec.Raw])
        try:
            decode(p)
        finally:
            jsonstream._BATCH = typed

    stages = (("gunzip", gunzip), ("+ text and msgspec's scan (no event built)", scan),
              ("+ the events built (args raw)", decode),
              ("+ the args read, the columns (load_trace)", lambda p: load_trace(p, keep_cpu_ops=False)),
              ("+ timeline and reductions (summarize_rank)", summarize_rank))
    print(f"per-rank CPU, best of {repeats} passes over {len(files)} files (load average {os.getloadavg()[0]:.2f})")
    for name, fn in stages:
        fn(files[0])
        best = min(_timed(cpu, fn, files) for _ in range(repeats))
        print(f"  {name:44} {best * 1000:6.0f} ms / rank")


def _timed(cpu, fn, files) -> float:
    t = cpu()
    for f in files:
        fn(f)
    return (cpu() - t) / len(files)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="one rank's real trace (.json.gz)")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--hta-python", default=str(ROOT / ".venv-hta" / "bin" / "python"))
    p.add_argument("--ours", default=str(ROOT / ".venv" / "bin" / "ccoverlap"))
    p.add_argument("--baseline", help="another ccoverlap executable run in every round too (before/after)")
    p.add_argument("--breakdown", action="store_true",
                   help="instead: where ccoverlap's per-rank CPU time goes, stage by stage, in this process")
    args = p.parse_args(argv)
    if not args.source.is_file():
        p.error(f"--source {args.source}: no such file (HolisticTraceAnalysis' tests/data/trace_diff/control/"
                f"control.json.gz, from a clone of facebookresearch/HolisticTraceAnalysis)")
    if not args.breakdown and not Path(args.hta_python).is_file():
        p.error(f"--hta-python {args.hta_python}: no such interpreter (python3 -m venv .venv-hta && "
                f".venv-hta/bin/pip install traceinsight)")
    with tempfile.TemporaryDirectory(prefix="ccoverlap-vs-hta-") as tmp:
        d = Path(tmp)
        files = replicate(args.source, d, args.ranks)
        if args.breakdown:
            breakdown(files)
            return 0
        cmds = {"ours": [args.ours, "analyze", str(d), "--json"], "hta": [args.hta_python, "-c", HTA, str(d)]}
        if args.baseline:
            cmds["base"] = [args.baseline, "analyze", str(d), "--json"]
            outs = [subprocess.run(c, capture_output=True, check=True).stdout for k, c in cmds.items() if k != "hta"]
            if outs[0] != outs[1]:
                raise SystemExit("--baseline prints a different --json document than --ours on this job")
        runs = {k: [] for k in cmds}
        load0 = os.getloadavg()
        names = list(cmds)
        for i in range(args.pairs):
            # every other round in reverse (ours, hta, base; base, hta, ours; ...): the tool that runs
            # right after HTA (750 MiB, 18 s of CPU on both cores) is not always the same one
            for k in (names if i % 2 == 0 else names[::-1]):
                runs[k].append(run(cmds[k]))
        load1 = os.getloadavg()
    print(f"{args.ranks} ranks of {args.source.name}; {args.pairs} alternating pairs, medians; CPUs {os.cpu_count()}; "
          f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    keys = ("wall_s", "cpu_s", "pss_mib", "rss_mib", "uss_mib", "maxrss_mib")
    print(f"{'tool':5} {'wall s':>7} {'CPU s':>7} {'PSS tree MiB':>13} {'RSS tree MiB':>13} {'USS tree MiB':>13} "
          f"{'largest MiB':>12} {'processes':>9}")
    med = {k: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for k, rs in runs.items()}
    for k, m in med.items():
        print(f"{k:5} {m['wall_s']:7.2f} {m['cpu_s']:7.2f} {m['pss_mib']:13.0f} {m['rss_mib']:13.0f} "
              f"{m['uss_mib']:13.0f} {m['maxrss_mib']:12.0f} {m['processes']:9.0f}")
    pairs = [("hta", "ours")] + ([("hta", "base"), ("base", "ours")] if "base" in runs else [])
    for a, b in pairs:
        ratios = {m: statistics.median(x[m] / y[m] for x, y in zip(runs[a], runs[b])) for m in keys}
        print(f"{a.upper() if a == 'hta' else a} / {b} (median of paired ratios): "
              + ", ".join(f"{m} {v:.2f}x" for m, v in ratios.items()))
    print("each run: " + "; ".join(f"{k} " + " ".join(f"{r['wall_s']:.1f}s/{r['pss_mib']:.0f}MiB" for r in rs)
                                     for k, rs in runs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
