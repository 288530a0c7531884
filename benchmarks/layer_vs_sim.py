"""Compare a measured one-layer GPU trace, op by op, with what ``ccoverlap simulate`` predicts
for the same layer.

Reads ``DIR/trace/rank-0.json`` and ``DIR/layer.json`` as ``benchmarks/gpu_layer_trace.py``
writes them. Every GPU kernel of the profiled steps (``ProfilerStep#N``) is attributed to a
layer op: the kernel's ``correlation`` finds its launch (``cudaLaunchKernel`` /
``cuLaunchKernelEx``), the CPU ops around the launch on its thread give the ``record_function``
label (``layer.qkv`` ...), the aten op that launched it with its ``Input Dims`` and, in
backward, the autograd node (``autograd::engine::evaluate_function: MmBackward0``). Forward
GEMMs take their linear from the label; backward GEMMs are matched by shape to the forward
GEMMs (dgrad ``dY·W`` contracts over the output features, wgrad over the tokens; where the
shapes cannot tell - seq = hidden - the order autograd ran the two in the other linears of
the same trace decides). Attention kernels are those launched under an SDPA / flash op;
every other kernel (norms, activation, residual adds, copies, memsets) is ``other`` of its
pass.

The prediction is the simulator's own: the step of this layer's model on one GPU of the
catalog type (tp = 1, micro-batch = the trace's batch, its sequence length, no recompute,
framework profile ``torchtitan`` by default: eager PyTorch, composite RMSNorm, separate SiLU
and multiply, SDPA) is built and simulated as ``ccoverlap simulate`` does, and the ops of one
of its layers are mapped by name to the measured classes (``qkv`` -> qkv, ``proj`` ->
out_proj, ``mlp_fc1`` -> gate_up, ``mlp_fc2`` -> down, ``*_dgrad`` / ``*_wgrad``,
``attention`` / ``attention_bwd``, the rest ``other``). Predicted ops the measured layer does
not run (the profile's rotary embedding) are listed but left out of the comparable totals.

    python benchmarks/layer_vs_sim.py DIR [--calibration FILE] [--gpu NAME] [--out OUTDIR]

Writes OUTDIR/layer_vs_sim.md and OUTDIR/layer_vs_sim.json (default OUTDIR = DIR) and prints
the table. Bad input (missing files, a trace without GPU kernels, an unknown GPU, a bad
calibration file) -> one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ccoverlap.calibrate.microbench import catalog_gpu
from ccoverlap.catalog.hardware import get_cluster, get_gpu
from ccoverlap.catalog.models import get_model
from ccoverlap.cost import CostModel
from ccoverlap.errors import CCOverlapError
from ccoverlap.parallel.context import linear_kind
from ccoverlap.predict.evaluate import cost_model_for_cluster, simulate_workload
from ccoverlap.predict.workload import Workload
from ccoverlap.specs import GemmSpec
from ccoverlap.trace.columns import DEVICE_CAT_LIST
from ccoverlap.trace.load import load_trace

PROG = "layer_vs_sim"
LINEARS = ("qkv", "out_proj", "gate_up", "down")
LABELS = {f"layer.{n}": n for n in (*LINEARS, "attention", "attn_norm", "mlp_norm")}
SIM_LINEAR = {"qkv": "qkv", "proj": "out_proj", "fc1": "gate_up", "fc2": "down"}
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
            "aten::_scaled_mm")
ATTENTION_WORDS = ("attention", "flash", "sdpa")
BACKWARD_PREFIX = "autograd::engine::evaluate_function"
#: the classes in table order: (op, pass)
CLASSES = [(n, "fwd") for n in LINEARS] + [("attention", "fwd"), ("other", "fwd")] + \
    [(n, r) for n in LINEARS for r in ("dgrad", "wgrad")] + [("attention", "bwd"), ("other", "bwd")]
#: simulated ops the profiled layer does not run (gpu_layer_trace.py applies no rotary embedding)
NOT_IN_TRACE = ("rope", "rope_bwd")
PASS_OF = {"fwd": "fwd", "dgrad": "bwd", "wgrad": "bwd", "bwd": "bwd", "grad": "bwd"}


class InputError(Exception):
    """Bad input: one line for stderr."""


# ----------------------------------------------------------------------------- measured side

@dataclass
class Kernel:
    """One device event of a profiled step, attributed: ``op`` (a linear, ``attention``,
    ``other`` or ``unattributed``), ``role`` (``fwd``, ``dgrad``, ``wgrad``, ``bwd``, or
    ``grad`` when dgrad / wgrad could not be told apart), ``detail`` (the label / aten op /
    autograd node it came from), ``dims`` (the launching GEMM's ``Input Dims``)."""

    step: int
    name: str
    ts: float
    dur: float
    op: str
    role: str
    detail: str
    dims: list | None = None
    node: int = -1  # row of the autograd node (backward GEMMs of one node are resolved together)

    @property
    def pass_(self) -> str:
        return PASS_OF.get(self.role, "-")

    @property
    def shape(self) -> tuple[int, int, int] | None:
        """M×N×K of a GEMM from its two operands' dims [[M, K], [K, N]] (batched: the last two)."""
        d = self.dims
        if not d or len(d) < 2 or not all(isinstance(x, list) and len(x) >= 2 for x in d[:2]):
            return None
        a, b = d[0], d[1]
        m = int(np.prod(a[:-1])) if len(a) > 2 and len(b) == 2 else a[-2]
        return (m, b[-1], a[-1])


def load_layer(dir_: Path) -> tuple[dict, object]:
    """(layer.json, the trace loaded with every op's External id and shapes)."""
    if not dir_.is_dir():
        raise InputError(f"{dir_}: no such directory")
    meta_path, trace_path = dir_ / "layer.json", dir_ / "trace" / "rank-0.json"
    if not trace_path.is_file() and trace_path.with_suffix(".json.gz").is_file():
        trace_path = trace_path.with_suffix(".json.gz")  # a committed trace, compressed
    for p in (meta_path, trace_path):
        if not p.is_file():
            raise InputError(f"{p}: missing (DIR must hold layer.json and trace/rank-0.json "
                             f"as benchmarks/gpu_layer_trace.py writes them)")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{meta_path}: not readable JSON ({exc})") from None
    need = ("hidden", "heads", "kv_heads", "head_dim", "ffn", "seq", "batch")
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), int) or meta[k] < 1 for k in need):
        raise InputError(f"{meta_path}: needs positive integers {', '.join(need)}")
    raw = load_trace(trace_path, keep_op_args=True)
    if not np.any(raw.k_cat == DEVICE_CAT_LIST.index("kernel")):
        raise InputError(f"{trace_path}: the trace holds no GPU kernels (a CPU-only profile, device "
                         f"{meta.get('device', '?')!r}): nothing to compare; profile with --device cuda")
    return meta, raw


