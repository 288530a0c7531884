"""benchmarks/gpu_ficco_pieces.py without a GPU: the pieces of every FiCCO schedule, their
semantics on CPU tensors, the composition of schedule times from (synthetic) measured pieces,
the heuristic's verdicts and the retune on a declared half, and the usage errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_scripts import BENCH, ROOT, load_script

from ccoverlap.deciders.ficco.schedules import SCHEDULES, machine, schedule_graph
from ccoverlap.predict.evaluate import cost_model_for_cluster
from ccoverlap.specs import CollectiveSpec, GemmSpec, MemorySpec, P2PSpec

SCRIPT = BENCH / "gpu_ficco_pieces.py"
fp = load_script("gpu_ficco_pieces")
COST = cost_model_for_cluster(machine("H100-SXM", None, fp.WORLD))


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _spec(key):
    kind, s = key.split(":")
    if kind == "copy":
        return MemorySpec(bytes=2 * int(s))
    m, n, k = map(int, s.removesuffix("+acc").split("x"))
    return GemmSpec(m=m, n=n, k=k, accumulate=s.endswith("+acc"))


def synthetic(plan, sm=1.3, ce=1.05, override=None):
    """Pieces timed by the cost model alone, x ``sm`` / x ``ce`` beside traffic; ``override``
    maps a piece-key predicate to a factor on its alone time."""
    out = {}
    for p in plan:
        pieces = {}
        for key in p["pieces"]:
            a = COST.duration_s(_spec(key))
            for pred, f in (override or {}).items():
                if pred(p, key):
                    a *= f
            pieces[key] = {"alone": {"time_s": a}, "sm": {"time_s": a * sm, "covered": True},
                           "ce": {"time_s": a * ce, "covered": True}}
        out[p["name"]] = {"pieces": pieces, "sequences": {}}
    return out


@pytest.fixture(scope="module")
def plan():
    return fp.make_plan(False, "H100-SXM")


def test_plan_has_the_16_table_i_shapes_with_every_schedules_pieces(plan):
    assert [p["name"] for p in plan] == [f"g{i}" for i in range(1, 17)]
    from ccoverlap.deciders.ficco.accuracy import PAPER_SCENARIOS

    for p, (_n, _par, _model, (m, n, k)) in zip(plan, PAPER_SCENARIOS):
        assert (p["m"] < p["k"]) == (m < k)          # scaling keeps the M-vs-K side (§IV-C1)
        assert 2 * p["m"] * p["n"] * p["k"] <= 4e12 * 1.05
        P = fp.WORLD
        M, N, K = p["m"], p["n"], p["k"]
        want = {f"gemm:{M}x{N}x{K}", f"gemm:{M // P}x{N}x{K}", f"gemm:{M // P // P}x{N}x{K}",
                f"gemm:{(P - 1) * M // P // P}x{N}x{K}", f"gemm:{M}x{N}x{K // P}", f"gemm:{M}x{N}x{K // P}+acc"}
        assert want <= set(p["pieces"])
        assert any(x.startswith("copy:") for x in p["pieces"])
        seq = p["sequences"]
        assert seq["serial"] == [f"gemm:{M}x{N}x{K}"]
        assert len(seq["hetero-unfused-1d"]) == 1 + P * (P - 1)
        assert seq["uniform-fused-2d"] == [f"gemm:{M}x{N}x{K // P}"] + [f"gemm:{M}x{N}x{K // P}+acc"] * (P - 1)


def test_piece_closures_compute_what_the_schedules_compute():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    M, N, K, P = 64, 24, 32, 8
    a = torch.randn(M, K, generator=g, dtype=torch.float64)
    b = torch.randn(K, N, generator=g, dtype=torch.float64)
    c = torch.full((M, N), float("nan"), dtype=torch.float64)
    # 2-D: first K/P columns plain, the rest accumulate -> with the same views it is A[:, :K/P] B[:K/P] * 1
    first = fp._piece_closure(torch, f"gemm:{M}x{N}x{K // P}", a, b, c)
    acc = fp._piece_closure(torch, f"gemm:{M}x{N}x{K // P}+acc", a, b, c)
    first()
    ref = a[:, :K // P] @ b[:K // P]
    assert torch.allclose(c, ref)
    acc()
    assert torch.allclose(c, 2 * ref)
    # row piece writes only its rows
    c.fill_(float("nan"))
    fp._piece_closure(torch, f"gemm:{M // P}x{N}x{K}", a, b, c)()
    assert torch.allclose(c[: M // P], a[: M // P] @ b) and torch.isnan(c[M // P:]).all()
    # copy moves BYTES (bytes / 2 bf16-sized elements)
    cp = fp._piece_closure(torch, "copy:64", a, b, c)
    cp()
    assert torch.equal(c.reshape(-1)[:32], a.reshape(-1)[:32])


def test_serial_composes_to_transfer_then_whole_gemm(plan):
    measured = synthetic(plan[:2])
    for p in plan[:2]:
        case = fp.case_for(p["name"], p["m"], p["n"], p["k"], "dma", "H100-SXM")
        ests = {e.schedule: e for e in fp.compose(case, measured[p["name"]]["pieces"], COST)}
        whole = measured[p["name"]]["pieces"][f"gemm:{p['m']}x{p['n']}x{p['k']}"]["alone"]["time_s"]
        comm = sum(COST.duration_s(op.spec) for op in schedule_graph(case, "serial").ops
                   if isinstance(op.spec, (CollectiveSpec, P2PSpec)))
        assert ests["serial"].time_s == pytest.approx(whole + comm)
        assert ests["serial"].cil_s == pytest.approx(0.0)
        assert set(ests) == set(SCHEDULES)
        # overlap schedules pay the traffic slowdown: with ce = 1.05 they run slower than with ce = 1
        calm = {e.schedule: e for e in fp.compose(case, synthetic([p], ce=1.0)[p["name"]]["pieces"], COST)}
        assert ests["uniform-fused-1d"].time_s > calm["uniform-fused-1d"].time_s
        assert ests["uniform-fused-1d"].cil_s > 0


def test_measured_cost_uses_traffic_times_only_beside_a_transfer():
    pieces = {"gemm:8x8x8": {"alone": {"time_s": 1.0}, "sm": {"time_s": 2.0}, "ce": {"time_s": 1.5}}}
    mc = fp.MeasuredCost(pieces, "ce", COST)
    g = GemmSpec(m=8, n=8, k=8)
    assert mc.duration_s(g, ()) == 1.0
    assert mc.duration_s(g, (MemorySpec(bytes=10.0),)) == 1.0
    assert mc.duration_s(g, (P2PSpec(bytes=1e6, inter_node=False, transport="dma"),)) == 1.5
    with pytest.raises(Exception, match="no measurement of piece gemm:9x8x8"):
        mc.duration_s(GemmSpec(m=9, n=8, k=8), ())


def test_analysis_judges_the_heuristic_and_retunes_on_the_declared_half(plan):
    # make the unfused per-piece GEMMs nearly free on M > K shapes: then hetero-unfused-1d is the
    # measured best there, which the default thresholds (uniform-fused-1d on these sizes) miss
    cheap = {lambda p, key: p["m"] > p["k"] and key.startswith(f"gemm:{p['m'] // 64}x"): 0.05}
    measured = synthetic(plan, override=cheap)
    res = fp.analyse(plan, measured, gpu="H100-SXM", calibration=None)
    for engine in ("sm", "dma"):
        r = res[engine]
        assert r["cases"] == 16 and len(r["rows"]) == 16
        big = [row for row in r["rows"] if row["m"] > row["k"]]
        assert all(row["best_ficco"] == "hetero-unfused-1d" for row in big)
        assert r["heuristic_matches"] == sum(v["match"] for v in r["verdicts"])
        rt = r["retune"]
        assert rt["train"] == list(fp.TRAIN) and set(rt["test"]) == {f"g{i}" for i in range(1, 17)} - set(fp.TRAIN)
        # the fit's grid holds the default constants, so it can only match more on its own half
        assert rt["train_retuned"]["matches"] >= rt["train_default"]["matches"]
        assert rt["test_retuned"]["matches"] > rt["test_default"]["matches"]
    doc = {"created": "t", "command": "c", "gpu": "H100-SXM", "device": {}, "settings": {}, "traffic": {},
           "plan": plan, "contention": fp.contention_table(plan, measured), "analysis": res}
    md = fp.markdown(doc)
    assert "(miss)" in md and "retune on g1, g2, g5, g6, g9, g10, g13, g14" in md
    assert "| g1 | gemm:" in md and "1.300" in md


def test_declared_halves_are_balanced():
    from ccoverlap.deciders.ficco.accuracy import PAPER_SCENARIOS

    train = [s for s in PAPER_SCENARIOS if s[0] in fp.TRAIN]
    test = [s for s in PAPER_SCENARIOS if s[0] not in fp.TRAIN]
    for half in (train, test):
        assert len(half) == 8
        assert sum(m < k for _n, _p, _mo, (m, _nn, k) in half) == 2
        assert {p for _n, p, _mo, _s in half} == {"SP+TP", "EP"}


def test_dry_run_and_usage_errors(tmp_path):
    out = _run("--dry-run", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "ficco_pieces.json").read_text())
    assert len(doc["plan"]) == 16 and "measured" not in doc
    assert "## Plan (dry run)" in (tmp_path / "ficco_pieces.md").read_text()
    bad = _run("--from-json", str(tmp_path / "ficco_pieces.json"), "--out", str(tmp_path / "b"))
    assert bad.returncode == 2 and "is not a ficco_pieces JSON file" in bad.stderr
    for args, needle in ((("--dry-run", "--calibration", "nope.json"), "--calibration: no such file"),
                         (("--from-json", "nope.json"), "--from-json: no such file"),
                         (("--dry-run", "--reps", "0"), "--reps")):
        r = _run(*args, "--out", str(tmp_path / "c"))
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_from_json_reanalyses_a_synthetic_run(tmp_path, plan):
    measured = synthetic(plan)
    doc = {"measured": measured, "device": {"name": "synthetic", "catalog_gpu": "H100-SXM"}, "settings": {},
           "traffic": {}, "full": False}
    src = tmp_path / "run.json"
    src.write_text(json.dumps(doc))
    out = _run("--from-json", str(src), "--out", str(tmp_path / "o"))
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "o" / "ficco_pieces.json").read_text())
    assert res["analysis"]["dma"]["cases"] == 16 and "retuned on 8 cases" in out.stdout


def test_measuring_without_cuda_says_so(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = _run("--out", str(tmp_path))
    assert out.returncode == 2 and "no CUDA GPU available" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.gpu
def test_pieces_measure_on_cuda(tmp_path, plan):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    small = [dict(p) for p in plan[:1]]
    measured, info, settings, traffic = fp.measure(small, device=None, reps=2, warmup=1, window_s=0.002, nc=16,
                                                   nt=512, chunk=512 * 1024, kernel_prefer="auto")
    pieces = measured["g1"]["pieces"]
    assert set(pieces) == set(small[0]["pieces"])
    for entry in pieces.values():
        assert entry["alone"]["time_s"] > 0 and entry["ce"]["time_s"] > 0
    assert traffic["ce"]["bytes_per_s"] > 1e11
    assert set(measured["g1"]["sequences"]) == set(SCHEDULES)


def test_an_engine_without_its_traffic_measured_is_skipped_not_faked(plan):
    measured = synthetic(plan[:16])
    for m in measured.values():
        for entry in m["pieces"].values():
            del entry["sm"]          # as when the channel-copy kernel could not be built
    res = fp.analyse(plan, measured, gpu="H100-SXM", calibration=None)
    assert res["sm"]["rows"] == [] and "no 'sm' traffic measured" in res["sm"]["skipped"]
    assert res["dma"]["cases"] == 16
    doc = {"created": "t", "command": "c", "gpu": "H100-SXM", "device": {}, "settings": {}, "traffic": {},
           "plan": plan, "contention": fp.contention_table(plan, measured), "analysis": res}
    assert "sm transfers: not analysed" in fp.markdown(doc)


def test_partial_file_of_a_cut_short_run_is_analysed_without_retune(tmp_path, plan):
    measured = synthetic(plan[:5])
    fp.write_partial(tmp_path / "p.json", measured, {"name": "synthetic", "catalog_gpu": "H100-SXM"},
                     {"cases_done": 5}, {}, False)
    out = _run("--from-json", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"))
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "o" / "ficco_pieces.json").read_text())
    assert res["analysis"]["dma"]["cases"] == 5 and res["analysis"]["dma"]["retune"] is None
