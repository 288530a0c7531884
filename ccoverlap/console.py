"""Where command output goes and how it fits: a rich Console as wide as the terminal (whole
tables when stdout is not a terminal), one table layout for every command, and wrapped text.

rich falls back to 80 columns when it cannot ask a terminal, which cuts tables (column names
folded, numbers wrapped) under ``| tee`` or in CI logs. Here: a terminal gives its own width;
otherwise ``COLUMNS`` if set, else :data:`PIPE_WIDTH` columns.

Tables (:func:`print_table`) never cut a cell: names, ranks, groups, collectives and numbers
stay whole at any width. The layout is the first of these that fits the console:

1. boxed, headers on one line, every column as wide as its widest cell (long free text in
   columns marked ``note`` wrapped at word boundaries);
2. compact: no vertical rules, headers wrapped at word boundaries, two (then one) spaces
   between columns, columns marked ``wrap`` wrapped at word boundaries;
3. the same after moving ``note`` columns (long free text) below the table (the column's
   name, then one wrapped ``label: text`` line per row), and then after leaving out the
   columns marked ``drop`` (highest first), with one line saying which were left out;
4. stacked: each row as its label line and then ``header: value`` pairs, wrapped at pair
   boundaries (every column shown).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # rich.progress is imported when a bar is first drawn
    from rich.progress import Progress as Bar
    from rich.progress import TaskID

PIPE_WIDTH = 200
#: a ``note`` column narrower than this (or than its widest cell) goes below the table
NOTE_MIN = 40
#: a ``wrap`` column is no narrower than this (or than its widest cell or longest word)
WRAP_MIN = 16
#: cells that say "nothing here": left out of the lines below a table
_EMPTY = ("", "-")
#: how much further than its first line a wrapped line is indented
_HANG = 2


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


class _Console(Console):
    #: printing to a pipe or a file without ``COLUMNS``: :func:`print_wrapped` keeps lines whole
    piped = False

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def make_console(file: IO[str] | None = None, *, stderr: bool = False, **kw: Any) -> Console:
    """A rich Console for command output (see the module docstring for its width); a closed
    pipe raises BrokenPipeError, which the CLI turns into a quiet exit 0 (rich's own
    handling exits 1)."""
    target = file if file is not None else (sys.stderr if stderr else sys.stdout)
    width = console_width(target)
    con = _Console(file=file, stderr=stderr, width=width, **kw)
    con.piped = width == PIPE_WIDTH and not os.environ.get("COLUMNS", "").isdigit()
    return con


# ----------------------------------------------------------------------------- tables

@dataclass(frozen=True)
class Col:
    """One column of :func:`print_table`.

    ``justify``: "left" for names and text, "right" for numbers. ``wrap``: cells may break
    between words (a list such as "all_gather, all_reduce"); otherwise a cell is always on
    one line. ``note``: long free text (implies ``wrap``) that goes below the table when the
    table leaves it less than :data:`NOTE_MIN` columns. ``drop`` > 0: the column may be left
    out when the table cannot fit otherwise, higher first. ``style``: rich style of its cells.
    """

    header: str
    justify: JustifyMethod = "right"
    wrap: bool = False
    note: bool = False
    drop: int = 0
    style: str | None = None


@dataclass
class Layout:
    """How a table is printed at one width (see the module docstring)."""

    kind: str                 # "boxed", "compact" or "stacked"
    shown: list[int]          # indices of the columns in the table
    widths: list[int]         # their widths
    below: list[int]          # note columns printed below the table
    dropped: list[int]        # columns left out
    gap: int = 2


def _words(s: str) -> int:
    return max((cell_len(w) for w in s.split()), default=0)


def _measure(columns: list[Col], rows: list[list[str]]) -> tuple[list[int], list[int]]:
    """(natural, narrowest) width of each column. Natural: the widest cell or the header on
    one line. Narrowest: the longest header word and the widest cell; for a ``wrap`` column
    its longest word and WRAP_MIN, for a ``note`` column NOTE_MIN (both at most natural)."""
    natural, narrow = [], []
    for i, col in enumerate(columns):
        cells = [r[i] for r in rows]
        widest = max((cell_len(c) for c in cells), default=0)
        natural.append(max(widest, cell_len(col.header)))
        if col.note:
            least = min(natural[-1], max(NOTE_MIN, _words(col.header)))
        elif col.wrap:
            least = max(max((_words(c) for c in cells), default=0), min(natural[-1], WRAP_MIN))
        else:
            least = widest
        narrow.append(max(least, _words(col.header), 1))
    return natural, narrow


def _spread(shown: list[int], columns: list[Col], least: list[int], natural: list[int], room: int) -> list[int]:
    """Widths of the ``shown`` columns: ``least``, then ``room`` spare columns given first to
    wrapped columns, then to wrapped headers, smallest shortfall first."""
    w = {i: least[i] for i in shown}
    for wrapped in (True, False):
        for i in sorted((i for i in shown if (columns[i].wrap or columns[i].note) == wrapped),
                        key=lambda i: natural[i] - w[i]):
            add = max(0, min(room, natural[i] - w[i]))
            w[i] += add
            room -= add
    return [w[i] for i in shown]


def table_layout(columns: list[Col], rows: list[list[str]], width: int) -> Layout:
    """The first layout of the module docstring that fits ``width`` columns."""
    n = len(columns)
    natural, narrow = _measure(columns, rows)
    # boxed: headers and cells on one line, but for long free text (notes)
    boxed = [narrow[i] if c.note else natural[i] for i, c in enumerate(columns)]
    room = width - sum(boxed) - 3 * n - 1
    if room >= 0:
        return Layout("boxed", list(range(n)), _spread(list(range(n)), columns, boxed, natural, room), [], [])
    steps: list[tuple[list[int], list[int]]] = [([], [])]
    notes = [i for i, c in enumerate(columns) if c.note and not c.drop]
    if notes:
        steps.append((notes, []))
    dropped: list[int] = []
    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: (-columns[i].drop, -i)):
        dropped.append(i)
        steps.append((notes, list(dropped)))
    for below, gone in steps:
        shown = [i for i in range(n) if i not in below and i not in gone]
        for gap in (2, 1):
            room = width - sum(narrow[i] for i in shown) - gap * (len(shown) - 1)
            if shown and room >= 0:
                return Layout("compact", shown, _spread(shown, columns, narrow, natural, room), below, gone, gap)
    return Layout("stacked", list(range(n)), natural, [], [])


def print_table(console: Console, columns: list[Col], rows: list[list[str]], *, title: str | None = None,
                styles: list | None = None, label: tuple[int, ...] = (0,),
                everything: str = "--json has everything") -> Layout:
    """Print ``rows`` (cells as text) under ``columns`` on ``console`` in the first layout that
    fits its width (see the module docstring), ``title`` above. ``styles``: one rich style (or
    None) per row. ``label``: the columns that name a row (for notes below the table and the
    stacked layout). ``everything``: where the left-out columns can be read. Returns the
    layout used."""
    rows = [[str(c) for c in r] for r in rows]
    styles = list(styles) if styles is not None else [None] * len(rows)
    layout = table_layout(columns, rows, console.width)
    if title:
        console.print(Text(title, style="table.title"))
    if layout.kind == "stacked":
        _print_stacked(console, columns, rows, styles, label)
        return layout
    if layout.kind == "boxed":
        table = Table()
    else:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                      padding=(0, layout.gap - 1))
    for i, w in zip(layout.shown, layout.widths):
        col = columns[i]
        boxed = layout.kind == "boxed"
        table.add_column(col.header, justify=col.justify, style=col.style, overflow="fold",
                         no_wrap=boxed and not col.note, width=None if boxed and not col.note else w)
    for row, style in zip(rows, styles):
        table.add_row(*(Text(row[i]) for i in layout.shown), style=style)
    console.print(table)
    if layout.dropped:
        names = ", ".join(columns[i].header for i in layout.dropped)
        what = "column" if len(layout.dropped) == 1 else "columns"
        print_wrapped(console, f"(narrow terminal: {what} {names} left out; {everything})", style="dim")
    for i in layout.below:
        if any(row[i] not in _EMPTY for row in rows):
            console.print(Text(f"{columns[i].header}:"))
        for row, style in zip(rows, styles):
            if row[i] not in _EMPTY:
                print_wrapped(console, f"{_label(row, label)}: {row[i]}", indent=2, style=style)
    return layout


def _label(row: list[str], label: tuple[int, ...]) -> str:
    return " ".join(row[i] for i in label if row[i])


def _print_stacked(console: Console, columns: list[Col], rows: list[list[str]], styles: list,
                   label: tuple[int, ...]) -> None:
    """Each row as its label (bold) and then its other cells as ``header: value`` pairs."""
    for row, style in zip(rows, styles):
        console.print(Text(_label(row, label), style=style or "bold"))
        pairs = [f"{c.header}: {row[i]}" if c.header else row[i]
                 for i, c in enumerate(columns) if i not in label and row[i]]
        line, room = "", console.width - 2 - _HANG
        for pair in pairs:
            if line and cell_len(line) + 2 + cell_len(pair) > room:
                print_wrapped(console, line, indent=2, style=style)
                line = ""
            line = f"{line}  {pair}" if line else pair
        if line:
            print_wrapped(console, line, indent=2, style=style)


def print_wrapped(console: Console, text: str | Text, *, indent: int = 0, hang: int = _HANG,
                  style: str | None = None) -> None:
    """Print ``text`` wrapped at word boundaries to the console's width: the first line
    indented by ``indent`` spaces, the next ones by ``indent + hang`` (less when a word would
    not fit otherwise); on a pipe or a file without ``COLUMNS`` it stays one line. A ``str``
    is plain text (no rich markup)."""
    t = text.copy() if isinstance(text, Text) else Text(text)
    if style:
        t.stylize(style)
    if getattr(console, "piped", False):  # a pipe or a file: one line, for grep and diff
        console.print(Text(" " * indent) + t, soft_wrap=True)
        return
    longest = _words(t.plain)
    if longest > console.width - indent - hang:  # a name that would be cut: less indent keeps it whole
        hang = 0
        indent = min(indent, max(console.width - longest, 0))
    room = max(console.width - indent - hang, 8)
    for k, line in enumerate(t.wrap(console, room)):
        line.rstrip()
        console.print(Text(" " * (indent + (hang if k else 0))) + line, soft_wrap=True)


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
        self._bar: Bar | None = None
        self._task: TaskID | None = None

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
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn(self.label), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TextColumn("{task.description}"), TimeElapsedColumn(),
                            console=Console(file=self.stream), transient=True, auto_refresh=False)
            self._bar.start()
            self._task = self._bar.add_task(what, total=total)
        assert self._task is not None  # added with the bar
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

    def __exit__(self, *exc: object) -> None:
        self.close()
