"""benchmarks/gpu_gemm_vs_model.py without a GPU: the shape set (TP-sharded Llama-3 layer GEMMs,
none of them measured by the calibration fit), the error table and summary on synthetic
measurements, --from-json re-prediction with a calibration file, and its usage errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_scripts import BENCH, ROOT, load_script

from ccoverlap.calibrate import grids
from ccoverlap.cost.compute import split_gemm
from ccoverlap.specs import GemmSpec

SCRIPT = BENCH / "gpu_gemm_vs_model.py"
gg = load_script("gpu_gemm_vs_model")


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_no_shape_of_the_sweep_is_measured_by_the_calibration_fit():
    shapes, dropped = gg.sweep()
    fit = set()
    for quick in (False, True):
        fit |= {(m, n, k) for _d, m, n, k in grids.gemm_sweep(quick)}
        for _name, m, n, k, _s in grids.ficco_shapes(grids.make_grid(quick)):
            fit.add((m, n, k))
            for dim in ("m", "k"):
                for ways in (8, 64):
                    fit |= {(p.m, p.n, p.k) for p in split_gemm(GemmSpec(m=m, n=n, k=k), ways, dim)}
    assert not {(s.m, s.n, s.k) for s in shapes} & fit
    # the fit does measure some layer GEMMs (e.g. 4096^3): those are the dropped ones, and only those
    assert dropped and all((d["m"], d["n"], d["k"]) in fit for d in dropped)
    assert (4096, 4096, 4096) in {(d["m"], d["n"], d["k"]) for d in dropped}


def test_sweep_covers_every_model_tp_token_layer_and_pass():
    shapes, dropped = gg.sweep()
    seen = {(lb["model"], lb["tp"], lb["tokens"], lb["layer"], lb["pass"]) for s in shapes for lb in s.labels}
    seen |= {(d["model"], d["tp"], d["tokens"], d["layer"], d["pass"]) for d in dropped}
    want = {(m, tp, t, layer, p) for m in ("Llama-3-8B", "Llama-3-70B") for tp in (1, 2, 4, 8)
            for t in (1024, 2048, 4096, 8192, 16384) for layer in gg.LAYERS for p in ("fwd", "dgrad", "wgrad")}
    assert seen == want
    assert len(shapes) > 400
    # small and skinny shapes of TP-sharded layers are there: 8B out-proj at TP 8 has K = 512
    assert any(min(s.m, s.n, s.k) == 512 for s in shapes)
    assert len({s.key() for s in shapes}) == len(shapes)


def test_layer_shapes_follow_the_model_catalog_and_megatron_sharding():
    lin8 = gg.layer_linears("Llama-3-8B", 8)
    assert lin8["qkv"] == (4096, (32 + 2 * 8) * 128 // 8)      # 768 columns per rank
    assert lin8["out_proj"] == (4096 // 8, 4096)
    assert gg.layer_linears("Llama-3-70B", 4)["mlp_up"] == (8192, 2 * 28672 // 4)
    assert gg.layer_linears("Llama-3-70B", 2)["mlp_down"] == (28672 // 2, 8192)
    assert gg.pass_gemm(2048, 4096, 768, "fwd") == (2048, 768, 4096)
    assert gg.pass_gemm(2048, 4096, 768, "dgrad") == (2048, 4096, 768)
    assert gg.pass_gemm(2048, 4096, 768, "wgrad") == (768, 4096, 2048)


def test_errors_and_group_summary_on_synthetic_measurements():
    shapes, dropped = gg.sweep(models=("Llama-3-8B",), tps=(8,), tokens=(1024, 2048))
    variants = {"default": gg.params_for("H100-SXM", None)}
    # measured = predicted / (1 + e), with e = +20 % for wgrad GEMMs and -10 % for the rest
    measured = {}
    for s in shapes:
        e = 0.2 if s.labels[0]["pass"] == "wgrad" else -0.1
        measured[s.key()] = {"time_s": gg.predict_s(s, *variants["default"]) / (1 + e), "samples_s": [], "iters": 1}
    doc = gg.build_doc(shapes, dropped, measured, variants, gpu_name="H100-SXM", calibration=None, device={},
                       settings={}, command="test")
    by = {s["group"]: s for s in doc["summary"]["default"]}
    assert by["all"]["n"] == len(shapes)
    assert by["pass=wgrad"]["mean_abs_err"] == pytest.approx(0.2)
    assert by["pass=fwd"]["worst_abs_err"] == pytest.approx(0.1)
    n_w = by["pass=wgrad"]["n"]
    assert by["all"]["mean_abs_err"] == pytest.approx((0.2 * n_w + 0.1 * (len(shapes) - n_w)) / len(shapes))
    assert by["all"]["worst_abs_err"] == pytest.approx(0.2)
    for r in doc["rows"]:
        assert r["err_default"] == pytest.approx(0.2 if r["labels"][0]["pass"] == "wgrad" else -0.1)
    md = gg.markdown(doc)
    assert "| all | %d | " % len(shapes) in md and "+20.0%" in md and "-10.0%" in md


def test_dry_run_writes_predictions_and_no_measurement(tmp_path):
    out = _run("--dry-run", "--out", str(tmp_path), "--models", "Llama-3-8B", "--tp", "8", "--tokens", "1024")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "gemm_vs_model.json").read_text())
    assert doc["rows"] and all(r["measured_s"] is None and r["predicted_default_s"] > 0 for r in doc["rows"])
    assert (tmp_path / "gemm_vs_model.md").read_text().startswith("# GEMM times")
    # a dry run's file cannot be re-predicted: one line, exit 2
    again = _run("--from-json", str(tmp_path / "gemm_vs_model.json"), "--out", str(tmp_path / "b"))
    assert again.returncode == 2 and "holds no measured times" in again.stderr
    assert "Traceback" not in again.stderr and len(again.stderr.strip().splitlines()) == 1


def test_from_json_repredicts_with_a_calibration_file(tmp_path):
    shapes, dropped = gg.sweep(models=("Llama-3-70B",), tps=(1,), tokens=(8192,))
    variants = {"default": gg.params_for("H100-SXM", None)}
    measured = {s.key(): {"time_s": gg.predict_s(s, *variants["default"]), "samples_s": [1.0], "iters": 3}
                for s in shapes}
    doc = gg.build_doc(shapes, dropped, measured, variants, gpu_name="H100-SXM", calibration=None,
                       device={"name": "synthetic", "catalog_gpu": "H100-SXM"}, settings={}, command="t")
    src = tmp_path / "run.json"
    src.write_text(json.dumps(doc))
    base = variants["default"][1].gemm_peak_fraction
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"version": 1, "gpu": "H100-SXM", "params": {"gemm_peak_fraction": base / 2}}))
    out = _run("--from-json", str(src), "--calibration", str(cal), "--out", str(tmp_path / "o"),
               "--models", "Llama-3-70B", "--tp", "1", "--tokens", "8192")
    assert out.returncode == 0, out.stderr
    res = json.loads((tmp_path / "o" / "gemm_vs_model.json").read_text())
    big = max(res["rows"], key=lambda r: r["flops"])
    assert big["err_default"] == pytest.approx(0.0, abs=1e-12)
    assert big["err_calibrated"] > 0.5   # half the peak: the large compute-bound GEMM is predicted ~2x slower
    assert "calibrated parameters" in out.stdout


@pytest.mark.parametrize("args,needle", [
    (("--dry-run", "--calibration", "no/such.json"), "--calibration: no such file"),
    (("--dry-run", "--gpu", "H999"), "H999"),
    (("--dry-run", "--tp", "3"), "not divisible by TP 3"),
    (("--dry-run", "--tokens", "a,b"), "--tokens"),
    (("--from-json", "no/such.json"), "--from-json: no such file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    out = _run(*args, "--out", str(tmp_path))
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_measuring_without_cuda_says_so(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = _run("--out", str(tmp_path), "--tp", "8", "--tokens", "1024")
    assert out.returncode == 2 and "no CUDA GPU available" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.gpu
def test_small_sweep_measures_on_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = _run("--out", str(tmp_path), "--models", "Llama-3-8B", "--tp", "8", "--tokens", "1024", "--reps", "3")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "gemm_vs_model.json").read_text())
    assert doc["device"]["name"] and all(r["measured_s"] > 0 for r in doc["rows"])
    assert all(len(r["samples_s"]) == 3 for r in doc["rows"])


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_layout_closure_computes_the_product(layout):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ccoverlap.calibrate import grids as G
    from ccoverlap.calibrate import microbench as mb

    bench = mb.Bench(mb.require_cuda(None), G.make_grid(quick=True))
    shape = gg.Shape(384, 256, 512, layout, ())
    captured = {}
    real = torch.matmul

    def spy(a, b, out):
        captured.update(a=a, b=b, out=out)
        return real(a, b, out=out)

    fn = gg.make_layout_gemm(bench, shape)
    torch.matmul = spy
    try:
        fn()
    finally:
        torch.matmul = real
    a, b, c = captured["a"], captured["b"], captured["out"]
    assert tuple(a.shape) == (384, 512) and tuple(b.shape) == (512, 256) and tuple(c.shape) == (384, 256)
    assert a.is_contiguous() == (layout != "tn") and b.is_contiguous() == (layout != "nt")
    ref = a.double() @ b.double()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
def test_graph_and_eager_timing_agree_on_a_large_gemm():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    big = gg.Shape(4096, 28672, 4096, "nt", ())
    small = gg.Shape(1024, 512, 4096, "nn", ())
    g, _info, _s = gg.measure([big, small], device=None, reps=5, warmup=2, window_s=0.003, timing="graph", log=print)
    e, _info, _s = gg.measure([big, small], device=None, reps=5, warmup=2, window_s=0.003, timing="eager", log=print)
    assert g[big.key()]["timing"] == "graph" and e[big.key()]["timing"] == "eager"
    print({k: (g[k]["time_s"], e[k]["time_s"]) for k in g})
    assert g[big.key()]["time_s"] == pytest.approx(e[big.key()]["time_s"], rel=0.15)
    assert g[small.key()]["time_s"] <= 1.1 * e[small.key()]["time_s"]   # no host launch cost in a replay


def test_partial_file_of_a_cut_short_run_is_read_back(tmp_path):
    shapes, _ = gg.sweep(models=("Llama-3-8B",), tps=(8,), tokens=(1024,))
    done = {s.key(): {"time_s": 1e-5 * (i + 1), "samples_s": [1e-5], "iters": 10, "timing": "graph"}
            for i, s in enumerate(shapes[:5])}
    gg.write_partial(tmp_path / "p.json", done, {"name": "synthetic", "catalog_gpu": "H100-SXM"}, "graph")
    out = _run("--from-json", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"),
               "--models", "Llama-3-8B", "--tp", "8", "--tokens", "1024")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "o" / "gemm_vs_model.json").read_text())
    measured = [r for r in doc["rows"] if r["measured_s"] is not None]
    assert len(measured) == 5 and all(r["timing"] == "graph" for r in measured)
    assert doc["summary"]["default"][0]["n"] == 5
