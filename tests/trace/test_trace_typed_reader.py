"""The typed reader decodes only what the analyser reads: an event of a skipped phase (flow events)
is not built, a CPU op's args are decoded only for collective ops, and a batch whose needed args
the typed decoder cannot read is read by the tolerant (standard-library) reader instead - with the
same result either way. ``ccoverlap analyze`` starts no BLAS threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_synth import kernel, nccl, trace, write

from ccoverlap.trace import jsonstream, load
from ccoverlap.trace.analyze import analyze
from ccoverlap.trace.columns import Columns

ROOT = Path(__file__).resolve().parents[2]


def _doc(extra: list[dict]) -> dict:
    doc = trace([kernel("gemm", 0, 100), nccl("all_reduce", 50, 100), kernel("gemm2", 200, 100)],
                steps=[(1, 0, 400), (2, 400, 400)],
                cpu_ops=[{"name": "aten::mm", "ts": 1, "dur": 3, "args": {"External id": 5}}])
    doc["traceEvents"][2:2] = extra       # not last: the last event is read on its own, tolerantly
    return doc


def _batches(path: Path) -> list:
    """Every event but the last (read on its own, after the window's last boundary) as the
    analyser's reader yields it, its columns deciding which args to decode."""
    cols = Columns()
    with load._open(path) as fh:
        es = jsonstream.EventStream(fh, prepare=cols.prepare)
        out = []
        for batch in es.batches():
            out.extend(batch)
            cols.add_batch(batch)
    return out[:-1]


def _result(path: Path) -> str:
    return json.dumps(analyze([path], jobs=1).to_dict(), sort_keys=True, default=str)


def _same_as_the_standard_library_reader(path: Path, monkeypatch) -> None:
    typed = _result(path)
    with monkeypatch.context() as m:
        m.setattr(jsonstream, "_BATCH", None)
        assert _result(path) == typed


def test_flow_events_are_not_built(tmp_path, monkeypatch):
    # the fields of a flow event are never read, so their types do not matter
    flow = {"ph": "f", "id": [1], "pid": 0, "tid": 7, "ts": "not a number", "cat": "ac2g", "name": {}, "bp": "e"}
    p = write(_doc([flow, dict(flow, ph="s")]), tmp_path / "flow.json")
    evs = _batches(p)
    assert not any(e.__class__ is jsonstream.LooseEvent for e in evs)      # the typed reader kept the batch
    assert sum(e.__class__ is jsonstream.TraceEvent for e in evs) == 8
    assert not any(hasattr(e, "ts") for e in evs if e.__class__.__name__.startswith("Phase"))
    _same_as_the_standard_library_reader(p, monkeypatch)
    assert not analyze([p], jobs=1).problems


def test_a_cpu_ops_args_are_decoded_only_for_collective_ops(tmp_path, monkeypatch):
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 100, "ts": 10, "dur": 2, "args": 5},
           {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 100, "tid": 100, "ts": 49, "dur": 2,
            "args": {"External id": 9, "Collective name": "allreduce", "In msg nelems": 1024}}]
    p = write(_doc(ops), tmp_path / "ops.json")
    evs = _batches(p)
    assert not any(e.__class__ is jsonstream.LooseEvent for e in evs)
    by_name = {e.name: e for e in evs if e.__class__ is jsonstream.TraceEvent}
    assert by_name["aten::add"].args.__class__ is jsonstream.msgspec.Raw            # never decoded
    assert by_name["record_param_comms"].args.__class__ is jsonstream.TraceArgs
    assert by_name["record_param_comms"].args.external_id == 9
    assert by_name["cudaLaunchKernel"].args.__class__ is jsonstream.LaunchArgs
    assert by_name["gemm"].args.__class__ is jsonstream.TraceArgs
    _same_as_the_standard_library_reader(p, monkeypatch)


@pytest.mark.parametrize("bad", [5, [1, 2], "text"])
def test_args_the_typed_decoder_cannot_read_go_to_the_tolerant_reader(tmp_path, monkeypatch, bad):
    # a kernel whose args are not an object: its args are read, so the batch is read again tolerantly
    odd = {"ph": "X", "cat": "kernel", "name": "odd", "pid": 0, "tid": 7, "ts": 300, "dur": 10, "args": bad}
    p = write(_doc([odd]), tmp_path / "odd.json")
    assert any(e.__class__ is jsonstream.LooseEvent for e in _batches(p))
    _same_as_the_standard_library_reader(p, monkeypatch)


