"""Time and peak memory of ``load_trace`` on hostile files, each in a fresh process.

Cases: 1 MB of nested ``[`` (rejected at Python's recursion limit), a 200 MB string inside an
event (rejected once 32 Mi characters were read), and a valid 30k-event trace with one NaN
and one broken event (both skipped, the rank kept). Prints seconds, the process's peak RSS
(``getrusage``, interpreter and imports included) and the message.

    .venv/bin/python benchmarks/bench_analyze_hostile.py
"""

from __future__ import annotations

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


def main() -> int:
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
