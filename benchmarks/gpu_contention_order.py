"""Does the order of launch decide who loses when a copy kernel and a GEMM share a GPU?

``ccoverlap calibrate`` releases the two streams together. In training, a collective is often
launched before the GEMM beside it (an FSDP prefetch, a TP all-gather), so its thread blocks
hold their SMs first; lagom §3.2 rests on those SMs being lost to compute. This script times a
GEMM beside the NC/NT/C channel-copy kernel (``ccoverlap/calibrate/kernels.py``) twice: both
released together, and the copy started ``--lead-us`` earlier; and the copy beside the GEMM,
released together and with the GEMM started first. Each as slowdown = time beside / time alone.

    python benchmarks/gpu_contention_order.py --out DIR            # CUDA GPU, about a minute
    python benchmarks/gpu_contention_order.py --dry-run --out DIR  # any machine: the plan only
    python benchmarks/gpu_contention_order.py --from-json DIR/contention_order.json --out DIR

Writes DIR/contention_order.json (every measurement, the device) and DIR/contention_order.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ccoverlap.calibrate import grids  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
VICTIMS = ((8192, 8192, 8192), (4096, 4096, 4096))  # bf16; the second has few waves (eq. 5)
CHANNELS = (1, 2, 4, 8, 16, 32, 64, 128)
CHUNKS = (16 * KiB, 256 * KiB, 4 * MiB)
NT = 512


def plan() -> list[dict]:
    """Every (victim, NC, C) point, with NT = 512 (NCCL's default)."""
    return [{"victim": list(v), "nc": nc, "nt": NT, "chunk_bytes": c} for v in VICTIMS for nc in CHANNELS
            for c in CHUNKS]


def measure(points: list[dict], *, device: str | None, lead_s: float, kernel: str, log=print) -> tuple[list, dict]:
    """Time each point on the GPU: victim and copy alone, the victim beside the copy released
    together and with the copy ``lead_s`` ahead, the copy beside the victim together and with
    the victim ahead. Returns (records, device info)."""
    from ccoverlap.calibrate import microbench as mb
    from ccoverlap.calibrate.kernels import load_channel_copy

    dev = mb.require_cuda(device)
    info = mb.device_info(dev)
    bench = mb.Bench(dev, replace(grids.make_grid(quick=True), reps=5, warmup=2), log=log)
    torch = bench.torch
    copy_kernel = load_channel_copy(prefer=kernel)
    info["kernel_backend"] = copy_kernel.backend
    src = torch.empty(256 * MiB // 4, dtype=torch.int32, device=bench.dev).fill_(7)
    dst, stats = torch.empty_like(src), torch.zeros(4, dtype=torch.int64, device=bench.dev)
    gemms = {tuple(v): mb.make_gemm(bench, "bf16", *v) for v in VICTIMS}
    alone = {v: bench.time_loop(fn)["time_s"] for v, fn in gemms.items()}
    out = []
    for i, p in enumerate(points):
        if i % 8 == 0:
            log(f"point {i + 1}/{len(points)}: victim {p['victim']} NC={p['nc']} C={p['chunk_bytes'] // KiB} KiB")
        nbytes = grids.channel_copy_bytes(p["nc"], p["chunk_bytes"])

        def copy(p=p, nbytes=nbytes) -> None:
            copy_kernel.launch(src, dst, nc=p["nc"], nt=p["nt"], chunk_bytes=p["chunk_bytes"], total_bytes=nbytes,
                               stats=stats)

        fn, v_alone = gemms[tuple(p["victim"])], alone[tuple(p["victim"])]
        c_alone = bench.time_loop(copy)["time_s"]
        rec = {**p, "copy_bytes": nbytes, "victim_alone_s": v_alone, "copy_alone_s": c_alone}
        for tag, lead in (("together", 0.0), ("other_first", lead_s)):
            v = bench.overlap(fn, v_alone, copy, c_alone, lead_s=lead)
            c = bench.overlap(copy, c_alone, fn, v_alone, lead_s=lead)
            rec[f"victim_s_{tag}"], rec[f"copy_s_{tag}"] = v["time_s"], c["time_s"]
            rec[f"covered_{tag}"] = bool(v["covered"] and c["covered"])
        out.append(rec)
    info["lead_s"] = lead_s
    return out, info


def table(records: list[dict], info: dict) -> str:
    """The Markdown report: per victim, slowdowns by NC (rows) and C (columns)."""
    lead_us = info.get("lead_s", 0) * 1e6
    lines = [f"# Launch order and contention on {info.get('name', '?')}", "",
             f"Channel copy ({info.get('kernel_backend', '?')}, NT = {NT}) beside a bf16 GEMM. Each cell: slowdown "
             f"when both are released together / when the other side started {lead_us:.0f} µs earlier. "
             "Slowdown = time beside / time alone; `*`: the covering side ended first.", ""]
    for v in VICTIMS:
        rows = [r for r in records if tuple(r["victim"]) == v]
        if not rows:
            continue
        for side, title in (("victim", f"GEMM {v[0]}x{v[1]}x{v[2]} beside the copy (copy first in the second number)"),
                            ("copy", f"the copy beside GEMM {v[0]}x{v[1]}x{v[2]} (GEMM first in the second number)")):
            lines += [f"## {title}", "", "| NC \\ C | " + " | ".join(f"{c // KiB} KiB" for c in CHUNKS) + " |",
                      "|---" * (len(CHUNKS) + 1) + "|"]
            for nc in CHANNELS:
                cells = []
                for c in CHUNKS:
                    r = next((x for x in rows if x["nc"] == nc and x["chunk_bytes"] == c), None)
                    if r is None:
                        cells.append("–")
                        continue
                    base = r[f"{side}_alone_s"]
                    cells.append(" / ".join(f"{r[f'{side}_s_{t}'] / base:.3f}" + ("" if r[f"covered_{t}"] else "*")
                                            for t in ("together", "other_first")))
                lines.append(f"| {nc} | " + " | ".join(cells) + " |")
            lines.append("")
    s = summary(records)
    if s:
        lines += [f"- GEMM slowdown, median over the points: {s['victim_together']:.3f} released together, "
                  f"{s['victim_other_first']:.3f} with the copy first; worst {s['victim_worst']:.3f}.",
                  f"- Copy slowdown, median: {s['copy_together']:.2f} together, {s['copy_other_first']:.2f} with the "
                  "GEMM first.", ""]
    return "\n".join(lines)


def summary(records: list[dict]) -> dict:
    """Medians over the covered points of each side's slowdown in each order, and the worst GEMM one."""
    ok = [r for r in records if r["covered_together"] and r["covered_other_first"]]
    if not ok:
        return {}
    out = {}
    for side in ("victim", "copy"):
        for t in ("together", "other_first"):
            out[f"{side}_{t}"] = statistics.median(r[f"{side}_s_{t}"] / r[f"{side}_alone_s"] for r in ok)
    out["victim_worst"] = max(r[f"victim_s_{t}"] / r["victim_alone_s"] for r in ok for t in ("together", "other_first"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for contention_order.json/.md")
    ap.add_argument("--device", default=None, help="CUDA device (cuda, cuda:N)")
    ap.add_argument("--lead-us", type=float, default=200.0, help="head start of the other side, µs (default 200)")
    ap.add_argument("--kernel", choices=("auto", "cuda", "triton"), default="triton")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: write the plan only")
    ap.add_argument("--from-json", metavar="FILE", help="rewrite the report from an earlier run (no GPU)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.lead_us < 0:
        print("gpu_contention_order: --lead-us must be at least 0", file=sys.stderr)
        return 2
    if a.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        pts = plan()
        (out / "contention_order.plan.json").write_text(json.dumps(pts, indent=1) + "\n")
        print(f"{len(pts)} points: victims {VICTIMS}, NC {CHANNELS}, C {[c // KiB for c in CHUNKS]} KiB, NT {NT}")
        return 0
    if a.from_json:
        try:
            doc = json.loads(Path(a.from_json).read_text())
            records, info = doc["records"], doc["device"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"gpu_contention_order: {a.from_json}: not a result of this script ({exc})", file=sys.stderr)
            return 2
    else:
        from ccoverlap.calibrate.kernels import KernelUnavailable
        from ccoverlap.errors import CCOverlapError

        try:
            records, info = measure(plan(), device=a.device, lead_s=a.lead_us * 1e-6, kernel=a.kernel)
        except (CCOverlapError, KernelUnavailable) as exc:
            print(f"gpu_contention_order: error: {exc}", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    if not a.from_json:
        (out / "contention_order.json").write_text(json.dumps({"device": info, "records": records}, indent=1,
                                                              default=str) + "\n")
    text = table(records, info)
    (out / "contention_order.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