def _step_of(steps: list, t: float) -> int:
    for n, ts, dur, gpu in steps:
        if not gpu and ts <= t <= ts + dur:
            return n
    return -1


def _stack(raw, tid: int, t: float) -> list[int]:
    """Rows of the CPU ops on thread ``tid`` that contain time ``t``, outermost first."""
    rows = np.flatnonzero((raw.c_tid == tid) & (raw.c_ts <= t) & (raw.c_ts + raw.c_dur >= t))
    return sorted(rows.tolist(), key=lambda i: (raw.c_ts[i], -raw.c_dur[i]))


def _anchor(raw, k: int, launch_of: dict, op_of_ext: dict) -> tuple[int, float] | None:
    """(thread, time) on the CPU where kernel row ``k`` was launched: its launch event by
    correlation, else the CPU op with its External id."""
    li = launch_of.get(int(raw.k_corr[k]))
    if li is not None:
        return int(raw.l_tid[li]), float(raw.l_ts[li])
    ci = op_of_ext.get(int(raw.k_ext[k]))
    if ci is not None:
        return int(raw.c_tid[ci]), float(raw.c_ts[ci])
    return None


def classify(raw, k: int, stack: list[int]) -> tuple[str, str, str, list | None, int]:
    """(op, role, detail, GEMM dims, autograd-node row) of kernel row ``k`` launched inside ``stack``."""
    names = [raw.names[raw.c_nid[i]] for i in stack]
    ops = [(i, n) for i, n in zip(stack, names) if not raw.c_annot[i]]
    label = next((LABELS[n] for i, n in zip(stack, names) if raw.c_annot[i] and n in LABELS), None)
    node = next((i for i, n in ops if n.startswith(BACKWARD_PREFIX)), -1)
    role = "bwd" if node >= 0 else ("fwd" if label else "")
    if not role:
        return "unattributed", "-", names[-1] if names else "no CPU op", None, -1
    inner = ops[-1][1] if ops else (label or "")
    detail = raw.names[raw.c_nid[node]].split(": ", 1)[-1] if node >= 0 else f"layer.{label}"
    if any(w in n.lower() for _, n in ops for w in ATTENTION_WORDS):
        return "attention", role, detail, None, node
    if DEVICE_CAT_LIST[raw.k_cat[k]] == "kernel" and inner in GEMM_OPS:
        ai = raw.c_args[ops[-1][0]]
        dims = raw.infos[ai].get("Input Dims") if ai >= 0 else None
        if role == "fwd" and label in LINEARS:
            return label, "fwd", detail, dims, node
        if role == "bwd":
            return "gemm", "bwd", detail, dims, node
    return "other", role, f"{detail} / {inner or DEVICE_CAT_LIST[raw.k_cat[k]]}", None, node


