"""``ccoverlap bench``: self-spawned 2-rank gloo runs, JSON output, per-rank traces, usage errors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from ccoverlap.cli import main  # noqa: E402


def _run(capsys, *argv):
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_json_and_profile(tmp_path, capsys):
    prof = tmp_path / "traces"
    code, out, err = _run(
        capsys, "--m", "64", "--n", "16", "--k", "24", "--iters", "2", "--warmup", "1",
        "--schedules", "ring,hetero-unfused-1d,auto,tune", "--json", "--profile-dir", str(prof), "--backward",
    )  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert res["world_size"] == 2 and res["backend"] == "gloo" and res["backward"] is True
    by = {r["schedule"]: r for r in res["results"]}
    assert [r["schedule"] for r in res["results"] if not r["reference"]] == [
        "serial", "ring", "hetero-unfused-1d", "auto", "tune"]
    # the check's cost and PyTorch's own TP are measured in the same round-robin
    assert {"(serial, unchecked)", "(cross-rank check)", "(DTensor TP)"} <= set(by)
    assert "check_cost_in_serial" in res["summary"] and "auto_vs_dtensor_tp" in res["summary"]
    info = by["tune"]["tune"]
    assert info["picked"] == by["tune"]["runs"] and info["rounds"] >= 1
    assert set(info["median_ms"]) == {"serial", "ring", "uniform-fused-1d", "hetero-fused-1d",
                                      "hetero-unfused-1d", "uniform-fused-2d"}  # fmt: skip
    assert all(len(v) == info["rounds"] or k in info["eliminated"] for k, v in info["samples_ms"].items())
    assert res["summary"]["tune_pick"] == info["picked"]
    # paired judgements: the pick against every concrete schedule per repetition (>= its ratio to itself, 1)
    assert res["summary"]["tune_pick_vs_fastest_paired"] >= 1.0
    assert "check_cost_in_serial_paired" in res["summary"]
    for r in by.values():
        assert len(r["times_s"]) == 2 and all(t > 0 for t in r["times_s"])
        if not r["reference"]:
            assert r["speedup_vs_serial"] == pytest.approx(by["serial"]["median_s"] / r["median_s"])
    assert by["auto"]["runs"] in ("serial", "ring", "uniform-fused-1d", "hetero-fused-1d",
                                  "hetero-unfused-1d", "uniform-fused-2d")  # fmt: skip
    for rank in (0, 1):
        trace = json.loads((prof / f"rank-{rank}.json").read_text())
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert "ccoverlap.bench.all_gather_matmul.ring" in names
        assert any(n.startswith("ProfilerStep#") for n in names)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_table_all_to_all(capsys):
    code, out, err = _run(capsys, "--op", "all_to_all_matmul", "--m", "32", "--n", "8", "--k", "8",
                          "--experts", "2", "--iters", "2", "--warmup", "0")
    assert code == 0, err
    assert "all_to_all_matmul M=32 N=8 K=8 E=2" in out
    body = out.split("-" * 20 + "\n")[-1].split("\n\n")[0]  # the table: after the rule, up to the first blank line
    lines = [ln for ln in body.splitlines() if ln.split() and ln.split()[0] in ("serial", "chunked", "auto", "tune")]
    assert [ln.split()[0] for ln in lines] == ["serial", "chunked", "auto", "tune"]
    assert lines[2].split()[1] == "chunked"
    assert lines[3].split()[1] in ("serial", "chunked:2", "chunked:4", "chunked:8")
    assert "tune measured 4 candidates" in out
    assert "(comm only)" in out and "(GEMM only)" in out  # forward runs show what serial is made of


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--m", "63", "--nproc", "2"], "--m 63 is not divisible by the 2 ranks"),
        (["--schedules", "ring,bogus"], "unknown schedule(s) bogus"),
        (["--op", "all_to_all_matmul", "--schedules", "ring"], "unknown schedule(s) ring"),
        (["--iters", "0"], "--iters must be >= 1"),
        (["--nproc", "0"], "--nproc must be >= 1"),
        (["--plan", "block", "--shape", "huge"], "unknown plan shape 'huge'"),
        (["--plan", "model", "--nproc", "3"], "does not split over 3 ranks"),
        (["--plan", "block", "--schedule", "fast"], "--schedule must be one of"),
    ],
)
def test_bench_usage_errors_are_one_line(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("workload", ["block", "model"])
def test_plan_bench_pairs_torch_and_ccoverlap_on_one_plan(workload):
    """The plan benchmark on a small shape: both rows time the same workload, start equal, and are paired."""
    from ccoverlap.runtime.plan_bench import PlanBenchConfig, PlanShape, bench, format_table

    cfg = PlanBenchConfig(workload=workload, reps=3, warmup=0, layers=1, vocab=32, dims=PlanShape(2, 8, 16, 4, 32),
                          schedule="serial", rows=("torch", "ccoverlap", "ccoverlap:ring", "async-tp"))
    res = bench(cfg, 2)
    rows = {r["row"]: r for r in res["rows"]}
    assert list(rows) == ["torch", "ccoverlap", "ccoverlap:ring"] and res["backend"] == "gloo"
    assert "CUDA" in res["skipped_rows"]["async-tp"]
    first = rows["torch"]["first_step_value"]
    for r in rows.values():
        assert len(r["times_s"]) == 3 and all(t > 0 for t in r["times_s"])
        assert r["first_step_value"] == pytest.approx(first, rel=1e-5)  # the same step, the same numbers
    ratio = rows["ccoverlap"]["ratio_vs_torch"]
    paired = sorted(a / b for a, b in zip(rows["ccoverlap"]["times_s"], rows["torch"]["times_s"]))
    assert ratio == pytest.approx(paired[1])
    assert "async-tp not run" in format_table([res])


def test_what_ran_looks_up_the_decision_under_the_engine_it_was_made_for(monkeypatch):
    """A matmul-reduce-scatter decides its schedule for c10d whatever ``--comm-engine`` says (copy
    engines cannot add): bench reports that decision, and does not ask for one under "dma" (a
    cache miss, which would decide, or tune, a second time)."""
    import torch

    from ccoverlap.commands import bench
    from ccoverlap.runtime import tuning

    asked = []

    def fake_resolve(kind, a, b, group, schedule, *, comm_engine="sm", **_):
        asked.append((kind, comm_engine))
        return tuning.Decision("ring", schedule, "stand-in")

    monkeypatch.setattr(tuning, "resolve", fake_resolve)
    for op, engine, want in (("matmul_reduce_scatter", "dma", ("rs", "sm")),
                             ("all_gather_matmul", "dma", ("ag", "dma")),
                             ("matmul_reduce_scatter", "sm", ("rs", "sm"))):
        b = bench._RankBench(rank=0, world=2, cfg={"op": op, "k": 8, "comm_engine": engine}, backend="gloo",
                             device=torch.device("cpu"), dtype=torch.float32, threads=1, gen=torch.Generator(),
                             x=torch.zeros(4, 8), w=torch.zeros(4, 8))
        assert bench._what_ran(b, "auto") == ("ring", None)
        assert asked[-1] == want
