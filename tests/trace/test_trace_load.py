"""Loader: streaming, ranks, time units, bad input (each problem named with its file)."""

from __future__ import annotations

import gzip
import json
import string
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trace_synth import kernel, nccl, trace, write

from ccoverlap.errors import TraceError
from ccoverlap.trace import load
from ccoverlap.trace.analyze import analyze


def _two_kernels():
    return [kernel("gemm", 0, 100), nccl("all_reduce", 50, 100)]


@pytest.fixture(params=["isal", "zlib"])
def inflater(request, monkeypatch):
    """The gzip checks run once with ISA-L's inflater (where installed) and once with zlib's."""
    from ccoverlap.trace import sources
    module = pytest.importorskip("isal.isal_zlib") if request.param == "isal" else zlib
    monkeypatch.setattr(sources, "_inflate_lib", module)
    return module


def test_loads_json_and_gz_identically(tmp_path, inflater):
    doc = trace(_two_kernels(), rank=1, world=2)
    a = load.load_trace(write(doc, tmp_path / "a.json"))
    b = load.load_trace(write(doc, tmp_path / "b.json.gz"))
    assert a.rank == b.rank == 1 and a.world_size == 2 and a.rank_source == "distributedInfo"
    assert np.array_equal(a.k_ts, b.k_ts) and len(a.k_ts) == 2
    assert sorted(a.names[i] for i in a.k_nid)[0] == "gemm"
    assert len(a.l_corr) == 2  # one cudaLaunchKernel per kernel


def test_events_are_streamed_not_json_loaded(tmp_path, monkeypatch):
    path = write(trace(_two_kernels()), tmp_path / "r.json")

    def boom(*a, **k):
        raise AssertionError("json.load(s) must not read the trace")

    monkeypatch.setattr(json, "load", boom)
    monkeypatch.setattr(json, "loads", boom)
    assert len(load.load_trace(path).k_ts) == 2


def test_metadata_written_after_trace_events_is_found(tmp_path):
    doc = trace(_two_kernels(), rank=3, world=4, display="ns", meta_after_events=True)
    raw = load.load_trace(write(doc, tmp_path / "x.json"))
    assert raw.rank == 3 and raw.world_size == 4
    assert raw.meta["displayTimeUnit"] == "ns"


def test_json_array_format(tmp_path):
    events = trace(_two_kernels())["traceEvents"]
    path = tmp_path / "rank-2.json"
    path.write_text(json.dumps(events))
    raw = load.load_trace(path)
    assert len(raw.k_ts) == 2 and raw.rank == 2 and raw.rank_source == "file name"


@pytest.mark.parametrize("name,rank", [
    ("rank-3.json", 3), ("rank3.pt.trace.json.gz", 3), ("job_rank_3.json", 3), ("host_rank12.123.pt.trace.json", 12),
    ("worker-RANK-7.json", 7),
])
def test_rank_from_file_name(tmp_path, name, rank):
    raw = load.load_trace(write(trace(_two_kernels(), rank=None, world=None), tmp_path / name))
    assert raw.rank == rank and raw.rank_source == "file name"


def test_rank_by_order_is_said_plainly(tmp_path):
    p1 = write(trace(_two_kernels(), rank=None, world=None), tmp_path / "a.json")
    p2 = write(trace(_two_kernels(), rank=None, world=None), tmp_path / "b.json")
    raws, problems = load.load_all([p1, p2])
    assert [r.rank for r in raws] == [0, 1]
    assert all(r.rank_source == "file order" for r in raws)
    assert any("a.json" in p and "assumed rank 0" in p for p in problems)
    assert any("b.json" in p and "assumed rank 1" in p for p in problems)


def test_different_world_sizes_drop_the_odd_file(tmp_path):
    ok0 = write(trace(_two_kernels(), rank=0, world=4), tmp_path / "r0.json")
    ok1 = write(trace(_two_kernels(), rank=1, world=4), tmp_path / "r1.json")
    odd = write(trace(_two_kernels(), rank=2, world=8), tmp_path / "odd.json")
    a = analyze([ok0, ok1, odd])
    assert [m.rank for m in a.metrics] == [0, 1]
    assert any("odd.json" in p and "world_size 8" in p for p in a.problems)


def test_duplicate_rank_is_dropped_with_a_message(tmp_path):
    p1 = write(trace(_two_kernels(), rank=0), tmp_path / "first.json")
    p2 = write(trace(_two_kernels(), rank=0), tmp_path / "second.json")
    raws, problems = load.load_all([p1, p2])
    assert len(raws) == 1
    assert any("second.json" in p and "also claimed by" in p and "first.json" in p for p in problems)


