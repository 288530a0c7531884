"""FiCCO's compute pieces on a real GPU, alone and beside emulated transfer traffic.

For each GEMM of the FiCCO paper's Table I (``ccoverlap.calibrate.grids.ficco_shapes``: every
shape scaled by one factor to the calibration's FLOP / memory budget, so M < K stays M < K)
and world size P = 8, this times every distinct compute piece the schedules of
``ccoverlap.deciders.ficco.schedules.schedule_graph`` run (the whole GEMM; the M/P-row shard GEMM of
``ring`` / ``uniform-fused-1d`` / the hetero local block; the fused remote step of
``hetero-fused-1d``, (P-1)·M/P² rows; the unfused per-piece GEMM of ``hetero-unfused-1d``,
M/P² rows; the K/P column GEMM of ``uniform-fused-2d``, first plain then accumulating
``C += A[:, ks] B[ks]`` on a column view of A; the gather / scatter copies) in three
conditions:

* ``alone``;
* ``sm``: beside the NC/NT/C channel-copy kernel (``ccoverlap.calibrate.kernels``) on a
  second stream, standing in for an NCCL-style SM-driven transfer (defaults NC=16 channels,
  NT=512 threads, C=512 KiB per step: NCCL's 4 MiB buffer over its 8 steps; assumed);
* ``ce``: beside copy-engine device-to-device copies (``cudaMemcpyAsync`` of 256 MiB,
  ``microbench.make_ce_copy``) on a second stream, standing in for a DMA transfer.

**Model choice (one GPU, no link):** the transfer is emulated by *local* copies that run
throughout the timed piece (``Bench.overlap``: the covering side outlasts the timed side).
That is the memory / SM pressure of a transfer that is always in flight, at local HBM copy
rates (several TB/s), not at NVLink rates (~450 GB/s per direction on H100): an upper bound
on the pressure of one transfer. The covering copy's own rate is kept in the JSON (``cover``)
so a later analysis can rescale; every repetition's time is kept (``samples_s``).

Each schedule's time is then composed from these pieces by the project's stream simulator
(``ccoverlap.sim.simulator.simulate`` on the schedule's op graph) with a cost object that returns the
*measured* time of a compute piece (alone, or under the engine's traffic when a transfer runs
beside it) and the *cost model's* time for transfers (NVLink of the catalog node: not
measurable on one GPU). The §V-C heuristic's pick (``ficco.heuristic_pick``) is compared with
the measured-fastest schedule, and its thresholds are retuned
(``ficco_accuracy.fit_heuristic``) on a declared half of the shapes (``TRAIN``: g1, g2, g5,
g6, g9, g10, g13, g14) and judged on the other half (g3, g4, g7, g8, g11, g12, g15, g16):
both halves hold two M < K and six M > K shapes, SP+TP and EP ones.

    python3 benchmarks/gpu_ficco_pieces.py --out DIR [--full]        # on a CUDA GPU
    python3 benchmarks/gpu_ficco_pieces.py --dry-run                 # pieces + cost model only
    python3 benchmarks/gpu_ficco_pieces.py --from-json DIR/ficco_pieces.json --out DIR2   # re-analyse

Writes ``ficco_pieces.json`` (raw times, composed schedule times, picks, retune) and
``ficco_pieces.md`` into ``--out``; while measuring, ``ficco_pieces.partial.json`` after every
case (``--from-json`` reads it, if a time limit cuts the run short). Bad input -> one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from ccoverlap.calibrate import grids
from ccoverlap.deciders.ficco.accuracy import PAPER_SCENARIOS, AccuracyReport, CaseVerdict, fit_heuristic, rejudge
from ccoverlap.deciders.ficco.schedules import (
    SCHEDULES,
    FiccoCase,
    ScheduleEstimate,
    estimate_all,
    heuristic_pick,
    machine,
    schedule_graph,
)
from ccoverlap.errors import CCOverlapError, ConfigError
from ccoverlap.predict.evaluate import cost_model_for_cluster
from ccoverlap.sim.simulator import simulate
from ccoverlap.sim.timeline import step_time_s
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, MemorySpec, P2PSpec

WORLD = 8
ENGINES = {"sm": "sm", "dma": "ce"}  # FiCCO engine -> traffic condition its transfers cause
CONDITIONS = ("alone", "sm", "ce")
TRAIN = ("g1", "g2", "g5", "g6", "g9", "g10", "g13", "g14")
KiB = 1 << 10
MiB = 1 << 20
FILE_STEM = "ficco_pieces"
_PATTERN = {name: ("a2a-gemm" if par == "EP" else "ag-gemm") for name, par, _m, _s in PAPER_SCENARIOS}


# ----------------------------------------------------------------------------- plan

def shapes(full: bool) -> list[tuple[str, int, int, int, float]]:
    """Table I GEMMs scaled as ``ccoverlap calibrate`` scales them: (name, M, N, K, factor);
    the quick plan's budget (4e12 FLOP, 4 GB) unless ``full`` (2e13 FLOP, 16 GB), all 16."""
    grid = replace(grids.make_grid(quick=not full), quick=False)  # quick=False: all 16 shapes
    return grids.ficco_shapes(grid)


