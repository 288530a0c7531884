"""Replay a job and its what-ifs; summarise each scenario (seconds).

A scenario's **step time** is, per profiler step, the slowest rank's step window (the
analyser's per-step window), averaged over the analysed steps; exposed communication and
overlap are the per-rank means of the same windows. Gains are against the replay of the
unedited graph (which equals the measurement, see :func:`fidelity_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ccoverlap.errors import ConfigError
from ccoverlap.replay import whatif as W
from ccoverlap.replay.core import Job, Measured, fidelity_rows, load_job, measure, replayed_ranks


@dataclass
class Scenario:
    """One replayed scenario: its numbers (s), the replayed ranks and the edit's note."""

    name: str
    note: str
    measured: Measured
    step_time_s: float
    exposed_comm_s: float
    overlap_ratio: float
    comm_s: float
    per_step: dict = field(default_factory=dict)       # step -> slowest rank's step time
    gain_s: float = 0.0
    gain_pct: float = 0.0
    times: object = None        # node start times of the replay (JobGraph.run)
    dur: object = None          # node durations used

    def as_dict(self) -> dict:
        """JSON-ready summary (seconds)."""
        return {"name": self.name, "note": self.note, "step_time_s": self.step_time_s,
                "exposed_comm_s": self.exposed_comm_s, "overlap_ratio": self.overlap_ratio,
                "comm_s": self.comm_s, "gain_s": self.gain_s, "gain_pct": self.gain_pct,
                "per_step": {str(k): v for k, v in self.per_step.items()},
                "per_rank": {str(r): {"step_time_s": m.step_time_s, "exposed_comm_s": m.exposed_comm_s,
                                      "overlap_ratio": m.overlap_ratio,
                                      "steps": {str(st): {"step_time_s": x.step_time_s,
                                                          "exposed_comm_s": x.exposed_comm_s,
                                                          "overlap_ratio": x.overlap_ratio}
                                                for st, x in self.measured.steps.get(r, {}).items()}}
                             for r, m in self.measured.overall.items()}}


@dataclass
class ReplayResult:
    """Everything ``ccoverlap replay`` prints."""

    job: Job
    measured: Scenario
    replay: Scenario
    whatifs: list[Scenario]
    fidelity: list[dict]
    cluster: str = ""

    def ranked(self) -> list[Scenario]:
        """What-ifs, largest gain first."""
        return sorted(self.whatifs, key=lambda s: -s.gain_s)


def summarise(name: str, note: str, m: Measured) -> Scenario:
    """Job-level numbers of one scenario from its per-rank / per-step metrics."""
    steps: dict[int, list] = {}
    for r, per in m.steps.items():
        for s, x in per.items():
            steps.setdefault(s, []).append(x)
    if steps:
        per_step = {s: max(x.step_time_s for x in xs) for s, xs in sorted(steps.items())}
        allm = [x for xs in steps.values() for x in xs]
    else:   # no step annotation: the whole window
        per_step = {}
        allm = list(m.overall.values())
    step_time = float(np.mean(list(per_step.values()))) if per_step else max(x.step_time_s for x in allm)
    comm = sum(x.comm_s for x in allm)
    n_steps = max(len(steps), 1)
    n_ranks = max(len(m.overall), 1)
    return Scenario(name=name, note=note, measured=m, step_time_s=step_time,
                    exposed_comm_s=sum(x.exposed_comm_s for x in allm) / (n_steps * n_ranks),
                    overlap_ratio=sum(x.overlap_s for x in allm) / comm if comm > 0 else 0.0,
                    comm_s=comm / (n_steps * n_ranks), per_step=per_step)


def cluster_for(job: Job, name: str | None):
    """The catalog cluster for the copy-engine cost model: ``name``, else from the traces'
    GPU name (A100 / H100 / H200 / MI300X), else dgx-h100 (said in the note)."""
    from ccoverlap.catalog.hardware import get_cluster

    if name:
        return get_cluster(name), ""
    devs = " ".join(job.device_names.values()).upper()
    for key, cl in (("H200", "hgx-h200"), ("H100", "dgx-h100"), ("A100", "dgx-a100"), ("MI300", "mi300x"),
                    ("A40", "a40-pcie")):
        if key in devs:
            return get_cluster(cl), ""
    return get_cluster("dgx-h100"), "GPU not named in the traces: copy-engine rates of dgx-h100 assumed"