def test_two_files_claiming_a_rank_are_decided_by_evidence(tmp_path):
    # the genuine rank-0 file has kernels; a file that also says rank 0 but holds nothing to measure
    # (and comes first in file order) must not push it out
    hostile = trace([], rank=0, world=2)
    hostile["traceEvents"] = [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]
    p_bad = write(hostile, tmp_path / "a_rank-0.json")
    p_good = write(trace(_two_kernels(), rank=0, world=2), tmp_path / "b_rank-0.json")
    p_other = write(trace(_two_kernels(), rank=1, world=2), tmp_path / "c_rank-1.json")
    a = analyze([p_bad, p_good, p_other])
    assert [(rt.rank, rt.path) for rt in a.ranks] == [(0, str(p_good)), (1, str(p_other))]
    msg = [p for p in a.problems if "also claimed by" in p]
    assert len(msg) == 1 and "a_rank-0.json" in msg[0] and "b_rank-0.json" in msg[0]


def test_microseconds_become_seconds_and_ns_resolution_is_kept_exactly(tmp_path):
    doc = trace([kernel("gemm", 10.25, 100.5), nccl("all_reduce", 60.75, 100.0)], rank=0, world=1, display="ns")
    path = write(doc, tmp_path / "ns.json")
    exact = analyze([path], time_resolution="exact").metrics[0]
    assert exact.compute_s == pytest.approx(100.5e-6)
    assert exact.overlap_s == pytest.approx((110.75 - 60.75) * 1e-6)
    hta = analyze([path], time_resolution="hta").metrics[0]
    # HTA: ceil(start), floor(end) for float timestamps -> gemm [11, 110], comm [61, 160]
    assert hta.compute_s == pytest.approx(99e-6)
    assert hta.overlap_s == pytest.approx(49e-6)


def test_integer_timestamps_are_never_rounded(tmp_path):
    # HTA rounds only when the timestamps themselves are floats (its ts column is float64)
    doc = trace([kernel("gemm", 0, 100.5), nccl("all_reduce", 50, 100.25)], rank=0, world=1)
    m = analyze([write(doc, tmp_path / "int.json")]).metrics[0]
    assert m.compute_s == pytest.approx(100.5e-6, abs=1e-12)
    assert m.overlap_ratio == pytest.approx(50.5 / 100.25, abs=1e-12)


def test_ids_too_large_for_the_columns_are_malformed(tmp_path):
    doc = trace(_two_kernels())
    huge = 2**62 + 5          # fits JSON parsers' int64, not our id range
    doc["traceEvents"] += [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"stream": huge, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"stream": 7, "correlation": huge}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 1, "pid": 1, "tid": 1,
         "args": {"correlation": huge}},
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{huge}", "ts": 1, "dur": 1, "pid": 1, "tid": 1},
    ]
    raw = load.load_trace(write(doc, tmp_path / "big.json"))
    assert len(raw.k_ts) == len(raw.k_stream) == len(raw.k_corr) == 2 and raw.n_malformed == 2
    assert len(raw.l_corr) == len(raw.l_ts) == 2 and raw.steps == []
    analyze([tmp_path / "big.json"])
    # beyond int64 too: the id is out of range, the event's other fields still count
    doc["traceEvents"][-1]["args"] = {"External id": 2**70}
    raw2 = load.load_trace(write(doc, tmp_path / "big2.json"))
    assert len(raw2.k_ts) == 2 and raw2.rank == raw.rank


