"""The reproduction table as text (rich), Markdown or JSON-ready dicts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ccoverlap.console import Col, print_wrapped
from ccoverlap.console import print_table as print_rows
from ccoverlap.reproduction.suite import TOLERANCE, SuiteResult

if TYPE_CHECKING:
    from rich.console import Console


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def summary_lines(result: SuiteResult) -> list[str]:
    """One line for the whole suite and one per paper: matches over expressible cases."""
    s = result.summary()
    lines = []
    for paper, c in s["papers"].items():
        fit = f"; {c['fit']} fit case{'s' if c['fit'] != 1 else ''}, not counted" if c["fit"] else ""
        lines.append(f"{paper}: {c['matches']} of {c['expressible']} expressible comparisons within "
                     f"{TOLERANCE:.0%} of the paper's gain ({c['cases']} cases{fit}; headline "
                     f"{c['headline_matches']} of {c['headline_cases']})")
    a = s["all"]
    share = f" ({a['share']:.0%})" if a["share"] is not None else ""
    lines.append(f"all: {a['matches']} of {a['expressible']} expressible comparisons match{share}, "
                 f"{a['cases']} cases in all")
    return lines


def print_table(result: SuiteResult, console: Console) -> None:
    """The table on a rich console: one row per case (every cell whole at any width,
    :func:`ccoverlap.console.print_table`), then the summary lines."""
    styles = {"match": "green", "miss": "red", "error": "bold red", "fit": "dim"}
    rows, row_styles = [], []
    for r in result.rows:
        d = r.to_dict()
        rows.append([d["paper"], d["id"] + (" *" if d["headline"] else ""), d["source"],
                     f"{d['method']} / {d['baseline']}", _x(d["paper_speedup"]), _x(d["ours_speedup"]),
                     _ratio(d["gain_ratio"]), d["verdict"]])
        row_styles.append(styles.get(d["verdict"]))
    columns = [Col("paper", "left"), Col("case", "left"), Col("source", "left", drop=1),
               Col("method / baseline", "left", note=True), Col("paper"), Col("ours"), Col("gain ratio"),
               Col("verdict", "left")]
    print_rows(console, columns, rows, styles=row_styles, label=(0, 1), everything="--markdown and --json have everything")
    print_wrapped(console, "* the paper's headline figure; gain ratio = (ours - 1) / (paper - 1)")
    for line in summary_lines(result):
        print_wrapped(console, line)


def markdown(result: SuiteResult) -> str:
    """The table as Markdown (with each case's detail), then the summary lines."""
    out = ["| paper | case | source | method / baseline | paper | ours | gain ratio | verdict | detail |",
           "|---|---|---|---|---:|---:|---:|---|---|"]
    for r in result.rows:
        d = r.to_dict()
        detail = str(d["detail"]).replace("|", "\\|")
        out.append(f"| {d['paper']} | {d['id']}{' *' if d['headline'] else ''} | {d['source']} | "
                   f"{d['method']} / {d['baseline']} | {_x(d['paper_speedup'])} | {_x(d['ours_speedup'])} | "
                   f"{_ratio(d['gain_ratio'])} | {d['verdict']} | {detail} |")
    out.append("")
    out.extend(f"- {line}" for line in summary_lines(result))
    return "\n".join(out) + "\n"