def case_for(name: str, m: int, n: int, k: int, engine: str, gpu: str) -> FiccoCase:
    """The FiCCO case of a scaled Table I shape on one node of ``WORLD`` catalog ``gpu``s
    (its catalog fabric); SP+TP shapes as all-gather + GEMM, EP ones as all-to-all + GEMM."""
    return FiccoCase(m=m, n=n, k=k, world=WORLD, cluster=machine(gpu, None, WORLD), pattern=_PATTERN[name],
                     engine=engine, name=name)


def piece_key(spec) -> str | None:
    """Name of a compute piece: ``gemm:MxNxK`` (``+acc`` when it accumulates into C) or
    ``copy:BYTES`` (a gather / scatter copy moving BYTES, reading and writing them); None for
    transfers."""
    if isinstance(spec, GemmSpec):
        return f"gemm:{spec.m}x{spec.n}x{spec.k}" + ("+acc" if spec.accumulate else "")
    if isinstance(spec, MemorySpec):
        return f"copy:{int(round(spec.bytes / 2))}"
    return None


def schedule_pieces(case: FiccoCase) -> dict[str, list[str]]:
    """Per schedule, the compute-stream GEMM pieces in issue order (piece keys)."""
    out = {}
    for s in SCHEDULES:
        g = schedule_graph(case, s)
        out[s] = [piece_key(op.spec) for op in g.ops if isinstance(op.spec, GemmSpec)]
    return out


def distinct_pieces(case: FiccoCase) -> list[str]:
    """Every distinct compute piece (GEMMs and copy kernels) of all schedules of ``case``, with
    SM and with DMA transfers: SM schedules copy with kernels (measured here), DMA schedules on
    copy engines (``CopySpec``, timed by the cost model like the transfers)."""
    seen: dict[str, None] = {}
    for engine in ENGINES:
        for s in SCHEDULES:
            for op in schedule_graph(replace(case, engine=engine), s).ops:
                key = piece_key(op.spec)
                if key is not None:
                    seen.setdefault(key)
    return list(seen)


# ----------------------------------------------------------------------------- composing

class MeasuredCost:
    """A cost object for :func:`ccoverlap.sim.simulator.simulate`: a compute piece takes its measured
    time, under the engine's traffic condition when a transfer (collective, peer copy or
    copy-engine copy) runs beside it, alone otherwise (compute beside compute is not measured: alone time); a
    transfer takes the cost model's time beside what runs with it."""

    def __init__(self, pieces: dict[str, dict], condition: str, cost) -> None:
        self.pieces, self.condition, self.cost = pieces, condition, cost

    def duration_s(self, spec, concurrent=()):
        """Seconds of ``spec`` while ``concurrent`` specs run beside it (see the class doc)."""
        key = piece_key(spec)
        if key is None:
            return self.cost.duration_s(spec, tuple(concurrent))
        entry = self.pieces.get(key)
        if entry is None:
            raise ConfigError(f"no measurement of piece {key}")
        busy = any(isinstance(c, (CollectiveSpec, P2PSpec, CopySpec)) for c in concurrent)
        t = entry.get(self.condition) if busy else None
        return float((t or entry["alone"])["time_s"])


