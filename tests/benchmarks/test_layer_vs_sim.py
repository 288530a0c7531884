"""benchmarks/layer_vs_sim.py on a hand-made Kineto trace of a tiny layer (two profiled steps):
the attribution of every kernel, the table's measured medians, that the predictions are the
simulator's own op times, and the error paths (a CPU-only trace among them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_scripts import BENCH, ROOT, load_script

from ccoverlap.catalog.hardware import get_cluster
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.predict.evaluate import cost_model_for_cluster, simulate_workload
from ccoverlap.specs import GemmSpec

lvs = load_script("layer_vs_sim")
SCRIPT = BENCH / "layer_vs_sim.py"
# seq = hidden: out_proj's dgrad and wgrad have the same shape, so autograd's order decides
META = {"layer": "tiny", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "seq": 64,
        "batch": 1, "dtype": "bfloat16", "device": "NVIDIA H200", "torch": "2.11.0+cu130", "steps": 2}
T, H, QKV = 64, 64, (4 + 2 * 2) * 16
# each kernel starts this long after its launch call: kernels on the stream run in launch order
QUEUE_US = 400.0


class Trace:
    """Builds the events: CPU ops on thread 1 (forward) / 2 (autograd), launches with a
    correlation id and the kernel each launches (stream 7)."""

    def __init__(self):
        self.events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]
        self.corr = 100

    def op(self, name, ts, dur, tid=1, cat="cpu_op", **args):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                            "args": {"External id": len(self.events), **args}})

    def launch(self, ts, dur, tid=1, name="kern", cat="kernel"):
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                            "ts": ts, "dur": 1, "args": {"correlation": self.corr, "External id": 0}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts + QUEUE_US, "dur": dur,
                            "args": {"correlation": self.corr, "External id": 0, "stream": 7, "device": 0}})

    def mm(self, ts, dims, kdur, tid=1):
        self.op("aten::mm", ts, 10, tid, **{"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2})
        self.launch(ts + 5, kdur, tid, name="nvjet_gemm")


def step(tr: Trace, s: float, qkv_us: float) -> None:
    """One step at ``s``: the forward under the layer.* labels, the backward on the autograd thread."""
    tr.op(f"ProfilerStep#{int(s // 1000) + 1}", s, 900, cat="user_annotation")
    tr.op("layer.attn_norm", s + 10, 20, cat="user_annotation")
    tr.op("aten::pow", s + 12, 10)
    tr.launch(s + 15, 2.0)                                     # other fwd
    tr.op("layer.qkv", s + 40, 30, cat="user_annotation")
    tr.mm(s + 45, [[T, H], [H, QKV]], qkv_us)                            # qkv fwd
    tr.op("aten::zero_", s + 56, 3)
    tr.launch(s + 57, 0.5, cat="gpu_memset", name="Memset")   # other fwd (a memset)
    tr.op("layer.attention", s + 80, 30, cat="user_annotation")
    tr.op("aten::scaled_dot_product_attention", s + 82, 20)
    tr.op("aten::_flash_attention_forward", s + 84, 10)
    tr.launch(s + 86, 10.0, name="flash_fwd")                  # attention fwd
    tr.op("layer.out_proj", s + 120, 40, cat="user_annotation")
    tr.mm(s + 122, [[T, H], [H, H]], 4.0)                               # out_proj fwd
    tr.op("aten::add", s + 140, 10)
    tr.launch(s + 142, 1.0)                                    # other fwd (residual add)
    tr.op("aten::fill_", s + 170, 10)
    tr.launch(s + 172, 0.25)                                   # outside the labels
    b = s + 300
    tr.op("autograd::engine::evaluate_function: MmBackward0", b, 40, tid=2)
    tr.mm(b + 2, [[H, T], [T, H]], 8.0, tid=2)                          # out_proj: wgrad (first)
    tr.mm(b + 20, [[T, H], [H, H]], 9.0, tid=2)                         # out_proj: dgrad
    tr.op("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0", b + 50, 30, tid=2)
    tr.op("aten::_flash_attention_backward", b + 52, 20, tid=2)
    tr.launch(b + 55, 20.0, tid=2, name="flash_bwd")          # attention bwd
    tr.op("autograd::engine::evaluate_function: MmBackward0", b + 90, 40, tid=2)
    tr.mm(b + 92, [[QKV, T], [T, H]], 11.0, tid=2)                      # qkv wgrad (contracts over T)
    tr.mm(b + 110, [[T, QKV], [QKV, H]], 12.0, tid=2)                   # qkv dgrad (over QKV)
    tr.op("autograd::engine::evaluate_function: PowBackward0", b + 140, 20, tid=2)
    tr.op("aten::mul", b + 142, 10, tid=2)
    tr.launch(b + 145, 3.0, tid=2)                             # other bwd


def layer_dir(tmp_path, *, kernels=True, meta=META):
    tr = Trace()
    step(tr, 0.0, 5.0)
    step(tr, 1000.0, 7.0)
    tr.launch(5000, 99.0)                                         # after the profiled steps
    events = tr.events if kernels else [e for e in tr.events if e.get("cat") not in ("kernel", "gpu_memset")]
    d = tmp_path / "layer"
    (d / "trace").mkdir(parents=True)
    (d / "trace" / "rank-0.json").write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    (d / "layer.json").write_text(json.dumps(meta))
    return d


def rows_of(doc):
    return {(r["op"], r["pass"]): r for r in doc["comparison"]["rows"]}


def test_every_kernel_is_attributed_to_its_layer_op(tmp_path):
    _, raw = lvs.load_layer(layer_dir(tmp_path))
    kernels = lvs.attribute(raw)
    assert sorted({k.step for k in kernels}) == [1, 2]          # the kernel after the steps is left out
    got = sorted((k.step, k.op, k.role, k.dur) for k in kernels)
    want = []
    for s, q in ((1, 5.0), (2, 7.0)):
        want += [(s, "other", "fwd", 2.0), (s, "qkv", "fwd", q), (s, "other", "fwd", 0.5),
                 (s, "attention", "fwd", 10.0), (s, "out_proj", "fwd", 4.0), (s, "other", "fwd", 1.0),
                 (s, "unattributed", "-", 0.25), (s, "out_proj", "wgrad", 8.0), (s, "out_proj", "dgrad", 9.0),
                 (s, "attention", "bwd", 20.0), (s, "qkv", "wgrad", 11.0), (s, "qkv", "dgrad", 12.0),
                 (s, "other", "bwd", 3.0)]
    assert got == sorted(want)
    qkv_fwd = next(k for k in kernels if (k.op, k.role) == ("qkv", "fwd"))
    assert qkv_fwd.shape == (T, QKV, H)


def test_the_table_holds_the_medians_and_the_simulators_op_times(tmp_path):
    d = layer_dir(tmp_path)
    assert lvs.main([str(d), "--out", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "layer_vs_sim.json").read_text())
    rows = rows_of(doc)
    measured = {k: r["measured_us"] for k, r in rows.items()}
    assert measured == {("qkv", "fwd"): 6.0, ("out_proj", "fwd"): 4.0, ("attention", "fwd"): 10.0,
                        ("other", "fwd"): 3.5, ("out_proj", "dgrad"): 9.0, ("out_proj", "wgrad"): 8.0,
                        ("qkv", "dgrad"): 12.0, ("qkv", "wgrad"): 11.0, ("attention", "bwd"): 20.0,
                        ("other", "bwd"): 3.0, ("gate_up", "fwd"): None, ("down", "fwd"): None,
                        ("gate_up", "dgrad"): None, ("gate_up", "wgrad"): None, ("down", "dgrad"): None,
                        ("down", "wgrad"): None, ("unattributed", "-"): 0.25}
    m = doc["comparison"]["totals"]["measured"]
    assert m["fwd_sum"] == pytest.approx(3.5 + 6 + 10 + 4) and m["bwd_sum"] == pytest.approx(63.0)
    assert m["unattributed_sum"] == 0.25
    # the prediction is the simulator's: the same workload simulated here gives the same op times
    w = lvs.layer_workload(META, "H200", "torchtitan")
    step, tl = simulate_workload(w)
    sim = {o.name: (tl.end_s[o.op_id] - tl.start_s[o.op_id]) * 1e6 for o in step.graph.ops
           if o.layer == 1 and o.microbatch == 0}
    assert rows[("qkv", "fwd")]["default_us"] == pytest.approx(sim["qkv"])
    assert rows[("out_proj", "wgrad")]["default_us"] == pytest.approx(sim["proj_wgrad"])
    assert rows[("attention", "bwd")]["default_us"] == pytest.approx(sim["attention_bwd"])
    assert rows[("other", "fwd")]["default_us"] == pytest.approx(sim["attn_norm"] + sim["mlp_norm"] + sim["mlp_act"])
    # ... which is the cost model's time of the GEMM alone (one GPU, nothing beside it)
    cost = cost_model_for_cluster(get_cluster("H200"))
    assert sim["qkv"] == pytest.approx(cost.alone_s(GemmSpec(m=T, n=QKV, k=H, host_kernels=1)) * 1e6)
    err = rows[("qkv", "fwd")]["default_err"]
    assert err == pytest.approx(sim["qkv"] / 6.0 - 1)
    md = (tmp_path / "out" / "layer_vs_sim.md").read_text()
    assert f"| qkv | fwd | {T}×{QKV}×{H} | 6.0 |" in md and "torch 2.11.0+cu130" in md and "NVIDIA H200" in md


def test_calibration_changes_the_prediction_as_the_cost_model_does(tmp_path):
    cal = tmp_path / "cal.json"
    # the tiny layer's kernels are host-bound: the eager dispatch floor is what a calibration moves
    cal.write_text(json.dumps({"params": {"eager_host_overhead_s": 2e-5}}))
    d = layer_dir(tmp_path)
    assert lvs.main([str(d), "--calibration", str(cal), "--out", str(tmp_path / "o")]) == 0
    doc = json.loads((tmp_path / "o" / "layer_vs_sim.json").read_text())
    r = rows_of(doc)[("qkv", "fwd")]
    params = CostParams.load(cal, base=default_params(get_cluster("H200").gpu))
    want = cost_model_for_cluster(get_cluster("H200"), str(cal)).alone_s(GemmSpec(m=T, n=QKV, k=H, host_kernels=1))
    assert params.eager_host_overhead_s == 2e-5
    assert r["calibrated_us"] == pytest.approx(want * 1e6) and r["calibrated_us"] != pytest.approx(r["default_us"])
    assert "| calibrated µs |" in (tmp_path / "o" / "layer_vs_sim.md").read_text()


def test_sustained_clock_overrides_the_calibrations_clock_share(tmp_path):
    # Llama-3-8B's layer (compute-bound GEMMs): a calibration with a sustained share of 0.5 makes
    # the GEMMs twice as long; judged at the clock of a short trace (clock=1) they are as by default
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"params": {"sustained_clock_fraction": 0.5}}))
    meta = {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "ffn": 14336, "seq": 4096, "batch": 1,
            "dtype": "bfloat16"}
    w = lvs.layer_workload(meta, "H200", "torchtitan")

    def gate_up(pred):
        return sum(o["us"] for o in pred["ops"] if o["op"] == "gate_up" and o["role"] == "fwd")

    default, half, one = lvs.predict(w, None), lvs.predict(w, str(cal)), lvs.predict(w, str(cal), clock=1.0)
    assert gate_up(one) == pytest.approx(gate_up(default))
    assert gate_up(half) == pytest.approx(2 * gate_up(default), rel=0.05)
    assert lvs.parse_args([str(tmp_path), "--sustained-clock", "1"]).sustained_clock == 1.0


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("case, words", [
    ("missing", "no such directory"),
    ("no-kernels", "no GPU kernels"),
    ("unknown-device", "not a GPU of the catalog"),
    ("bad-gpu", "unknown GPU"),
    ("bad-meta", "needs positive integers"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case, words):
    if case == "missing":
        args = [tmp_path / "nothing"]
    elif case == "no-kernels":
        args = [layer_dir(tmp_path, kernels=False)]
    elif case == "unknown-device":
        args = [layer_dir(tmp_path, meta={**META, "device": "NVIDIA GeForce RTX 4090"})]
    elif case == "bad-gpu":
        args = [layer_dir(tmp_path), "--gpu", "B999"]
    else:
        args = [layer_dir(tmp_path, meta={**META, "seq": "long"})]
    p = _run(*args, "--out", tmp_path / "out")
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and words in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_cpu_only_trace_of_the_profiler_script_is_refused(tmp_path):
    pytest.importorskip("torch")
    made = subprocess.run([sys.executable, str(BENCH / "gpu_layer_trace.py"), "--out", str(tmp_path / "cpu"),
                           "--device", "cpu", "--small", "--steps", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    p = _run(tmp_path / "cpu")
    assert p.returncode == 2 and "no GPU kernels" in p.stderr and p.stderr.count("\n") == 1
