"""A machine without msgspec (some GPU machines have none): the CLI must start without it, and `analyze`
must read traces through the trace loader's standard-library path with the same result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "fixtures" / "traces" / "gloo_2rank"
# runs `python -m ccoverlap ARGS` with `import msgspec` failing as it does where it is not installed
BLOCKED = ("import runpy, sys; sys.modules['msgspec'] = None; sys.argv = ['ccoverlap'] + sys.argv[1:]; "
           "runpy.run_module('ccoverlap', run_name='__main__')")


def _cli(*args, blocked):
    cmd = [sys.executable, "-c", BLOCKED, *args] if blocked else [sys.executable, "-m", "ccoverlap", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_blocking_really_hides_msgspec():
    out = subprocess.run([sys.executable, "-c", "import sys; sys.modules['msgspec'] = None\n"
                          "from ccoverlap.trace import jsonstream; print(jsonstream.msgspec)"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "None"


def test_help_works_without_msgspec():
    out = _cli("--help", blocked=True)
    assert out.returncode == 0, out.stderr
    for name in ("analyze", "calibrate", "bench"):
        assert name in out.stdout


def test_analyze_without_msgspec_gives_the_same_result(tmp_path):
    with_ = _cli("analyze", str(TRACES), "--json", "--no-png", "--jobs", "1", blocked=False)
    without = _cli("analyze", str(TRACES), "--json", "--no-png", "--jobs", "1", blocked=True)
    assert with_.returncode == 0 and without.returncode == 0, without.stderr
    a, b = json.loads(with_.stdout), json.loads(without.stdout)
    assert a["summary"] is not None and a == b
