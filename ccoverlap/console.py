"""Where command output goes: a rich Console as wide as the terminal, and whole tables when
stdout is not a terminal (a pipe, a file, a CI log).

rich falls back to 80 columns when it cannot ask a terminal, which cuts tables (column names
folded, numbers wrapped) under ``| tee`` or in CI logs. Here: a terminal gives its own width;
otherwise ``COLUMNS`` if set, else :data:`PIPE_WIDTH` columns.
"""

from __future__ import annotations

import os
import sys
from typing import IO

PIPE_WIDTH = 200


def console_width(file: IO | None = None) -> int | None:
    """Columns to print to ``file`` (default stdout): None (let rich ask the terminal) for a
    terminal, else ``COLUMNS`` when it is a positive integer, else :data:`PIPE_WIDTH`."""
    f = file if file is not None else sys.stdout
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    try:
        if f.isatty():
            return None
    except (AttributeError, ValueError):
        pass
    return PIPE_WIDTH


def make_console(file: IO | None = None, *, stderr: bool = False, **kw):
    """A rich Console for command output (see the module docstring for its width)."""
    from rich.console import Console

    target = file if file is not None else (sys.stderr if stderr else sys.stdout)
    return Console(file=file, stderr=stderr, width=console_width(target), **kw)