def compose(case: FiccoCase, pieces: dict[str, dict], cost) -> list[ScheduleEstimate]:
    """Every schedule's time for ``case`` from measured pieces (see :class:`MeasuredCost`),
    as :class:`~ccoverlap.deciders.ficco.schedules.ScheduleEstimate` (``gemm_s`` / ``copy_s``: measured
    alone, summed; ``comm_s``: the cost model's; ``cil_s``: composed time minus the same with
    every piece alone; ``dil_gemm_s``: GEMM pieces minus the whole GEMM, both measured alone)."""
    cond = ENGINES[case.engine]
    contended = MeasuredCost(pieces, cond, cost)
    isolated = MeasuredCost(pieces, "alone", cost)
    whole = float(pieces[piece_key(GemmSpec(m=case.m, n=case.n, k=case.k))]["alone"]["time_s"])
    out, serial_s = [], None
    for s in SCHEDULES:
        g = schedule_graph(case, s)
        t = step_time_s(simulate(g, contended))
        t_iso = step_time_s(simulate(g, isolated))
        gemm = sum(isolated.duration_s(op.spec) for op in g.ops if isinstance(op.spec, GemmSpec))
        copy = sum(isolated.duration_s(op.spec) for op in g.ops if isinstance(op.spec, MemorySpec))
        comm = sum(cost.duration_s(op.spec, ()) for op in g.ops if isinstance(op.spec, (CollectiveSpec, P2PSpec)))
        serial_s = t if s == "serial" else serial_s
        out.append(ScheduleEstimate(schedule=s, time_s=t, gemm_s=gemm, comm_s=comm, copy_s=copy,
                                    dil_gemm_s=gemm - whole, dil_comm_s=0.0, cil_s=t - t_iso,
                                    speedup=serial_s / t if serial_s and t > 0 else 1.0, ops=len(g.ops)))
    return out


def report_of(cases_estimates: list[tuple[FiccoCase, list[ScheduleEstimate]]], label: str, **tuning) -> AccuracyReport:
    """The heuristic judged against the measured-composed schedule times, with the project's
    own verdict logic (``ficco_accuracy.rejudge``: best among the four FiCCO schedules unless
    the heuristic answers serial / ring)."""
    seed = tuple(CaseVerdict(case=c, pick="", reason="", best="", best_overall="", pick_time_s=0.0,
                             best_time_s=0.0, serial_time_s=0.0, estimates=tuple(e)) for c, e in cases_estimates)
    return rejudge(AccuracyReport(label=label, verdicts=seed), **tuning)


def retune(cases_estimates, train: tuple[str, ...] = TRAIN) -> dict:
    """Fit the §V-C thresholds (reference time, hetero-unfused factor) on the ``train`` cases
    and judge default and retuned constants on the rest. Returns a JSON-ready dict."""
    tr = [(c, e) for c, e in cases_estimates if c.name in train]
    te = [(c, e) for c, e in cases_estimates if c.name not in train]
    if not tr or not te:
        raise ConfigError("retune needs cases in both halves")
    fitted = fit_heuristic(report_of(tr, "train"))
    tuning = {k: fitted[k] for k in ("reference_time_s", "hetero_unfused_factor")}
    out = {"train": [c.name for c, _ in tr], "test": [c.name for c, _ in te], "fitted": fitted}
    for label, cases in (("train", tr), ("test", te)):
        for which, kw in (("default", {}), ("retuned", tuning)):
            r = report_of(cases, label, **kw)
            out[f"{label}_{which}"] = {"matches": r.matches, "cases": r.cases, "mean_loss": r.mean_loss,
                                       "max_loss": r.max_loss}
    return out