def test_malformed_events_are_skipped_and_counted(tmp_path):
    doc = trace(_two_kernels())
    doc["traceEvents"] += [
        {"ph": "X", "cat": "kernel", "name": "bad", "ts": "12", "dur": 3, "args": {"stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "neg", "ts": 12, "dur": -3},
        {"ph": "X", "cat": "cpu_op", "name": 42, "ts": 1, "dur": 1, "pid": 1, "tid": 1},
        17, None, [1, 2],
    ]
    raw = load.load_trace(write(doc, tmp_path / "m.json"))
    assert len(raw.k_ts) == 2
    assert raw.n_malformed == 6
    assert any("skipped 6 malformed" in w for w in raw.warnings)


# ----------------------------------------------------------------------------- bad files

def _bad_files(tmp_path):
    good = json.dumps(trace(_two_kernels()))
    (tmp_path / "truncated.json").write_text(good[: len(good) // 2])
    (tmp_path / "notjson.json").write_text("this is not a trace\n")
    (tmp_path / "fake.json.gz").write_text(good)
    full = gzip.compress(good.encode())
    (tmp_path / "cut.json.gz").write_bytes(full[: len(full) // 2])
    (tmp_path / "empty.json").write_bytes(b"")
    (tmp_path / "noevents.json").write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0}}))
    (tmp_path / "emptyevents.json").write_text(json.dumps({"traceEvents": []}))
    (tmp_path / "eventsdict.json").write_text(json.dumps({"traceEvents": {"a": 1}}))
    (tmp_path / "numbers.json").write_text(json.dumps([1, 2, 3]))
    (tmp_path / "otherjson.json").write_text(json.dumps({"name": "resnet", "layers": [1, 2]}))
    return {
        "truncated.json": "truncated or invalid JSON",
        "notjson.json": "not JSON",
        "fake.json.gz": "named .gz but is not gzip",
        "cut.json.gz": "broken gzip stream",
        "empty.json": "file is empty",
        "noevents.json": "no 'traceEvents'",
        "emptyevents.json": "'traceEvents' is empty",
        "eventsdict.json": "valid JSON but not a Chrome/Kineto trace: 'traceEvents' is not a list",
        "numbers.json": "valid JSON but not a Chrome/Kineto trace: none of its 3 'traceEvents' entries",
        "otherjson.json": "valid JSON but not a Chrome/Kineto trace: no 'traceEvents' list (top-level keys: "
                          "'name', 'layers')",
    }


def test_each_bad_file_gets_a_clear_message(tmp_path):
    for name, problem in _bad_files(tmp_path).items():
        with pytest.raises(TraceError) as exc:
            load.load_trace(tmp_path / name)
        assert name in str(exc.value) and problem in str(exc.value), str(exc.value)


def test_bad_files_do_not_stop_the_good_ones(tmp_path):
    expected = _bad_files(tmp_path)
    write(trace(_two_kernels(), rank=0, world=1), tmp_path / "good-rank-0.json")
    a = analyze([tmp_path])
    assert [m.rank for m in a.metrics] == [0]
    for name in expected:
        assert any(name in p for p in a.problems), name


def test_nothing_analysable_raises(tmp_path):
    _bad_files(tmp_path)
    with pytest.raises(TraceError, match="nothing could be analysed"):
        analyze([tmp_path])


def test_trace_without_gpu_events_is_named(tmp_path):
    cpu_only = trace([], rank=1, world=2, cpu_ops=[{"name": "aten::mm", "ts": 0, "dur": 10}])
    write(cpu_only, tmp_path / "cpu.json")
    write(trace(_two_kernels(), rank=0, world=2), tmp_path / "gpu.json")
    a = analyze([tmp_path])
    assert [m.rank for m in a.metrics] == [0]
    assert any("cpu.json" in p and "no GPU kernel events" in p for p in a.problems)


def test_missing_paths_are_problems_not_crashes(tmp_path):
    write(trace(_two_kernels(), rank=0, world=1), tmp_path / "r.json")
    a = analyze([tmp_path / "r.json", tmp_path / "nope.json"])
    assert any("nope.json" in p and "no such file" in p for p in a.problems)


# ----------------------------------------------------------------------------- fuzz

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
_json = st.recursive(_json_leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                                     st.dictionaries(st.text(max_size=6), c, max_size=4)),
                     max_leaves=20)
_keys = st.sampled_from(["ph", "cat", "name", "ts", "dur", "pid", "tid", "args", "stream", "correlation",
                         "External id", "Collective name", "In msg nelems", "dtype", "Input Dims"])
_big = st.one_of(st.integers(-3, 10), st.integers(-(2**63), 2**63 - 1), st.integers(-(2**70), 2**70), _json_leaf)
_args = st.dictionaries(st.sampled_from(["stream", "correlation", "External id", "device", "Collective name",
                                         "In msg nelems", "Out msg nelems", "dtype", "Group size",
                                         "Process Group Name", "Input Dims", "Input type", "grid", "ccoverlap_kind"]),
                        st.one_of(_big, _json), max_size=8)
_event = st.one_of(
    st.dictionaries(_keys, st.one_of(_json, st.sampled_from(
        ["X", "M", "kernel", "cpu_op", "cuda_runtime", "user_annotation", "ProfilerStep#3", "ncclDevKernel_Generic",
         "gloo:all_reduce", "record_param_comms", "Float"])), max_size=10),
    st.fixed_dictionaries(
        {"ph": st.just("X"), "cat": st.sampled_from(["kernel", "cpu_op", "user_annotation", "cuda_runtime",
                                                      "gpu_memcpy", "cuda_sync", "weird"]),
         "name": st.sampled_from(["ncclDevKernel_Generic", "gemm", "gloo:all_gather", "record_param_comms",
                                  "ProfilerStep#99999999999999999999", "ProfilerStep#2", "Memcpy DtoD"]),
         "ts": st.one_of(st.integers(0, 10**6), st.floats(0, 1e6), _json_leaf),
         "dur": st.one_of(st.integers(0, 10**4), st.floats(-1, 1e4), _json_leaf),
         "pid": _big, "tid": _big, "args": _args}))
_doc = st.one_of(
    st.fixed_dictionaries({"traceEvents": st.lists(_event, max_size=12)},
                          optional={"distributedInfo": _json, "displayTimeUnit": _json, "deviceProperties": _json}),
    _json,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_doc, gz=st.booleans(), cut=st.one_of(st.none(), st.integers(0, 400)))
def test_fuzz_loader_raises_only_trace_error(tmp_path, doc, gz, cut):
    data = json.dumps(doc).encode()
    if cut is not None:
        data = data[:cut]
    if gz:
        data = gzip.compress(data)
    path = tmp_path / ("f.json.gz" if gz else "f.json")
    path.write_bytes(data)
    try:
        load.load_trace(path)
    except TraceError as exc:
        assert "f.json" in str(exc)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | st.text(alphabet=string.printable, max_size=300).map(str.encode))
