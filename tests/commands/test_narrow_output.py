"""Every command's output reads whole in an 80- and a 60-column terminal, and piped output keeps
its full-width tables.

For each command the text printed at COLUMNS=80 and 60 is compared with the same command
piped (no COLUMNS: 200 columns, boxed tables): no line is wider than the terminal, nothing is
cut ("…"), every word of the narrow output is a word of the piped one (a name or a number
folded mid-word, "all_r" + "educe" or "26." + "49", would be a new word), and the names each
table is about (collectives, ranks, strategies, schedules, case ids, runs, verdicts) are there
whole. The shared layout (:func:`ccoverlap.console.print_table`) is checked on its own over
random tables and widths.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console

from ccoverlap.cli import main
from ccoverlap.console import NOTE_MIN, Col, make_console, print_table, print_wrapped, table_layout

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "fixtures" / "traces"
SHARED = next((p / "shared" / "traces" for p in (ROOT.parent, ROOT.parent.parent)
               if (p / "shared" / "traces").is_dir()), ROOT.parent / "shared" / "traces")
WIDTHS = (80, 60)
#: the words of the "(narrow terminal: columns ... left out; --json has everything)" line
NOTE_WORDS = {"narrow", "terminal", "column", "columns", "left", "out", "--json", "--markdown", "and", "has",
              "have", "everything"}
_SPLIT = re.compile(r"[\s│┃┏┓┗┛┡┩┠┨━─┳┻╇╈┼┬┴┌┐└┘├┤]+")
_SECONDS = re.compile(r"\b\d+(?:\.\d+)? s\b")  # run times: they differ from one run to the next


def words(text: str) -> set[str]:
    """The words of ``text`` (split at spaces and table rules), without the punctuation that
    a header or a label gets in the stacked layout and the lines below a table."""
    text = _SECONDS.sub("<T> s", text)
    return {w.strip(":;,()") for w in _SPLIT.split(text)} - {""}


def whole(text: str, name: str) -> int:
    """How often ``name`` occurs as a whole word of ``text``."""
    return len(re.findall(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text))


def output(argv: list[str], columns: int | None, monkeypatch, capsys) -> str:
    """What ``ccoverlap ARGV`` prints on stdout with COLUMNS set (None: piped, unset)."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    assert main(argv) == 0
    return capsys.readouterr().out


def check(argv: list[str], names: list[str], monkeypatch, capsys, *, same_count: bool = True) -> dict[int, str]:
    """Run ``argv`` piped and at every width of WIDTHS and check the narrow outputs (see the
    module docstring); ``names`` must be whole, when ``same_count`` at least as often as piped
    (a label can come again below a table). Returns the outputs by width."""
    wide = output(argv, None, monkeypatch, capsys)
    assert "┃" in wide  # piped: today's full-width boxed tables
    outs = {}
    for width in WIDTHS:
        text = output(argv, width, monkeypatch, capsys)
        lines = text.splitlines()
        assert max(cell_len(line) for line in lines) <= width, max(lines, key=cell_len)
        assert "…" not in text
        new = words(text) - words(wide) - NOTE_WORDS
        assert not new, (width, sorted(new)[:10])
        for name in names:
            n = whole(text, name)
            assert n >= 1 and (n >= whole(wide, name) or not same_count), (width, name, n, whole(wide, name))
        outs[width] = text
    return outs


def test_analyze(monkeypatch, capsys):
    outs = check(["analyze", str(TRACES / "gloo_tpdp_4rank"), "-q"],
                 ["all_reduce", "all_gather", "DP", "TP", "call order", "communication-bound"],
                 monkeypatch, capsys)
    assert "all_r\n" not in outs[80] and "desc 'mes" not in outs[80].replace("desc 'mesh_", "")


def test_analyze_vs(monkeypatch, capsys):
    monkeypatch.chdir(TRACES / "synthetic")  # short relative paths: the checkout's own path is not the table's
    check(["analyze", "two_steps", "--vs", "overlap50", "-q"],
          ["step_time (ms)", "exposed_comm (ms)", "overlap_ratio"], monkeypatch, capsys)


def test_replay(tmp_path, monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("replay_synth", ROOT / "tests" / "replayer" / "synth.py")
    assert spec is not None and spec.loader is not None
    synth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synth)
    two_rank_job = synth.two_rank_job

    paths = [str(p) for p in two_rank_job(tmp_path)]
    outs = check(["replay", *paths, "--steps", "all", "-q"],
                 ["no-comm", "comm-hidden", "no-contention", "copy-engine", "network-2x", "network-0.5x"],
                 monkeypatch, capsys)
    assert "what changed:" in outs[80]  # the long notes below the table, one wrapped line per scenario