# ----------------------------------------------------------------------------- analysis

def analyse(plan: list[dict], measured: dict[str, dict], *, gpu: str, calibration: str | None) -> dict:
    """Per engine: every case's composed schedule times, the heuristic's pick, the measured
    fastest, the cost-model estimator's fastest, and the retune. ``measured[name]`` holds
    ``pieces`` as recorded by :func:`measure`."""
    cost = cost_model_for_cluster(machine(gpu, None, WORLD), calibration)
    out = {}
    for engine, cond in ENGINES.items():
        missing = sorted({name for name, m in measured.items()
                          for entry in m["pieces"].values() if not entry.get(cond)})
        if missing:  # e.g. the channel-copy kernel could not be built: no SM traffic was measured
            out[engine] = {"rows": [], "cases": 0, "heuristic_matches": 0, "mean_loss": None, "verdicts": [],
                           "retune": None, "skipped": f"no '{cond}' traffic measured for {', '.join(missing)}"}
            continue
        rows, pairs = [], []
        for p in plan:
            if p["name"] not in measured:
                continue
            case = case_for(p["name"], p["m"], p["n"], p["k"], engine, gpu)
            ests = compose(case, measured[p["name"]]["pieces"], cost)
            pairs.append((case, ests))
            model = estimate_all(case, cost)
            pick, reason = heuristic_pick(case)
            best = min(ests, key=lambda e: e.time_s)
            model_best = min(model, key=lambda e: e.time_s)
            rows.append({"name": case.name, "m": case.m, "n": case.n, "k": case.k, "pattern": case.pattern,
                         "composed": {e.schedule: e.to_dict() for e in ests},
                         "model": {e.schedule: e.time_s for e in model},
                         "heuristic": pick, "reason": reason, "measured_best": best.schedule,
                         "model_best": model_best.schedule})
        rep = report_of(pairs, engine) if pairs else None
        for row, v in zip(rows, rep.verdicts if rep else ()):
            row["best_ficco"] = v.best  # what the heuristic is judged against
        out[engine] = {"rows": rows,
                       "heuristic_matches": rep.matches if rep else 0, "cases": rep.cases if rep else 0,
                       "mean_loss": rep.mean_loss if rep else None,
                       "verdicts": [{"name": v.case.name, "pick": v.pick, "best": v.best, "match": v.match,
                                     "loss": v.loss} for v in rep.verdicts] if rep else [],
                       "retune": retune(pairs) if len(pairs) == len(plan) else None}
    return out


def contention_table(plan: list[dict], measured: dict[str, dict]) -> list[dict]:
    """Per case and piece: time alone and slowdown (time under traffic / alone) per condition."""
    rows = []
    for p in plan:
        pieces = measured.get(p["name"], {}).get("pieces", {})
        for key, entry in pieces.items():
            alone = entry["alone"]["time_s"]
            rows.append({"name": p["name"], "piece": key, "alone_s": alone,
                         **{f"slowdown_{c}": (entry[c]["time_s"] / alone if entry.get(c) else None)
                            for c in CONDITIONS[1:]},
                         **{f"covered_{c}": entry[c].get("covered") for c in CONDITIONS[1:] if entry.get(c)}})
    return rows