def replay(paths: Sequence[str], *, steps: str | None = "hta", whatifs: Sequence[str] | None = None,
           cluster: str | None = None, keep_times: bool = False) -> ReplayResult:
    """Load the traces, replay them, run the what-ifs (default all of :data:`whatif.DEFAULT_WHATIFS`)."""
    names = W.check_names(list(whatifs) if whatifs is not None else ["all"])
    job = load_job(paths, steps=steps)
    jg = job.graph
    meas = measure(job.rts, job.spec, job.job_step_names)
    t0 = jg.run()
    base_m = measure(replayed_ranks(job, t0), job.spec, job.job_step_names)
    t_nom = jg.run(w=jg.w_nom)
    nom_m = measure(replayed_ranks(job, t_nom), job.spec, job.job_step_names)
    measured = summarise("measured", "the traces as recorded", meas)
    base = summarise("replay", "measured durations, rebuilt dependencies", base_m)
    base.times = t0
    base.dur = jg.dur
    out = []
    cl, cl_note = (None, "")
    for name in names:
        if name == "no-comm":
            e = W.no_comm(jg)
        elif name == "comm-hidden":
            e = W.comm_hidden(jg)
        elif name == "no-contention":
            e = W.no_contention(jg)
        elif name == "copy-engine":
            if cl is None:
                cl, cl_note = cluster_for(job, cluster)
            e = W.copy_engine(jg, cl)
            if cl_note:
                e.note += f"; {cl_note}"
        elif name == "lagom":
            if cl is None:
                cl, cl_note = cluster_for(job, cluster)
            e = W.lagom(jg, t0, cl)
            if cl_note:
                e.note += f"; {cl_note}"
        elif name == "centauri":
            e = W.centauri(jg, t0)
        else:
            m = W._NET.match(name)
            if not m:   # pragma: no cover - check_names rejected it
                raise ConfigError(f"unknown what-if {name}")
            # the trace names the GPU, not the network: the cost model's ratio only for a named cluster
            e = W.network(jg, float(m.group(1)), cluster_for(job, cluster)[0] if cluster else None)
        t = e.run(jg)
        sm = measure(replayed_ranks(job, t, e.dur), job.spec, job.job_step_names)
        sc = summarise(name, e.note, sm)
        sc.gain_s = base.step_time_s - sc.step_time_s
        sc.gain_pct = 100 * sc.gain_s / base.step_time_s if base.step_time_s > 0 else 0.0
        sc.times, sc.dur = t, e.dur
        out.append(sc)
    return ReplayResult(job=job, measured=measured, replay=base, whatifs=out,
                        fidelity=fidelity_rows(meas, base_m, nom_m), cluster=cl.name if cl is not None else "")


def recommendation(res: ReplayResult) -> str:
    """One plain-words recommendation from the ranked what-ifs."""
    base = res.replay.step_time_s
    bound = next((s for s in res.whatifs if s.name == "no-comm"), None)
    actionable = [s for s in res.ranked() if s.name not in ("no-comm", "comm-hidden") and
                  not s.name.startswith("network")]
    parts = []
    if bound is not None and base > 0:
        parts.append(f"communication costs at most {bound.gain_s * 1e3:.2f} ms ({bound.gain_pct:.1f}%) of the "
                     f"{base * 1e3:.2f} ms step (the no-communication bound)")
    best = actionable[0] if actionable else None
    if best is not None and best.gain_pct >= 1.0:
        what = {"lagom": "retune the NCCL resources of the overlapped collectives with Lagom (`ccoverlap tune`)",
                "no-contention": "reduce SM contention of the overlapped collectives (fewer NCCL channels / "
                                 "threads: `ccoverlap tune`, Lagom)",
                "copy-engine": "move the non-reducing collectives to copy engines (FiCCO-style, `ccoverlap ficco`)",
                "centauri": "partition the most exposed collectives and pipeline them with their consumers "
                            "(Centauri; chunked all-gather / all-to-all)"}.get(best.name, best.name)
        parts.append(f"the best change to try is to {what}: {best.gain_s * 1e3:.2f} ms "
                     f"({best.gain_pct:.1f}%) predicted")
    elif actionable:
        parts.append("none of the overlap changes gains 1% or more: look at compute, not overlap")
    net = [s for s in res.whatifs if s.name.startswith("network")]
    if net and all(abs(s.gain_pct) < 0.5 for s in net):
        parts.append("the network speed barely matters here")
    return "; ".join(parts) + "." if parts else "nothing to recommend (no what-if run)."


def finite(x: float):
    """``x`` or None for inf/nan (JSON)."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
