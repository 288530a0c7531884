"""Replay a job and its what-ifs; summarize each scenario (seconds).

A scenario's **step time** is, per rank, the time from the start of the analysed window (where
the measured one started, the same in every scenario) to the end of the last analysed step,
divided by the number of steps; the job's is the slowest rank's (:mod:`.core`). Exposed
communication and overlap are the per-rank means over the analyser's per-step windows.

A what-if is replayed on the *rebuilt* step (the unedited graph replayed), and reported in the
measured step's time: each of its times is the measured one x (what-if / rebuilt)
(:func:`in_measured_time`), so a what-if that only removes or shortens work - never longer than
the rebuilt step (max-plus) - can never exceed the measured step, whatever the rebuilt step's own
error (:attr:`ReplayResult.rebuilt_error_pct`, printed). Gains are against the measured step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ccoverlap.catalog.hardware import ClusterSpec, get_cluster
from ccoverlap.errors import ConfigError
from ccoverlap.replayer import decide as D
from ccoverlap.replayer import whatif as W
from ccoverlap.replayer.core import Job, Measured, fidelity_rows, gpu_times, load_job, measure, step_time
from ccoverlap.replayer.explain import explain
from ccoverlap.sim.timeline import job_overlap_ratio


@dataclass
class Scenario:
    """One replayed scenario: its numbers (s), its per-rank metrics and the edit's note."""

    name: str
    note: str
    measured: Measured
    step_time_s: float
    exposed_comm_s: float
    overlap_ratio: float
    comm_s: float
    per_step: dict[int, float] = field(default_factory=dict)     # step -> the slowest rank's time for that step
    step_end_s: dict[int, float] = field(default_factory=dict)   # step -> latest end over ranks, from the window start
    gain_s: float = 0.0
    gain_pct: float = 0.0
    rebuilt_step_time_s: float | None = None   # a what-if's own replayed step time, before in_measured_time
    times: np.ndarray | None = None     # node start times of the replay (JobGraph.run), when kept
    dur: np.ndarray | None = None       # node durations used, when kept

    def to_dict(self) -> dict:
        """JSON-ready summary (seconds)."""
        m = self.measured
        return {"name": self.name, "note": self.note, "step_time_s": self.step_time_s,
                "exposed_comm_s": self.exposed_comm_s, "overlap_ratio": self.overlap_ratio,
                "comm_s": self.comm_s, "gain_s": self.gain_s, "gain_pct": self.gain_pct,
                "rebuilt_step_time_s": self.rebuilt_step_time_s,
                "per_step": {str(k): v for k, v in self.per_step.items()},
                "step_end_s": {str(k): v for k, v in self.step_end_s.items()},
                "per_rank": {str(r): _rank_dict(m, r) for r in m.overall}}


def _rank_dict(m: Measured, r: int) -> dict:
    b = m.bounds[r]
    ends, prev, steps = b.ends, b.start_s, {}
    for st in sorted(ends):
        x = m.steps[r][st]
        steps[str(st)] = {"step_time_s": ends[st] - prev, "end_s": ends[st] - b.start_s,
                          "window_s": x.step_time_s, "exposed_comm_s": x.exposed_comm_s,
                          "overlap_ratio": x.overlap_ratio}
        prev = ends[st]
    o = m.overall[r]
    return {"step_time_s": (b.end_s - b.start_s) / b.n_steps, "exposed_comm_s": o.exposed_comm_s,
            "overlap_ratio": o.overlap_ratio, "steps": steps}


@dataclass
class ReplayResult:
    """Everything ``ccoverlap replay`` prints."""

    job: Job
    measured: Scenario
    replay: Scenario
    whatifs: list[Scenario]
    fidelity: list[dict]
    cluster: str = ""
    explanation: str = ""

    @property
    def rebuilt_error_pct(self) -> float:
        """The rebuilt step's error against the measured step (%, + = rebuilt longer)."""
        m = self.measured.step_time_s
        return 100 * (self.replay.step_time_s - m) / m if m > 0 else 0.0

    def ranked(self) -> list[Scenario]:
        """What-ifs, largest gain first."""
        return sorted(self.whatifs, key=lambda s: -s.gain_s)