@pytest.mark.skipif(not (SHARED / "nccl_parser_config").is_dir(), reason="real traces not present")
def test_replay_real_trace(monkeypatch, capsys):
    check(["replay", str(SHARED / "nccl_parser_config"), "-q"],
          ["no-comm", "comm-hidden", "no-contention", "copy-engine", "lagom", "centauri", "all_reduce"],
          monkeypatch, capsys)


def test_validate(monkeypatch, capsys):
    runs = ["mcore-gpt-1.7b-h100x48", "torchtitan-llama3.1-405b-fsdp8-cp1-tp8-pp8-seq32k-h100x512"]
    outs = check(["validate", "published", "-q", *[a for r in runs for a in ("--run", r)]], runs,
                 monkeypatch, capsys)
    assert "mean |error|" in outs[80]


def test_validate_short_names_keep_a_table(monkeypatch, capsys):
    runs = ["mcore-gpt-1.7b-h100x48", "fms-llama2-7b-hsdp-a100x128"]
    argv = ["validate", "published", "-q", *[a for r in runs for a in ("--run", r)]]
    outs = check(argv, runs, monkeypatch, capsys)
    doc = json.loads(output([*argv, "--json"], None, monkeypatch, capsys))
    for r in doc["runs"]:  # one line per run: its name, predicted step time and error
        row = next(line for line in outs[80].splitlines() if line.startswith(r["name"] + " ")).split()
        assert f"{r['predicted_step_time_s']:.3f}" in row and f"{r['error_pct']:+.1f}" in row, row
    assert "(narrow terminal: columns GPU, TPxCPxPPxDP, GPUs, compute (s) left out; --json has everything)" in \
        " ".join(outs[80].split())


def test_reproduce(monkeypatch, capsys):
    outs = check(["reproduce", "--paper", "ficco", "-q", "--jobs", "1"],
                 ["ficco-heuristic-max", "ficco-techniques-geomean", "ficco-comm-cil-shard", "not expressible",
                  "match"], monkeypatch, capsys, same_count=False)  # the source column is left out
    assert "column source left out" in outs[80]


def test_tune(monkeypatch, capsys):
    check(["tune", "-q", "--steps"], ["nccl-default", "autoccl", "lagom", "lagom-alg12", "fsdp_rs_dp#0",
                                      "reduce_scatter", "all_gather"], monkeypatch, capsys)


def test_ficco(monkeypatch, capsys):
    check(["ficco"], ["serial", "ring", "uniform-fused-1d", "hetero-fused-1d", "hetero-unfused-1d",
                      "uniform-fused-2d", "heuristic"], monkeypatch, capsys)


def test_ficco_accuracy(monkeypatch, capsys):
    check(["ficco", "--accuracy"], ["g1", "g16", "s8k-4k-4k", "uniform-fused-2d"],
          monkeypatch, capsys, same_count=False)  # the best-overall column is left out


def test_simulate(tmp_path, monkeypatch, capsys):
    check(["simulate", "-q", "--out", str(tmp_path), "--tp", "1", "--pp", "2", "--dp", "4"], ["Llama-3-8B"],
          monkeypatch, capsys)


@pytest.mark.parametrize("what,names", [
    ("models", ["Llama-3-8B", "DeepSeek-MoE-16B"]), ("clusters", ["dgx-h100", "a40-nvlink", "nvlink_pair"]),
    ("gpus", ["H100-96GB-HBM2e-500W", "MI300X"]), ("frameworks", ["torchtitan-fused-rmsnorm", "megatron-core"]),
    ("strategies", ["knobs+lagom", "centauri"])])
def test_list(monkeypatch, capsys, what, names):
    check(["list", what], names, monkeypatch, capsys)


def test_plan(tmp_path, monkeypatch, capsys):
    outs = check(["plan", "-q", "--out", str(tmp_path), "--strategies", "lagom,centauri"],
                 ["as-given", "no-overlap", "best-knobs", "lagom", "centauri"], monkeypatch, capsys)
    assert "column tokens/s left out" in outs[60]


def test_plan_search(tmp_path, monkeypatch, capsys):
    check(["plan", "--search", "--max-simulations", "2", "--top", "2", "-q", "--out", str(tmp_path)],
          ["TP1", "FSDP"], monkeypatch, capsys, same_count=False)


