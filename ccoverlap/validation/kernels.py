"""Judge the compute cost model on the kernel corpus: predicted vs measured kernel times.

Each row of a corpus table of kind ``gemm``, ``attention`` or ``memory``
(:mod:`ccoverlap.corpus.tables`) is turned into the cost model's spec (:class:`GemmSpec`,
:class:`AttentionSpec`, :class:`MemorySpec`) and predicted on the table's catalog GPU with that
GPU's default parameters (or ``params_for``). Error = predicted / measured − 1.

Rows with ``timing: kernel`` hold kernel *durations* (profiler / CUPTI): the gap between one
kernel's end and the next one's start is not in them, so the prediction compared is the model's
time less ``kernel_gap_s`` per kernel. Rows with ``timing: graph`` (CUDA-graph replays) include it.

Attention rows name a ``backend`` (``fa2``, ``fa3``, ``cudnn``, ``efficient``, ``math``), a
``direction`` (``fwd`` / ``bwd``), ``causal`` (0/1), ``batch``, ``heads``, ``kv_heads``, ``seq``
and ``head_dim``; their FLOPs and bytes are counted as :mod:`ccoverlap.parallel.flash` counts them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccoverlap.catalog.hardware import GPUSpec, get_gpu
from ccoverlap.corpus.tables import Table, load_kind
from ccoverlap.cost.compute import attention_time_s, gemm_time_s, memory_time_s
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.errors import ConfigError
from ccoverlap.specs import AttentionSpec, GemmSpec, MemorySpec

#: The kernel classes judged, in print order (the corpus kinds of the same names).
CLASSES = ("gemm", "attention", "memory")
#: Memory rows' ``pattern``: ``stream`` (a vectorised grid-stride element-wise kernel),
#: ``rowwise`` (one thread block per token row, one pass over it: rotary, activation),
#: ``rowwise-twopass`` (a norm that reads its row for the reduction, then again to normalise).
MEMORY_PATTERNS = ("stream", "rowwise", "rowwise-twopass")


@dataclass(frozen=True)
class KernelRow:
    """One measured kernel against its prediction."""

    table: str
    gpu: str
    kind: str
    label: str
    measured_s: float
    predicted_s: float
    split: str

    @property
    def error(self) -> float:
        """predicted / measured − 1."""
        return self.predicted_s / self.measured_s - 1.0


@dataclass
class ClassSummary:
    """Errors of one (GPU, class) or (table) group: count, median and mean |error|, mean signed."""

    n: int
    median_abs: float
    mean_abs: float
    mean_signed: float
    worst: float
    tables: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "median_abs_error": self.median_abs, "mean_abs_error": self.mean_abs,
                "mean_signed_error": self.mean_signed, "worst_error": self.worst, "tables": self.tables}


def _summary(rows: list[KernelRow]) -> ClassSummary:
    errs = [r.error for r in rows]
    absd = [abs(e) for e in errs]
    return ClassSummary(n=len(rows), median_abs=statistics.median(absd), mean_abs=sum(absd) / len(absd),
                        mean_signed=sum(errs) / len(errs), worst=max(errs, key=abs),
                        tables=sorted({r.table for r in rows}))


def attention_spec(row: dict[str, Any]) -> AttentionSpec:
    """The :class:`AttentionSpec` of a corpus attention row (FLOPs: 4·b·s²·h·d forward, halved
    when causal; backward 2.5×; bytes: Q, K, V, O (and their gradients backward) once)."""
    b, h, kv, s, d = (int(row[c]) for c in ("batch", "heads", "kv_heads", "seq", "head_dim"))
    causal = bool(int(row["causal"]))
    bwd = str(row["direction"]) == "bwd"
    fwd_flops = 4.0 * b * s * s * h * d * (0.5 if causal else 1.0)
    el = 2
    nbytes = el * d * b * s * ((4 * h + 4 * kv) if bwd else (2 * h + 2 * kv)) + 4.0 * b * s * h
    return AttentionSpec(flops=fwd_flops * (2.5 if bwd else 1.0), bytes=nbytes, dtype_bytes=el, backward=bwd,
                         kernel=str(row["backend"]), causal_len=s if causal else 0,  # type: ignore[arg-type]
                         heads=b * h, seq=s, head_dim=d)


def predict_row(kind: str, row: dict[str, Any], gpu: GPUSpec, p: CostParams) -> tuple[float, str]:
    """``(predicted seconds comparable to the row's time, label)`` of one corpus row."""
    if kind == "gemm":
        spec = GemmSpec(m=int(row["m"]), n=int(row["n"]), k=int(row["k"]), batch=int(row.get("batch", 1)),
                        dtype_bytes=int(row.get("dtype_bytes", 2)))
        t, kernels, label = gemm_time_s(spec, gpu, p), 1, f"{spec.batch}x{spec.m}x{spec.n}x{spec.k}"
    elif kind == "memory":
        pattern = str(row.get("pattern", "stream"))
        if pattern not in MEMORY_PATTERNS:
            raise ConfigError(f"memory row pattern must be one of {MEMORY_PATTERNS}, got {pattern!r}")
        rowwise = float(row["bytes"]) if pattern != "stream" else 0.0
        # a two-pass norm reads its input (half of the read + written bytes) a second time
        mspec = MemorySpec(bytes=float(row["bytes"]), kernels=int(row.get("kernels", 1)), rowwise_bytes=rowwise,
                           rows=int(row.get("tokens", 0)) if rowwise else 0,
                           reread_bytes=rowwise / 2.0 if pattern == "rowwise-twopass" else 0.0)
        t, kernels, label = memory_time_s(mspec, gpu, p), mspec.kernels, f"{row.get('op', '')} {row['bytes']:.0f} B"
    elif kind == "attention":
        aspec = attention_spec(row)
        t, kernels = attention_time_s(aspec, gpu, p), 1
        label = (f"{row['backend']} {row['direction']} b{int(row['batch'])} h{int(row['heads'])} "
                 f"s{int(row['seq'])} d{int(row['head_dim'])}{' causal' if int(row['causal']) else ''}")
    else:
        raise ConfigError(f"kernel class must be one of {CLASSES}, got {kind!r}")
    if str(row.get("timing", "kernel")) == "kernel":
        t -= p.kernel_gap_s * kernels
    return t, label


def kernel_params(gpu: GPUSpec) -> CostParams:
    """The GPU's default parameters at the microbenchmarks' clock (the corpus rows are short
    timed loops): :func:`ccoverlap.cost.params.default_params` with ``sustained=False``."""
    return default_params(gpu, sustained=False)


def judge_table(table: Table, split: str,
                params_for: Callable[[GPUSpec], CostParams] = kernel_params) -> list[KernelRow]:
    """Every row of ``table``'s ``split`` half (``fit``, ``held-out`` or ``all``) predicted."""
    try:
        gpu = get_gpu(table.gpu)
    except ConfigError as exc:
        raise ConfigError(f"corpus table {table.kind}/{table.name}: {exc}") from None
    p = params_for(gpu)
    out = []
    for row in table.half(split):
        measured = float(row["time_s"])
        if not (measured > 0 and math.isfinite(measured)):
            raise ConfigError(f"corpus table {table.kind}/{table.name}: time_s must be positive, got {row['time_s']!r}")
        t, label = predict_row(table.kind, row, gpu, p)
        out.append(KernelRow(table=table.name, gpu=gpu.name, kind=table.kind, label=label, measured_s=measured,
                             predicted_s=t, split=table.split_of(row)))
    return out


def judge_corpus(split: str = "held-out", kinds: Iterable[str] = CLASSES,
                 params_for: Callable[[GPUSpec], CostParams] = kernel_params,
                 root: Path | None = None) -> list[KernelRow]:
    """Rows of every table of ``kinds`` in the corpus (default the shipped one), predicted."""
    rows: list[KernelRow] = []
    for kind in kinds:
        for table in load_kind(kind, root=root):
            rows.extend(judge_table(table, split, params_for))
    return rows


def summarize(rows: list[KernelRow]) -> dict[tuple[str, str], ClassSummary]:
    """``{(gpu, class): summary}`` in catalog-name, then class order."""
    groups: dict[tuple[str, str], list[KernelRow]] = {}
    for r in rows:
        groups.setdefault((r.gpu, r.kind), []).append(r)
    order = {k: i for i, k in enumerate(CLASSES)}
    return {k: _summary(v) for k, v in sorted(groups.items(), key=lambda kv: (kv[0][0], order[kv[0][1]]))}


def summarize_tables(rows: list[KernelRow]) -> dict[str, ClassSummary]:
    """``{kind/table: summary}``: the same errors per source table."""
    groups: dict[str, list[KernelRow]] = {}
    for r in rows:
        groups.setdefault(f"{r.kind}/{r.table}", []).append(r)
    return {k: _summary(v) for k, v in sorted(groups.items())}


def report(split: str, params_for: Callable[[GPUSpec], CostParams] = kernel_params,
           root: Path | None = None) -> dict[str, Any]:
    """The ``validate kernels`` result as one JSON-ready object: per (GPU, class) and per table."""
    if split not in ("fit", "held-out", "all"):
        raise ConfigError(f"--split must be one of fit, held-out, all, got {split!r}")
    rows = judge_corpus(split, params_for=params_for, root=root)
    if not rows:
        raise ConfigError(f"the kernel corpus has no rows in split {split!r}")
    return {"split": split, "parameters": "defaults per GPU at the microbenchmarks' clock (nothing fitted to these rows)",
            "classes": [{"gpu": g, "class": k, **s.to_dict()} for (g, k), s in summarize(rows).items()],
            "tables": {name: s.to_dict() for name, s in summarize_tables(rows).items()}}


def text_lines(rep: dict[str, Any]) -> list[str]:
    """The ``validate kernels`` text report: one line per (GPU, class), then per source table."""
    head = f"{'gpu':<20} {'class':<10} {'rows':>5} {'median':>7} {'mean':>7} {'signed':>7} {'worst':>7}"
    out = [f"kernel corpus, {rep['split']} rows, {rep['parameters']}",
           "error = predicted / measured - 1 (|error| median and mean, mean signed, worst)", "", head]
    for c in rep["classes"]:
        out.append(f"{c['gpu']:<20} {c['class']:<10} {c['n']:>5} {c['median_abs_error']:>7.1%} "
                   f"{c['mean_abs_error']:>7.1%} {c['mean_signed_error']:>+7.1%} {c['worst_error']:>+7.1%}")
    out += ["", "by table:"]
    for name, s in rep["tables"].items():
        out.append(f"  {name}: {s['n']} rows, median {s['median_abs_error']:.1%}, mean {s['mean_abs_error']:.1%}, "
                   f"signed {s['mean_signed_error']:+.1%}")
    return out


def fit_params(gpu_name: str, kind: str, names: list[str], split: str = "fit",
               root: Path | None = None, start: dict[str, float] | None = None) -> dict[str, float]:
    """Fit the cost parameters ``names`` of ``gpu_name`` on the ``split`` half of the corpus
    tables of ``kind`` on that GPU: Nelder-Mead on the mean |log(predicted / measured)| (the mean
    of each table's mean, so a large table does not drown a small one), from the
    GPU's defaults, in log space. ``start``: starting values that replace the defaults (a
    parameter whose default is 0 or 1-as-off cannot leave it by factors: seed it here).
    Returns ``{name: value}`` (fractions kept in [0.01, 1])."""
    import numpy as np
    from scipy.optimize import minimize

    gpu = get_gpu(gpu_name)
    base = kernel_params(gpu)
    tables = [t for t in load_kind(kind, root=root) if get_gpu(t.gpu).name == gpu.name]
    rows = [(t, r) for t in tables for r in t.half(split)]
    if not rows:
        raise ConfigError(f"no {kind} rows on {gpu.name} in split {split!r} to fit on")
    # search in log space around the defaults: every parameter moves by factors, whatever its unit
    unknown = sorted(set(start or {}) - set(names))
    if unknown:
        raise ConfigError(f"fit_params: start values for parameters not fitted: {', '.join(unknown)}")
    x0 = np.array([max(float((start or {}).get(n, getattr(base, n))), 1e-9) for n in names])
    fractions = {n for n in names if n.endswith(("fraction", "efficiency", "overlap"))}

    def params_of(u: np.ndarray) -> CostParams:
        vals = {n: (min(max(v, 0.01), 1.0) if n in fractions else max(v, 0.0))
                for n, v in zip(names, x0 * np.exp(u))}
        return base.with_overrides(**vals)

    def loss(u: np.ndarray) -> float:  # each table weighs the same, whatever its number of rows
        p = params_of(u)
        per_table = [np.mean([abs(math.log(max(predict_row(kind, r, gpu, p)[0], 1e-9) / float(r["time_s"])))
                              for r in t.half(split)]) for t in tables if t.half(split)]
        return float(np.mean(per_table))

    simplex = np.vstack([np.zeros(len(names))] + [np.eye(len(names))[i] * -0.3 for i in range(len(names))])
    res = minimize(loss, np.zeros(len(names)), method="Nelder-Mead",
                   options={"initial_simplex": simplex, "xatol": 1e-3, "fatol": 1e-6, "maxiter": 600})
    p = params_of(res.x)
    return {n: float(getattr(p, n)) for n in names}