def attribute(raw) -> list[Kernel]:
    """Every device event launched inside a ``ProfilerStep#N``, attributed (module doc)."""
    launch_of = {int(c): i for i, c in enumerate(raw.l_corr.tolist())}
    op_of_ext = {int(e): i for i, e in enumerate(raw.c_ext.tolist()) if e >= 0}
    if not raw.steps:
        raise InputError(f"{raw.path}: no ProfilerStep#N annotations: run the profiler with a schedule")
    out = []
    for k in range(len(raw.k_ts)):
        where = _anchor(raw, k, launch_of, op_of_ext)
        if where is None:
            continue
        step = _step_of(raw.steps, where[1])
        if step < 0:
            continue
        op, role, detail, dims, node = classify(raw, k, _stack(raw, *where))
        out.append(Kernel(step, raw.names[raw.k_nid[k]], float(raw.k_ts[k]), float(raw.k_dur[k]), op, role, detail,
                          dims, node))
    resolve_backward_gemms(out)
    return out


# ----------------------------------------------------------------------------- backward GEMMs

def forward_shapes(kernels: list[Kernel]) -> dict[str, tuple[int, int, int]]:
    """Per linear, the forward GEMM's (tokens T, output features N, input features K)."""
    out = {}
    for kn in kernels:
        if kn.role == "fwd" and kn.op in LINEARS and kn.shape:
            out.setdefault(kn.op, kn.shape)
    return out


def gemm_candidates(shape: tuple[int, int, int], fwd: dict) -> set[tuple[str, str]]:
    """(linear, role) a backward GEMM of ``shape`` (M, N, K) can be: dgrad ``dY[T,N]·W[N,K]``
    is M×N×K = T×K×N; wgrad ``dYᵀ·X`` is N×K×T (or ``Xᵀ·dY``: K×N×T)."""
    out = set()
    for lin, (t, n, k) in fwd.items():
        if shape == (t, k, n):
            out.add((lin, "dgrad"))
        if shape in ((n, k, t), (k, n, t)):
            out.add((lin, "wgrad"))
    return out


def resolve_backward_gemms(kernels: list[Kernel]) -> None:
    """Give each backward GEMM its linear and dgrad / wgrad role, in place (module doc)."""
    fwd = forward_shapes(kernels)
    nodes: dict[tuple[int, int], list[Kernel]] = {}
    for kn in kernels:
        if kn.op == "gemm":
            nodes.setdefault((kn.step, kn.node), []).append(kn)
    first_roles = []       # the role autograd ran first, in nodes where the shapes decide
    pending = []
    for group in nodes.values():
        cands = [gemm_candidates(kn.shape, fwd) if kn.shape else set() for kn in group]
        linears = set.intersection(*[{c[0] for c in cs} for cs in cands])
        lin = linears.pop() if len(linears) == 1 else None
        for kn in group:
            kn.op = lin or "other"
            kn.role = "grad" if lin else "bwd"
        if lin is None:
            continue
        roles = [{r for ln, r in cs if ln == lin} for cs in cands]
        if all(len(r) == 1 for r in roles):
            for kn, r in zip(group, roles):
                kn.role = next(iter(r))
        elif len(group) == 2 and any(len(r) == 1 for r in roles):
            one = next(i for i, r in enumerate(roles) if len(r) == 1)
            role = next(iter(roles[one]))
            group[one].role, group[1 - one].role = role, _other_role(role)
        elif len(group) == 2:
            pending.append(group)
            continue
        if len(group) == 2 and group[0].role != group[1].role:
            first_roles.append(group[0].role)
    if first_roles and len(set(first_roles)) == 1:
        for group in pending:
            group[0].role = first_roles[0]
            group[1].role = _other_role(first_roles[0])


