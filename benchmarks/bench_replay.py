"""Time and peak memory of ``ccoverlap replay`` against ``ccoverlap analyze`` on the same traces.

Whole processes, as a user runs them, on the same files, alternating (the order rotates each
round so no command always runs first on a warm cache):

* ``analyze``: ``ccoverlap analyze --json --no-png DIR`` (every metric, no picture);
* ``replay``: ``ccoverlap replay --json -q --whatif none DIR`` (load, graph, replay, structure-only
  replay, the fidelity table);
* ``replay+all``: ``ccoverlap replay --json -q DIR`` (the default: every what-if as well).

Per process: wall seconds, CPU seconds (user + sys, children included) and peak RSS (the
largest of the process and its children), from ``os.wait4`` (the job is built in a process of
its own: a child's peak RSS counts its parent's at the fork). Printed: every round, the
medians, and the median of the paired per-round ratios to ``analyze``; the load average
before and after (the figures are only comparable on a quiet machine).

The job: by default ``--ranks`` ranks (8) each a copy of one real trace with its rank number
changed (``--source``, default HTA's ``nccl_parser_config`` from ``--shared``), repeated
``--replicas`` times in time (ids and step numbers renumbered: ``bench_analyze.make_job``);
``--dir`` benchmarks existing traces instead.

    .venv/bin/python benchmarks/bench_replay.py                           # 8 ranks x nccl_parser_config
    .venv/bin/python benchmarks/bench_replay.py --source rank0.json.gz --runs 5
    .venv/bin/python benchmarks/bench_replay.py --dir ../shared/traces/trace_filter
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_analyze import DEFAULT_SHARED, SOURCE  # noqa: E402

COMMANDS = {
    "analyze": ["analyze", "--json", "--no-png"],
    "replay": ["replay", "--json", "-q", "--whatif", "none"],
    "replay+all": ["replay", "--json", "-q"],
}


def run_one(kind: str, d: Path) -> dict:
    """One whole ``ccoverlap`` process: wall s, CPU s (user + sys), peak RSS MiB."""
    cmd = [sys.executable, "-m", "ccoverlap", *COMMANDS[kind], str(d)]
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-2000:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024}


def _median_ratio(rows: list[dict], kind: str, key: str) -> float:
    return statistics.median(r[kind][key] / r["analyze"][key] for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--shared", type=Path, default=DEFAULT_SHARED)
    ap.add_argument("--source", type=Path, help="the one-rank trace to copy (default: SHARED/" + SOURCE + ")")
    ap.add_argument("--dir", type=Path, help="benchmark these traces instead")
    args = ap.parse_args(argv)
    if args.dir:
        d = args.dir
    else:
        src = args.source or args.shared / SOURCE
        if not src.is_file():
            raise SystemExit(f"{src} not found: pass --source FILE, --shared DIR or --dir TRACES")
        d = Path(tempfile.mkdtemp(prefix="ccoverlap-bench-replay-"))
        # in a process of its own: a child's peak RSS counts its parent's at the fork, so this
        # process must stay smaller than every command it measures
        subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from bench_analyze "
                        "import make_job; from pathlib import Path; make_job(Path(sys.argv[2]), Path(sys.argv[3]), "
                        "int(sys.argv[4]), int(sys.argv[5]))", str(ROOT / "benchmarks"), str(src), str(d),
                        str(args.ranks), str(args.replicas)], check=True)
    files = sorted(p for p in d.iterdir() if p.name.endswith((".json", ".json.gz")))
    mib = sum(p.stat().st_size for p in files) / 2**20
    la = os.getloadavg()
    print(f"traces: {d} ({len(files)} file(s), {mib:.1f} MiB); CPUs {os.cpu_count()}; "
          f"load average before {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    kinds = list(COMMANDS)
    rows = []
    print(f"{'round':>5} " + " ".join(f"{k + ' wall/cpu s, MiB':>28}" for k in kinds))
    for i in range(args.runs):
        order = kinds[i % 3:] + kinds[:i % 3]
        row = {k: run_one(k, d) for k in order}
        rows.append(row)
        print(f"{i + 1:>5} " + " ".join(f"{row[k]['wall_s']:9.2f} {row[k]['cpu_s']:8.2f} {row[k]['rss_mib']:9.1f}"
                                        for k in kinds))
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if own >= min(r[k]["rss_mib"] for r in rows for k in kinds):
        print(f"warning: this process peaked at {own:.0f} MiB, as much as a command measured: peak memory not comparable")
    med = {k: {m: statistics.median(r[k][m] for r in rows) for m in ("wall_s", "cpu_s", "rss_mib")} for k in kinds}
    print("  med " + " ".join(f"{med[k]['wall_s']:9.2f} {med[k]['cpu_s']:8.2f} {med[k]['rss_mib']:9.1f}"
                              for k in kinds))
    for k in kinds[1:]:
        print(f"{k} / analyze (median of paired ratios): wall {_median_ratio(rows, k, 'wall_s'):.2f}x, "
              f"CPU {_median_ratio(rows, k, 'cpu_s'):.2f}x, peak memory {_median_ratio(rows, k, 'rss_mib'):.2f}x "
              f"(target <= 2x)")
    la = os.getloadavg()
    print(f"load average after: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
