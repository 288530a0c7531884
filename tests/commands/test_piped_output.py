"""Output stays whole when stdout is a pipe (``ccoverlap plan | cat``, CI logs): no table cut
at 80 columns."""

import os
import subprocess
import sys

from ccoverlap.console import PIPE_WIDTH, console_width


def test_console_width_pipe_columns_and_terminal(monkeypatch):
    class Pipe:
        def isatty(self):
            return False

    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("COLUMNS", raising=False)
    assert console_width(Pipe()) == PIPE_WIDTH
    assert console_width(Tty()) is None  # rich asks the terminal
    monkeypatch.setenv("COLUMNS", "150")
    assert console_width(Pipe()) == 150
    monkeypatch.setenv("COLUMNS", "junk")
    assert console_width(Pipe()) == PIPE_WIDTH


def test_plan_piped_shows_whole_column_names_and_numbers(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out = subprocess.run(
        [sys.executable, "-m", "ccoverlap", "plan", "--no-png", "--out", str(tmp_path), "--strategies", "lagom",
         "--model", "phi-2", "--cluster", "dgx-h100", "--nodes", "1", "--dp", "8", "--data-parallel", "ddp",
         "--global-batch", "16", "--micro-batch", "1", "--seq-len", "2048"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(line for line in lines if "strategy" in line and "step (ms)" in line)
    for col in ("step (ms)", "tokens/s", "MFU", "exposed comm (ms)", "overlap", "peak mem (GiB)", "vs as-given"):
        assert col in header, header
    row = next(line for line in lines if line.strip("│ ").startswith("as-given"))
    cells = [c.strip() for c in row.strip().strip("│").split("│")]
    assert len(cells) == 8, row  # every column on one line, no wrapped cell
    float(cells[1])  # step time printed whole
    assert cells[-1] == "1.00x"