def _other_role(role: str) -> str:
    return "wgrad" if role == "dgrad" else "dgrad"


# ----------------------------------------------------------------------------- measured tables

def measured_table(kernels: list[Kernel]) -> tuple[dict, dict, list[int]]:
    """(median µs per (op, pass-role) class over the steps, per-step totals, the steps)."""
    steps = sorted({kn.step for kn in kernels})
    per: dict[tuple[str, str], list[float]] = {}
    totals: dict[str, list[float]] = {k: [] for k in ("fwd_sum", "bwd_sum", "layer_sum", "busy_span",
                                                       "fwd_span", "bwd_span", "unattributed_sum")}
    for s in steps:
        ks = [kn for kn in kernels if kn.step == s]
        acc: dict[tuple[str, str], float] = {}
        for kn in ks:
            acc[(kn.op, kn.role)] = acc.get((kn.op, kn.role), 0.0) + kn.dur
        for key in set(acc) | set(per):
            per.setdefault(key, []).append(acc.get(key, 0.0))
        for p in ("fwd", "bwd"):
            sel = [kn for kn in ks if kn.pass_ == p]
            totals[f"{p}_sum"].append(sum(kn.dur for kn in sel))
            totals[f"{p}_span"].append(_span(sel))
        totals["layer_sum"].append(sum(kn.dur for kn in ks if kn.pass_ != "-"))
        totals["unattributed_sum"].append(sum(kn.dur for kn in ks if kn.pass_ == "-"))
        totals["busy_span"].append(_span(ks))
    med = {k: statistics.median(v + [0.0] * (len(steps) - len(v))) for k, v in per.items()}
    return med, {k: statistics.median(v) for k, v in totals.items()}, steps


def _span(ks: list[Kernel]) -> float:
    return max(kn.ts + kn.dur for kn in ks) - min(kn.ts for kn in ks) if ks else 0.0


def measured_shapes(kernels: list[Kernel]) -> dict[tuple[str, str], str]:
    """The GEMM shape (M×N×K as recorded) of each linear class."""
    out = {}
    for kn in kernels:
        if kn.op in LINEARS and kn.shape:
            out.setdefault((kn.op, kn.role), "×".join(map(str, kn.shape)))
    return out


def other_breakdown(kernels: list[Kernel], steps: list[int]) -> dict[str, float]:
    """Mean µs per step of the ``other`` and unattributed kernels, by where they came from
    (label or autograd node / launching op)."""
    acc: dict[str, float] = {}
    for kn in kernels:
        if kn.op in ("other", "unattributed"):
            key = f"{kn.pass_} {kn.detail}"
            acc[key] = acc.get(key, 0.0) + kn.dur
    return {k: v / len(steps) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}


# ----------------------------------------------------------------------------- predicted side

def gpu_name_for(meta: dict, override: str | None) -> str:
    """The catalog GPU: ``--gpu`` (checked against the catalog), else recognised from the device name."""
    if override:
        try:
            return get_gpu(override).name
        except CCOverlapError as exc:
            raise InputError(str(exc)) from None
    name = catalog_gpu(str(meta.get("device", "")))
    if name is None:
        raise InputError(f"device {meta.get('device')!r} of layer.json is not a GPU of the catalog; "
                         f"name one with --gpu (e.g. H100-SXM, H200)")
    return name


def layer_workload(meta: dict, gpu: str, framework: str) -> Workload:
    """The layer's model (the catalog Llama-3-8B when the dimensions are its own, else one with
    the trace's dimensions) on one GPU: tp = dp = pp = 1, micro-batch = batch, no recompute."""
    base = get_model("llama-3-8b")
    dims = {"hidden": meta["hidden"], "heads": meta["heads"], "kv_heads": meta["kv_heads"],
            "head_dim": meta["head_dim"], "ffn_hidden": meta["ffn"]}
    if all(getattr(base, k) == v for k, v in dims.items()):
        model = base.name
    else:
        model = {**asdict(base), **dims, "name": f"layer {meta['hidden']}/{meta['ffn']}", "layers": 2}
    cluster = asdict(get_cluster(gpu))
    cluster.update(name=f"one {gpu}", gpu=gpu, nodes=1, gpus_per_node=1)
    dtype = meta.get("dtype", "bfloat16")
    return Workload(model=model, cluster=cluster, tp=1, pp=1, dp=1, global_batch=meta["batch"],
                    micro_batch=meta["batch"], seq_len=meta["seq"], recompute="none", framework=framework,
                    dtype=dtype if dtype in ("bfloat16", "float16", "float32") else None)