# ----------------------------------------------------------------------------- the layout itself

def render(columns, rows, width, **kw) -> tuple[str, object]:
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, highlight=False)
    layout = print_table(con, columns, rows, **kw)
    return buf.getvalue(), layout


COLS = [Col("collective", "left"), Col("group", "left"), Col("calls"), Col("mean time", drop=2),
        Col("exposed comm (ms)"), Col("algbw", drop=1), Col("what changed", "left", note=True)]
ROWS = [["all_reduce", "mesh_dp", "4", "6.621", "23.06", "0.16", "the traces as recorded, nothing changed here"],
        ["reduce_scatter", "mesh_tp", "12", "14.03", "126.25", "1.04", "21 communication op(s) set to 0 s"]]


def test_layout_goes_from_boxed_to_compact_to_notes_below_to_fewer_columns_to_stacked():
    kinds = {w: table_layout(COLS, ROWS, w) for w in (200, 110, 80, 46, 40, 30)}
    assert kinds[200].kind == "boxed" and not kinds[200].dropped
    assert kinds[110].kind == "compact" and not kinds[110].below
    assert kinds[80].kind == "compact" and kinds[80].below == [6] and not kinds[80].dropped
    assert kinds[46].kind == "compact" and kinds[46].dropped == [3]  # mean time first
    assert kinds[40].kind == "compact" and kinds[40].dropped == [3, 5]  # then algbw
    assert kinds[30].kind == "stacked"
    text, _ = render(COLS, ROWS, 40)
    assert "(narrow terminal: columns mean time, algbw left out; --json has everything)" in " ".join(text.split())
    assert "what changed:" in text and "  all_reduce: the traces as recorded" in text
    text, _ = render(COLS, ROWS, 30)
    assert text.splitlines()[0] == "all_reduce" and "  group: mesh_dp" in text  # every column, stacked


def test_a_note_column_stays_in_the_table_when_wide_enough():
    layout = table_layout(COLS, ROWS, 200)
    assert layout.widths[6] >= min(NOTE_MIN, 44)


def test_wrapped_text_keeps_a_name_whole_that_fits_the_line():
    buf = io.StringIO()
    con = Console(file=buf, width=60, color_system=None)
    name = "torchtitan-llama3.1-405b-fsdp8-cp1-tp8-pp8-seq32k-h100x512"
    print_wrapped(con, f"torchtitan (H100, 2024-12): mean |error| 19.4%, worst -19.4% ({name}) over 1 run", indent=2)
    lines = buf.getvalue().splitlines()
    assert any(f"({name})" in line for line in lines) and max(map(len, lines)) <= 60


def test_piped_text_stays_on_one_line(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    con = make_console(buf)
    text = " ".join(["word"] * 100)
    print_wrapped(con, text, indent=2)
    assert buf.getvalue() == "  " + text + "\n"
    monkeypatch.setenv("COLUMNS", "80")
    buf = io.StringIO()
    print_wrapped(make_console(buf), text, indent=2)
    assert len(buf.getvalue().splitlines()) > 1


_name = st.text("abcdefghijklmnopqrstuvwxyz_-.0123456789", min_size=1, max_size=20)
_sentence = st.lists(st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12), min_size=1,
                     max_size=12).map(" ".join)
_column = st.builds(lambda h, kind, drop: Col(h, "left" if kind else "right", wrap=kind == 1, note=kind == 2,
                                              drop=drop),
                    st.text("abcdefghij ()%", min_size=1, max_size=12).map(lambda h: h.strip() or "h"),
                    st.integers(0, 2), st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(columns=st.lists(_column, min_size=1, max_size=8), n_rows=st.integers(0, 5),
       width=st.integers(40, 200), data=st.data())
def test_every_cell_whole_and_no_line_wider_than_the_console(columns, n_rows, width, data):
    rows = [[data.draw(_sentence if (c.wrap or c.note) else _name) for c in columns] for _ in range(n_rows)]
    text, layout = render(columns, rows, width)
    lines = text.splitlines()
    assert all(cell_len(line) <= width for line in lines), (layout, text)
    shown = set(range(len(columns))) - set(layout.dropped)
    for row in rows:
        for i in shown:
            c = columns[i]
            for piece in (row[i].split() if (c.wrap or c.note) else [row[i]]):
                assert any(piece in line for line in lines), (piece, layout.kind, text)