def summarize(name: str, note: str, m: Measured) -> Scenario:
    """Job-level numbers of one scenario from its per-rank bounds and per-step metrics."""
    per_step: dict[int, float] = {}
    ends: dict[int, float] = {}
    for r, b in m.bounds.items():
        prev = b.start_s
        for st in sorted(b.ends):
            per_step[st] = max(per_step.get(st, 0.0), b.ends[st] - prev)
            ends[st] = max(ends.get(st, -math.inf), b.ends[st] - b.start_s)
            prev = b.ends[st]
    allm = [x for per in m.steps.values() for x in per.values()] or list(m.overall.values())
    n = max(len(allm), 1)
    comm = sum(x.comm_s for x in allm)
    return Scenario(name=name, note=note, measured=m, step_time_s=step_time(m),
                    exposed_comm_s=sum(x.exposed_comm_s for x in allm) / n,
                    overlap_ratio=job_overlap_ratio(allm),
                    comm_s=comm / n, per_step=dict(sorted(per_step.items())), step_end_s=dict(sorted(ends.items())))


def cluster_for(job: Job, name: str | None) -> tuple[ClusterSpec, str]:
    """The catalog cluster for the cost-model what-ifs: ``name``, else from the traces' GPU
    name (A100 / H100 / H200 / MI300X / A40), else dgx-h100; with a note when assumed."""

    if name:
        return get_cluster(name), ""
    devs = " ".join(job.device_names.values()).upper()
    for key, cl in (("H200", "hgx-h200"), ("H100", "dgx-h100"), ("A100", "dgx-a100"), ("MI300", "mi300x"),
                    ("A40", "a40-pcie")):
        if key in devs:
            return get_cluster(cl), f"cluster {cl} from the GPU name (--cluster to choose)"
    return get_cluster("dgx-h100"), "GPU not named in the traces: cluster dgx-h100 assumed (--cluster to choose)"


class _Runner:
    """Replays edits of one job and measures them against the replay of the unedited graph."""

    def __init__(self, job: Job, base_s: float, keep_times: bool):
        self.job, self.base_s, self.keep_times = job, base_s, keep_times

    def measure(self, e: W.Edit, metrics: bool = True) -> tuple[Measured, np.ndarray]:
        """The edit replayed and measured (with the window start of the unedited replay), and its node times."""
        t = e.run(self.job.graph)
        return measure(self.job, *gpu_times(self.job, t, e.dur), anchors=self.job.anchors, metrics=metrics), t

    def step_time(self, e: W.Edit) -> float:
        """The step time of an edit (s)."""
        return step_time(self.measure(e, metrics=False)[0])

    def scenario(self, e: W.Edit) -> Scenario:
        """The edit as a :class:`Scenario` with its gain over the unedited replay."""
        m, t = self.measure(e)
        sc = summarize(e.name, e.note, m)
        sc.gain_s = self.base_s - sc.step_time_s
        sc.gain_pct = 100 * sc.gain_s / self.base_s if self.base_s > 0 else 0.0
        if self.keep_times:
            sc.times, sc.dur = t, e.dur
        return sc


def _decided(run: _Runner, name: str, units: list, notes: list[str], extra: str) -> W.Edit:
    """The ``lagom``/``centauri`` edit: the decider's units the replay finds faster (:func:`decide.keep_faster`)."""
    e, kept, rejected = D.keep_faster(run.job.graph, name, units, run.step_time, run.base_s)
    parts = []
    if kept:
        parts.append(f"applied {len(kept)}: " + _few(kept))
    if rejected:
        parts.append(f"kept the given configuration for {len(rejected)} that replay no faster: " + _few(rejected))
    if not units:
        parts.append("nothing to change")
    parts += notes
    if extra:
        parts.append(extra)
    e.note = "; ".join(parts)
    return e


def _few(labels: list[str], n: int = 3) -> str:
    """The first ``n`` labels, and how many more."""
    return ", ".join(labels[:n]) + (f" and {len(labels) - n} more" if len(labels) > n else "")


def _edit(run: _Runner, name: str, t0: np.ndarray, cluster: tuple[ClusterSpec | None, str], named: bool) -> W.Edit:
    jg = run.job.graph
    cl, cl_note = cluster
    if name == "no-comm":
        return W.no_comm(jg)
    if name == "comm-hidden":
        return W.comm_hidden(jg)
    if name == "no-contention":
        return W.no_contention(jg)
    if name == "centauri":
        units, notes = D.centauri_units(jg, t0)
        return _decided(run, name, units, notes, "")
    assert cl is not None       # replay() looked the cluster up: a what-if on the cost model is asked for
    if name == "copy-engine":
        return W.copy_engine(jg, cl, cl_note)
    if name == "lagom":
        units, notes = D.lagom_units(jg, t0, cl)
        return _decided(run, name, units, notes, f"{cl.name} cost model; NCCL defaults assumed measured"
                        + (f"; {cl_note}" if cl_note else ""))
    m = W.NET.match(name)
    if not m:   # pragma: no cover - check_names rejected it
        raise ConfigError(f"unknown what-if {name}")
    note = cl_note.replace("cluster", "GPUs per node of", 1) if cl_note and not named else cl_note
    return W.network(jg, float(m.group(1)), cl, model=named, cluster_note=note)


