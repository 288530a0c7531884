"""Hostile input, part three: one impossible timestamp, one bad header value, one over-deep or
over-long event, a decompression bomb, thousands of bad files, a huge --steps number or path -
each costs one event or one file (counted and said in one short line), never the other ranks,
never a traceback."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trace_synth import kernel, nccl, trace, write

from ccoverlap.cli import main
from ccoverlap.errors import TraceError
from ccoverlap.replayer.run import replay
from ccoverlap.trace import consistency, load
from ccoverlap.trace.analyze import analyze

SMALL_RANK = ("trace_filter", "sampled_rank-0.json.gz")
REPLAYED_RANK = ("ns_resolution_trace", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")


def _real_with(shared_traces, tmp_path, which, edit) -> tuple:
    """A real rank copied to ``tmp_path/clean`` and, with ``edit(events)`` applied, to ``tmp_path/bad``."""
    src = shared_traces.joinpath(*which)
    clean = tmp_path / "clean" / "rank-0.json.gz"
    clean.parent.mkdir()
    shutil.copy(src, clean)
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    edit(doc["traceEvents"])
    return clean, write(doc, tmp_path / "bad" / "rank-0.json.gz")


def _set_memset_ts(ts):
    def edit(events):
        memsets = [e for e in events if e.get("cat") == "gpu_memset"]
        memsets[len(memsets) // 2]["ts"] = ts
    return edit


def test_one_memset_at_ts_minus_one_is_dropped_and_counted(shared_traces, tmp_path, capsys):
    clean, bad = _real_with(shared_traces, tmp_path, SMALL_RANK, _set_memset_ts(-1))
    ref, got = analyze([clean], steps="all"), analyze([bad], steps="all")
    assert got.ranks[0].n_dropped == 1 and ref.ranks[0].n_dropped == 0
    # the step and idle time stay what they were (1.68e9 s, 53 years, before the check); one memset less
    assert got.metrics[0].step_time_s == pytest.approx(ref.metrics[0].step_time_s, rel=1e-6)
    assert got.metrics[0].idle_s == pytest.approx(ref.metrics[0].idle_s, abs=1e-4)
    assert any("dropped 1 event(s) with inconsistent timestamps" in p and "far outside" in p for p in got.problems)
    assert main(["analyze", str(bad), "--json", "--no-png", "--steps", "all"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["ranks"][0]["dropped_events"] == 1
    assert "dropped 1 event(s) with inconsistent timestamps" in err


def test_replay_of_a_rank_with_one_memset_at_ts_minus_one(shared_traces, tmp_path):
    # before the check: "the dependency graph has a cycle through 11466 node(s)"
    _, bad = _real_with(shared_traces, tmp_path, REPLAYED_RANK, _set_memset_ts(-1))
    r = replay([str(bad)], whatifs=["no-comm"])
    assert r.replay.step_time_s > 0 and r.fidelity
    assert any("dropped 1 event(s) with inconsistent timestamps" in p for p in r.job.problems)


def _tiny(**over) -> dict:
    """Two streams, launches 5 µs before each kernel, in order; ``over``: kernel name -> changes."""
    ks = [kernel(f"k{i}", 100 + 20 * i, 10) for i in range(10)] + [nccl("all_reduce", 150, 40)]
    for k in ks:
        k.update(over.get(k["name"], {}))
    return trace(ks, world=1)


def test_a_gpu_event_before_its_launch_is_dropped(tmp_path):
    raw = load.load_trace(write(_tiny(k4={"ts": 150, "launch": 170}), tmp_path / "r.json"))
    assert raw.n_dropped == 1 and len(raw.k_ts) == 10
    assert any("1 starting before their CPU launch" in w for w in raw.warnings), raw.warnings


def test_a_kernel_out_of_order_on_its_stream_is_dropped(tmp_path):
    # k3 launched at 155 but starting at 290, after k4..k8 started: the one out of order is dropped
    raw = load.load_trace(write(_tiny(k3={"ts": 290}), tmp_path / "r.json"))
    assert raw.n_dropped == 1 and 290 not in raw.k_ts.tolist()
    assert any("1 out of order on their CUDA stream" in w for w in raw.warnings), raw.warnings


def test_a_launch_far_outside_the_span_is_dropped(tmp_path):
    raw = load.load_trace(write(_tiny(k2={"launch": 1e15}), tmp_path / "r.json"))
    assert raw.n_dropped == 1 and raw.l_ts.max() < 1e6


def test_skewed_clocks_drop_nothing_and_say_so(tmp_path):
    ks = [kernel(f"k{i}", 100 + 20 * i, 10, launch=130 + 20 * i) for i in range(10)]
    raw = load.load_trace(write(trace(ks, world=1), tmp_path / "r.json"))
    assert raw.n_dropped == 0 and len(raw.k_ts) == 10
    assert any("clocks of this trace disagree" in w for w in raw.warnings)


def test_clean_traces_drop_nothing(tmp_path):
    raw = load.load_trace(write(_tiny(), tmp_path / "r.json"))
    assert raw.n_dropped == 0 and not raw.warnings


def test_longest_non_decreasing_keeps_all_but_the_outliers():
    assert consistency._longest_non_decreasing([1, 2, 99, 3, 4, 5]) == [0, 1, 3, 4, 5]
    assert consistency._longest_non_decreasing([1, 2, -1, 3, 3, 4]) == [0, 1, 3, 4, 5]
    assert consistency._longest_non_decreasing([]) == []


def _job(tmp_path, bad_doc=None, bad_name="rank-1.json", bad_text=None):
    """A 2-rank job: a good rank 0 and a rank whose header (or file name) is hostile."""
    write(trace([kernel("gemm", 0, 100), nccl("all_reduce", 50, 100)], rank=0, world=2), tmp_path / "rank-0.json")
    bad = tmp_path / bad_name
    if bad_text is not None:
        bad.write_text(bad_text)
    else:
        write(bad_doc, bad)
    return tmp_path


def _rank1(rank=1, world=2) -> dict:
    doc = trace([kernel("gemm", 0, 100), nccl("all_reduce", 50, 100)], rank=1, world=2)
    doc["distributedInfo"].update(rank=rank, world_size=world)
    return doc


@pytest.mark.parametrize("value", ["²", "٣", "9" * 5000, 2**64, -3, 1e300, True, [1]])
def test_a_rank_that_is_not_a_number_falls_back_to_the_file_name(tmp_path, capsys, value):
    job = _job(tmp_path, _rank1(rank=value))
    a = analyze([job])
    assert [r.rank for r in a.ranks] == [0, 1]             # rank-1.json: the file name decides
    if value is not True and value != [1] and value != -3:
        assert any("rank-1.json: distributedInfo.rank" in p and "ignored" in p and len(p) < 300 for p in a.problems)
    assert main(["analyze", str(job), "--no-png"]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("value", ["٣", "9" * 5000, 2**64])
def test_a_world_size_that_is_not_a_number_is_ignored(tmp_path, value):
    a = analyze([_job(tmp_path, _rank1(world=value))])
    assert [r.rank for r in a.ranks] == [0, 1] and a.ranks[1].world_size == 2
    assert any("distributedInfo.world_size" in p for p in a.problems)


def test_a_rank_of_5000_digits_as_a_json_number(tmp_path):
    text = json.dumps(_rank1()).replace('"rank": 1', '"rank": ' + "7" * 5000)
    a = analyze([_job(tmp_path, bad_text=text)])
    assert [r.rank for r in a.ranks] == [0, 1]
    assert any("header value(s) that cannot be read" in p and "distributedInfo" in p and len(p) < 400
               for p in a.problems)


def test_a_rank_of_30_digits_in_the_file_name(tmp_path):
    doc = _rank1()
    del doc["distributedInfo"]
    a = analyze([_job(tmp_path, doc, bad_name="rank-" + "1" * 30 + ".json")])
    assert [r.rank for r in a.ranks] == [0, 1]
    assert any("rank in the file name" in p and "larger than" in p for p in a.problems)
    assert any("assumed rank 1 (file order)" in p for p in a.problems)


def test_the_api_gives_a_result_or_a_trace_error(tmp_path):
    import ccoverlap as cc
    doc = _rank1(rank="²")
    write(doc, tmp_path / "one" / "trace.json")                 # no rank in the name: file order
    assert [row["rank"] for row in cc.analyze(tmp_path / "one").rows] == [0]
    r = cc.analyze(_job(tmp_path / "job", _rank1(rank=2**64)))
    assert [row["rank"] for row in r.rows] == [0, 1] and r.rows[1]["dropped_events"] == 0
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "rank-0.json").write_text('{"distributedInfo": {"rank": "²"}}')
    with pytest.raises(TraceError, match="rank-0.json"):
        cc.analyze(tmp_path / "none")


def _with_first_event(path, raw_event: str):
    """A 1-rank trace with ``raw_event`` (JSON text) as its first event."""
    text = json.dumps(_tiny())
    i = text.index('"traceEvents": [') + len('"traceEvents": [')
    path.write_text(text[:i] + raw_event + ", " + text[i:])
    return path


@pytest.mark.parametrize("depth", [1500, 200_000])
def test_one_event_nested_too_deeply_costs_that_event(tmp_path, depth):
    deep = "[" * depth + "]" * depth
    p = _with_first_event(tmp_path / "r.json", '{"ph": "X", "cat": "kernel", "name": "deep", "ts": 120, "dur": 1, '
                                               '"args": {"stream": 7, "x": ' + deep + ', "s": "]]"}}')
    raw = load.load_trace(p)
    assert raw.n_malformed == 1 and len(raw.k_ts) == 11 and "deep" not in raw.names
    assert any("event #0 at offset" in w and "nested deeper than" in w for w in raw.warnings), raw.warnings
    assert analyze([p]).metrics[0].comm_s > 0


def test_one_over_long_string_costs_that_event_in_bounded_memory(tmp_path, monkeypatch):
    import tracemalloc

    from ccoverlap.trace import jsonstream
    monkeypatch.setattr(jsonstream, "MAX_VALUE_CHARS", 1 << 20)
    huge = 'x\\"' * (3 << 20)                               # 9 MiB of text, escaped quotes inside, cap 1 MiB
    p = _with_first_event(tmp_path / "r.json", '{"ph": "X", "cat": "kernel", "name": "long", "ts": 120, '
                                               '"dur": 1, "args": {"x": "' + huge + '"}}')
    tracemalloc.start()
    raw = load.load_trace(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert raw.n_malformed == 1 and len(raw.k_ts) == 11
    assert any("longer than 1 Mi characters" in w for w in raw.warnings), raw.warnings
    assert peak < 16e6, peak                                # never the whole 9 MiB value (plus copies)


def test_a_header_value_nested_too_deeply_still_ends_the_file(tmp_path):
    (tmp_path / "r.json").write_text('{"meta": ' + "[" * 5000 + "]" * 5000 + ', "traceEvents": []}')
    with pytest.raises(TraceError, match="r.json.*nested deeper than"):
        load.load_trace(tmp_path / "r.json")


def _gzip_of_blanks(path, mib: int):
    """A gzip trace whose events list holds ``mib`` MiB of blanks (compresses ~1000x)."""
    c = gzip.zlib.compressobj(6, gzip.zlib.DEFLATED, 31)
    parts = [c.compress(b'{"traceEvents": [')]
    parts += [c.compress(b" " * (1 << 20)) for _ in range(mib)]
    parts += [c.compress(b"]}"), c.flush()]
    path.write_bytes(b"".join(parts))
    return path


def test_a_gzip_bomb_is_refused_by_ratio(tmp_path, monkeypatch):
    from ccoverlap.trace import sources
    monkeypatch.setattr(sources, "RATIO_FREE_BYTES", 1 << 20)
    bomb = _gzip_of_blanks(tmp_path / "rank-1.json.gz", 8)
    with pytest.raises(TraceError, match=r"rank-1.json.gz: gzip expands more than 200x .*MAX_GZIP_RATIO"):
        load.load_trace(bomb)
    # the other rank of the job is still analysed
    write(_tiny(), tmp_path / "rank-0.json.gz")
    a = analyze([tmp_path])
    assert [r.rank for r in a.ranks] == [0] and any("decompression bomb" in p for p in a.problems)


def test_a_gzip_past_the_size_cap_is_refused(tmp_path, monkeypatch):
    from ccoverlap.trace import sources
    monkeypatch.setattr(sources, "MAX_GZIP_BYTES", 1 << 20)
    monkeypatch.setattr(sources, "RATIO_FREE_BYTES", 1 << 30)
    with pytest.raises(TraceError, match=r"big.json.gz: gzip expands to more than .*MAX_GZIP_BYTES"):
        load.load_trace(_gzip_of_blanks(tmp_path / "big.json.gz", 3))
    assert load.load_trace(write(_tiny(), tmp_path / "small.json.gz")).n_events > 0


def test_thousands_of_unreadable_files_give_one_short_line(tmp_path, capsys):
    for i in range(1000):
        (tmp_path / f"r{i}.json").write_bytes(b"")
    with pytest.raises(TraceError) as err:
        analyze([tmp_path])
    msg = str(err.value)
    assert len(msg) < 600 and msg.endswith("and 997 more") and "file is empty" in msg
    assert len(err.value.problems) == 1000                   # --json still lists every one
    assert main(["analyze", str(tmp_path), "--no-png"]) == 2
    out, errtext = capsys.readouterr()
    assert errtext.count("\n") == 1 and len(errtext) < 600 and "Traceback" not in errtext


def test_a_path_longer_than_the_system_allows_is_named_short(tmp_path, capsys):
    for long in (tmp_path / ("a" * 100_000 + ".json"), tmp_path.joinpath(*["b" * 200] * 30, "r.json")):
        with pytest.raises(TraceError) as err:
            analyze([long])
        assert "cannot read" in str(err.value) and "characters]" in str(err.value) and len(str(err.value)) < 600
        for cmd in ("analyze", "replay"):
            assert main([cmd, str(long)]) == 2
            errtext = capsys.readouterr().err
            assert "Traceback" not in errtext and len(errtext) < 600, errtext[:300]


def test_few_names_the_first_items_and_counts_the_rest():
    from ccoverlap.config import clip_middle, few
    assert few(["a", "b"]) == "a; b"
    assert few([f"f{i}" for i in range(10)], n=2) == "f0; f1; and 8 more"
    cut = clip_middle("x" * 1000 + "/rank-3.json", 100)
    assert len(cut) < 140 and cut.endswith("/rank-3.json") and "[912 characters]" in cut


@pytest.mark.parametrize("spec", ["1-99999999999999999999999", "99999999999999999999999", "3,1000000000000000",
                                  "1-" + "9" * 5000])
def test_a_steps_number_too_large_is_one_config_error(tmp_path, capsys, spec):
    from ccoverlap.errors import ConfigError
    from ccoverlap.trace.steps import parse_steps
    with pytest.raises(ConfigError, match="--steps"):
        parse_steps(spec)
    p = write(_tiny(), tmp_path / "r.json")
    for cmd in ("analyze", "replay"):
        assert main([cmd, str(p), "--steps", spec]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--steps" in err and len(err) < 300 and "Traceback" not in err


EPOCH_US = 1_712_195_495_000_000.0        # a Kineto trace's timestamps: µs since the epoch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 10), where=st.sampled_from(["ts", "launch", "dur"]),
       value=st.one_of(st.floats(-1e17, 1e17, allow_nan=False), st.integers(-10**17, 10**17),
                       st.sampled_from([-1, 0, EPOCH_US - 1, EPOCH_US * 2])))
def test_one_corrupted_time_never_stretches_the_rank(tmp_path, which, where, value):
    """Fuzz: any one kernel's ts, launch ts or duration set to anything in range: the rank is
    analysed, its step stays within the span rule's bounds (not 53 years), nothing raises."""
    ks = [kernel(f"k{i}", EPOCH_US + 100 + 20 * i, 10) for i in range(10)] + [nccl("all_reduce", EPOCH_US + 150, 40)]
    if where == "dur":
        ks[which]["dur"] = abs(value)
    else:
        ks[which][where] = value
    p = write(trace(ks, world=1), tmp_path / "r.json")
    try:
        a = analyze([p], steps="all")
    except TraceError as exc:            # only when nothing is left to measure
        assert "nothing could be analysed" in str(exc)
        return
    bound = 2 * consistency.SPAN_FLOOR_US * 1e-6 + 1
    assert a.metrics[0].step_time_s < bound and a.metrics[0].idle_s < bound
    r = a.ranks[0]
    assert r.n_dropped + r.n_malformed <= 2          # the kernel, and at most its launch


@pytest.mark.parametrize("size", [2**64, 1e300, float("inf"), "x", -4])
def test_a_group_size_out_of_range_counts_as_not_stated(tmp_path, size):
    doc = _rank1()
    doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": size}]
    for e in doc["traceEvents"]:
        if "Group size" in e.get("args", {}):
            e["args"]["Group size"] = size
    a = analyze([_job(tmp_path, doc)], steps="all")
    assert [r.rank for r in a.ranks] == [0, 1] and a.collectives
    assert all(0 < c.group_size < 2**31 for c in a.collectives)


def test_an_unforeseen_value_error_costs_that_rank_only(tmp_path, monkeypatch):
    from ccoverlap.trace import summary
    build = summary.build_rank

    def fragile(raw, *a, **k):
        if raw.rank == 1:
            raise OverflowError("Python int too large to convert to C long")
        return build(raw, *a, **k)
    monkeypatch.setattr(summary, "build_rank", fragile)
    a = analyze([_job(tmp_path, _rank1())], jobs=1)
    assert [r.rank for r in a.ranks] == [0]
    assert any("rank-1.json: cannot be analysed (OverflowError" in p for p in a.problems)