def sim_class(name: str, phase: str) -> tuple[str, str]:
    """The measured class (op, role) of a simulated op of a dense layer, by its name."""
    for role in ("dgrad", "wgrad"):
        if name.endswith("_" + role):
            lin = SIM_LINEAR.get(linear_kind(name.removesuffix("_" + role)))
            return (lin, role) if lin else ("other", "bwd")
    lin = SIM_LINEAR.get(linear_kind(name))
    if lin and phase == "fwd":
        return lin, "fwd"
    if name in ("attention", "attention_bwd"):
        return "attention", phase
    return "other", phase


def predict(w: Workload, calibration: str | None, clock: float | None = None) -> dict:
    """Simulate the step as ``ccoverlap simulate`` does; the ops of one layer (layer 1) with
    their simulated µs, class and spec, and the layer's simulated forward / backward spans.
    ``clock`` overrides the parameters' ``sustained_clock_fraction`` (a few profiled steps run
    at the clock of short loops, 1, not at the one a long run settles at)."""
    cost = cost_model_for_cluster(w.cluster, calibration)
    if clock is not None:
        cost = CostModel(w.cluster, cost.params.with_overrides(sustained_clock_fraction=clock))
    step, tl = simulate_workload(w, cost=cost)
    layer = 1 if w.model.layers > 1 else 0
    ops, spans = [], {}
    for o in step.graph.ops:
        if o.layer != layer or o.microbatch != 0 or o.phase not in ("fwd", "bwd"):
            continue
        i = o.op_id
        assert tl.name[i] == o.name, "timeline rows follow the graph's op ids"
        start, end = float(tl.start_s[i]), float(tl.end_s[i])
        op, role = sim_class(o.name, o.phase)
        spec = o.spec
        shape = f"{spec.m}×{spec.n}×{spec.k}" if isinstance(spec, GemmSpec) else ""
        ops.append({"name": o.name, "phase": o.phase, "op": op, "role": role, "us": (end - start) * 1e6,
                    "alone_us": cost.alone_s(spec) * 1e6, "shape": shape, "spec": repr(spec)})
        lo, hi = spans.get(o.phase, (start, end))
        spans[o.phase] = (min(lo, start), max(hi, end))
    span_us = {p: (hi - lo) * 1e6 for p, (lo, hi) in spans.items()}
    return {"layer": layer, "ops": ops, "fwd_span_us": span_us.get("fwd", 0.0), "bwd_span_us": span_us.get("bwd", 0.0),
            "step_time_us": float(np.max(tl.end_s) - np.min(tl.start_s)) * 1e6}


# ----------------------------------------------------------------------------- comparison

def _err(pred: float | None, meas: float | None) -> float | None:
    return pred / meas - 1.0 if pred is not None and meas else None


