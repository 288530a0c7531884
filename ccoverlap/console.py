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
    """A rich Console for command output (see the module docstring for its width); a closed
    pipe raises BrokenPipeError, which the CLI turns into a quiet exit 0 (rich's own
    handling exits 1)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    target = file if file is not None else (sys.stderr if stderr else sys.stdout)
    return _Console(file=file, stderr=stderr, width=console_width(target), **kw)


class Progress:
    """Progress of long work on stderr: the one progress helper of the commands.

    Called as ``progress(done, total, what)`` (the callback the planner, the search, Lagom's
    tuner, validate and reproduce take) and closed with :meth:`close` (or used as a context
    manager). On a terminal it is a rich bar, drawn once the work has run ``delay`` seconds and
    redrawn from these calls at most 10 times a second: no refresh thread, because the
    planner forks worker processes and forking a process that runs threads may deadlock the
    child. Elsewhere (a pipe, a CI log) it writes ``LABEL: [i/n] what`` lines, at most one a
    second after ``delay``. ``enabled=False`` (``-q``) shows nothing.
    """

    def __init__(self, label: str, *, enabled: bool = True, delay: float = 1.0, stream: IO | None = None) -> None:
        import time

        self.label, self.enabled, self.delay = label, enabled, delay
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self._clock = time.perf_counter
        self._t0 = self._clock()
        self._drawn = -1.0
        self._bar = None
        self._task = None

    def __call__(self, done: int, total: int, what: str = "") -> None:
        if not self.enabled:
            return
        now = self._clock()
        if now - self._t0 < self.delay:
            return
        if self.tty:
            self._draw(done, total, what, now)
        elif done < total and (self._drawn < 0 or now - self._drawn >= 1.0 or self.delay == 0):
            self._drawn = now
            self.stream.write(f"{self.label}: [{done + 1}/{total}] {what}\n")
            self.stream.flush()

    def _draw(self, done: int, total: int, what: str, now: float) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn(self.label), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TextColumn("{task.description}"), TimeElapsedColumn(),
                            console=Console(file=self.stream), transient=True, auto_refresh=False)
            self._bar.start()
            self._task = self._bar.add_task(what, total=total)
        self._bar.update(self._task, completed=done, total=total, description=what)
        if now - self._drawn >= 0.1 or done >= total:
            self._drawn = now
            self._bar.refresh()

    def close(self) -> None:
        """Remove the bar, if one was drawn."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
