"""``ccoverlap analyze`` end to end: table, --json, --png, --vs, exit codes, the gloo fixture."""

from __future__ import annotations

import json

import pytest
from trace_synth import kernel, nccl, trace, write

from ccoverlap.cli import main

REQUIRED_RANK_KEYS = {"rank", "compute_s", "comm_s", "overlap_ratio", "exposed_comm_s", "idle_s"}


def _gloo(fixtures_dir):
    return fixtures_dir / "gloo_2rank"


def test_table_output(fixtures_dir, capsys, tmp_path):
    rc = main(["analyze", str(fixtures_dir / "synthetic" / "two_steps"), "--png", str(tmp_path / "p.png")])
    out = capsys.readouterr().out
    assert rc == 0
    for text in ("Per rank", "Per step", "Collectives", "all_reduce", "Stragglers", "rank 1", "Verdict:",
                 "Most worth trying"):
        assert text in out, text
    assert (tmp_path / "p.png").stat().st_size > 5000


def test_json_is_one_object_with_the_promised_keys(fixtures_dir, capsys):
    rc = main(["analyze", str(_gloo(fixtures_dir)), "--json", "--no-png"])
    captured = capsys.readouterr()
    assert rc == 0
    doc = json.loads(captured.out)
    assert len(doc["ranks"]) == 2
    for r in doc["ranks"]:
        assert REQUIRED_RANK_KEYS <= set(r)
        assert 0 <= r["overlap_ratio"] <= 1 and r["comm_s"] > 0 and r["compute_s"] > 0
        assert r["steps"], "per-step metrics"
    for key in ("per_step", "collectives", "cross_rank", "contention", "verdict", "summary", "problems"):
        assert key in doc
    assert doc["verdict"]["label"] in ("communication-bound", "overlap-limited", "contention-limited", "fine")
    assert "no GPU events" in captured.err      # said plainly, on stderr


def test_gloo_fixture_measures_what_the_script_did(fixtures_dir):
    """make_gloo_traces.py: async all_reduce (1 MiB) under matmuls, sync all_gather (2 x 256 KiB),
    rank 1 arriving ~4 ms late at every all_gather."""
    from ccoverlap.trace.analyze import analyze

    a = analyze([_gloo(fixtures_dir)])
    assert [rt.rank for rt in a.ranks] == [0, 1] and all(rt.mode == "cpu" for rt in a.ranks)
    assert all(rt.meta["rank_source"] == "distributedInfo" for rt in a.ranks)
    colls = {c.collective: c for c in a.collectives}
    assert set(colls) == {"all_reduce", "all_gather"}
    assert colls["all_reduce"].bytes_mean == 1 << 20 and colls["all_gather"].bytes_mean == 2 * 256 * 1024
    assert colls["all_reduce"].group_size == 2
    assert a.cross.stragglers == [1]
    assert all(0 < m.overlap_ratio < 1 for m in a.metrics)
    assert a.analysed_steps == a.available_steps[:-1]      # HTA's default: last step dropped


def test_vs_compares_metric_by_metric(fixtures_dir, capsys):
    two = str(fixtures_dir / "synthetic" / "two_steps")
    one = str(fixtures_dir / "synthetic" / "overlap50")
    rc = main(["analyze", two, "--vs", one, "--json", "--no-png"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    rows = {r["metric"]: r for r in doc["vs"]["comparison"]["job"]}
    assert rows["overlap_ratio"]["b"] == pytest.approx(0.5)
    assert rows["comm_s"]["b"] == pytest.approx(100e-6)
    assert rows["comm_s"]["a"] == pytest.approx(185e-6)          # per-step mean of the measured run
    main(["analyze", two, "--vs", one, "--no-png"])
    assert "B / A" in capsys.readouterr().out


def test_exit_code_two_only_when_nothing_could_be_analysed(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{ not json")
    assert main(["analyze", str(tmp_path / "bad.json"), "--no-png"]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "nothing could be analysed" in err and "Traceback" not in err
    write(trace([kernel("gemm", 0, 10), nccl("all_reduce", 5, 10)], rank=0, world=1), tmp_path / "good.json")
    assert main(["analyze", str(tmp_path), "--no-png"]) == 0
    assert "bad.json" in capsys.readouterr().err


def test_bad_steps_is_a_usage_error(fixtures_dir, capsys):
    assert main(["analyze", str(_gloo(fixtures_dir)), "--steps", "banana", "--no-png"]) == 2
    assert "--steps" in capsys.readouterr().err


def test_png_is_opt_in_and_goes_to_the_output_dir(fixtures_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    png = tmp_path / "ccoverlap-out" / "analyze" / "analyze.png"
    assert main(["analyze", str(fixtures_dir / "synthetic" / "two_steps")]) == 0
    assert not png.exists()
    assert main(["analyze", str(fixtures_dir / "synthetic" / "two_steps"), "--json", "--png"]) == 0
    assert not png.exists() and "not drawn with --json" in capsys.readouterr().err
    assert main(["analyze", str(fixtures_dir / "synthetic" / "two_steps"), "--png"]) == 0
    assert png.is_file() and png.stat().st_size > 10_000
