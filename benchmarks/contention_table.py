"""The contention table of a calibration file: a GEMM's slowdown beside the NC/NT/C channel copy
and beside copy-engine copies, as measured, next to the cost model's prediction for the same
pair (lagom §3.2 Fig. 3; ficco §IV-D Fig. 9). Runs anywhere (no GPU): it reads the raw
measurements that ``ccoverlap calibrate`` keeps in the file.

    python benchmarks/contention_table.py calibrations/h200.json --out docs/gpu
    python benchmarks/contention_table.py FILE --victim memory        # the memory-bound victim

For each (NC, C) at the main NT and for each copy-engine copy it prints: the victim's slowdown
(time beside the copy / time alone), the copy's bandwidth alone and beside the victim, the
model's slowdown with the GPU's default parameters and with the file's fitted ones, and
whether the record was held out of the fit (only held-out rows judge the fitted model).
Writes OUT/contention.md, OUT/contention.json and OUT/contention.png (slowdown against NC).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ccoverlap.calibrate import fileformat  # noqa: E402
from ccoverlap.calibrate import fit as F  # noqa: E402
from ccoverlap.calibrate.grids import is_held_out  # noqa: E402
from ccoverlap.catalog.hardware import get_gpu  # noqa: E402
from ccoverlap.cost.params import CostParams, default_params  # noqa: E402
from ccoverlap.errors import ConfigError  # noqa: E402

KiB = 1024


def victim_name(v: dict) -> str:
    """``gemm`` victims as ``gemm MxNxK``, the memory-bound one as ``memory``."""
    return f"gemm {v['m']}x{v['n']}x{v['k']}" if v["op"] == "gemm" else "memory"


def rows(records: list[dict], gpu, fitted: CostParams | None, victim: str) -> list[dict]:
    """One row per contention record of ``victim`` (``gemm`` = the largest GEMM victim, or
    ``memory``): measured and predicted slowdowns (ratios), copy bandwidths (bytes/s)."""
    ctx, base = F.make_context(gpu), default_params(gpu)
    recs = [r for r in records if r["kind"] in ("sm_contention", "ce_contention")]
    gemms = [r["victim"] for r in recs if r["victim"]["op"] == "gemm"]
    want = max(gemms, key=lambda v: v["m"] * v["n"] * v["k"]) if victim == "gemm" and gemms else None
    out = []
    for r in recs:
        if (want is None and r["victim"]["op"] != "memory") or (want is not None and r["victim"] != want):
            continue
        sm = r["kind"] == "sm_contention"
        predict = F.predict_sm_victim if sm else F.predict_ce_victim
        nbytes = float(r["copy_bytes"] if sm else r["bytes"])
        row = {"engine": "sm" if sm else "ce", "victim": victim_name(r["victim"]),
               "nc": r.get("nc"), "nt": r.get("nt"), "direction": r.get("direction", "d2d"),
               "chunk_bytes": r.get("chunk_bytes"), "bytes": nbytes,
               "slowdown": r["victim_s"] / r["victim_alone_s"],
               "copy_alone_bps": nbytes / r["copy_alone_s"], "copy_beside_bps": nbytes / r["copy_s"],
               "predicted_default": predict(r, base, ctx),
               "held_out": is_held_out(r),
               "covered": bool(r.get("covered_victim", True) and r.get("covered_copy", True))}
        if fitted is not None:
            row["predicted_fitted"] = predict(r, fitted, ctx)
        out.append(row)
    out.sort(key=lambda x: (x["engine"] != "sm", x["direction"], x["nt"] or 0, x["nc"] or 0, x["chunk_bytes"] or 0))
    return out


def error(pred: float, meas: float) -> float:
    """Error of a predicted slowdown: (pred − meas) / meas, in %."""
    return 100.0 * (pred - meas) / meas


def summary(table: list[dict]) -> dict:
    """Median |error| of the default and of the fitted model, per engine; the fitted one on
    held-out rows only (the others were fitted)."""
    out = {}
    for eng in ("sm", "ce"):
        sel = [r for r in table if r["engine"] == eng and r["covered"]]
        if not sel:
            continue
        d = {"n": len(sel), "median_abs_err_default_pct":
             statistics.median(abs(error(r["predicted_default"], r["slowdown"])) for r in sel),
             "measured_slowdown_max": max(r["slowdown"] for r in sel)}
        held = [r for r in sel if r["held_out"] and "predicted_fitted" in r]
        if held:
            d["n_held_out"] = len(held)
            d["median_abs_err_fitted_held_out_pct"] = statistics.median(
                abs(error(r["predicted_fitted"], r["slowdown"])) for r in held)
        out[eng] = d
    return out


def markdown(table: list[dict], summ: dict, device: str, victim: str) -> str:
    """The table as Markdown, the device named in the title."""
    fitted = any("predicted_fitted" in r for r in table)
    head = ["copy", "NC", "NT", "C", "slowdown measured", "copy GB/s alone", "copy GB/s beside",
            "model (default)", "err"] + (["model (fitted)", "err", "held out"] if fitted else [])
    lines = [f"# Contention on {device}: {table[0]['victim'] if table else victim} beside copies", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        copy = "SM channel copy" if r["engine"] == "sm" else f"copy engine {r['direction']}" + (
            " (chunked)" if r["chunk_bytes"] else "")
        c = f"{r['chunk_bytes'] // KiB} KiB" if r["chunk_bytes"] else "whole"
        cells = [copy, str(r["nc"] or "–"), str(r["nt"] or "–"), c, f"{r['slowdown']:.3f}" + ("" if r["covered"] else "*"),
                 f"{r['copy_alone_bps'] / 1e9:.0f}", f"{r['copy_beside_bps'] / 1e9:.0f}",
                 f"{r['predicted_default']:.3f}", f"{error(r['predicted_default'], r['slowdown']):+.1f}%"]
        if fitted:
            cells += [f"{r['predicted_fitted']:.3f}", f"{error(r['predicted_fitted'], r['slowdown']):+.1f}%",
                      "yes" if r["held_out"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Slowdown = the victim's time with the copy running throughout / its time alone. Error = "
              "model / measured − 1. `*`: the covering side ended first (left out of the fit and the summary).", ""]
    for eng, d in summ.items():
        name = "SM channel copy" if eng == "sm" else "copy engine"
        s = f"- {name}: {d['n']} pairs, measured slowdown up to {d['measured_slowdown_max']:.3f}; median |error| " \
            f"default parameters {d['median_abs_err_default_pct']:.1f}%"
        if "median_abs_err_fitted_held_out_pct" in d:
            s += f", fitted parameters on the {d['n_held_out']} held-out pairs {d['median_abs_err_fitted_held_out_pct']:.1f}%"
        lines.append(s)
    return "\n".join(lines) + "\n"


def plot(table: list[dict], device: str, path: Path) -> bool:
    """Left: the victim's slowdown against NC, one colour per C (measured solid, default model
    dashed, fitted model dotted; log scale). Right: the copy's bandwidth alone and beside the
    victim. The device in the title. False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sm = [r for r in table if r["engine"] == "sm" and r["nt"] == 512]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.4))
    for c in sorted({r["chunk_bytes"] for r in sm}):
        pts = sorted((r for r in sm if r["chunk_bytes"] == c), key=lambda r: r["nc"])
        nc = [r["nc"] for r in pts]
        line, = ax.plot(nc, [r["slowdown"] for r in pts], marker="o", label=f"C = {c // KiB} KiB")
        ax.plot(nc, [r["predicted_default"] for r in pts], ls="--", color=line.get_color(), alpha=0.6)
        if all("predicted_fitted" in r for r in pts):
            ax.plot(nc, [r["predicted_fitted"] for r in pts], ls=":", color=line.get_color(), alpha=0.9)
        bx.plot(nc, [r["copy_alone_bps"] / 1e9 for r in pts], marker="o", color=line.get_color(),
                label=f"C = {c // KiB} KiB alone")
        bx.plot(nc, [r["copy_beside_bps"] / 1e9 for r in pts], marker="x", ls="--", color=line.get_color())
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlabel("NC (thread blocks of the channel copy, NT = 512)")
        a.grid(alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("victim slowdown (x, log scale)")
    ax.set_title(f"{table[0]['victim'] if table else ''} beside the copy\n"
                 "measured (solid), model: default (dashed), fitted (dotted)", fontsize=9)
    ax.legend(fontsize=7)
    bx.set_yscale("log")
    bx.set_ylabel("copy bandwidth (GB/s, log scale)")
    bx.set_title("the copy alone (solid) and beside the victim (dashed)", fontsize=9)
    fig.suptitle(f"SM channel copy vs compute on {device}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calibration", help="calibration file written by ccoverlap calibrate")
    ap.add_argument("--out", default=None, help="folder for contention.md/.json/.png (default: print only)")
    ap.add_argument("--victim", choices=("gemm", "memory"), default="gemm")
    a = ap.parse_args(argv)
    try:
        data = fileformat.read(a.calibration)
        gpu = get_gpu(data["gpu"])
        fitted = CostParams.load(a.calibration, base=default_params(gpu)) if data["params"] else None
    except ConfigError as exc:
        print(f"contention_table: error: {exc}", file=sys.stderr)
        return 2
    records = (data.get("source") or {}).get("measurements") or []
    table = rows(records, gpu, fitted, a.victim)
    if not table:
        print(f"contention_table: error: {a.calibration} holds no contention measurement "
              f"(kinds sm_contention / ce_contention) for the {a.victim} victim", file=sys.stderr)
        return 2
    device = (data.get("source") or {}).get("device", {}).get("name") or gpu.name
    summ = summary(table)
    text = markdown(table, summ, device, a.victim)
    print(text, end="")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = "contention" if a.victim == "gemm" else "contention-memory"
        (out / f"{stem}.md").write_text(text)
        (out / f"{stem}.json").write_text(json.dumps({"device": device, "gpu": gpu.name, "rows": table,
                                                        "summary": summ}, indent=1) + "\n")
        if plot(table, device, out / f"{stem}.png"):
            print(f"wrote {out / (stem + '.md')}, .json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
