"""Output of ``ccoverlap analyze``: a terminal report (rich), one JSON object, a PNG.

The PNG shows one profiler step - per rank a compute lane and a communication lane, exposed
communication (no compute running) marked in red - and per-rank bars of the analysed
window: compute alone, compute overlapped with communication, exposed communication, idle.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import IO, Any

import numpy as np
from rich.console import Console

from ccoverlap.console import Col, make_console, print_table, print_wrapped
from ccoverlap.outputs import save_figure
from ccoverlap.trace.contention import Contention
from ccoverlap.trace.ranks import MAX_CLOCK_SPREAD_S, CrossRank
from ccoverlap.trace.result import Analysis

MAX_LANE_RANKS = 16


def _ms(x: float | np.floating[Any] | None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x * 1e3:.3f}" if abs(x) < 0.01 else f"{x * 1e3:.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _bytes(x: float) -> str:
    if not x:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f}"


def _gbs(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:.2f}"


def steps_label(a: Analysis) -> str:
    """How the analysed window was chosen, in words."""
    spec = a.steps_spec
    got = ",".join(map(str, a.analysed_steps)) or "none"
    if spec == "hta":
        return f"HTA default window (kernels launched before the last ProfilerStep; steps {got})"
    if spec == "all":
        return f"all profiler steps incl. the last ({got})"
    return f"steps {got}"


def _rank_columns() -> list[Col]:
    return [Col("rank"), Col("span"), Col("compute"), Col("comm"), Col("memcpy", drop=3), Col("overlap"),
            Col("exposed comm"), Col("compute only", drop=2), Col("idle", drop=1), Col("R")]


def _rank_row(label: str, m: dict) -> list[str]:
    r = m["compute_comm_ratio"]
    return [label, _ms(m["step_time_s"]), _ms(m["compute_s"]), _ms(m["comm_s"]), _ms(m["memcpy_s"]),
            _pct(m["overlap_ratio"]), _ms(m["exposed_comm_s"]), _ms(m["compute_only_s"]), _ms(m["idle_s"]),
            "-" if not math.isfinite(r) else f"{r:.2f}"]


def print_report(a: Analysis, file: IO | None = None, *, width: int | None = None) -> None:
    """Readable tables of :class:`Analysis` on ``file`` (default stdout), every cell whole at
    any width (:func:`ccoverlap.console.print_table`)."""
    con = _console(file, width)
    s = a.summary()
    con.print(f"[bold]ccoverlap analyze[/bold] - {len(a.ranks)} rank(s), {steps_label(a)}; "
              f"times in ms; time resolution: {a.time_resolution}")
    rows = [_rank_row(str(m.rank), vars(m)) for m in a.metrics]
    styles: list[str | None] = [None] * len(rows)
    if len(a.metrics) > 1:
        rows.append(_rank_row("all", s))
        styles.append("bold")
    print_table(con, _rank_columns(), rows, styles=styles, title="Per rank (analysed window)")
    _print_steps(con, a)
    _print_collectives(con, a)
    _print_cross(con, a.cross)
    _print_contention(con, a.contention)
    v = a.verdict
    colour = {"fine": "green", "overlap-limited": "yellow", "contention-limited": "yellow",
              "communication-bound": "red", "host-bound": "yellow"}.get(v.label, "white")
    con.print(f"[bold {colour}]Verdict: {v.label}[/bold {colour}] - {v.why}.")
    con.print(f"[bold]Most worth trying:[/bold] {v.try_next}.")


def _print_steps(con: Console, a: Analysis) -> None:
    """The per-step table (means over ranks, the slowest rank)."""
    if not a.step_metrics:
        return
    rows = []
    for st in a.analysed_steps:
        per = list(a.step_metrics[st].values())
        comm = sum(x.comm_s for x in per)
        rows.append([str(st), _ms(np.mean([x.step_time_s for x in per])), _ms(np.mean([x.compute_s for x in per])),
                     _ms(np.mean([x.comm_s for x in per])),
                     _pct(sum(x.overlap_s for x in per) / comm if comm else 0.0),
                     _ms(np.mean([x.exposed_comm_s for x in per])), _ms(np.mean([x.idle_s for x in per])),
                     str(a.cross.slowest_rank_per_step.get(st, "-"))])
    print_table(con, [Col("step"), Col("step time"), Col("compute"), Col("comm"), Col("overlap"),
                      Col("exposed comm"), Col("idle", drop=1), Col("slowest rank")], rows,
                title="Per step (mean over ranks; slowest rank = longest step)")


def _print_collectives(con: Console, a: Analysis) -> None:
    """The collectives table and the per-dimension table."""
    if a.collectives:
        rows = [[c.collective, c.group, str(c.group_size or "-"), str(c.count), _bytes(c.bytes_mean),
                 _ms(c.time_mean_s), _ms(c.time_total_s), _ms(c.exposed_s), _gbs(c.algbw), _gbs(c.busbw)]
                for c in a.collectives]
        print_table(con, [Col("collective", "left"), Col("group", "left"), Col("n", drop=1), Col("calls"),
                          Col("mean size"), Col("mean time", drop=3), Col("total time"), Col("exposed"),
                          Col("algbw", drop=2), Col("busbw")], rows,
                    title="Collectives (all ranks; bandwidths in GB/s, nccl-tests definitions)")
    if a.dimensions:
        rows = [[d.dimension, ", ".join(d.groups), ", ".join(d.collectives), str(d.calls), _ms(d.time_s),
                 _ms(d.exposed_s), _ms(d.overlap_s), f"{100 * d.overlap_ratio:.1f}%", _gbs(d.algbw),
                 d.how.replace("description ", "desc ")] for d in a.dimensions]
        print_table(con, [Col("dimension", "left"), Col("groups", "left", wrap=True),
                          Col("collectives", "left", wrap=True), Col("calls"), Col("time"), Col("exposed"),
                          Col("overlap", drop=2), Col("overlap %"), Col("algbw", drop=1),
                          Col("from", "left", wrap=True, drop=3)], rows,
                    title="Per parallelism dimension (sum over ranks; ms; algbw GB/s)")


def _print_cross(con: Console, cr: CrossRank) -> None:
    """Start skew per group, the latest arrivals and the stragglers (or why they are not measured)."""
    if cr.groups and any(g.reliable for g in cr.groups):
        rows = [[g.group, _ranges(g.ranks), str(g.matched),
                 ", ".join(f"r{r}:{n}" for r, n in sorted(g.unmatched.items())) or "0",
                 "call order" if g.paired_by == "order" else "type+ends",
                 _ms(g.mean_skew_s) if g.reliable else "-", _ms(g.max_skew_s) if g.reliable else "-"]
                for g in cr.groups]
        print_table(con, [Col("group", "left"), Col("ranks", "left"), Col("matched"), Col("unpaired", wrap=True),
                          Col("paired by", drop=1), Col("mean skew"), Col("max skew")], rows,
                    title="Across ranks (matched collectives: start skew)")
        if cr.note:
            con.print(f"Across ranks: {cr.note}")
        top = ", ".join(f"rank {x.rank}: last {x.times_latest}/{x.collectives}, late {_ms(x.total_lateness_s)} ms"
                        for x in cr.lateness[:3])
        con.print(f"Latest arrivals: {top}")
        unpaired = sum(n for g in cr.groups for n in g.unmatched.values())
        paired = sum(g.matched for g in cr.groups if g.reliable)
        con.print("Stragglers (everyone waits for): "
                  + (", ".join(f"rank {r}" for r in cr.stragglers) if cr.stragglers
                     else f"none stands out ({cr.too_few})" if cr.too_few else "none stands out")
                  + (f" (from {paired} paired call(s); {unpaired} call(s) without a partner on another rank "
                     f"not compared)" if unpaired else ""))
    elif cr.note:
        con.print(f"Across ranks: {cr.note}")


def _print_contention(con: Console, c: Contention) -> None:
    """The job's contention slowdown and the three most slowed kernels."""
    if c.kernels:
        con.print(f"Contention: compute runs [bold]{c.slowdown:.2f}x[/bold] slower while communication runs "
                  f"(time-weighted over {len(c.kernels)} kernel(s) seen both alone and overlapped, "
                  f"{c.coverage:.0%} of overlapped compute time); time lost {_ms(c.time_lost_s)} ms")
        for k in c.kernels[:3]:
            print_wrapped(con, f"{k.slowdown:.2f}x  {_short(k.name)}  ({k.n_alone} alone, {k.n_overlapped} "
                               f"overlapped, median {_ms(k.median_alone_s)} -> {_ms(k.median_overlapped_s)} ms)",
                          indent=2)
    else:
        con.print(f"Contention: {c.note or 'not measurable'}")