def test_analyze_starts_no_blas_threads(tmp_path):
    if not Path("/proc/self/task").is_dir():
        pytest.skip("needs /proc")
    p = write(_doc([]), tmp_path / "t.json")
    code = ("import os, sys\nfrom ccoverlap.cli import main\nmain(['analyze', sys.argv[1], '--json', '--jobs', '1'])\n"
            "sys.stderr.write(f\"threads={len(os.listdir('/proc/self/task'))} "
            "env={os.environ.get('OPENBLAS_NUM_THREADS')}\")\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr.endswith("threads=1 env=1"), run.stderr[-300:]


@pytest.mark.parametrize("chunk", [17, 64, 301])
def test_batches_cut_anywhere_in_the_text_give_every_event_once(tmp_path, monkeypatch, chunk):
    # small reads and batches: the batch boundary lands in every kind of place, also inside
    # a name that holds the text of a boundary ("},{")
    ops = [{"ph": "X", "cat": "cpu_op", "name": f"op }},{{ #{i}", "pid": 1, "tid": 1, "ts": 10 + i, "dur": 1}
           for i in range(40)]
    p = write(_doc(ops), tmp_path / "cut.json")
    expected = json.loads(p.read_text())["traceEvents"]
    whole = _result(p)
    monkeypatch.setattr(jsonstream, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(jsonstream, "BATCH_CHARS", 3 * chunk)
    evs = _batches(p)
    assert len(evs) == len(expected) - 1
    names = [e.name for e in evs if e.__class__ in (jsonstream.TraceEvent, jsonstream.LooseEvent)]
    assert names == [e["name"] for e in expected[:-1] if e.get("ph") == "X"]
    assert _result(p) == whole


def test_an_event_without_dur_is_an_instant_on_both_readers(tmp_path, monkeypatch):
    # a complete event whose dur is missing or null lasts 0 µs (typed reader and tolerant reader alike)
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 100, "tid": 100, "ts": 20},
           {"ph": "X", "cat": "cpu_op", "name": "aten::zeros", "pid": 100, "tid": 100, "ts": 30, "dur": None}]
    p = write(_doc(ops), tmp_path / "nodur.json")
    raw = load.load_trace(p)
    by_name = {raw.names[n]: d for n, d in zip(raw.c_nid.tolist(), raw.c_dur.tolist())}
    assert by_name["aten::empty"] == 0 and by_name["aten::zeros"] == 0 and by_name["aten::mm"] == 3
    assert raw.n_malformed == 0
    _same_as_the_standard_library_reader(p, monkeypatch)


def _ops_with(name_of, n: int = 5000) -> list[dict]:
    # 5000 ops: more than the reader's first read (CHUNK_BYTES when the module was loaded), which
    # holds the header; the batches after it are read as CHUNK_BYTES / BATCH_CHARS say
    return [{"ph": "X", "cat": "cpu_op", "name": name_of(i), "pid": 1, "tid": 1, "ts": 10 + i, "dur": 1,
             "args": {"External id": i, "note": "x" * (i % 7)}} for i in range(n)]


def _read_in_chunks(path: Path, monkeypatch, chunk: int) -> tuple[list, str]:
    """Names of the complete events and the analysis, the file read ``chunk`` bytes at a time."""
    with monkeypatch.context() as m:
        m.setattr(jsonstream, "CHUNK_BYTES", chunk)
        m.setattr(jsonstream, "BATCH_CHARS", 3 * chunk)
        names = [e.name for e in _batches(path) if e.__class__ in (jsonstream.TraceEvent, jsonstream.LooseEvent)]
        return names, _result(path)


@pytest.mark.parametrize("chunk", [61, 4099])
def test_characters_cut_by_the_reads_anywhere_give_the_same_events(tmp_path, monkeypatch, chunk):
    # ASCII, then names that are not (2- and 4-byte characters, cut by the chunks anywhere)
    doc = _doc(_ops_with(lambda i: f"op{i}" if i < 4000 else f"op{i} é\U0001f600"))
    p = tmp_path / "utf8.json"
    p.write_bytes(json.dumps(doc, ensure_ascii=False).encode())
    assert not p.read_bytes().isascii()
    expected = [e["name"] for e in doc["traceEvents"][:-1] if e.get("ph") == "X"]
    small, small_result = _read_in_chunks(p, monkeypatch, chunk)
    assert small == expected
    assert small_result == _result(p)


def test_a_byte_that_is_not_utf8_in_args_never_read_costs_its_event(tmp_path, monkeypatch):
    # msgspec does not look inside args it keeps as raw text: the event holding the byte is still
    # skipped, however the reads cut the file
    text = json.dumps(_doc(_ops_with(lambda i: f"op{i}"))).encode()
    at = text.index(b'"name": "op4500"')
    bad = text[:at] + text[at:].replace(b'"note": "xxxxx"}', b'"note": "xx\xffxx"}', 1)
    assert bad != text
    p = tmp_path / "badarg.json"
    p.write_bytes(bad)
    small, small_result = _read_in_chunks(p, monkeypatch, 997)
    assert [n for n in small if n.startswith("op")] == [f"op{i}" for i in range(5000) if i != 4506]   # it held it
    assert small_result == _result(p)
    assert "0xff is not UTF-8" in small_result
