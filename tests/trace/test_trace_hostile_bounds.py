"""Hostile input, bounded: a BOM is accepted, a byte that is not UTF-8 costs one event, any amount of
whitespace costs linear work (checked by the reader's own work counter at two sizes, not by a
clock), and a --steps range is never expanded into memory."""

from __future__ import annotations

import gzip
import json
import tracemalloc

from trace_synth import kernel, nccl, trace, write

from ccoverlap.cli import main
from ccoverlap.trace import jsonstream, load
from ccoverlap.trace.analyze import analyze


def _doc(rank=0, world=1) -> dict:
    return trace([kernel("gemm", 0, 100), kernel("gemm2", 200, 100), nccl("all_reduce", 50, 100)],
                 rank=rank, world=world)


def test_a_utf8_bom_is_accepted(tmp_path):
    text = json.dumps(_doc()).encode()
    plain = tmp_path / "bom.json"
    plain.write_bytes(b"\xef\xbb\xbf" + text)
    gz = tmp_path / "bom.json.gz"
    gz.write_bytes(gzip.compress(b"\xef\xbb\xbf" + text))
    ref = analyze([write(_doc(), tmp_path / "ref.json")]).metrics[0]
    for p in (plain, gz):
        a = analyze([p])
        assert a.metrics[0].compute_s == ref.compute_s and not a.problems


def test_a_byte_that_is_not_utf8_costs_one_event(tmp_path):
    text = json.dumps(_doc()).encode()
    bad = text.replace(b'"name": "gemm2"', b'"name": "gemm\xff2"')
    assert bad != text
    p = tmp_path / "badbyte.json"
    p.write_bytes(bad)
    a = analyze([p])
    assert a.ranks[0].analysed_names.count("gemm") == 1 and "gemm2" not in a.ranks[0].analysed_names
    assert any("skipped 1 malformed event" in x and "0xff is not UTF-8" in x for x in a.problems)


def _whitespace_trace(path, mib: int) -> None:
    doc = _doc()
    events = [json.dumps(e) for e in doc.pop("traceEvents")]
    head = json.dumps(doc)[:-1]
    blank = " " * (1 << 20)
    with open(path, "w") as fh:
        fh.write(head + ', "traceEvents": [' + events[0] + ",")
        for _ in range(mib):
            fh.write(blank)
        fh.write(",".join(events[1:]) + "]}")


def _work(path) -> int:
    with open(path, "rb") as fh:
        es = jsonstream.EventStream(fh)
        for _ in es.batches():
            pass
        return es.work


def test_whitespace_inside_the_events_costs_linear_work(tmp_path):
    small, big = tmp_path / "w4.json", tmp_path / "w16.json"
    _whitespace_trace(small, 4)
    _whitespace_trace(big, 16)
    w_small, w_big = _work(small), _work(big)
    # 4x the text, about 4x the characters handled (a quadratic reader does ~16x), and never much
    # more than the text itself
    assert 3.5 < w_big / w_small < 4.5
    assert w_big < 1.5 * big.stat().st_size
    assert load.load_trace(big).n_events == len(_doc()["traceEvents"])


def test_a_huge_steps_range_is_never_expanded(tmp_path, capsys):
    doc = trace([kernel("a", 100, 10, launch=50), nccl("all_reduce", 1100, 10, launch=1050),
                 kernel("b", 2100, 10, launch=2050)], rank=0, world=1,
                steps=[(1, 0, 1000), (2, 1000, 1000), (3, 2000, 1000)])
    p = write(doc, tmp_path / "r.json")
    tracemalloc.start()
    a = analyze([p], steps="1-1000000000000")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert a.analysed_steps == [1, 2, 3] and peak < 50 << 20
    assert main(["analyze", str(p), "--steps", "2-1000000000000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"]["spec"] == "2-1000000000000" and out["steps"]["analysed"] == [2, 3]
    assert main(["analyze", str(p), "--steps", "10-1000000000000"]) == 2
    assert "no such profiler step" in capsys.readouterr().err


def test_many_unreadable_ranks_are_counted_not_listed_on_stderr(tmp_path, capsys):
    """30 truncated rank files beside one good one: the report stands, stderr holds the first
    MAX_PROBLEM_LINES warnings and one line counting the rest; --json keeps every one."""
    from ccoverlap.trace.report_json import MAX_PROBLEM_LINES

    write(trace([kernel("a", 100, 10), nccl("all_reduce", 200, 10)], rank=0, world=31,
                steps=[(1, 0, 1000)]), tmp_path / "rank-0.json")
    for r in range(1, 31):
        (tmp_path / f"rank-{r}.json").write_text("{")
    assert main(["analyze", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == MAX_PROBLEM_LINES + 1 < 30
    assert err[-1].startswith("ccoverlap analyze: warning: ... and ") and "more problem(s)" in err[-1]
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    assert sum("truncated" in p for p in json.loads(captured.out)["problems"]) == 30


def test_replay_counts_the_problems_past_the_first_ones_too(tmp_path, capsys):
    from ccoverlap.trace.report_json import MAX_PROBLEM_LINES

    for r in range(2):
        write(trace([kernel("a", 100, 10), nccl("all_reduce", 200, 10)], rank=r, world=2,
                    steps=[(1, 0, 1000)]), tmp_path / f"rank-{r}.json")
    for r in range(2, 30):
        (tmp_path / f"rank-{r}.json").write_text("{")
    assert main(["replay", str(tmp_path), "--whatif", "no-comm"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ccoverlap replay: warning:")]
    assert len(err) == MAX_PROBLEM_LINES + 1 and "more problem(s)" in err[-1]