def _console(file: IO[str] | None, width: int | None = None) -> Console:
    """The report's console: ``width`` columns, else as :func:`ccoverlap.console.make_console`."""
    if width:
        return Console(file=file, width=width, highlight=False)
    return make_console(file, highlight=False)


def _short(name: str, n: int = 80) -> str:
    return name if len(name) <= n else name[: n - 3] + "..."


def _ranges(ranks: list[int]) -> str:
    if len(ranks) <= 4:
        return ",".join(map(str, ranks))
    return f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"


def print_comparison(cmp: dict, name_a: str, name_b: str, file: IO | None = None) -> None:
    """``A --vs B`` table: per-step means, job level, then collectives."""
    con = _console(file)
    rows = []
    for r in cmp["job"] + cmp["collectives"]:
        is_ratio = r["metric"] in ("overlap_ratio", "compute_comm_ratio")
        fmt = (lambda x: "-" if x is None else f"{x:.3f}") if is_ratio else _ms
        label = r["metric"] if is_ratio else re.sub(r"_s$", " (ms)", r["metric"])
        rows.append([label, fmt(r["a"]), fmt(r["b"]), fmt(r["diff"]),
                     "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"])
    print_table(con, [Col("metric", "left"), Col("A"), Col("B"), Col("B - A"), Col("B / A")], rows,
                title=f"Per step, mean over ranks: A = {name_a}  vs  B = {name_b}")
    if cmp.get("only_in_a") or cmp.get("only_in_b"):
        con.print(f"ranks only in A: {cmp.get('only_in_a')}, only in B: {cmp.get('only_in_b')}")


