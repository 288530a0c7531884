"""Terminal rendering of the planner's results (rich tables)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f}"


def _widths(columns, rows: list[list[str]]) -> tuple[list[int], list[int]]:
    """(natural, narrowest) width of each column: its widest cell and its header on one line,
    or its header's longest word."""
    cells = [max((len(r[i]) for r in rows), default=0) for i in range(len(columns))]
    natural = [max(c, len(col)) for c, (col, _) in zip(cells, columns)]
    narrow = [max([c] + [len(w) for w in col.split()]) for c, (col, _) in zip(cells, columns)]
    return natural, narrow


def fits(columns, rows: list[list[str]], width: int) -> bool:
    """Whether the table fits ``width`` columns with its cells whole (headers may wrap)."""
    return sum(_widths(columns, rows)[1]) + 2 * len(columns) <= width


def _table(columns, rows: list[list[str]], styles: list, console: Console) -> Table:
    """A table whose cells are never cut. Boxed when it fits the console with its headers on
    one line; otherwise (an 80-column terminal) without vertical rules, one space between
    columns, each column as wide as its widest cell and the headers wrapped."""
    natural, narrow = _widths(columns, rows)
    if sum(natural) + 3 * len(columns) + 1 <= console.width:
        table = Table(show_lines=False)
        for col, justify in columns:
            table.add_column(col, justify=justify, no_wrap=True)
    else:
        table = Table(show_lines=False, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
        for (col, justify), width in zip(columns, narrow):
            table.add_column(col, justify=justify, width=width + 1)  # + the one space rich counts in
    for row, style in zip(rows, styles):
        table.add_row(*row, style=style)
    return table


def plan_table(payload: dict, console: Console | None = None) -> None:
    """Print the ``plan`` comparison table, R, the recommendation and the files written."""
    if console is None:
        from ccoverlap.console import make_console

        console = make_console()
    console.print(f"[bold]{payload['workload']}[/bold]  ({payload['source']})")
    base = payload["strategies"][0]["step_time_s"]
    rows, styles = [], []
    for s in payload["strategies"]:
        speedup = base / s["step_time_s"] if s["step_time_s"] > 0 else float("nan")
        mem = _gib(s["peak_memory_bytes"]) + ("" if s["fits_memory"] else " (does not fit)")
        styles.append("bold green" if s["name"] == payload["best"] else None)
        rows.append([s["name"], f"{s['step_time_s'] * 1e3:.1f}", f"{s['tokens_per_s']:,.0f}", f"{s['mfu']:.1%}",
                     f"{s['exposed_comm_s'] * 1e3:.1f}", f"{s['overlap_ratio']:.0%}", mem, f"{speedup:.2f}x"])
    table = _table((("strategy", "left"), ("step (ms)", "right"), ("tokens/s", "right"), ("MFU", "right"),
                    ("exposed comm (ms)", "right"), ("overlap", "right"), ("peak mem (GiB)", "right"),
                    ("vs as-given", "right")), rows, styles, console)
    console.print(table)
    for s in payload["strategies"]:
        if s.get("note"):
            console.print(f"  [bold]{s['name']}[/bold]: {s['note']}", highlight=False)
    r = payload["compute_comm_ratio"]
    console.print(f"compute-to-communication ratio R = {r:.2f} "
                  f"({'communication-bound' if r < 1 else 'compute can hide communication'})")
    console.print(f"[bold]Recommendation:[/bold] {payload['recommendation']}")
    screened = payload.get("screen_microbatches")
    ex = payload.get("extrapolated_from")
    full = ("as-given and best-knobs simulated in full, the other rows extrapolated from steps of "
            f"{ex[0]} and {ex[1]} micro-batches" if ex else "every step time above simulated in full")
    how = (f" (candidates judged on {screened} micro-batches per pipeline, {full};"
           f" --exact to judge and simulate everything in full)" if screened else "")
    console.print(f"{payload['simulations']} simulations in {payload['search_seconds']:.1f} s{how}")
    for name, path in payload["files"].items():
        console.print(f"  {name}: {path}")


def search_table(payload: dict, console: Console | None = None, show: int = 15) -> None:
    """Print the ``plan --search`` ranking: the simulated layouts fastest first, then counts."""
    if console is None:
        from ccoverlap.console import make_console

        console = make_console()
    console.print(f"[bold]layout search:[/bold] {payload['workload']}")
    columns = (("#", "right"), ("layout", "left"), ("step (ms)", "right"), ("tokens/s", "right"),
               ("MFU", "right"), ("exposed comm (ms)", "right"), ("mem (GiB)", "right"),
               ("screen est. (ms)", "right"), ("knobs changed", "left"))
    rows, knob_lines = [], []
    for i, c in enumerate(payload["ranked"][:show], 1):
        t = c["best_knobs_step_time_s"] if c["best_knobs_step_time_s"] is not None else c["step_time_s"]
        knobs = c["best_knobs"]
        knob_txt = "-" if knobs is None else (", ".join(f"{k}={v}" for k, v in knobs.items()) or "defaults best")
        rows.append([str(i), c["label"], f"{t * 1e3:.1f}", f"{c['tokens_per_s']:,.0f}", f"{c['mfu']:.1%}",
                     f"{c['exposed_comm_s'] * 1e3:.1f}", _gib(c["memory_bytes"]), f"{c['estimate_s'] * 1e3:.1f}",
                     knob_txt])
    keep = len(columns)
    if not fits(columns, rows, console.width):  # knobs (and estimates) go below the table
        keep = 8 if fits(columns[:8], [r[:8] for r in rows], console.width) else 7
        knob_lines = [f"  #{r[0]} knobs changed: {r[8]}" for r in rows if r[8] != "-"]
    table = _table(columns[:keep], [r[:keep] for r in rows], ["bold green"] + [None] * (len(rows) - 1), console)
    console.print(table)
    for line in knob_lines:
        console.print(line, highlight=False)
    console.print(f"{payload['enumerated']} legal layouts, {payload['fitting']} fit in memory, "
                  f"{payload['simulated']} simulated, {payload['pruned_by_bound']} skipped because their "
                  f"screening estimate exceeds the best simulated step "
                  f"({payload['bound_violations']} simulated below their estimate), {payload['seconds']:.1f} s")
    for n in payload["notes"]:
        console.print(f"  note: {n}", highlight=False)
    for name, path in payload["files"].items():
        console.print(f"  {name}: {path}")
