"""Pictures: a step's timeline as lanes (one per rank × stream) with exposed communication
marked, and bar charts comparing strategies or ranks. matplotlib with the Agg backend, so
they render without a display."""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from ccoverlap.outputs import save_figure
from ccoverlap.sim.timeline import Timeline, merge_intervals

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.patches import Patch

KIND_COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "memcpy": "#55A868", "other": "#8C8C8C"}
EXPOSED_COLOR = "#C44E52"


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def exposed_comm_intervals(tl: Timeline, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of ``rank`` where communication runs and no compute does (seconds)."""
    t = tl.for_rank(rank)
    comm = merge_intervals(t.start_s[t.kind == "comm"], t.end_s[t.kind == "comm"])
    comp = merge_intervals(t.start_s[t.kind == "compute"], t.end_s[t.kind == "compute"])
    starts, ends = [], []
    j = 0
    for s, e in zip(*comm):
        cur = s
        while j < len(comp[0]) and comp[1][j] <= cur:
            j += 1
        k = j
        while cur < e:
            if k < len(comp[0]) and comp[0][k] < e:
                if comp[0][k] > cur:
                    starts.append(cur)
                    ends.append(comp[0][k])
                cur = max(cur, comp[1][k])
                k += 1
            else:
                starts.append(cur)
                ends.append(e)
                break
    return np.array(starts), np.array(ends)


# A timeline picture is ~1300 pixels wide (12 in at 110 dpi); bars of one kind on one lane closer
# than a fifth of a pixel are drawn as one (the same picture, a fraction of the rectangles:
# hundreds of thousands of ops on a 70B step made matplotlib the slowest part of `plan`).
_DRAW_RESOLUTION = 1 / 6500


def draw_timeline(ax: Axes, tl: Timeline, *, title: str = "", max_lanes: int = 24) -> None:
    """Draw ``tl`` on ``ax``: one lane per (rank, stream); exposed communication as a red band
    above each rank's lanes. Times in milliseconds from the first start; bars of one kind closer
    than a fifth of a pixel are merged (``merge_intervals`` with a gap)."""
    if len(tl) == 0:
        ax.set_title(title + " (empty)")
        return
    t0 = float(tl.start_s.min())
    gap = (float(tl.end_s.max()) - t0) * _DRAW_RESOLUTION
    lanes = list(dict.fromkeys(zip(tl.rank.tolist(), tl.stream.tolist())))[:max_lanes]
    lanes.sort(key=lambda x: (x[0], x[1] != "compute", x[1]))
    labels = []
    y = 0
    for rank in sorted({r for r, _ in lanes}):
        s, e = exposed_comm_intervals(tl, rank)
        if len(s):
            ax.broken_barh(list(zip((s - t0) * 1e3, (e - s) * 1e3)), (y - 0.45, 0.3), color=EXPOSED_COLOR)
        labels.append(f"rank {rank} exposed comm")
        y += 1
        for lane_rank, stream in lanes:
            if lane_rank != rank:
                continue
            m = (tl.rank == rank) & (tl.stream == stream)
            for kind, color in KIND_COLORS.items():
                mk = m & (tl.kind == kind)
                if mk.any():
                    bs, be = merge_intervals(tl.start_s[mk], tl.end_s[mk], gap)
                    ax.broken_barh(list(zip((bs - t0) * 1e3, (be - bs) * 1e3)),
                                   (y - 0.4, 0.8), color=color, linewidth=0)
            labels.append(f"rank {rank} {stream}")
            y += 1
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title, fontsize=10)
    handles = [_patch(c, k) for k, c in KIND_COLORS.items() if (tl.kind == k).any()]
    handles.append(_patch(EXPOSED_COLOR, "exposed comm"))
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles))


def _patch(color: str, label: str) -> Patch:
    from matplotlib.patches import Patch

    return Patch(color=color, label=label)


def draw_bars(ax: Axes, labels: Sequence[str], series: dict[str, Sequence[float]], *, ylabel: str, title: str = "") -> None:
    """Grouped bars: one group per label, one bar per series entry."""
    x = np.arange(len(labels))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + i * width - 0.4 + width / 2, values, width, label=name)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def save_plan_figure(path: str | os.PathLike, timelines: Sequence[tuple[str, Timeline]],
                     strategies: Sequence[dict]) -> str:
    """The ``plan`` picture: the timelines (e.g. as-given and best) and step-time bars per strategy."""
    plt = pyplot()
    n = len(timelines)
    lanes = [len(set(zip(t.rank.tolist(), t.stream.tolist()))) + len(t.ranks()) for _, t in timelines]
    heights = [max(2.0, 0.28 * min(k, 26) + 1.0) for k in lanes] + [3.0]
    fig, axes = plt.subplots(n + 1, 1, figsize=(12, sum(heights)), gridspec_kw={"height_ratios": heights})
    for ax, (title, tl) in zip(axes[:n], timelines):
        draw_timeline(ax, tl, title=title)
    names = [s["name"] for s in strategies]
    draw_bars(axes[n], names, {
        "compute (ms)": [s["compute_s"] * 1e3 for s in strategies],
        "exposed comm (ms)": [s["exposed_comm_s"] * 1e3 for s in strategies],
        "step (ms)": [s["step_time_s"] * 1e3 for s in strategies],
    }, ylabel="ms per step", title="strategies")
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)
    return str(path)

