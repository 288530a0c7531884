"""Terminal rendering of the planner's results (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from ccoverlap.console import Col, make_console, print_table, print_wrapped


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f}"


def plan_table(payload: dict, console: Console | None = None) -> None:
    """Print the ``plan`` comparison table, R, the recommendation and the files written."""
    if console is None:
        console = make_console()
    console.print(f"[bold]{payload['workload']}[/bold]  ({payload['source']})")
    base = payload["strategies"][0]["step_time_s"]
    rows, styles = [], []
    for s in payload["strategies"]:
        speedup = base / s["step_time_s"] if s["step_time_s"] > 0 else float("nan")
        mem = _gib(s["peak_memory_bytes"]) + ("" if s["fits_memory"] else " (does not fit)")
        styles.append("bold green" if s["name"] == payload.get("best_row", payload["best"]) else None)
        rows.append([s["name"], f"{s['step_time_s'] * 1e3:.1f}", f"{s['tokens_per_s']:,.0f}", f"{s['mfu']:.1%}",
                     f"{s['exposed_comm_s'] * 1e3:.1f}", f"{s['overlap_ratio']:.0%}", mem, f"{speedup:.2f}x"])
    print_table(console, [Col("strategy", "left"), Col("step (ms)"), Col("tokens/s", drop=1), Col("MFU"),
                          Col("exposed comm (ms)"), Col("overlap"), Col("peak mem (GiB)"), Col("vs as-given")],
                rows, styles=styles)
    for s in payload["strategies"]:
        if s.get("note"):
            print_wrapped(console, Text.assemble((s["name"], "bold"), f": {s['note']}"), indent=2)
    r = payload["compute_comm_ratio"]
    console.print(f"compute-to-communication ratio R = {r:.2f} "
                  f"({'communication-bound' if r < 1 else 'compute can hide communication'})")
    print_wrapped(console, Text.assemble(("Recommendation: ", "bold"), payload["recommendation"]))
    for line in payload.get("recommendation_details", []):
        print_wrapped(console, line, indent=2)
    screened = payload.get("screen_microbatches")
    ex = payload.get("extrapolated_from")
    full = ("as-given and best-knobs simulated in full, the other rows extrapolated from steps of "
            f"{ex[0]} and {ex[1]} micro-batches" if ex else "every step time above simulated in full")
    how = (f" (candidates judged on {screened} micro-batches per pipeline, {full};"
           f" --exact to judge and simulate everything in full)" if screened else "")
    console.print(f"{payload['simulations']} simulations in {payload['search_seconds']:.1f} s{how}")
    for name, path in payload["files"].items():
        print_wrapped(console, f"{name}: {path}", indent=2)


def search_table(payload: dict, console: Console | None = None, show: int = 15) -> None:
    """Print the ``plan --search`` ranking: the simulated layouts fastest first, then counts."""
    if console is None:
        console = make_console()
    console.print(f"[bold]layout search:[/bold] {payload['workload']}")
    columns = [Col("#"), Col("layout", "left", wrap=True), Col("step (ms)"), Col("tokens/s", drop=1), Col("MFU"),
               Col("exposed comm (ms)"), Col("mem (GiB)"), Col("screen est. (ms)", drop=2),
               Col("knobs changed", "left", note=True)]
    rows = []
    for i, c in enumerate(payload["ranked"][:show], 1):
        t = c["best_knobs_step_time_s"] if c["best_knobs_step_time_s"] is not None else c["step_time_s"]
        knobs = c["best_knobs"]
        knob_txt = "-" if knobs is None else (", ".join(f"{k}={v}" for k, v in knobs.items()) or "defaults best")
        rows.append([str(i), c["label"], f"{t * 1e3:.1f}", f"{c['tokens_per_s']:,.0f}", f"{c['mfu']:.1%}",
                     f"{c['exposed_comm_s'] * 1e3:.1f}", _gib(c["memory_bytes"]), f"{c['estimate_s'] * 1e3:.1f}",
                     knob_txt])
    print_table(console, columns, rows, styles=["bold green"] + [None] * (len(rows) - 1), label=(0,))
    console.print(f"{payload['enumerated']} legal layouts, {payload['fitting']} fit in memory, "
                  f"{payload['simulated']} simulated, {payload['pruned_by_bound']} skipped because their "
                  f"screening estimate exceeds the best simulated step "
                  f"({payload['bound_violations']} simulated below their estimate), {payload['seconds']:.1f} s")
    for n in payload["notes"]:
        print_wrapped(console, f"note: {n}", indent=2)
    for name, path in payload["files"].items():
        print_wrapped(console, f"{name}: {path}", indent=2)
