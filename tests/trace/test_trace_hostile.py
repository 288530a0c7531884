"""Hostile input: one bad value costs one event, never a rank; deep nesting and huge values are
rejected early and cheaply; --json always prints one object; symlink loops are named."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc

import pytest
from trace_synth import kernel, nccl, trace, write

from ccoverlap.cli import main
from ccoverlap.errors import TraceError
from ccoverlap.trace import jsonstream, load
from ccoverlap.trace.analyze import analyze


def _good_text(rank=0, world=1) -> str:
    return json.dumps(trace([kernel("gemm", 0, 100), nccl("all_reduce", 50, 100)], rank=rank, world=world))


def _insert_event(text: str, raw_event: str) -> str:
    """Put ``raw_event`` (JSON text, possibly invalid) as the first event of the trace."""
    i = text.index('"traceEvents": [') + len('"traceEvents": [')
    return text[:i] + raw_event + ", " + text[i:]


@pytest.mark.parametrize("raw_event,why", [
    ('{"ph": "X", "cat": "kernel", "name": "k", "ts": NaN, "dur": 1, "args": {"stream": 7, "correlation": 9}}',
     "NaN"),
    ('{"ph": "X", "cat": "kernel", "name": "k", "ts": Infinity, "dur": 1, "args": {"stream": 7}}', "Infinity"),
    ('{"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": -Infinity, "args": {"stream": 7}}', "-Infinity"),
    ('{"ph": "X", "cat": "kernel", "name": "k", "ts": 1' + "0" * 30 + ', "dur": 1}', "out of range"),
    ('{"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 1, "args": {"External id": 1' + "7" * 5000 + '}}',
     "5000-digit integer"),
    ('{"ph": "X", "cat": "cpu_op", "name": ["not", "a", "string"], "ts": 5, "dur": 1, "pid": 1, "tid": 1}',
     "wrong type"),
    ('{"ph": "X", "cat": "kernel", "name": "k", "ts": "5", "dur": 1}', "string ts"),
    ('{"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 1, "args": {"stream": tru}}', "invalid literal"),
    ('{"ph": "X", "cat": "kernel", "name": "k", "ts": 5 "dur": 1}', "missing comma"),
    ('[1, 2, {"x": "}"}]', "not an object"),
])
def test_one_bad_event_is_skipped_with_its_index_and_the_rank_kept(tmp_path, raw_event, why):
    path = tmp_path / "rank-0.json"
    path.write_text(_insert_event(_good_text(), raw_event))
    raw = load.load_trace(path)
    assert raw.n_malformed == 1, why
    assert len(raw.k_ts) == 2, why                          # the two good kernels are still there
    assert any("skipped 1 malformed event(s)" in w and "event #0" in w for w in raw.warnings), raw.warnings
    a = analyze([path])
    assert a.metrics[0].comm_s > 0 and any("event #0" in p for p in a.problems)


def test_lexical_errors_name_the_character_offset(tmp_path):
    text = _insert_event(_good_text(), '{"ph": "X", "name": "k", "ts": 5, "dur": 1, "args": {"a": tru}}')
    (tmp_path / "r.json").write_text(text)
    raw = load.load_trace(tmp_path / "r.json")
    off = text.index('{"ph": "X", "name": "k", "ts": 5')
    assert any(f"event #0 at offset {off} (invalid JSON" in w for w in raw.warnings), raw.warnings


def test_bad_event_in_the_middle_of_a_big_gzip_file(tmp_path):
    # many events, so the bad one sits inside a batch far from the start (fast path falls back)
    good = json.loads(_good_text())
    evs = good["traceEvents"]
    filler = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1,
               "args": {"External id": i}} for i in range(30000)]
    parts = [json.dumps(e) for e in filler]
    parts[17000] = '{"ph": "X", "cat": "cpu_op", "name": "bad", "ts": NaN, "dur": 1, "pid": 1, "tid": 1}'
    parts[23000] = '{"ph": "X", "cat": "cpu_op", "name": "bad2", "ts": 3, "dur": 1, "pid": 1 "tid": 1}'
    text = json.dumps({k: v for k, v in good.items() if k != "traceEvents"})[:-1]
    text += ', "traceEvents": [' + ",\n".join(parts + [json.dumps(e) for e in evs]) + "]}"
    path = tmp_path / "rank-0.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    raw = load.load_trace(path)
    assert raw.n_malformed == 2 and len(raw.k_ts) == 2 and len(raw.c_ts) == 30000 - 2
    w = " ".join(raw.warnings)
    assert "event #17000" in w and "event #23000 at offset" in w


def test_deep_nesting_is_rejected_early_with_bounded_memory(tmp_path):
    depth = 500_000                                      # 1 MB of '[' (and of ']')
    for text in ("[" * depth + "]" * depth,
                 '{"traceEvents": [' + "[" * depth + "]" * depth + "]}",
                 '{"meta": ' + "{\"a\": " * 100_000 + "1" + "}" * 100_000 + ', "traceEvents": []}'):
        path = tmp_path / "deep.json"
        path.write_text(text)
        tracemalloc.start()
        with pytest.raises(TraceError, match="deep.json.*nested deeper than"):
            load.load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 100e6, peak


def test_over_long_value_is_rejected_before_it_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonstream, "MAX_VALUE_CHARS", 1 << 20)
    huge = "x" * (8 << 20)                                # 8 MiB string, cap 1 MiB
    for text in ('{"traceEvents": [{"ph": "X", "name": "' + huge + '", "ts": 1, "dur": 1}]}',
                 '{"note": "' + huge + '", "traceEvents": []}'):
        path = tmp_path / "long.json"
        path.write_text(text)
        tracemalloc.start()
        with pytest.raises(TraceError, match="long.json.*longer than 1 Mi characters"):
            load.load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16e6, peak                          # never the whole 8 MiB string (plus copies)


def test_json_is_one_object_even_when_nothing_could_be_analysed(tmp_path, capsys):
    (tmp_path / "bad.json").write_text('{"not": "a trace"}')
    rc = main(["analyze", str(tmp_path / "bad.json"), "--json", "--no-png"])
    out, err = capsys.readouterr()
    assert rc == 2
    doc = json.loads(out)
    assert doc["ranks"] == [] and doc["error"].startswith("nothing could be analysed")
    assert any("valid JSON but not a Chrome/Kineto trace" in p for p in doc["problems"])
    assert "error" in err and "Traceback" not in err


def test_json_object_also_for_a_bad_option(tmp_path, capsys):
    write(trace([kernel("gemm", 0, 100), nccl("all_reduce", 50, 100)]), tmp_path / "r.json")
    rc = main(["analyze", str(tmp_path / "r.json"), "--json", "--no-png", "--steps", "99"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and "no such profiler step" in doc["error"] and doc["problems"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks")
def test_symlink_loop_and_broken_link_are_named(tmp_path, capsys):
    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    broken = tmp_path / "broken.json"
    os.symlink(tmp_path / "gone.json", broken)
    files, problems = load.discover([loop, broken])
    assert files == []
    assert "symlink loop" in problems[0] and "loop.json" in problems[0]
    assert "broken symlink" in problems[1] and "gone.json" in problems[1]
    rc = main(["analyze", str(loop), "--json", "--no-png"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and any("symlink loop" in p for p in doc["problems"])