def markdown(doc: dict) -> str:
    """The report: settings, decomposition/contention per piece, composed schedule times with
    picks per engine, and the retune on the declared halves."""
    dev = doc.get("device") or {}
    lines = [f"# FiCCO pieces on {dev.get('name', 'no device: dry run')}", "",
             f"- created: {doc['created']}", f"- command: `{doc['command']}`",
             f"- catalog GPU: {doc['gpu']}; world {WORLD}; calibration: {doc.get('calibration') or 'none'}",
             f"- traffic: {doc.get('traffic')}", f"- timing: {doc.get('settings')}", ""]
    if doc.get("contention"):
        lines += ["## Pieces: time alone and slowdown beside traffic", "",
                  "| case | piece | alone ms | x SM copy | x CE copy |", "| :-- | :-- | --: | --: | --: |"]
        for r in doc["contention"]:
            sm, ce = r.get("slowdown_sm"), r.get("slowdown_ce")
            lines.append(f"| {r['name']} | {r['piece']} | {r['alone_s'] * 1e3:.4f} | "
                         f"{'-' if sm is None else f'{sm:.3f}'} | {'-' if ce is None else f'{ce:.3f}'} |")
        lines.append("")
    for engine, res in (doc.get("analysis") or {}).items():
        if res.get("skipped"):
            lines += [f"## {engine} transfers: not analysed ({res['skipped']})", ""]
            continue
        if not res["rows"]:
            continue
        lines += [f"## Schedules composed from measured pieces, {engine} transfers", "",
                  "| case | " + " | ".join(SCHEDULES) + " | measured best | best judged | heuristic | model best |",
                  "| :-- |" + " --: |" * len(SCHEDULES) + " :-- | :-- | :-- | :-- |"]
        for r in res["rows"]:
            times = " | ".join(f"{r['composed'][s]['time_s'] * 1e3:.3f}" for s in SCHEDULES)
            mark = "" if r["heuristic"] == r.get("best_ficco") else " (miss)"
            lines.append(f"| {r['name']} | {times} | {r['measured_best']} | {r.get('best_ficco')} | "
                         f"{r['heuristic']}{mark} | {r['model_best']} |")
        lines += ["", "times in ms; 'best judged': the fastest of the four FiCCO schedules, or of all six when the "
                      "heuristic answers serial / ring (as `ccoverlap ficco --accuracy` judges)", "",
                  f"heuristic = best judged: "
                      f"{res['heuristic_matches']}/{res['cases']}, mean loss {res['mean_loss'] or 0:.1%}", ""]
        rt = res.get("retune")
        if rt:
            f = rt["fitted"]
            lines += [f"retune on {', '.join(rt['train'])}: reference_time_s={f['reference_time_s']:.3g}, "
                      f"hetero_unfused_factor={f['hetero_unfused_factor']:g}", "",
                      "| half | constants | matches | mean loss |", "| :-- | :-- | --: | --: |"]
            for half in ("train", "test"):
                for which in ("default", "retuned"):
                    s = rt[f"{half}_{which}"]
                    lines.append(f"| {half} | {which} | {s['matches']}/{s['cases']} | {s['mean_loss']:.1%} |")
            lines.append("")
    if doc.get("dry_run"):
        lines += ["## Plan (dry run): pieces and the cost model's times", "",
                  "| case | M x N x K (scale) | pieces | model best (dma) | heuristic (dma) |",
                  "| :-- | :-- | --: | :-- | :-- |"]
        for p in doc["plan"]:
            lines.append(f"| {p['name']} | {p['m']}x{p['n']}x{p['k']} ({p['scale']:.3f}) | {len(p['pieces'])} | "
                         f"{p['model_best_dma']} | {p['heuristic_dma']} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- measuring
def require_gpu(device: str | None):
    """The CUDA device to measure on, or a one-line ConfigError that points to the no-GPU modes."""
    from ccoverlap.calibrate import microbench as mb

    return mb.require_cuda(device, offline_hint="--dry-run or --from-json")


def measure(plan: list[dict], *, device: str | None, reps: int, warmup: int, window_s: float,
            nc: int, nt: int, chunk: int, kernel_prefer: str, log=print,
            checkpoint=None) -> tuple[dict, dict, dict, dict]:
    """Time every piece of every case alone and beside each traffic, and each schedule's
    compute-stream sequence alone and beside traffic. Returns (measured, device info,
    settings, traffic description). ``checkpoint(measured, info, settings, traffic)`` is called
    after every case, so a run cut short by a time limit keeps what it measured."""
    from ccoverlap.calibrate import microbench as mb
    from ccoverlap.calibrate.kernels import KernelUnavailable, load_channel_copy

    dev = require_gpu(device)
    info = mb.device_info(dev)
    grid = replace(grids.make_grid(quick=True), reps=reps, warmup=warmup, min_window_s=window_s)
    bench = mb.Bench(dev, grid)
    torch = bench.torch
    covers, traffic = {}, {}
    try:
        kernel = load_channel_copy(prefer=kernel_prefer)
        src = torch.empty(512 * MiB // 4, dtype=torch.int32, device=dev).fill_(7)
        dst = torch.empty_like(src)
        stats = torch.zeros(4, dtype=torch.int64, device=dev)
        nbytes = grids.channel_copy_bytes(nc, chunk)
        covers["sm"] = lambda: kernel.launch(src, dst, nc=nc, nt=nt, chunk_bytes=chunk, total_bytes=nbytes, stats=stats)
        traffic["sm"] = {"kind": "channel_copy", "backend": kernel.backend, "nc": nc, "nt": nt, "chunk_bytes": chunk,
                         "bytes_per_launch": nbytes}
    except KernelUnavailable as exc:
        traffic["sm"] = {"error": str(exc)}
        log(f"SM traffic not measured: {exc}")
    covers["ce"] = mb.make_ce_copy(bench, "d2d", 256 * MiB)
    traffic["ce"] = {"kind": "memcpy_async d2d", "bytes_per_launch": 256 * MiB}
    for c, fn in covers.items():
        r = bench.time_loop(fn)
        traffic[c].update(alone_s=r["time_s"], bytes_per_s=traffic[c]["bytes_per_launch"] / r["time_s"])
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    measured: dict[str, dict] = {}
    t0 = time.perf_counter()

    def timed(fn) -> dict:
        alone = bench.time_loop(fn)
        out = {"alone": alone}
        for c, cover in covers.items():
            r = bench.overlap(fn, alone["time_s"], cover, traffic[c]["alone_s"])
            out[c] = r
        return out

    for i, p in enumerate(plan):
        log(f"[{time.perf_counter() - t0:6.1f}s] case {i + 1}/{len(plan)} {p['name']}: {p['m']}x{p['n']}x{p['k']}, "
            f"{len(p['pieces'])} pieces")
        try:
            dt = torch.bfloat16
            a = torch.randn(p["m"], p["k"], device=dev, dtype=dt)
            b = torch.randn(p["k"], p["n"], device=dev, dtype=dt)
            c = torch.empty(p["m"], p["n"], device=dev, dtype=dt)
            closures = {key: _piece_closure(torch, key, a, b, c) for key in p["pieces"]}
            pieces = {key: timed(fn) for key, fn in closures.items()}
            sequences = {}
            for sched, keys in p["sequences"].items():
                fns = [closures[k] for k in keys]

                def seq(fns=fns) -> None:
                    for f in fns:
                        f()

                sequences[sched] = timed(seq)
            measured[p["name"]] = {"pieces": pieces, "sequences": sequences}
            del a, b, c, closures
        except oom:
            log(f"  {p['name']}: out of memory, skipped")
        torch.cuda.empty_cache()
        settings = {"reps": reps, "warmup": warmup, "min_window_s": window_s, "dtype": "bf16",
                    "seconds": round(time.perf_counter() - t0, 1), "cases_done": len(measured)}
        if checkpoint is not None:
            checkpoint(measured, info, settings, traffic)
    return measured, info, settings, traffic


def _piece_closure(torch, key: str, a, b, c):
    """A closure running piece ``key`` on views of the case's full operands (A [M, K], B [K, N],
    C [M, N]): row pieces use the first rows of A and C; K pieces a column view of A (leading
    dimension K, as a 2-D split really is) and the matching rows of B; ``+acc`` pieces
    accumulate into C; copies move the first BYTES of A into C (an elementwise SM kernel)."""
    kind, spec = key.split(":", 1)
    if kind == "copy":
        n = int(spec) // 2
        src, dst = a.reshape(-1)[:n], c.reshape(-1)[:n]
        if src.numel() < n or dst.numel() < n:
            src = torch.empty(n, dtype=a.dtype, device=a.device).fill_(1)
            dst = torch.empty_like(src)
        return lambda: torch.mul(src, 1.0, out=dst)
    acc = spec.endswith("+acc")
    m, n, k = (int(x) for x in spec.removesuffix("+acc").split("x"))
    av, bv, cv = a[:m, :k], b[:k, :n], c[:m, :n]
    if acc:
        return lambda: cv.addmm_(av, bv)
    return lambda: torch.matmul(av, bv, out=cv)


# ----------------------------------------------------------------------------- main

def make_plan(full: bool, gpu: str) -> list[dict]:
    """Per scaled Table I shape: its pieces, each schedule's compute sequence, and (for the
    dry run) the cost-model estimator's fastest schedule and the heuristic's pick with DMA."""
    cost = cost_model_for_cluster(machine(gpu, None, WORLD))
    plan = []
    for name, m, n, k, scale in shapes(full):
        case = case_for(name, m, n, k, "dma", gpu)
        ests = estimate_all(case, cost)
        plan.append({"name": name, "m": m, "n": n, "k": k, "scale": scale, "pattern": case.pattern,
                     "pieces": distinct_pieces(case), "sequences": schedule_pieces(case),
                     "model_dma": {e.schedule: e.time_s for e in ests},
                     "model_best_dma": min(ests, key=lambda e: e.time_s).schedule,
                     "heuristic_dma": heuristic_pick(case)[0]})
    return plan


def parse_args(argv=None) -> argparse.Namespace:
    """The command-line options (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="ccoverlap-out/gpu", help="folder for ficco_pieces.json/.md")
    ap.add_argument("--gpu", help="catalog GPU (default: recognised from the device; H100-SXM in a dry run)")
    ap.add_argument("--calibration", help="calibration file for the transfers' cost model and the estimator")
    ap.add_argument("--device", help="CUDA device (cuda, cuda:N)")
    ap.add_argument("--full", action="store_true", help="the full calibration budget (2e13 FLOP per GEMM) "
                                                        "instead of the quick one (4e12)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: list the pieces and the cost model's view")
    ap.add_argument("--from-json", metavar="FILE", help="re-analyse the measurements of an earlier run (no GPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--window-ms", type=float, default=3.0)
    ap.add_argument("--sm-channels", type=int, default=16, help="NC of the SM traffic (default 16)")
    ap.add_argument("--sm-threads", type=int, default=512, help="NT of the SM traffic (default 512)")
    ap.add_argument("--sm-chunk-kib", type=int, default=512, help="C of the SM traffic in KiB (default 512)")
    ap.add_argument("--kernel", choices=("auto", "cuda", "triton"), default="auto")
    return ap.parse_args(argv)


def run(args) -> dict:
    """Do what the arguments say; returns the JSON document."""
    if args.reps < 1 or args.warmup < 0 or args.window_ms <= 0:
        raise ConfigError("--reps must be >= 1, --warmup >= 0 and --window-ms > 0")
    if args.dry_run and args.from_json:
        raise ConfigError("--dry-run and --from-json exclude each other")
    if args.calibration and not Path(args.calibration).is_file():
        raise ConfigError(f"--calibration: no such file: {args.calibration}")
    command = "python3 benchmarks/gpu_ficco_pieces.py " + " ".join(sys.argv[1:])
    measured, device, settings, traffic, full = None, {}, {}, {}, args.full
    if args.from_json:
        try:
            old = json.loads(Path(args.from_json).read_text())
            measured, device = old["measured"], old.get("device") or {}
            settings, traffic = old["settings"], old["traffic"]
            full = bool(old.get("full", False))
        except FileNotFoundError:
            raise ConfigError(f"--from-json: no such file: {args.from_json}") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"--from-json: {args.from_json} is not a ficco_pieces JSON file "
                              f"({type(exc).__name__}: {exc})") from None
        if not measured:
            raise ConfigError(f"--from-json: {args.from_json} holds no measurements (a dry run?)")
    gpu = args.gpu or device.get("catalog_gpu")
    if not args.dry_run and not args.from_json:
        from ccoverlap.calibrate import microbench as mb

        dev = require_gpu(args.device)
        gpu = gpu or mb.device_info(dev).get("catalog_gpu")
        if not gpu:
            raise ConfigError("this GPU is not in the catalog; pass --gpu NAME")
    gpu = gpu or "H100-SXM"
    plan = make_plan(full, gpu)
    if not args.dry_run and not args.from_json:
        partial = Path(args.out) / f"{FILE_STEM}.partial.json"
        measured, device, settings, traffic = measure(
            plan, device=args.device, reps=args.reps, warmup=args.warmup, window_s=args.window_ms / 1e3,
            nc=args.sm_channels, nt=args.sm_threads, chunk=args.sm_chunk_kib * KiB, kernel_prefer=args.kernel,
            checkpoint=lambda m, info, st, tr: write_partial(partial, m, info, st, tr, full))
    doc = {"tool": "benchmarks/gpu_ficco_pieces.py",
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "command": command,
           "gpu": gpu, "calibration": args.calibration, "device": device, "settings": settings, "traffic": traffic,
           "full": full, "dry_run": bool(args.dry_run), "train": list(TRAIN), "plan": plan}
    if measured:
        doc["measured"] = measured
        doc["contention"] = contention_table(plan, measured)
        doc["analysis"] = analyse(plan, measured, gpu=gpu, calibration=args.calibration)
    return doc


def write_partial(path: Path, measured: dict, info: dict, settings: dict, traffic: dict, full: bool) -> None:
    """The cases measured so far, in the layout ``--from-json`` reads (a run cut short by a
    time limit keeps them; the analysis skips missing cases and the retune needs all 16)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"measured": measured, "device": info, "settings": settings, "traffic": traffic,
                                "full": full}) + "\n")


