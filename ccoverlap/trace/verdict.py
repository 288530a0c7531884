"""The verdict: what limits this run, in plain words, and the one change most worth trying.

Five outcomes, decided on the analysed window summed over ranks. Each rank's exposed
communication is first capped by what removing all communication could save on its critical
path (:mod:`ccoverlap.trace.critical`; GPU traces): exposed communication the GPU would have
idled through anyway - waiting for the CPU to launch the next kernel - is not a gain; and the
job runs at its slowest rank's pace, so the job's bound is the slowest rank's step minus the
slowest step left after each rank's saving (a rank waiting in a collective for a later one
saves nothing for the job).

* **communication-bound** - R = compute / communication < 1: even a perfect overlap leaves
  ``comm - compute`` exposed; the communication itself has to get cheaper (and removing it
  would save at least ``threshold`` of the step).
* **overlap-limited** - communication is exposed while compute runs alone elsewhere in the
  step: ``hideable = min(exposed comm, compute-only time, critical-path bound)`` is at least
  ``threshold`` (5 %) of the step time. Issue the collectives earlier / asynchronously.
* **contention-limited** - overlapped compute runs slower than the same kernels alone
  (:mod:`ccoverlap.trace.contention`, Lagom §3.2 / FiCCO §IV-D): the time lost is at least
  ``threshold`` of the step and the slowdown at least 5 %. Give communication fewer SMs /
  channels, or move it to copy engines.
* **host-bound** - exposed communication is at least ``threshold`` of the step, but the
  critical-path bound is not: the GPU waits for the CPU, and overlap cannot shorten the step.
  Speed up the host side first.
* **fine** - none of the above reaches the threshold.

When both overlap and contention qualify, the larger potential gain wins.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ccoverlap.sim.timeline import RankMetrics
from ccoverlap.trace.collectives import CollectiveStats
from ccoverlap.trace.contention import Contention

_ADVICE_COMM_BOUND = {
    "all_gather": "keep the parameter all-gathers inside a node (hybrid sharding, HSDP) or shard over fewer "
                  "ranks, and raise the work per all-gather (larger micro-batch)",
    "reduce_scatter": "keep the gradient reduce-scatters inside a node (hybrid sharding, HSDP) or reduce less "
                      "often (gradient accumulation)",
    "all_reduce": "communicate less often or less: gradient accumulation / larger micro-batches per "
                  "all-reduce, or reduced-precision (bf16) gradient all-reduce",
    "all_to_all": "cut the all-to-all volume or keep it inside a node: place experts / embedding-table "
                  "shards so most tokens stay local, a lower capacity factor, or a hierarchical (intra-node "
                  "first) all-to-all",
}
_ADVICE_OVERLAP = {
    "all_gather": "prefetch the next all-gather while the current layer computes (FSDP forward/backward "
                  "prefetch, limit_all_gathers off), so it runs under compute",
    "reduce_scatter": "start the gradient reduce-scatter during backward (smaller buckets / per-layer "
                      "reduce-scatter on a separate stream) instead of at the end",
    "all_reduce": "start the gradient all-reduce during backward: smaller DDP buckets (bucket_cap_mb) so the "
                  "first buckets reduce while later layers still compute",
    "all_to_all": "overlap the all-to-all with independent expert/attention compute (chunk the dispatch, "
                  "or FiCCO-style finer-grain all-to-all + GEMM)",
}


@dataclass
class Verdict:
    """One label, a sentence why, the one change to try, and the numbers behind it
    (fractions of the summed step time, except ``R`` and ``slowdown``)."""

    label: str
    why: str
    try_next: str
    R: float
    exposed_fraction: float
    hideable_fraction: float
    contention_fraction: float
    slowdown: float
    top_collective: str
    comm_bound_fraction: float = 0.0    # removing all communication saves at most this (critical-path estimate)

    def to_dict(self) -> dict:
        """Plain dict for JSON."""
        return asdict(self)


def _ms(x: float) -> str:
    return f"{x * 1e3:.3g} ms"


_HOST_BOUND_ADVICE = ("speed up the host side of the step first - fewer, larger kernels (torch.compile, CUDA "
                      "graphs), less Python and data loading per step, fewer host syncs (.item(), blocking copies); "
                      "`ccoverlap replay` shows the critical path")


def _job_bound(metrics: list[RankMetrics], bounds: list[float]) -> float:
    """What removing all communication could save, as a fraction of the job's step: the job
    runs at its slowest rank's pace, so a rank that saves more than the slowest one (time it
    waited in a collective for a later rank) does not shorten the step."""
    slowest = max((m.step_time_s for m in metrics), default=0.0)
    if slowest <= 0:
        return 0.0
    after = max(m.step_time_s - b for m, b in zip(metrics, bounds))
    return max(0.0, slowest - after) / slowest


def decide(metrics: list[RankMetrics], colls: list[CollectiveStats], cont: Contention, *,
           threshold: float = 0.05, mode: str = "gpu", comm_bounds: list[float | None] | None = None) -> Verdict:
    """The :class:`Verdict` for the per-rank metrics of the analysed window (``mode`` "cpu":
    gloo collectives on CPU threads, where contention is for CPU cores, not SMs).
    ``comm_bounds``: per rank (as ``metrics``), what removing all communication could save
    (s, :func:`ccoverlap.trace.critical.comm_bound_s`; None: unknown, the exposed time)."""
    step = sum(m.step_time_s for m in metrics)
    comp = sum(m.compute_s for m in metrics)
    comm = sum(m.comm_s for m in metrics)
    exposed = sum(m.exposed_comm_s for m in metrics)
    bounds = [m.exposed_comm_s if b is None else min(b, m.exposed_comm_s)
              for m, b in zip(metrics, comm_bounds or [None] * len(metrics))]
    hideable = sum(min(m.exposed_comm_s, m.compute_only_s, b) for m, b in zip(metrics, bounds))
    f_bound = _job_bound(metrics, bounds)
    n = max(len(metrics), 1)
    R = comp / comm if comm > 0 else float("inf")
    f_exp = exposed / step if step > 0 else 0.0
    f_hide = min(hideable / step, f_bound) if step > 0 else 0.0
    f_cont = max(cont.time_lost_s, 0.0) / step if step > 0 else 0.0
    by_exposed = sorted(colls, key=lambda c: -c.exposed_s)
    top = by_exposed[0].collective if by_exposed and by_exposed[0].exposed_s > 0 else (
        colls[0].collective if colls else "")
    overlap_pct = (1 - exposed / comm) * 100 if comm > 0 else 0.0
    common: dict[str, Any] = dict(R=R, exposed_fraction=f_exp, hideable_fraction=f_hide, contention_fraction=f_cont,
                                  slowdown=cont.slowdown, top_collective=top, comm_bound_fraction=f_bound)
    if comm <= 0:
        return Verdict(label="fine", why="no communication kernels in the analysed window - nothing to overlap",
                       try_next="nothing overlap-related; profile compute efficiency instead", **common)
    if R < 1 and f_bound >= threshold:
        advice = _ADVICE_COMM_BOUND.get(top, "make the communication cheaper (less volume, fewer ranks per "
                                        "collective, or faster links/algorithms)")
        return Verdict(
            label="communication-bound",
            why=(f"compute is only R = {R:.2f}x the communication time ({_ms(comp / n)} vs {_ms(comm / n)} per "
                 f"rank), so even perfect overlap leaves {_ms(max(comm - comp, 0) / n)} of communication exposed "
                 f"per rank; now {f_exp:.0%} of the step is exposed communication"
                 + (f", mostly {top}" if top else "")
                 + (f", and removing it would save up to {f_bound:.0%} on the critical path" if f_bound < f_exp else "")),
            try_next=advice, **common)
    overlap_gain = f_hide
    cont_gain = f_cont if cont.slowdown >= 1.05 else 0.0
    if max(overlap_gain, cont_gain) >= threshold:
        if overlap_gain >= cont_gain:
            advice = _ADVICE_OVERLAP.get(top, "issue the collectives earlier, asynchronously, on their own "
                                         "stream so they run under compute")
            return Verdict(
                label="overlap-limited",
                why=(f"{_ms(exposed / n)} of communication per rank ({f_exp:.0%} of the step) is exposed "
                     f"(overlap {overlap_pct:.0f}%) while compute runs alone for "
                     f"{_ms(sum(m.compute_only_s for m in metrics) / n)}; "
                     f"up to {f_hide:.0%} of the step could be hidden"
                     + (f" - most exposed: {top}" if top else "")),
                try_next=advice, **common)
        return Verdict(
            label="contention-limited",
            why=(f"compute kernels run {cont.slowdown:.2f}x slower while communication runs beside them, "
                 f"adding {_ms(cont.time_lost_s / n)} of compute per rank ({f_cont:.0%} of the step)"),
            try_next=("leave the gloo threads a CPU core: fewer compute threads (torch.set_num_threads) "
                      "or pinning compute and communication to different cores" if mode == "cpu" else
                      "give the collectives fewer GPU resources - fewer NCCL channels/threads "
                      "(NCCL_MAX_NCHANNELS, NCCL_NTHREADS; `ccoverlap tune` searches them, Lagom) or copy-engine "
                      "(DMA) collectives (FiCCO): communication slows a little but stays hidden"),
            **common)
    if f_exp >= threshold:
        return Verdict(
            label="host-bound",
            why=(f"{_ms(exposed / n)} of communication per rank ({f_exp:.0%} of the step) is exposed, but the GPU "
                 f"waits for the CPU to launch the work after it: removing all communication would shorten the "
                 f"step by about {f_bound:.0%} (critical-path estimate)"),
            try_next=_HOST_BOUND_ADVICE, **common)
    return Verdict(
        label="fine",
        why=(f"communication is {overlap_pct:.0f}% overlapped, exposed communication is {f_exp:.0%} of the step "
             f"and contention costs {f_cont:.0%} (slowdown {cont.slowdown:.2f}x)"),
        try_next="little to gain from overlap here; look at compute efficiency or the idle time instead",
        **common)
