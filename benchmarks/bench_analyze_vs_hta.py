"""Whole-process ``ccoverlap analyze`` vs HolisticTraceAnalysis on N ranks replicated from one real rank.

The job: one rank of a real torch.profiler trace (``--source``, e.g. HolisticTraceAnalysis' test
trace ``tests/data/trace_diff/control/control.json.gz``, A100, 109k events) written ``--ranks``
times with ``distributedInfo.rank`` changed - every rank the same real events. Each run is a fresh
process, ours and HTA's alternating (``--pairs`` pairs):

* ours: ``ccoverlap analyze DIR --json`` (every metric; stdout discarded);
* HTA: ``TraceAnalysis(trace_dir=DIR).get_comm_comp_overlap()`` in its own interpreter
  (``--hta-python``, a separate venv: ``python -m venv .venv-hta && .venv-hta/bin/pip install traceinsight``).

Per run: wall seconds, CPU seconds of the process and its children (``wait4`` rusage), and the peak
resident memory of the whole process tree (sampled every 20 ms from /proc: HTA and ours both use
worker processes). Medians and the paired ratios are printed with the load average.

    .venv/bin/python benchmarks/bench_analyze_vs_hta.py --source control.json.gz --hta-python .venv-hta/bin/python
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


def _tree_rss(root: int) -> int:
    total, todo, page = 0, [root], os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * page
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return total


def run(cmd: list[str]) -> dict:
    """Wall, CPU (self + children) and sampled peak tree RSS of one command."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
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
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_mib": peak[0] / 2**20,
            "maxrss_mib": ru.ru_maxrss / 1024}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="one rank's real trace (.json.gz)")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--hta-python", default=str(ROOT / ".venv-hta" / "bin" / "python"))
    p.add_argument("--ours", default=str(ROOT / ".venv" / "bin" / "ccoverlap"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ccoverlap-vs-hta-") as tmp:
        d = Path(tmp)
        replicate(args.source, d, args.ranks)
        cmds = {"ours": [args.ours, "analyze", str(d), "--json"], "hta": [args.hta_python, "-c", HTA, str(d)]}
        runs = {k: [] for k in cmds}
        load0 = os.getloadavg()
        for _ in range(args.pairs):
            for k, cmd in cmds.items():
                runs[k].append(run(cmd))
        load1 = os.getloadavg()
    print(f"{args.ranks} ranks of {args.source.name}; {args.pairs} alternating pairs, medians; CPUs {os.cpu_count()}; "
          f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    print(f"{'tool':5} {'wall s':>7} {'CPU s':>7} {'peak tree MiB':>14} {'largest process MiB':>20}")
    med = {k: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for k, rs in runs.items()}
    for k, m in med.items():
        print(f"{k:5} {m['wall_s']:7.2f} {m['cpu_s']:7.2f} {m['peak_mib']:14.0f} {m['maxrss_mib']:20.0f}")
    ratios = {m: statistics.median(h[m] / o[m] for h, o in zip(runs["hta"], runs["ours"]))
              for m in ("wall_s", "cpu_s", "peak_mib", "maxrss_mib")}
    print("HTA / ours (median of paired ratios): " + ", ".join(f"{m} {v:.1f}x" for m, v in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