def test_fuzz_loader_on_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "b.json"
    path.write_bytes(data)
    try:
        load.load_trace(path)
    except TraceError:
        pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(_event, min_size=1, max_size=15))
def test_fuzz_whole_analysis_raises_only_trace_error(tmp_path, events):
    doc = trace([kernel("gemm", 0, 10), nccl("all_reduce", 5, 10)], rank=0, world=1)
    doc["traceEvents"] += events
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps(doc))
    try:
        a = analyze([path])
        json.dumps(a.to_dict(), allow_nan=False)
    except TraceError:
        pass


def test_keep_op_args_keeps_every_ops_external_id_and_shapes(tmp_path):
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100, "ts": 10, "dur": 5,
            "args": {"External id": 7, "Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}},
           {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 100, "ts": 20, "dur": 5,
            "args": {"External id": 9}}]
    p = write(trace([kernel("k", 11, 3)], steps=[(1, 0, 50)], cpu_ops=ops), tmp_path / "r0.json")
    plain = load.load_trace(p)
    assert len(plain.c_args) == 0 and -1 in plain.c_ext[[plain.names[n] == "aten::mm" for n in plain.c_nid]]
    raw = load.load_trace(p, keep_op_args=True)
    by_name = {raw.names[n]: i for i, n in enumerate(raw.c_nid)}
    mm, add = by_name["aten::mm"], by_name["aten::add"]
    assert raw.c_ext[mm] == 7 and raw.c_ext[add] == 9
    assert raw.infos[raw.c_args[mm]]["Input Dims"] == [[4, 8], [8, 2]]
    assert raw.c_args[add] == -1


def test_gzip_members_one_after_another_read_as_one_stream(tmp_path, inflater):
    # gzip allows several members in one file (``cat a.gz b.gz``), zero bytes between them
    text = json.dumps(trace(_two_kernels(), rank=1, world=2)).encode()
    cut = len(text) // 3
    joined = tmp_path / "joined.json.gz"
    joined.write_bytes(gzip.compress(text[:cut]) + b"\0" * 7 + gzip.compress(text[cut:]) + b"\0" * 3)
    a = load.load_trace(joined)
    b = load.load_trace(write(trace(_two_kernels(), rank=1, world=2), tmp_path / "whole.json.gz"))
    assert np.array_equal(a.k_ts, b.k_ts) and len(a.k_ts) == 2 and a.rank == 1


@pytest.mark.parametrize("damage", ["crc", "length", "garbage after", "cut in the trailer"])
def test_a_damaged_gzip_trailer_or_tail_is_a_broken_stream(tmp_path, damage, inflater):
    full = bytearray(gzip.compress(json.dumps(trace(_two_kernels())).encode()))
    if damage == "crc":
        full[-8] ^= 0xFF
    elif damage == "length":
        full[-1] ^= 0x01
    elif damage == "garbage after":
        full += b"this is not gzip"
    else:
        full = full[:-3]
    path = tmp_path / "damaged.json.gz"
    path.write_bytes(bytes(full))
    with pytest.raises(TraceError, match=r"damaged.json.gz: broken gzip stream"):
        load.load_trace(path)


def test_gzip_traces_are_inflated_by_isal_where_it_is_installed():
    from ccoverlap.trace import sources
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    assert sources._inflate_lib is isal_zlib and isal_zlib.error in sources.GZIP_ERRORS
