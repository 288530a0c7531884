"""Terminal rendering of the planner's results (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f}"


def plan_table(payload: dict, console: Console | None = None) -> None:
    """Print the ``plan`` comparison table, R, the recommendation and the files written."""
    if console is None:
        from ccoverlap.console import make_console

        console = make_console()
    console.print(f"[bold]{payload['workload']}[/bold]  ({payload['source']})")
    table = Table(show_lines=False)
    for col, justify in (("strategy", "left"), ("step (ms)", "right"), ("tokens/s", "right"), ("MFU", "right"),
                         ("exposed comm (ms)", "right"), ("overlap", "right"), ("peak mem (GiB)", "right"),
                         ("vs as-given", "right")):
        table.add_column(col, justify=justify)
    base = payload["strategies"][0]["step_time_s"]
    for s in payload["strategies"]:
        speedup = base / s["step_time_s"] if s["step_time_s"] > 0 else float("nan")
        mem = _gib(s["peak_memory_bytes"]) + ("" if s["fits_memory"] else " (does not fit)")
        style = "bold green" if s["name"] == payload["best"] else None
        table.add_row(s["name"], f"{s['step_time_s'] * 1e3:.1f}", f"{s['tokens_per_s']:,.0f}", f"{s['mfu']:.1%}",
                      f"{s['exposed_comm_s'] * 1e3:.1f}", f"{s['overlap_ratio']:.0%}", mem, f"{speedup:.2f}x",
                      style=style)
    console.print(table)
    for s in payload["strategies"]:
        if s.get("note"):
            console.print(f"  [bold]{s['name']}[/bold]: {s['note']}", highlight=False)
    r = payload["compute_comm_ratio"]
    console.print(f"compute-to-communication ratio R = {r:.2f} "
                  f"({'communication-bound' if r < 1 else 'compute can hide communication'})")
    console.print(f"[bold]Recommendation:[/bold] {payload['recommendation']}")
    console.print(f"{payload['simulations']} simulations in {payload['search_seconds']:.1f} s")
    for name, path in payload["files"].items():
        console.print(f"  {name}: {path}")