def compare(kernels: list[Kernel], predictions: dict[str, dict]) -> dict:
    """Rows per class and the totals block: measured µs (median over steps) against each
    prediction (``default`` and, when given, ``calibrated``)."""
    med, tot, steps = measured_table(kernels)
    shapes = measured_shapes(kernels)
    keys = CLASSES + sorted(k for k in med if k not in CLASSES)
    rows = []
    for op, role in keys:
        row = {"op": op, "pass": role, "shape": shapes.get((op, role), ""), "measured_us": med.get((op, role))}
        for tag, pr in predictions.items():
            sim = [o for o in pr["ops"] if (o["op"], o["role"]) == (op, role) and o["name"] not in NOT_IN_TRACE]
            row[f"{tag}_us"] = sum(o["us"] for o in sim) if sim else None
            row[f"{tag}_ops"] = [o["name"] for o in sim]
            row[f"{tag}_shape"] = ", ".join(o["shape"] for o in sim if o["shape"])
            row[f"{tag}_err"] = _err(row[f"{tag}_us"], row["measured_us"])
        if row["measured_us"] is not None or any(row.get(f"{t}_us") is not None for t in predictions):
            rows.append(row)
    totals = {"measured": tot, "steps": steps}
    for tag, pr in predictions.items():
        comparable = {p: sum(o["us"] for o in pr["ops"] if o["phase"] == p and o["name"] not in NOT_IN_TRACE)
                      for p in ("fwd", "bwd")}
        totals[tag] = {"fwd_sum_us": comparable["fwd"], "bwd_sum_us": comparable["bwd"],
                       "layer_sum_us": comparable["fwd"] + comparable["bwd"],
                       "fwd_span_us": pr["fwd_span_us"], "bwd_span_us": pr["bwd_span_us"],
                       "layer_span_us": pr["fwd_span_us"] + pr["bwd_span_us"],
                       "not_in_trace_us": sum(o["us"] for o in pr["ops"] if o["name"] in NOT_IN_TRACE)}
    return {"rows": rows, "totals": totals, "other_measured": other_breakdown(kernels, steps),
            "other_predicted": {tag: {o["name"]: o["us"] for o in pr["ops"] if o["op"] == "other"}
                                for tag, pr in predictions.items()}}


def _us(x) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def totals_lines(doc: dict) -> list[tuple[str, float, dict]]:
    """(what, measured µs, {tag: predicted µs}) of the totals block."""
    m, t = doc["comparison"]["totals"]["measured"], doc["comparison"]["totals"]
    tags = [k for k in ("default", "calibrated") if k in t]
    pick = lambda key: {tag: t[tag][key] for tag in tags}  # noqa: E731
    return [("forward, kernel sum", m["fwd_sum"], pick("fwd_sum_us")),
            ("backward, kernel sum", m["bwd_sum"], pick("bwd_sum_us")),
            ("layer, kernel sum", m["layer_sum"], pick("layer_sum_us")),
            ("forward, GPU busy span", m["fwd_span"], pick("fwd_span_us")),
            ("backward, GPU busy span", m["bwd_span"], pick("bwd_span_us")),
            ("layer, GPU busy span", m["busy_span"], pick("layer_span_us"))]


def markdown(doc: dict) -> str:
    """The report: per-class table, totals, the ``other`` breakdown, provenance."""
    tags = [k for k in ("default", "calibrated") if k in doc["comparison"]["totals"]]
    head = "| op | pass | shape M×N×K | measured µs |" + "".join(
        f" {t} µs | {t} error |" for t in tags)
    lines = [f"# One {doc['layer']} layer: measured kernels vs `ccoverlap simulate`", "",
             f"Trace: {doc['device']} (catalog GPU {doc['gpu']}), torch {doc['torch']}, "
             f"{doc['dtype']}, seq {doc['seq']} × batch {doc['batch']}; steps {doc['steps']} "
             f"(median per step). Prediction: framework profile `{doc['framework']}`, layer "
             f"{doc['predicted']['default']['layer']} of the simulated one-GPU step"
             + (f"; calibration `{doc['calibration']}`" if doc.get("calibration") else "") + ".",
             "", "error = predicted / measured − 1.", "", head,
             "|" + "---|" * (4 + 2 * len(tags))]
    for r in doc["comparison"]["rows"]:
        shape = r["shape"] or r.get("default_shape", "")
        lines.append(f"| {r['op']} | {r['pass']} | {shape} | {_us(r['measured_us'])} |" + "".join(
            f" {_us(r.get(f'{t}_us'))} | {_pct(r.get(f'{t}_err'))} |" for t in tags))
    lines += ["", "## Totals", "", "| total | measured µs |" + "".join(f" {t} µs | {t} error |" for t in tags),
              "|" + "---|" * (2 + 2 * len(tags))]
    for what, m, pred in totals_lines(doc):
        lines.append(f"| {what} | {_us(m)} |" + "".join(f" {_us(pred[t])} | {_pct(_err(pred[t], m))} |"
                                                         for t in tags))
    t = doc["comparison"]["totals"]
    lines += ["", f"Predicted spans are the simulator's timeline of the layer (its forward and backward "
                  f"ops run back to back on one GPU); measured spans run from the first kernel's start to "
                  f"the last one's end. Kernels outside the layer's ops: "
                  f"{_us(t['measured']['unattributed_sum'])} µs per step. Predicted ops the profiled layer "
                  f"does not run ({', '.join(NOT_IN_TRACE)}): {_us(t['default']['not_in_trace_us'])} µs, "
                  f"left out of the sums, inside the spans.", "", "## `other`, measured (µs per step)", ""]
    lines += [f"- {k}: {_us(v)}" for k, v in doc["comparison"]["other_measured"].items()]
    lines += ["", "## `other`, predicted (default parameters, µs)", ""]
    lines += [f"- {k}: {_us(v)}" + (" (not in the profiled layer)" if k in NOT_IN_TRACE else "")
              for k, v in doc["comparison"]["other_predicted"]["default"].items()]
    return "\n".join(lines) + "\n"