def write_outputs(doc: dict, out_dir: str) -> list[Path]:
    """Write ``ficco_pieces.json`` and ``.md`` into ``out_dir``."""
    from ccoverlap.calibrate.fileformat import write_result_files

    return write_result_files(doc, out_dir, FILE_STEM, markdown(doc))


def main(argv=None) -> int:
    """Run, write the outputs, print a summary; 0, or 2 with one line on stderr for bad input."""
    args = parse_args(argv)
    try:
        doc = run(args)
        paths = write_outputs(doc, args.out)
    except CCOverlapError as exc:
        sys.stderr.write(f"gpu_ficco_pieces: error: {exc}\n")
        return 2
    if doc.get("measured") and not args.from_json:
        (Path(args.out) / f"{FILE_STEM}.partial.json").unlink(missing_ok=True)
    if args.dry_run:
        for p in doc["plan"]:
            print(f"{p['name']:>4} {p['m']}x{p['n']}x{p['k']} (x{p['scale']:.3f}) {len(p['pieces'])} pieces; "
                  f"model best (dma) {p['model_best_dma']}, heuristic {p['heuristic_dma']}")
    for engine, res in (doc.get("analysis") or {}).items():
        if res.get("skipped"):
            print(f"{engine}: not analysed: {res['skipped']}")
            continue
        print(f"{engine}: heuristic = measured best in {res['heuristic_matches']}/{res['cases']} cases")
        if res.get("retune"):
            rt = res["retune"]
            print(f"  retuned on {len(rt['train'])} cases: test matches {rt['test_default']['matches']} -> "
                  f"{rt['test_retuned']['matches']} of {rt['test_default']['cases']}")
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
