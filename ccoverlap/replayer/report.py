"""Output of ``ccoverlap replay``: tables, JSON, a picture, and Chrome traces of each scenario.

The Chrome traces keep the Kineto layout ``ccoverlap analyze`` reads: device events with
their original names, categories, streams and correlation ids, the CUDA runtime calls at
their replayed times (so each kernel's step is found by its launch, as for a real trace),
``ProfilerStep#N`` annotations at their replayed times, and the collective args. Times are
µs since the job's origin; ``traceName`` starts with "ccoverlap simulated" so ``analyze``
keeps exact times (no µs rounding) and reads back the numbers replay printed.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import IO, Any

import numpy as np

from ccoverlap.console import Col, make_console, print_table, print_wrapped
from ccoverlap.outputs import save_figure, write_files
from ccoverlap.replayer.core import gpu_times, replayed_annotations, replayed_calls
from ccoverlap.replayer.graph import RankGraph
from ccoverlap.replayer.run import ReplayResult, Scenario, recommendation
from ccoverlap.trace.classify import RankTrace

_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "kernel", "kernel")


def _ms(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.3f}"


def print_report(res: ReplayResult, file: IO | None = None) -> None:
    """Fidelity table, what-if table (ranked), inferred dependencies, why analyze and replay
    differ (when they do), recommendation; every cell whole at any width
    (:func:`ccoverlap.console.print_table`)."""
    con = make_console(file, highlight=False)
    job = res.job
    steps = "whole window (no ProfilerStep annotation)" if job.whole_window else f"steps: {job.spec}"
    con.print(f"[bold]ccoverlap replay[/bold] - {len(job.rts)} rank(s), {steps}; times in ms")
    rows = [[str(r["rank"]), "-" if r["step"] is None else str(r["step"]), _ms(r["measured_s"]), _ms(r["replayed_s"]),
             f"{r['error_pct']:+.2f}%", _ms(r.get("structure_s")), f"{r.get('structure_error_pct', math.nan):+.2f}%"]
            for r in res.fidelity]
    print_table(con, [Col("rank"), Col("step"), Col("measured"), Col("replayed"), Col("error"),
                      Col("structure only"), Col("error (structure)")], rows,
                title="Fidelity: replayed vs measured step window (per rank and step)")
    print_wrapped(con, "replayed: every op's binding gap as measured (exact by construction when the graph is "
                       "consistent); structure only: GPU-side gaps nominal (0 on a stream, the median launch latency), "
                       "CPU gaps and durations measured - how much of the step the dependencies alone explain", indent=2)
    rows = [[s.name, _ms(s.step_time_s), _ms(s.exposed_comm_s), f"{s.overlap_ratio:.1%}", "", "", s.note]
            for s in (res.measured, res.replay)]
    rows += [[s.name, _ms(s.step_time_s), _ms(s.exposed_comm_s), f"{s.overlap_ratio:.1%}", _ms(s.gain_s),
              f"{s.gain_pct:+.1f}%", s.note] for s in res.ranked()]
    print_table(con, [Col("scenario", "left"), Col("step time"), Col("exposed comm"), Col("overlap"), Col("gain ms"),
                      Col("gain %"), Col("what changed", "left", note=True)], rows,
                title="What-ifs (ranked by gain; step time = window start to the end of the last step, per step, "
                      "slowest rank)")
    print_wrapped(con, rebuilt_line(res), indent=2)
    con.print("Dependencies:")
    for g in job.graph.ranks:
        inf = g.inferred
        print_wrapped(con, f"rank {g.rank}: launches by correlation id; stream order by stream id; cross-stream "
                           f"{inf['cross_stream_from_args']} from cuda_sync args, "
                           f"{inf['cross_stream_inferred_from_timing']} inferred from timing; "
                           f"{inf['host_sync_blocking_calls']} blocking host call(s) (target inferred from timing "
                           f"when the trace names none); {inf['launch_queue_waits']} launch-queue wait(s); launch "
                           f"latency {inf['launch_latency_us']:.1f} us", indent=2)
    nc = len(job.graph.collectives)
    print_wrapped(con, f"collectives matched across ranks (process group + call order, ends aligned): {nc}"
                       + ("" if len(job.rts) > 1 else " (one rank only: collective durations as measured, "
                                                        "waiting for peers included)"), indent=2)
    if res.explanation:
        con.print(f"[bold]Why analyze and replay differ:[/bold] {res.explanation}")
    con.print(f"[bold]Recommendation:[/bold] {recommendation(res)}")


def rebuilt_line(res: ReplayResult) -> str:
    """The rebuilt step against the measured one, and how the what-ifs are put in measured time."""
    return (f"rebuilt step: {_ms(res.replay.step_time_s)} ms, measured {_ms(res.measured.step_time_s)} ms, "
            f"error {round(res.rebuilt_error_pct, 2) + 0.0:+.2f}%; each what-if is replayed on the rebuilt step and shown as the "
            f"measured step x (what-if / rebuilt)")


def to_dict(res: ReplayResult, extra: dict | None = None) -> dict:
    """One JSON-ready object (seconds)."""
    job = res.job
    doc = {
        "tool": "ccoverlap replay",
        "files": job.files,
        "problems": job.problems,
        "steps": {"spec": job.spec, "whole_window": job.whole_window},
        "fidelity": res.fidelity,
        "measured": res.measured.to_dict(),
        "replay": res.replay.to_dict(),
        "rebuilt": {"step_time_s": res.replay.step_time_s, "measured_step_time_s": res.measured.step_time_s,
                    "error_pct": res.rebuilt_error_pct},
        "whatifs": [s.to_dict() for s in res.ranked()],
        "dependencies": {str(g.rank): g.inferred for g in job.graph.ranks},
        "collectives_matched": len(job.graph.collectives),
        "engine": job.graph.engine,
        "explanation": res.explanation,
        "recommendation": recommendation(res),
        "cluster": res.cluster,
    }
    if extra:
        doc.update(extra)
    return _clean(doc)


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return float(f"{v:.12g}") if math.isfinite(v) else None
    return x


def _device_events(g: RankGraph, rt: RankTrace, starts: np.ndarray, ends: np.ndarray) -> list[dict[str, Any]]:
    tl, dc = rt.timeline, g.device
    ev: list[dict[str, Any]] = []
    for i in range(len(tl)):
        args = {"device": int(dc.device[i]), "stream": int(dc.stream[i]), "correlation": int(dc.corr[i]),
                "ccoverlap_kind": str(tl.kind[i])}
        if tl.kind[i] == "comm":
            args.update({"Collective name": str(tl.collective[i]), "In msg nelems": int(tl.bytes[i]),
                         "Out msg nelems": int(tl.bytes[i]), "dtype": "Byte",
                         "Group size": int(rt.group_size[i]), "Process Group Name": str(tl.group[i])})
        ev.append({"ph": "X", "cat": _CATS[int(dc.cat[i])], "name": str(tl.name[i]), "pid": int(dc.device[i]),
                   "tid": int(dc.stream[i]), "ts": float(starts[i]) * 1e6,
                   "dur": float(ends[i] - starts[i]) * 1e6, "args": args})
    return ev


def write_chrome(res: ReplayResult, scenario: Scenario, out_dir: str | Path) -> list[Path]:
    """One ``rank-<r>.json.gz`` per rank of ``scenario`` in ``out_dir`` (see the module docstring);
    the scenario's node times must have been kept (``replay(..., keep_times=True)``)."""
    job = res.job
    jg = job.graph
    if scenario.times is None or any(g.calls is None for g in jg.ranks):
        raise ValueError(f"scenario {scenario.name}: node times not kept (replay(..., keep_times=True))")
    starts, ends = gpu_times(job, scenario.times, scenario.dur)
    files: dict[str, bytes | str] = {}
    world = max((rt.meta.get("world_size") or 0 for rt in job.rts), default=0) or len(job.rts)
    for gi, g in enumerate(jg.ranks):
        rt = g.rt
        ev = _device_events(g, rt, starts[rt.rank], ends[rt.rank])
        pid_cpu = 1_000_000 + rt.rank
        cs, ce = replayed_calls(job, gi, scenario.times, scenario.dur)
        c = g.calls
        assert c is not None        # checked above: every rank kept its calls
        for j in range(len(cs)):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": c.names[j], "pid": pid_cpu, "tid": int(c.tid[j]),
                       "ts": float(cs[j]) * 1e6, "dur": float(ce[j] - cs[j]) * 1e6,
                       "args": {"correlation": int(c.corr[j])}})
        for num, s, e, gpu, tid in replayed_annotations(job, gi, scenario.times, ce, starts[rt.rank]):
            ev.append({"ph": "X", "cat": "gpu_user_annotation" if gpu else "user_annotation",
                       "name": f"ProfilerStep#{num}", "pid": 0 if gpu else pid_cpu, "tid": 0 if gpu else tid,
                       "ts": s * 1e6, "dur": (e - s) * 1e6, "args": {}})
        doc = {"schemaVersion": 1, "traceName": f"ccoverlap simulated replay {scenario.name} rank {rt.rank}",
               "distributedInfo": {"backend": "nccl", "rank": rt.rank, "world_size": world},
               "deviceProperties": [{"id": 0, "name": job.device_names.get(rt.rank, "")}],
               "displayTimeUnit": "ms", "traceEvents": ev}
        files[f"rank-{rt.rank}.json.gz"] = gzip.compress(json.dumps(doc).encode(), compresslevel=1)
    return write_files(out_dir, files)  # the set, all or none


def write_png(res: ReplayResult, path: str | Path) -> Path:
    """Bar chart: step time of measured, replay and every what-if, exposed communication hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sc = [res.measured, res.replay] + res.ranked()
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(sc)), 4))
    x = np.arange(len(sc))
    st = [s.step_time_s * 1e3 for s in sc]
    ex = [min(s.exposed_comm_s, s.step_time_s) * 1e3 for s in sc]
    ax.bar(x, st, color="#4c72b0", label="step time")
    ax.bar(x, ex, color="none", edgecolor="#c44e52", hatch="//", label="exposed communication")
    ax.set_xticks(x, [s.name for s in sc], rotation=30, ha="right")
    ax.set_ylabel("ms")
    ax.set_title("ccoverlap replay: step time per scenario")
    ax.legend()
    fig.tight_layout()
    try:
        return save_figure(fig, path, dpi=100)
    finally:
        plt.close(fig)