def replay(paths: Sequence[str], *, steps: str | None = "hta", whatifs: Sequence[str] | None = None,
           cluster: str | None = None, keep_times: bool = False) -> ReplayResult:
    """Load the traces, replay them, run the what-ifs (default all of :data:`whatif.DEFAULT_WHATIFS`).

    ``keep_times``: keep every scenario's node times and every runtime call (for
    :func:`report.write_chrome`).
    """

    names = W.check_names(list(whatifs) if whatifs is not None else ["all"])
    job = load_job(paths, steps=steps, keep_calls=keep_times)
    jg = job.graph
    meas = measure(job, {rt.rank: rt.timeline.start_s for rt in job.rts},
                   {rt.rank: rt.timeline.end_s for rt in job.rts})
    t0 = jg.run()
    base_m = measure(job, *gpu_times(job, t0))
    job.anchors = {r: b.start_s for r, b in base_m.bounds.items()}
    nom_m = measure(job, *gpu_times(job, jg.run(w=jg.w_nom)), anchors=job.anchors)
    measured = summarize("measured", "the traces as recorded", meas)
    base = summarize("replay", "the rebuilt step: measured durations, rebuilt dependencies", base_m)
    base.times, base.dur = t0, jg.dur
    run = _Runner(job, base.step_time_s, keep_times)
    cl = cluster_for(job, cluster) if set(names) - {"no-comm", "comm-hidden", "no-contention", "centauri"} else (None, "")
    out = [run.scenario(_edit(run, name, t0, cl, bool(cluster))) for name in names]
    res = ReplayResult(job=job, measured=measured, replay=base, whatifs=out,
                       fidelity=fidelity_rows(meas, base_m, nom_m), cluster=cl[0].name if cl[0] is not None else "")
    res.explanation = explain(res)     # on the rebuilt step, where the critical path is
    for sc in out:
        in_measured_time(sc, measured, base)
    return res


def _scale(x: float, measured: float, rebuilt: float) -> float:
    """``x`` (a time of the replay of an edited graph) x ``measured / rebuilt``; exactly
    ``measured`` when ``x`` is the rebuilt time itself, ``x`` when ``rebuilt`` is 0."""
    if x == rebuilt:
        return measured
    return x * measured / rebuilt if rebuilt > 0 else x


def in_measured_time(sc: Scenario, measured: Scenario, rebuilt: Scenario) -> None:
    """Put what-if ``sc`` (replayed on the rebuilt step) in the measured step's time, in place:
    step time, exposed and total communication x (measured / rebuilt step time), each step's end
    and time x (measured / rebuilt) of that step; gains against the measured step. A what-if no
    longer than the rebuilt step is then no longer than the measured one, step by step."""
    m, r = measured.step_time_s, rebuilt.step_time_s
    sc.rebuilt_step_time_s = sc.step_time_s
    sc.step_time_s = _scale(sc.step_time_s, m, r)
    k = m / r if r > 0 else 1.0
    sc.exposed_comm_s *= k
    sc.comm_s *= k
    sc.step_end_s = {st: _scale(e, measured.step_end_s.get(st, e), rebuilt.step_end_s.get(st, 0.0))
                     for st, e in sc.step_end_s.items()}
    sc.per_step = {st: _scale(x, measured.per_step.get(st, x), rebuilt.per_step.get(st, 0.0))
                   for st, x in sc.per_step.items()}
    sc.gain_s = m - sc.step_time_s
    sc.gain_pct = 100 * sc.gain_s / m if m > 0 else 0.0


def recommendation(res: ReplayResult) -> str:
    """One plain-words recommendation from the ranked what-ifs."""
    base = res.measured.step_time_s
    bound = next((s for s in res.whatifs if s.name == "no-comm"), None)
    actionable = [s for s in res.ranked() if s.name not in ("no-comm", "comm-hidden") and
                  not s.name.startswith("network")]
    parts = []
    if bound is not None and base > 0:
        gain = 0.0 if abs(bound.gain_s) <= 1e-9 * base else bound.gain_s     # float rounding of equal ends
        parts.append(f"communication costs at most {gain * 1e3:.2f} ms ({100 * gain / base:.1f}%) of the "
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


def finite(x: float) -> float | None:
    """``x`` or None for inf/nan (JSON)."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
