"""Held-out check of the cost model's GEMM time on a real GPU.

Times cuBLAS GEMMs (``torch.matmul`` into a preallocated output, bf16, CUDA events, median of
several repetitions, :class:`ccoverlap.calibrate.microbench.Bench`) on shapes that
``ccoverlap calibrate`` does NOT measure: the GEMMs of a TP-sharded Llama-3-8B / 70B layer
(QKV, attention out-projection, MLP gate+up, MLP down; Megatron column/row parallel) at
TP 1/2/4/8 and 1k-16k tokens, forward and both backward GEMMs, each in the operand layout
``F.linear`` and its backward use. Each measured time is compared with
:func:`ccoverlap.cost.compute.gemm_time_s` under the GPU's default ``CostParams`` and, with
``--calibration FILE``, under a calibration file; error = predicted / measured - 1.

    python3 benchmarks/gpu_gemm_vs_model.py --out DIR [--calibration FILE]   # on a CUDA GPU
    python3 benchmarks/gpu_gemm_vs_model.py --dry-run [--gpu H100-SXM]       # shapes + model only
    python3 benchmarks/gpu_gemm_vs_model.py --from-json DIR/gemm_vs_model.json \\
        --calibration calibrations/h100-sxm.json --out DIR2                    # re-predict, no GPU

Writes ``gemm_vs_model.json`` (every shape: measured samples, predictions, errors) and
``gemm_vs_model.md`` (per-shape table and mean / worst |error| per group) into ``--out``;
while measuring, ``gemm_vs_model.partial.json`` every 50 shapes (``--from-json`` reads it).
Bad input (unknown GPU, unreadable calibration or JSON) -> one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ccoverlap.calibrate import grids
from ccoverlap.catalog.hardware import get_gpu
from ccoverlap.catalog.models import get_model
from ccoverlap.cost.compute import gemm_time_s, split_gemm
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.errors import CCOverlapError, ConfigError
from ccoverlap.specs import GemmSpec

MODELS = ("Llama-3-8B", "Llama-3-70B")
TPS = (1, 2, 4, 8)
TOKENS = (1024, 2048, 4096, 8192, 16384)
LAYERS = ("qkv", "out_proj", "mlp_up", "mlp_down")
PASSES = ("fwd", "dgrad", "wgrad")
# operand layout of each pass, as torch.matmul sees it: F.linear computes x @ W.T ("nt": B is a
# transposed view of the [out, in] weight), dgrad dY @ W ("nn"), wgrad dY.T @ X ("tn").
LAYOUT = {"fwd": "nt", "dgrad": "nn", "wgrad": "tn"}
FILE_STEM = "gemm_vs_model"


@dataclass(frozen=True)
class Shape:
    """One GEMM of the sweep: ``C[m, n] = A[m, k] @ B[k, n]`` (elements), bf16, in ``layout``;
    ``labels`` names every (model, tp, tokens, layer, pass) that runs this exact GEMM."""

    m: int
    n: int
    k: int
    layout: str
    labels: tuple[dict, ...]

    @property
    def flops(self) -> float:
        """2·M·N·K floating-point operations."""
        return 2.0 * self.m * self.n * self.k

    def key(self) -> str:
        """``MxNxK/layout``: names the shape in tables and JSON."""
        return f"{self.m}x{self.n}x{self.k}/{self.layout}"


def layer_linears(model_name: str, tp: int) -> dict[str, tuple[int, int]]:
    """(in, out) features per TP rank of the four linear layers of one transformer layer of
    ``model_name`` (catalog :mod:`ccoverlap.catalog.models`) under Megatron tensor parallelism ``tp``:
    QKV and MLP gate+up column-parallel (out / tp), out-projection and MLP down row-parallel
    (in / tp). The gated MLP's gate and up projections are one fused GEMM."""
    m = get_model(model_name)
    hd = m.head_dim or m.hidden // m.heads
    qkv = (m.heads + 2 * m.kv_heads) * hd
    up = (2 if m.gated_mlp else 1) * m.ffn_hidden
    for name, size in (("heads", m.heads), ("kv_heads", m.kv_heads), ("ffn_hidden", m.ffn_hidden)):
        if size % tp:
            raise ConfigError(f"{model_name}: {name}={size} is not divisible by TP {tp}")
    return {"qkv": (m.hidden, qkv // tp), "out_proj": (m.heads * hd // tp, m.hidden),
            "mlp_up": (m.hidden, up // tp), "mlp_down": (m.ffn_hidden // tp, m.hidden)}


def pass_gemm(tokens: int, fin: int, fout: int, which: str) -> tuple[int, int, int]:
    """(M, N, K) of a linear layer's GEMM: ``fwd`` Y[T, out] = X[T, in] W^T, ``dgrad``
    dX[T, in] = dY[T, out] W, ``wgrad`` dW[out, in] = dY^T X (K = tokens)."""
    if which == "fwd":
        return tokens, fout, fin
    if which == "dgrad":
        return tokens, fin, fout
    if which == "wgrad":
        return fout, fin, tokens
    raise ConfigError(f"unknown pass {which!r}; expected one of {PASSES}")


def fit_shapes() -> set[tuple[int, int, int]]:
    """(M, N, K) of every GEMM ``ccoverlap calibrate`` times (full and quick plans): the
    ``gemm`` sweep of :func:`ccoverlap.calibrate.grids.gemm_sweep` in every dtype, and the
    pieces of the scaled ficco GEMMs split 8- and 64-way (``gemm_split``), whole ones too.
    Train and held-out records alike: none of them may appear in this sweep."""
    out = {(m, n, k) for quick in (False, True) for _dt_, m, n, k in grids.gemm_sweep(quick)}
    for quick in (False, True):
        for _name, m, n, k, _s in grids.ficco_shapes(grids.make_grid(quick)):
            out.add((m, n, k))
            for dim in ("m", "k"):
                for ways in (8, 64):
                    out.update((p.m, p.n, p.k) for p in split_gemm(GemmSpec(m=m, n=n, k=k), ways, dim))
    return out


def sweep(models=MODELS, tps=TPS, tokens=TOKENS) -> tuple[list[Shape], list[dict]]:
    """The shapes to time (duplicates merged, their labels kept) and the labelled GEMMs left
    out because the calibration fit measures that (M, N, K)."""
    fit = fit_shapes()
    by_key: dict[tuple, list[dict]] = {}
    dropped = []
    for model in models:
        for tp in tps:
            lin = layer_linears(model, tp)
            for t in tokens:
                for layer in LAYERS:
                    for which in PASSES:
                        m, n, k = pass_gemm(t, *lin[layer], which)
                        label = {"model": model, "tp": tp, "tokens": t, "layer": layer, "pass": which}
                        if (m, n, k) in fit:
                            dropped.append({**label, "m": m, "n": n, "k": k})
                            continue
                        by_key.setdefault((m, n, k, LAYOUT[which]), []).append(label)
    shapes = [Shape(m, n, k, lay, tuple(lbls)) for (m, n, k, lay), lbls in by_key.items()]
    shapes.sort(key=lambda s: (s.flops, s.key()))
    return shapes, dropped


# ----------------------------------------------------------------------------- predictions

def params_for(gpu_name: str, calibration: str | None) -> tuple[object, CostParams]:
    """(catalog GPU, CostParams): the GPU's defaults, overridden by ``calibration`` if given
    (as ``ccoverlap plan --calibration`` does). ConfigError on an unknown GPU or bad file."""
    gpu = get_gpu(gpu_name)
    params = default_params(gpu)
    if calibration:
        if not Path(calibration).is_file():
            raise ConfigError(f"--calibration: no such file: {calibration}")
        params = CostParams.load(calibration, base=params)
    return gpu, params


def predict_s(shape: Shape, gpu, params: CostParams) -> float:
    """The cost model's seconds for one bf16 GEMM of ``shape`` (lagom eqs. 4-6; the model has
    no operand-layout term, so all layouts get the same prediction)."""
    return gemm_time_s(GemmSpec(m=shape.m, n=shape.n, k=shape.k, dtype_bytes=2), gpu, params)


def rows_for(shapes: list[Shape], measured: dict[str, dict] | None, variants: dict[str, tuple]) -> list[dict]:
    """One row per shape: its labels, measured median seconds (None in a dry run) with samples,
    and per variant (``default``, ``calibrated``) the predicted seconds and
    ``err_<variant>`` = predicted / measured - 1."""
    rows = []
    for s in shapes:
        meas = (measured or {}).get(s.key())
        row = {"shape": s.key(), "m": s.m, "n": s.n, "k": s.k, "layout": s.layout, "flops": s.flops,
               "labels": list(s.labels), "measured_s": meas["time_s"] if meas else None,
               "samples_s": meas.get("samples_s") if meas else None, "iters": meas.get("iters") if meas else None,
               "timing": meas.get("timing") if meas else None}
        if meas and meas.get("note"):
            row["note"] = meas["note"]
        for name, (gpu, params) in variants.items():
            p = predict_s(s, gpu, params)
            row[f"predicted_{name}_s"] = p
            row[f"err_{name}"] = (p / row["measured_s"] - 1.0) if row["measured_s"] else None
        rows.append(row)
    return rows


def size_class(flops: float) -> str:
    """Coarse GEMM size bucket by FLOPs (tables group by it)."""
    for lim, name in ((1e10, "<1e10 flop"), (1e11, "1e10-1e11 flop"), (1e12, "1e11-1e12 flop")):
        if flops < lim:
            return name
    return ">=1e12 flop"


def groups_of(row: dict) -> list[str]:
    """Group names a row belongs to: ``all``, each model / tp / layer / pass it is labelled
    with (a merged shape can belong to several), its layout and its size class."""
    out = {"all", f"layout={row['layout']}", f"size {size_class(row['flops'])}"}
    for lbl in row["labels"]:
        out.update({f"model={lbl['model']}", f"tp={lbl['tp']}", f"layer={lbl['layer']}", f"pass={lbl['pass']}"})
    return sorted(out)


def summarize(rows: list[dict], variant: str) -> list[dict]:
    """Per group: n, mean and worst |err_<variant>| and the worst shape (rows without a
    measurement are skipped). ``all`` first, then sorted by name."""
    acc: dict[str, list[tuple[float, str]]] = {}
    for r in rows:
        e = r.get(f"err_{variant}")
        if e is None:
            continue
        for g in groups_of(r):
            acc.setdefault(g, []).append((abs(e), r["shape"]))
    out = []
    for g in sorted(acc, key=lambda g: (g != "all", g)):
        errs = acc[g]
        worst = max(errs)
        out.append({"group": g, "n": len(errs), "mean_abs_err": sum(e for e, _ in errs) / len(errs),
                    "worst_abs_err": worst[0], "worst_shape": worst[1]})
    return out


# ----------------------------------------------------------------------------- tables

def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.4f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def markdown(doc: dict) -> str:
    """The Markdown report: header (device, settings, command), the summary per variant, and
    the per-shape table."""
    rows, variants = doc["rows"], doc["variants"]
    lines = [f"# GEMM times: measured vs the cost model ({doc.get('device', {}).get('name', 'no device: dry run')})",
             "", f"- created: {doc['created']}", f"- command: `{doc['command']}`",
             f"- catalog GPU for predictions: {doc['gpu']}; calibration: {doc.get('calibration') or 'none'}",
             f"- shapes: {len(rows)} (left out, measured by the calibration fit: {len(doc.get('dropped', []))})",
             f"- timing: {doc.get('settings', {})}", ""]
    for v in variants:
        summ = doc["summary"].get(v) or []
        if not summ:
            continue
        lines += [f"## |error| per group, {v} parameters", "",
                  "| group | n | mean abs err | worst abs err | worst shape |", "| :-- | --: | --: | --: | :-- |"]
        lines += [f"| {s['group']} | {s['n']} | {s['mean_abs_err'] * 100:.1f}% | {s['worst_abs_err'] * 100:.1f}% | "
                  f"{s['worst_shape']} |" for s in summ]
        lines.append("")
    head = "| shape (MxNxK/layout) | GFLOP | used by | measured ms |" + "".join(
        f" {v} ms | {v} err |" for v in variants)
    lines += ["## Per shape", "", head, "| :-- | --: | :-- | --: |" + " --: | --: |" * len(variants)]
    for r in rows:
        used = "; ".join(sorted({f"{lb['model'].split('-')[-1]} tp{lb['tp']} {lb['layer']} {lb['pass']}"
                                 for lb in r["labels"]}))
        if len(used) > 60:
            used = used[:57] + "..."
        cells = "".join(f" {_ms(r[f'predicted_{v}_s'])} | {_pct(r[f'err_{v}'])} |" for v in variants)
        lines.append(f"| {r['shape']} | {r['flops'] / 1e9:.1f} | {used} | {_ms(r['measured_s'])} |{cells}")
    return "\n".join(lines) + "\n"


def print_summary(doc: dict, out=sys.stdout) -> None:
    """Short plain-text summary: per variant the ``all``, pass and tp groups."""
    for v in doc["variants"]:
        summ = doc["summary"].get(v) or []
        if not summ:
            continue
        print(f"{v} parameters: |predicted/measured - 1| per group", file=out)
        for s in summ:
            if s["group"] == "all" or s["group"].startswith(("pass=", "tp=", "size")):
                print(f"  {s['group']:<22} n={s['n']:<4} mean {s['mean_abs_err'] * 100:5.1f}%  "
                      f"worst {s['worst_abs_err'] * 100:5.1f}% ({s['worst_shape']})", file=out)


def build_doc(shapes, dropped, measured, variants, *, gpu_name, calibration, device, settings, command) -> dict:
    """The JSON document: rows with predictions and errors, summary per variant."""
    rows = rows_for(shapes, measured, variants)
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {"tool": "benchmarks/gpu_gemm_vs_model.py", "created": created,
            "command": command, "gpu": gpu_name, "calibration": calibration, "device": device or {},
            "settings": settings, "variants": list(variants), "dropped": dropped, "rows": rows,
            "summary": {v: summarize(rows, v) for v in variants}}


def write_outputs(doc: dict, out_dir: str) -> list[Path]:
    """Write ``gemm_vs_model.json`` and ``.md`` into ``out_dir`` (created); returns the paths."""
    from ccoverlap.calibrate.fileformat import write_result_files

    return write_result_files(doc, out_dir, FILE_STEM, markdown(doc))


# ----------------------------------------------------------------------------- measuring
def require_gpu(device: str | None):
    """The CUDA device to measure on, or a one-line ConfigError that points to the no-GPU modes."""
    from ccoverlap.calibrate import microbench as mb

    return mb.require_cuda(device, offline_hint="--dry-run or --from-json")


def make_layout_gemm(bench, shape: Shape):
    """A closure running ``C = A @ B`` for ``shape`` in its layout on random bf16 operands:
    ``nt`` B a transposed view of an [N, K] tensor, ``tn`` A a transposed view of a [K, M]
    tensor, ``nn`` both contiguous. Operands stay warm in L2 between calls, as in the
    calibration's GEMM sweep."""
    torch = bench.torch
    dt, dev = torch.bfloat16, bench.dev
    m, n, k = shape.m, shape.n, shape.k
    a = torch.randn(k, m, device=dev, dtype=dt).t() if shape.layout == "tn" else torch.randn(m, k, device=dev, dtype=dt)
    b = torch.randn(n, k, device=dev, dtype=dt).t() if shape.layout == "nt" else torch.randn(k, n, device=dev, dtype=dt)
    c = torch.empty(m, n, device=dev, dtype=dt)
    return lambda: torch.matmul(a, b, out=c)


def measure(shapes: list[Shape], *, device: str | None, reps: int, warmup: int, window_s: float,
            timing: str = "graph", log=print, checkpoint=None) -> tuple[dict[str, dict], dict, dict]:
    """Time every shape on the CUDA device: ``warmup`` untimed and ``reps`` timed repetitions
    (median) of loops lasting at least ``window_s``, either replays of a CUDA graph of the
    calls (``timing="graph"``, ``Bench.time_kernels``; falls back to eager for a shape whose capture
    fails, and says so in its record) or an eager loop (``"eager"``, ``Bench.time_loop``, as
    ``ccoverlap calibrate`` times its GEMM sweep). Returns (measured per shape key, device
    info, settings)."""
    from ccoverlap.calibrate import microbench as mb

    dev = require_gpu(device)
    info = mb.device_info(dev)
    grid = replace(grids.make_grid(quick=True), reps=reps, warmup=warmup, min_window_s=window_s)
    bench = mb.Bench(dev, grid)
    oom = getattr(bench.torch.cuda, "OutOfMemoryError", RuntimeError)
    out: dict[str, dict] = {}
    t0 = time.perf_counter()
    for i, s in enumerate(shapes):
        if i % 25 == 0:
            log(f"[{time.perf_counter() - t0:6.1f}s] gemm {i + 1}/{len(shapes)}: {s.key()}")
        try:
            fn = make_layout_gemm(bench, s)
            if timing == "graph":
                out[s.key()] = bench.time_kernels(fn)
            else:
                out[s.key()] = {**bench.time_loop(fn), "timing": "eager"}
        except oom:
            log(f"  {s.key()}: out of memory, skipped")
        bench.torch.cuda.empty_cache()
        if checkpoint is not None and (i + 1) % 50 == 0:
            checkpoint(out, info)
    settings = {"reps": reps, "warmup": warmup, "min_window_s": window_s, "dtype": "bf16", "timing": timing,
                "allow_tf32": info.get("allow_tf32"), "seconds": round(time.perf_counter() - t0, 1)}
    return out, info, settings


def write_partial(path: Path, measured: dict[str, dict], info: dict, timing: str) -> None:
    """The shapes measured so far, in the rows format :func:`load_measured` reads (a run cut
    short by a time limit keeps them; ``--from-json`` re-predicts them)."""
    rows = [{"shape": k, "measured_s": v["time_s"], "samples_s": v.get("samples_s"), "iters": v.get("iters"),
             "timing": v.get("timing")} for k, v in measured.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, "device": info, "settings": {"timing": timing, "partial": True}}) + "\n")


def load_measured(path: str) -> tuple[dict[str, dict], dict, dict]:
    """Measured times, device and settings from an earlier run's JSON (``--from-json``)."""
    try:
        doc = json.loads(Path(path).read_text())
        measured = {r["shape"]: {"time_s": float(r["measured_s"]), "samples_s": r.get("samples_s"),
                                 "iters": r.get("iters"), "timing": r.get("timing")}
                    for r in doc["rows"] if r.get("measured_s") is not None}
    except FileNotFoundError:
        raise ConfigError(f"--from-json: no such file: {path}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--from-json: {path} is not a gemm_vs_model JSON file "
                          f"({type(exc).__name__}: {exc})") from None
    if not measured:
        raise ConfigError(f"--from-json: {path} holds no measured times (a dry run?)")
    return measured, doc.get("device") or {}, doc.get("settings") or {}


def parse_args(argv=None) -> argparse.Namespace:
    """The command-line options (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="ccoverlap-out/gpu", help="folder for gemm_vs_model.json/.md")
    ap.add_argument("--calibration", help="calibration file (ccoverlap calibrate) for the second prediction")
    ap.add_argument("--gpu", help="catalog GPU of the predictions (default: recognised from the device; "
                                  "H100-SXM in a dry run)")
    ap.add_argument("--device", help="CUDA device (cuda, cuda:N)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: list the shapes and the model's predictions")
    ap.add_argument("--from-json", metavar="FILE", help="re-predict the measured times of an earlier run (no GPU)")
    ap.add_argument("--models", default=",".join(MODELS), help="catalog models (comma-separated)")
    ap.add_argument("--tp", default=",".join(map(str, TPS)), help="TP degrees (comma-separated)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="tokens per micro-batch (comma-separated)")
    ap.add_argument("--timing", choices=("graph", "eager"), default="graph",
                    help="graph: replay a CUDA graph of the calls (kernel time, no host launch cost; default); "
                         "eager: a Python loop of launches, as calibrate times its sweep")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per shape (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed repetitions per shape")
    ap.add_argument("--window-ms", type=float, default=3.0, help="each timed loop lasts at least this long")
    return ap.parse_args(argv)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--{what}: expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ConfigError(f"--{what}: expected positive integers, got {text!r}")
    return vals


def run(args: argparse.Namespace) -> dict:
    """Do what the arguments say; returns the JSON document (also written to ``--out``)."""
    if args.reps < 1 or args.warmup < 0 or args.window_ms <= 0:
        raise ConfigError("--reps must be >= 1, --warmup >= 0 and --window-ms > 0")
    if args.dry_run and args.from_json:
        raise ConfigError("--dry-run and --from-json exclude each other")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    shapes, dropped = sweep(models, _ints(args.tp, "tp"), _ints(args.tokens, "tokens"))
    command = "python3 benchmarks/gpu_gemm_vs_model.py " + " ".join(sys.argv[1:])
    measured, device, settings = None, {}, {}
    if args.from_json:
        measured, device, settings = load_measured(args.from_json)
    elif not args.dry_run:
        # check the GPU's catalog entry and the calibration file before spending GPU time
        from ccoverlap.calibrate import microbench as mb

        found = mb.device_info(require_gpu(args.device)).get("catalog_gpu")
        if not (args.gpu or found):
            raise ConfigError("this GPU is not in the catalog; pass --gpu NAME (the closest catalog entry)")
        params_for(args.gpu or found, args.calibration)
        partial = Path(args.out) / f"{FILE_STEM}.partial.json"
        measured, device, settings = measure(shapes, device=args.device, reps=args.reps, warmup=args.warmup,
                                             window_s=args.window_ms / 1e3, timing=args.timing,
                                             checkpoint=lambda m, info: write_partial(partial, m, info, args.timing))
    gpu_name = args.gpu or device.get("catalog_gpu") or "H100-SXM"
    if not args.gpu and device and not device.get("catalog_gpu"):
        raise ConfigError(f"GPU {device.get('name')!r} is not in the catalog; pass --gpu NAME")
    variants = {"default": params_for(gpu_name, None)}
    if args.calibration:
        variants["calibrated"] = params_for(gpu_name, args.calibration)
    return build_doc(shapes, dropped, measured, variants, gpu_name=gpu_name, calibration=args.calibration,
                     device=device, settings=settings, command=command)


def main(argv=None) -> int:
    """Run, write the outputs, print a summary; 0, or 2 with one line on stderr for bad input."""
    args = parse_args(argv)
    try:
        doc = run(args)
        paths = write_outputs(doc, args.out)
    except CCOverlapError as exc:
        sys.stderr.write(f"gpu_gemm_vs_model: error: {exc}\n")
        return 2
    if not (args.dry_run or args.from_json):
        (Path(args.out) / f"{FILE_STEM}.partial.json").unlink(missing_ok=True)
    rows = doc["rows"]
    if args.dry_run:
        print(f"{len(rows)} shapes (dry run; {len(doc['dropped'])} labelled GEMMs left out: the fit measures them)")
        for r in rows:
            print(f"  {r['shape']:<26} {r['flops'] / 1e9:9.1f} GFLOP  default {r['predicted_default_s'] * 1e3:.4f} ms")
    print_summary(doc)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