# ----------------------------------------------------------------------------- picture

def write_png(a: Analysis, path: str | Path, *, step: int | None = None) -> Path:
    """Draw one step's lanes and the per-rank bars to ``path`` (matplotlib, Agg). ``a`` must come
    from ``analyze(..., picture=True)`` (the lanes of that step are kept then)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    if step is None and a.analysed_steps:
        step = a.analysed_steps[0]
    shown = a.ranks[:MAX_LANE_RANKS]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 2.2 + 0.55 * len(shown) + 2.6),
                                 gridspec_kw={"height_ratios": [max(len(shown), 1) * 0.55 + 0.8, 2.6]})
    lanes = []
    for rt in shown:
        iv = rt.lanes.get(step if step in a.step_metrics else None)
        if iv is None and rt.lanes:
            iv = next(iter(rt.lanes.values()))
        empty = np.empty(0)
        comp, comm = ((iv[0], iv[1]), (iv[2], iv[3])) if iv is not None else ((empty, empty), (empty, empty))
        starts = [x[0][0] for x in (comp, comm) if len(x[0])]
        lanes.append((rt.rank, comp, comm, _subtract(comm, comp), min(starts) if starts else 0.0))
    firsts = [lane[4] for lane in lanes]
    own_clock = bool(firsts) and max(firsts) - min(firsts) > MAX_CLOCK_SPREAD_S
    t0_all = min(firsts) if firsts else 0.0
    y: float = 0
    ticks, labels = [], []
    for rank, comp, comm, exposed, first in lanes:
        t0 = first if own_clock else t0_all
        for iv, colour, lab in ((comm, "#4C72B0", "comm"), (comp, "#55A868", "compute")):
            segs = [((s - t0) * 1e3, (e - s) * 1e3) for s, e in zip(*iv)]
            ax.broken_barh(segs, (y, 0.8), facecolors=colour, linewidth=0)
            ticks.append(y + 0.4)
            labels.append(f"rank {rank} {lab}")
            if lab == "comm" and len(exposed[0]):
                ax.broken_barh([((s - t0) * 1e3, (e - s) * 1e3) for s, e in zip(*exposed)], (y, 0.8),
                               facecolors="none", edgecolors="#C44E52", hatch="////", linewidth=0.8)
            y += 1
        y += 0.4
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms" + (" from each rank's first event (clocks not comparable)" if own_clock else ""))
    title = f"step {step}" if step is not None else "analysed window"
    more = f" (first {MAX_LANE_RANKS} of {len(a.ranks)} ranks)" if len(a.ranks) > MAX_LANE_RANKS else ""
    ax.set_title(f"{title}{more}: compute (green), communication (blue), exposed communication (red hatch)",
                 fontsize=10)
    ranks = [m.rank for m in a.metrics]
    overl = np.array([m.overlap_s for m in a.metrics]) * 1e3
    alone = np.array([m.compute_only_s for m in a.metrics]) * 1e3
    expo = np.array([m.exposed_comm_s for m in a.metrics]) * 1e3
    idle = np.array([m.idle_s for m in a.metrics]) * 1e3
    xs = np.arange(len(ranks))
    bottom = np.zeros(len(ranks))
    for vals, colour, lab in ((alone, "#55A868", "compute alone"), (overl, "#8172B2", "compute + comm"),
                              (expo, "#C44E52", "exposed comm"), (idle, "#CCCCCC", "idle")):
        bx.bar(xs, vals, bottom=bottom, color=colour, label=lab, width=0.7)
        bottom += vals
    bx.set_xticks(xs)
    bx.set_xticklabels([str(r) for r in ranks], fontsize=8 if len(ranks) < 32 else 5)
    bx.set_xlabel("rank")
    bx.set_ylabel("ms (analysed window)")
    bx.legend(fontsize=8, ncol=4, loc="upper right")
    bx.set_title(f"verdict: {a.verdict.label}", fontsize=10)
    fig.tight_layout()
    try:
        return save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)


def _subtract(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Parts of the disjoint sorted intervals ``a`` not covered by the disjoint sorted ``b``."""
    out_s, out_e = [], []
    bs, be = b
    for s, e in zip(*a):
        cur = s
        i = int(np.searchsorted(be, s, side="right"))
        while i < len(bs) and bs[i] < e:
            if bs[i] > cur:
                out_s.append(cur)
                out_e.append(bs[i])
            cur = max(cur, be[i])
            i += 1
        if cur < e:
            out_s.append(cur)
            out_e.append(e)
    return np.array(out_s, dtype=float), np.array(out_e, dtype=float)