def print_summary(doc: dict, out=sys.stdout) -> None:
    """The per-class table and totals, within 80 columns."""
    tags = [k for k in ("default", "calibrated") if k in doc["comparison"]["totals"]]
    out.write(f"{doc['device']} (catalog {doc['gpu']}), torch {doc['torch']}, steps {doc['steps']}\n")
    out.write(f"{'op':<10} {'pass':<6} {'measured':>10}" + "".join(f" {t[:10]:>10} {'err':>7}" for t in tags) + "\n")
    for r in doc["comparison"]["rows"]:
        out.write(f"{r['op']:<10} {r['pass']:<6} {_us(r['measured_us']):>10}" + "".join(
            f" {_us(r.get(f'{t}_us')):>10} {_pct(r.get(f'{t}_err')):>7}" for t in tags) + "\n")
    for what, m, pred in totals_lines(doc):
        out.write(f"{what:<25} {_us(m):>10}" + "".join(f" {_us(pred[t]):>10} {_pct(_err(pred[t], m)):>7}"
                                                       for t in tags) + "\n")
    out.write("(µs; error = predicted / measured - 1)\n")


# ----------------------------------------------------------------------------- command line

def run(args: argparse.Namespace) -> dict:
    """Load, attribute, predict, compare; returns the JSON document."""
    meta, raw = load_layer(Path(args.dir))
    kernels = attribute(raw)
    if not any(kn.op != "unattributed" for kn in kernels):
        raise InputError(f"{raw.path}: no GPU kernel was launched inside the layer's labelled ops "
                         f"(layer.* record_function ranges) of a ProfilerStep")
    gpu = gpu_name_for(meta, args.gpu)
    w = layer_workload(meta, gpu, args.framework)
    predictions = {"default": predict(w, None)}
    if args.calibration:
        predictions["calibrated"] = predict(w, args.calibration, args.sustained_clock)
    return {"layer": meta.get("layer", "decoder"), "device": meta.get("device", "?"), "gpu": gpu,
            "torch": meta.get("torch", "?"), "dtype": meta.get("dtype", "?"), "seq": meta["seq"],
            "batch": meta["batch"], "framework": args.framework, "calibration": args.calibration,
            "workload": w.describe(), "steps": sorted({kn.step for kn in kernels}),
            "predicted": predictions, "comparison": compare(kernels, predictions),
            "kernels": [asdict(kn) for kn in kernels]}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="layer_vs_sim.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="folder holding trace/rank-0.json and layer.json (gpu_layer_trace.py --out)")
    ap.add_argument("--calibration", help="a calibration file (ccoverlap calibrate) to predict with as well")
    ap.add_argument("--sustained-clock", type=float, default=None, metavar="F",
                    help="sustained_clock_fraction of the calibrated prediction (default: the file's; 1 for a "
                         "trace of a few steps, which runs at the clock of short loops)")
    ap.add_argument("--gpu", help="catalog GPU to predict for (default: recognised from layer.json's device)")
    ap.add_argument("--framework", default="torchtitan",
                    help="framework profile of the prediction (default torchtitan: eager PyTorch, as profiled)")
    ap.add_argument("--out", help="folder for layer_vs_sim.md / .json (default: DIR)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        doc = run(args)
    except (InputError, CCOverlapError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or args.dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "layer_vs_sim.md").write_text(markdown(doc))
        (out / "layer_vs_sim.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    except OSError as exc:
        print(f"{PROG}: cannot write to {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print_summary(doc)
    print(f"wrote {out / 'layer_vs_sim.md'} and {out / 'layer_vs_sim.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
