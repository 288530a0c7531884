"""Resolve ``schedule="auto"`` (FiCCO §V-C heuristic) and ``schedule="tune"`` (live timing).

Both decisions must be identical on every rank, or ranks would run different collectives
and hang. Both are cached per key (op kind, shapes, dtype, device, group, group size,
backend, comm engine); the per-call cross-rank check (:mod:`ccoverlap.runtime.checks`)
also compares "is this key decided?" across ranks, so a cache cleared on one rank only is
a clear error rather than a hang.

* ``auto``: rank 0's candidate (:func:`auto_candidate`: the FiCCO §V-C heuristic, ``ring`` on a
  CPU transport) is broadcast once per key; unless it is ``serial`` it is then timed against
  ``serial`` on forward + backward through the public op (:data:`AUTO_MEASURE`: paired rounds
  as ``tune``'s, at most 2 s) and kept only when it is faster beyond a 2% tie, so ``auto``
  does not run a schedule that was measured slower than ``serial`` on what training runs.
  The decision is one schedule for both directions of that op.
* ``tune``: the candidates run in *rounds* (one timed call of every remaining candidate per
  round) through the public op, per-call cross-rank check included, so ``tune`` times what a
  user's call (and ``ccoverlap bench``) runs. The order inside a round follows a Williams
  design (:func:`round_order`): over a cycle of rounds every candidate runs right after every
  other one equally often, so no candidate always inherits the same predecessor's state. A
  call's time is the slowest rank's (all-reduce MAX per round). Comparisons are *paired*
  within a round (a shared machine's load changes from round to round and moves every
  candidate of that round alike): for two candidates the per-round ratios of their times
  give a distribution-free confidence interval for the median ratio (sign-test order
  statistics, :func:`median_ratio_interval`, level ``confidence``). After ``min_reps`` rounds
  rank 0 applies :func:`tune_step` every round: a candidate is dropped once it is *provably*
  slower than another remaining one (the interval lies above 1), and tuning stops when one
  remaining candidate is provably within ``margin`` of every other remaining one (one left
  is the special case) - the pick is then the *simplest* such candidate (the order the
  candidates are listed in: fewest transfers first, see :func:`tune_candidates`), a
  deterministic tie-break that costs at most ``margin``. Otherwise it stops after
  ``max_reps`` rounds or when rank 0's clock passes ``budget_s`` and picks the remaining
  candidate with the lowest median of (its time / the fastest time of the same round).
  The stop flag, the pick and the surviving set are broadcast from rank 0, so every rank
  follows rank 0's decision.
  Settings: :func:`set_tune_options` or ``CCOVERLAP_TUNE="min_reps=8,max_reps=200,budget_s=10"``.
* An optional JSON cache file (:func:`set_tune_cache_file` or ``CCOVERLAP_TUNE_CACHE``) keeps
  tune decisions across runs, keyed by op, shapes, dtype, device name, group size, backend
  and engine; only rank 0 reads and writes it and broadcasts what it found.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from ccoverlap.deciders.ficco.heuristic import choose_schedule
from ccoverlap.runtime import comm
from ccoverlap.runtime.machine import MachineSpec, machine_for
from ccoverlap.runtime.schedules import SCHEDULES

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "AUTO_MEASURE",
    "auto_candidate",
    "Decision",
    "TuneOptions",
    "resolve",
    "is_decided",
    "auto_choice",
    "tune_choice",
    "tune_candidates",
    "tuning_cache",
    "clear_tuning_cache",
    "set_tune_options",
    "get_tune_options",
    "set_tune_cache_file",
    "paired_scores",
    "median_ratio_interval",
    "round_order",
    "tune_step",
    "register_op",
]

_lock = threading.Lock()
_cache: dict[tuple, Decision] = {}


@dataclass(frozen=True)
class TuneOptions:
    """How hard ``tune`` measures: rounds (each times every remaining candidate once) and budget.

    ``warmup``: untimed calls per candidate; ``min_reps``/``max_reps``: timed rounds before
    any decision may be taken / at most; ``budget_s``: rank 0's wall-clock budget in seconds
    (checked after each round, at least ``min_reps`` rounds run); ``margin``: relative gap
    (dimensionless) within which a candidate that is *provably* that close to every other one
    ends the tuning (the simplest such is picked); ``confidence``: level of the per-pair
    interval of the median ratio used both to drop a candidate and to call a tie.

    Defaults (assumed, not fitted): ``confidence=0.99`` needs at least 8 rounds before a pair
    can be told apart at all (a sign test over n rounds reaches 1 - 2/2**n), hence
    ``min_reps=8``; ``margin=0.02`` keeps the cost of the tie-break well inside a 5%
    tolerance; ``max_reps=200``/``budget_s=10`` let the time budget bind first on the
    documented CPU shapes (a round of three survivors takes ~0.12 s there on a quiet machine),
    since the call-to-call spread measured there (sigma of log time 0.08-0.14 for one
    schedule on a quiet machine: ``benchmarks/bench_runtime_tune.py --rejudge``) needs tens of
    rounds to resolve gaps of a few percent.
    """

    warmup: int = 2
    min_reps: int = 8
    max_reps: int = 200
    budget_s: float = 10.0
    margin: float = 0.02
    confidence: float = 0.99


def _options_from_env() -> TuneOptions:
    text = os.environ.get("CCOVERLAP_TUNE", "").strip()
    if not text:
        return TuneOptions()
    kw: dict[str, int | float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in TuneOptions.__dataclass_fields__:
            raise ValueError(f"CCOVERLAP_TUNE: unknown option {name!r}; known: {list(TuneOptions.__dataclass_fields__)}")
        kw[name] = float(value) if name in ("budget_s", "margin", "confidence") else int(value)
    return TuneOptions(**kw)  # type: ignore[arg-type]  # each value's type follows its field name above


_options = _options_from_env()
_cache_file: str | None = os.environ.get("CCOVERLAP_TUNE_CACHE") or None


def set_tune_options(**kwargs: int | float) -> TuneOptions:
    """Change the ``tune`` settings (fields of :class:`TuneOptions`) for this process; returns the old ones.

    Must be the same on every rank (rank 0's clock and rules decide, but every rank runs
    the same number of rounds only because they all follow rank 0's broadcast).
    """
    global _options
    old = _options
    new = replace(old, **kwargs)  # type: ignore[arg-type]  # fields are int or float; a wrong name raises TypeError
    if (new.min_reps < 1 or new.max_reps < new.min_reps or new.warmup < 0 or new.budget_s <= 0 or new.margin < 0
            or not 0.5 <= new.confidence < 1):
        raise ValueError(f"set_tune_options: need warmup >= 0, 1 <= min_reps <= max_reps, budget_s > 0, margin >= 0, "
                         f"0.5 <= confidence < 1: {new}")
    _options = new
    return old


def get_tune_options() -> TuneOptions:
    """The current ``tune`` settings."""
    return _options


def set_tune_cache_file(path: str | None) -> str | None:
    """Keep tune decisions in JSON file ``path`` across runs (None: memory only); returns the old path."""
    global _cache_file
    old, _cache_file = _cache_file, path
    return old


@dataclass(frozen=True)
class Decision:
    """A resolved schedule with how it was chosen.

    ``timings_s``: (candidate, median seconds per call, slowest rank) for ``tune``;
    ``samples_s``: every timed call per candidate; ``rounds``: timed rounds run;
    ``elapsed_s``: rank 0's tuning wall time; ``num_chunks``: for all-to-all candidates.
    """

    schedule: str
    how: str
    reason: str
    timings_s: tuple[tuple[str, float], ...] = ()
    samples_s: tuple[tuple[str, tuple[float, ...]], ...] = ()
    rounds: int = 0
    elapsed_s: float = 0.0
    num_chunks: int | None = None
    eliminated: tuple[str, ...] = field(default=())


def _key(
    kind: str, a_shape: Sequence[int], b_shape: Sequence[int], dtype: torch.dtype, device: torch.device,
    group: ProcessGroup | None, mode: str, engine: str,
) -> tuple:
    return (kind, mode, tuple(a_shape), tuple(b_shape), dtype, device.type,
            id(group) if group is not None else 0, comm.group_size(group), comm.backend_of(group), engine)  # fmt: skip


def _file_key(key: tuple, device: torch.device) -> str:
    kind, mode, a, b, dtype, _dev, _gid, p, backend, engine = key
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{kind}|a={list(a)}|b={list(b)}|{str(dtype).replace('torch.', '')}|{name}|P={p}|{backend}|{engine}"


def decision_engine(kind: str, comm_engine: str) -> str:
    """The communication engine ``auto`` / ``tune`` decide an op's schedule for, which keys its
    decision: the requested one for an all-gather (``"ag"``), c10d's (``"sm"``) for a
    reduce-scatter and an all-to-all (copy engines cannot add; the requested engine applies to
    the backward's all-gather only)."""
    return comm_engine if kind == "ag" else "sm"


def is_decided(
    kind: str, a_shape: Sequence[int], b_shape: Sequence[int], dtype: torch.dtype, device: torch.device,
    group: ProcessGroup | None, schedule: str, comm_engine: str = "sm",
) -> bool:
    """Whether ``resolve`` would answer from this process's cache (no communication) for a call
    whose GEMM operands have shapes ``a_shape`` (2-D input) and ``b_shape`` (``[k, n]``)."""
    if schedule not in ("auto", "tune") or comm.group_size(group) == 1:
        return False
    key = _key(kind, a_shape, b_shape, dtype, device, group, schedule, comm_engine)
    with _lock:
        return key in _cache


def tuning_cache() -> dict[tuple, Decision]:
    """A copy of the decisions made so far in this process."""
    with _lock:
        return dict(_cache)


def clear_tuning_cache() -> None:
    """Forget every cached decision (call it on every rank, or on none: the check compares)."""
    with _lock:
        _cache.clear()


def auto_choice(
    kind: str, a: torch.Tensor, b: torch.Tensor, group: ProcessGroup | None, *, comm_engine: str = "sm",
    spec: MachineSpec | None = None,
) -> tuple[str, str]:
    """FiCCO §V-C heuristic for one op call, on this rank only (no communication).

    ``kind`` is ``"ag"`` (``a`` is the shard ``[m, k]``, the GEMM is ``[P*m, k] x [k, n]``) or
    ``"rs"`` (``a`` is ``[P*m, k]``); for ``"rs"`` the 2-D schedule splits the output columns,
    so the heuristic's "K" is the output width ``n`` there. Returns ``(schedule, reason)``.
    """
    p = comm.group_size(group)
    spec = spec or machine_for(a.device)
    big_m = a.shape[0] * p if kind == "ag" else a.shape[0]
    k, n = a.shape[1], b.shape[1]
    split_dim, other = (k, n) if kind == "ag" else (n, k)
    name, reason = choose_schedule(
        max(big_m, 1), max(other, 1), max(split_dim, 1), p, a.element_size(),
        peak_flops=spec.peak_flops(a.dtype), mem_bw_bytes_per_s=spec.mem_bw_bytes_per_s,
        comm_engine=comm_engine, link_bw_bytes_per_s=spec.link_bw_bytes_per_s,
    )  # fmt: skip
    return name, f"{reason} [{spec.name}]"


def paired_scores(samples: dict[str, list[float]], active: Sequence[str]) -> dict[str, float]:
    """Per candidate, the median over rounds of its time divided by the fastest time of that round.

    ``samples[c][i]`` is candidate c's time in round i; every candidate in ``active`` has run in
    every round so far (eliminated ones stop), so the lists line up. Dividing by the same round's
    fastest cancels what a round's load did to all candidates alike (the rounds are interleaved),
    which raw medians under a drifting background load do not. Dimensionless, >= 1.
    """
    n = min(len(samples[c]) for c in active)
    mins = [min(samples[c][i] for c in active) for i in range(n)]
    return {c: statistics.median(samples[c][i] / mins[i] if mins[i] > 0 else 1.0 for i in range(n)) for c in active}


def _sign_test_rank(n: int, confidence: float) -> int:
    """Largest j >= 1 with P(Binomial(n, 1/2) <= j - 1) <= (1 - confidence) / 2, or 0 when none."""
    tail = (1.0 - confidence) / 2.0
    cdf, j = 0.0, 0
    for i in range(n):
        cdf += math.comb(n, i) / 2.0**n
        if cdf > tail:
            break
        j = i + 1
    return j


def median_ratio_interval(num: Sequence[float], den: Sequence[float], confidence: float) -> tuple[float, float]:
    """Confidence interval (level ``confidence``) of the median of the per-round ratios ``num[i] / den[i]``.

    Distribution-free: the j-th smallest and j-th largest ratio, with j from the sign test
    (the median lies below the j-th smallest of n values with probability
    P(Binomial(n, 1/2) <= j - 1)); Hollander & Wolfe, *Nonparametric Statistical Methods*,
    §3.6. Dimensionless. ``(0, inf)`` when there are too few rounds for that level (fewer
    than log2(2 / (1 - confidence)) + 1, i.e. 8 at 0.99). Rounds where ``den`` is 0 are skipped.
    """
    ratios = sorted(a / b for a, b in zip(num, den) if b > 0)
    j = _sign_test_rank(len(ratios), confidence)
    if j == 0:
        return 0.0, math.inf
    return ratios[j - 1], ratios[len(ratios) - j]


def round_order(n: int, round_index: int) -> list[int]:
    """Positions ``0..n-1`` in the order round ``round_index`` runs them (Williams design).

    Row 0 is ``0, 1, n-1, 2, n-2, ...``; row r adds r (mod n); for odd n the rows of the
    second half-cycle are reversed. Over ``n`` rounds (``2n`` for odd n) every position runs
    first equally often and directly after every other position equally often (Williams,
    Aust. J. Sci. Res. A 2 (1949) 149-168), so no candidate always inherits the same
    predecessor's state (a plain rotation keeps every predecessor fixed).
    """
    if n <= 0:
        return []
    first, lo, hi = [0], 1, n - 1
    while lo <= hi:
        first.append(lo)
        lo += 1
        if lo <= hi:
            first.append(hi)
            hi -= 1
    r = round_index % (2 * n if n % 2 else n)
    row = [(x + r) % n for x in first]
    return row[::-1] if n % 2 and r >= n else row


@dataclass(frozen=True)
class TuneStep:
    """Rank 0's decision after one round: who stays, and the pick when tuning can stop."""

    keep: tuple[str, ...]
    pick: str | None
    why: str


def tune_step(samples: dict[str, list[float]], active: Sequence[str], margin: float, confidence: float) -> TuneStep:
    """One round's decision (pure; rank 0 runs it and broadcasts the result).

    ``samples[c][i]``: candidate c's time in round i (seconds, any unit, paired by round);
    ``active``: the remaining candidates, simplest first. With ``I(c, d)`` the
    :func:`median_ratio_interval` of ``c``'s time over ``d``'s at level ``confidence``:

    * **drop** ``c`` when some other remaining ``d`` has ``I(c, d)`` entirely above 1 (``c``
      is provably slower than ``d``; if this would drop every candidate, none is dropped);
    * **stop** when some remaining ``s`` has ``I(s, d)`` entirely at or below ``1 + margin``
      for every other remaining ``d`` (``s`` is provably at most ``margin`` slower than any of
      them); the pick is the first such ``s`` in ``active`` order, the simplest. One candidate
      left is the special case.

    Otherwise ``pick`` is None (go on measuring).
    """
    active = list(active)
    if len(active) == 1:
        return TuneStep(tuple(active), active[0], "the only candidate")
    iv = {(c, d): median_ratio_interval(samples[c], samples[d], confidence) for c in active for d in active if c != d}
    keep = [c for c in active if not any(iv[(c, d)][0] > 1.0 for d in active if d != c)]
    if not keep:  # a cycle of "provably slower" (non-transitive medians): drop nobody this round
        keep = active
    dropped = [c for c in active if c not in keep]
    for s in keep:
        if all(iv[(s, d)][1] <= 1.0 + margin for d in keep if d != s):
            if len(keep) == 1:
                why = "every other candidate provably slower"
            else:
                others = ", ".join(d for d in keep if d != s)
                why = (f"provably within {margin:.0%} of {others} at {confidence:.0%} confidence; "
                       "the simplest of the tied candidates")
            return TuneStep(tuple(keep), s, why)
    return TuneStep(tuple(keep), None, f"dropped {', '.join(dropped)}" if dropped else "undecided")


def tune_choice(
    kind: str,
    run_for: Callable[[str], Callable[[], object]],
    candidates: Sequence[str],
    group: ProcessGroup | None,
    device: torch.device,
    *,
    options: TuneOptions | None = None,
) -> Decision:
    """Time ``candidates`` in interleaved rounds until the order is clear; every rank follows rank 0.

    ``run_for(name)`` returns a zero-argument callable running candidate ``name`` once;
    ``candidates`` are listed simplest first (the tie-break order).
    Collective: every rank of ``group`` must call it with the same candidates. Times are
    seconds per call, MAX over ranks per round. See the module docstring for the stopping
    rule (:func:`tune_step`) and the pick.
    """
    opt = options or _options
    cands = list(candidates)
    runs = {c: run_for(c) for c in cands}
    samples: dict[str, list[float]] = {c: [] for c in cands}
    active = list(cands)
    cdev = comm.comm_device(group)
    is_root = comm.group_rank(group) == 0
    t_start = time.perf_counter()
    why = ""
    with torch.no_grad():
        for c in cands:
            for _ in range(opt.warmup):
                runs[c]()
        rounds = 0
        while True:
            worst = _timed_round(runs, cands, active, rounds, device, group, cdev)
            for c in active:
                samples[c].append(worst[cands.index(c)])
            rounds += 1
            # rank 0 decides whether to go on, who stays and what is picked; everyone follows its broadcast
            keep, pick = active, None
            if is_root:
                keep, pick, why = _root_verdict(samples, cands, active, rounds, opt, t_start, why)
            active, best = _follow_root(cands, keep, pick, is_root, cdev, group)
            if best is not None:
                break
    elapsed = torch.tensor([time.perf_counter() - t_start], dtype=torch.float64, device=cdev)
    comm.broadcast(elapsed, 0, group=group, async_op=False)
    medians = {c: statistics.median(samples[c]) for c in cands}
    table = tuple((c, medians[c]) for c in cands)
    shown = ", ".join(f"{c}={s * 1e3:.3g}ms" for c, s in table)
    if not is_root:
        why = "rank 0's decision"
    return Decision(
        best, "tune", f"{why}; {rounds} interleaved rounds (slowest rank per call; medians {shown})", table,
        tuple((c, tuple(samples[c])) for c in cands), rounds, float(elapsed.item()),
        eliminated=tuple(c for c in cands if c not in active),
    )  # fmt: skip


def _timed_round(runs: dict[str, Callable[[], object]], cands: list[str], active: list[str], rounds: int,
                 device: torch.device, group: ProcessGroup | None, cdev: torch.device) -> list[float]:
    """One round: every active candidate once, in Williams order; seconds per call (MAX over ranks), by ``cands``."""
    local = torch.zeros(len(cands), dtype=torch.float64)
    for pos in round_order(len(active), rounds):
        c = active[pos]
        _sync(device)
        comm.barrier(group)
        t0 = time.perf_counter()
        runs[c]()
        _sync(device)
        local[cands.index(c)] = time.perf_counter() - t0
    t = local.to(cdev)
    comm.all_reduce(t, group=group, op=torch.distributed.ReduceOp.MAX, async_op=False)
    return t.cpu().tolist()


def _root_verdict(samples: dict[str, list[float]], cands: list[str], active: list[str], rounds: int,
                  opt: TuneOptions, t_start: float, why: str) -> tuple[list[str], str | None, str]:
    """Rank 0 after a round: the candidates kept, the pick (None: go on) and why (the previous why if unchanged)."""
    keep, pick = active, None
    if rounds >= opt.min_reps:
        step = tune_step(samples, active, opt.margin, opt.confidence)
        keep, pick, why = list(step.keep), step.pick, step.why
    over = time.perf_counter() - t_start >= opt.budget_s and rounds >= opt.min_reps
    if pick is None and (rounds >= opt.max_reps or over):
        scores = paired_scores(samples, keep)
        pick = min(keep, key=lambda c: (scores[c], cands.index(c)))
        why = (f"{'time budget' if over else 'max_reps'} reached with {len(keep)} candidates not "
               "told apart; lowest median time relative to each round's fastest")
    return keep, pick, why


def _follow_root(cands: list[str], keep: list[str], pick: str | None, is_root: bool, cdev: torch.device,
                 group: ProcessGroup | None) -> tuple[list[str], str | None]:
    """Broadcast rank 0's verdict; every rank returns the candidates still in and the pick (None: go on)."""
    ctl = torch.zeros(2 + len(cands), dtype=torch.int64)
    if is_root:
        ctl[0] = int(pick is not None)
        ctl[1] = cands.index(pick) if pick is not None else -1
        for c in keep:
            ctl[2 + cands.index(c)] = 1
    ctl = ctl.to(cdev)
    comm.broadcast(ctl, 0, group=group, async_op=False)
    flags = ctl.cpu().tolist()
    active = [c for i, c in enumerate(cands) if flags[2 + i]]
    return active, (cands[flags[1]] if flags[0] else None)


def tune_candidates(kind: str) -> tuple[str, ...]:
    """The schedules ``tune`` times for op kind ``"ag"``/``"rs"``: every concrete schedule, simplest first.

    "Simplest" is the tie-break order of :func:`tune_step`: fewest transfers per call first
    (``serial``: one collective; ``ring``: P-1 whole-shard exchanges; the FiCCO schedules:
    P steps of pieces, in the order FiCCO §V-B lists them) - the order of ``SCHEDULES``.
    """
    return SCHEDULES


def resolve(
    kind: str,
    a: torch.Tensor,
    b: torch.Tensor,
    group: ProcessGroup | None,
    schedule: str,
    *,
    comm_engine: str = "sm",
    runner: Callable[[str], Callable[[], object]] | None = None,
    candidates: Sequence[str] | None = None,
) -> Decision:
    """Turn ``schedule`` (a name, ``"auto"`` or ``"tune"``) into a concrete schedule (collective for auto/tune on first use).

    ``runner``/``candidates`` override what ``tune`` times (the all-to-all op passes its own).
    """
    if schedule in SCHEDULES and runner is None:
        return Decision(schedule, "given", "named by the caller")
    if schedule not in ("auto", "tune"):
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {(*SCHEDULES, 'auto', 'tune')}")
    if comm.group_size(group) == 1:
        return Decision("serial", schedule, "one rank: nothing to overlap")
    key = _key(kind, a.shape, b.shape, a.dtype, a.device, group, schedule, comm_engine)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    if schedule == "auto":
        decision = _auto_decision(kind, a, b, group, comm_engine)
    else:
        cands = tuple(candidates or tune_candidates(kind))
        found = _from_file(key, a.device, cands, group)
        if found is None:
            run_for = runner or (lambda name: _runner(kind, a, b, group, name, comm_engine))
            found = tune_choice(kind, run_for, cands, group, a.device)
            _to_file(key, a.device, found, group)
        decision = found
    with _lock:
        _cache[key] = decision
    return decision


def _from_file(key: tuple, device: torch.device, cands: Sequence[str], group: ProcessGroup | None) -> Decision | None:
    """Rank 0 looks the key up in the cache file and broadcasts (found, index); None when not found."""
    path = _cache_file
    found = torch.tensor([-1], dtype=torch.int64)
    entry = None
    if comm.group_rank(group) == 0 and path and os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f).get(_file_key(key, device))
        except (OSError, ValueError):
            entry = None
        if entry and entry.get("schedule") in cands:
            found[0] = list(cands).index(entry["schedule"])
    # every rank takes part in the broadcast whether or not it has a path configured
    found = found.to(comm.comm_device(group))
    comm.broadcast(found, 0, group=group, async_op=False)
    idx = int(found.item())
    if idx < 0:
        return None
    return Decision(list(cands)[idx], "tune", f"from the tune cache file (rank 0: {path})")


def _to_file(key: tuple, device: torch.device, decision: Decision, group: ProcessGroup | None) -> None:
    path = _cache_file
    if not path or comm.group_rank(group) != 0:
        return
    data = {}
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
    data[_file_key(key, device)] = {
        "schedule": decision.schedule,
        "medians_ms": {c: round(s * 1e3, 4) for c, s in decision.timings_s},
        "rounds": decision.rounds,
        "elapsed_s": round(decision.elapsed_s, 3),
    }
    from ccoverlap.outputs import write_text

    write_text(path, json.dumps(data, indent=1, sort_keys=True))  # atomically: concurrent readers see a whole file


#: How ``auto`` times its candidate against ``serial``: forward + backward through the public op,
#: paired interleaved rounds; the candidate is kept only when it is not provably slower and the
#: two are not tied within 2% (a tie keeps ``serial``, the simpler). 95% intervals need 6 rounds.
AUTO_MEASURE = TuneOptions(warmup=1, min_reps=6, max_reps=30, budget_s=2.0, margin=0.02, confidence=0.95)


def auto_candidate(
    kind: str, a: torch.Tensor, b: torch.Tensor, group: ProcessGroup | None, *, comm_engine: str = "sm"
) -> tuple[str, str]:
    """The schedule ``auto`` weighs against ``serial`` (no communication): ``(name, reason)``.

    :func:`auto_choice` (FiCCO §V-C with the "overlap cannot help" step) decides whether
    overlap can pay at all. With a CPU transport (gloo) every step of a schedule is a
    collective whose latency and memory copies cost the very cores the GEMM runs on, so the
    overlapping candidate there is ``ring``, the one with the fewest steps (P-1 exchanges of
    whole shards, the local shard computed while the first is in flight); FiCCO's piece
    schedules (P steps, piece gathers and scatters) target GPU DMA and SM contention.
    """
    name, reason = auto_choice(kind, a, b, group, comm_engine=comm_engine)
    if name == "serial" or a.device.type == "cuda":
        return name, reason
    return "ring", f"CPU transport: ring has the fewest steps ({comm.group_size(group) - 1}); heuristic: {reason}"


def _auto_decision(
    kind: str, a: torch.Tensor, b: torch.Tensor, group: ProcessGroup | None, comm_engine: str
) -> Decision:
    """``auto``: rank 0's candidate; unless it is ``serial``, timed against ``serial`` on forward + backward."""
    name, reason = auto_candidate(kind, a, b, group, comm_engine=comm_engine)
    idx = torch.tensor([SCHEDULES.index(name)], dtype=torch.int64, device=comm.comm_device(group))
    comm.broadcast(idx, 0, group=group, async_op=False)  # rank 0's answer, on every rank
    agreed = SCHEDULES[int(idx.item())]
    if agreed != name:
        reason = f"rank 0's candidate (this rank's said {name})"
    if agreed == "serial":
        return Decision("serial", "auto", reason)
    d = tune_choice(kind, lambda nm: _fwd_bwd_runner(kind, a, b, group, nm, comm_engine), ("serial", agreed), group,
                    a.device, options=AUTO_MEASURE)  # fmt: skip
    why = f"{reason}; timed against serial on forward + backward: {d.reason}"
    return Decision(d.schedule, "auto", why, d.timings_s, d.samples_s, d.rounds, d.elapsed_s, eliminated=d.eliminated)


#: The public ops ``auto`` and ``tune`` time, by op kind (``"ag"``, ``"rs"``): each takes
#: ``(x, weight, group, *, schedule, comm_engine)`` as :func:`~ccoverlap.runtime.ops.all_gather_matmul`
#: does. :mod:`ccoverlap.runtime.ops` imports this module and registers them when it is imported
#: (:func:`register_op`), so this module never imports the ops (no import cycle).
_OPS: dict[str, Callable[..., torch.Tensor]] = {}


def register_op(kind: str, op: Callable[..., torch.Tensor]) -> None:
    """Register the public op ``auto`` and ``tune`` time for op ``kind`` (``"ag"`` or ``"rs"``).

    ``op(x, weight, group, schedule=..., comm_engine=...)`` runs one call with a concrete
    schedule; :mod:`ccoverlap.runtime.ops` registers its two ops when it is imported.
    """
    if kind not in ("ag", "rs"):
        raise ValueError(f"register_op: unknown op kind {kind!r}; expected 'ag' or 'rs'")
    _OPS[kind] = op


def _op(kind: str) -> Callable[..., torch.Tensor]:
    """The registered public op of ``kind`` (see :func:`register_op`)."""
    if kind not in ("ag", "rs"):
        raise ValueError(f"unknown op kind {kind!r}")
    op = _OPS.get(kind)
    if op is None:  # only when this module is loaded without the package (ccoverlap.runtime imports ops)
        raise RuntimeError(f"no op registered for kind {kind!r}: import ccoverlap.runtime.ops first")
    return op


def _fwd_bwd_runner(
    kind: str, a: torch.Tensor, b: torch.Tensor, group: ProcessGroup | None, name: str, comm_engine: str = "sm"
) -> Callable[[], None]:
    """Forward + backward of the public op with schedule ``name`` (what a training step runs of it)."""
    op = _op(kind)
    x = a.detach().clone().requires_grad_()
    w = b.t().detach().clone().requires_grad_()
    dy: list[torch.Tensor] = []

    def run() -> None:
        with torch.enable_grad():
            y = op(x, w, group, schedule=name, comm_engine=comm_engine)
            if not dy:
                dy.append(torch.ones_like(y))
            y.backward(dy[0])
        x.grad = w.grad = None

    return run


def _runner(
    kind: str, a: torch.Tensor, b: torch.Tensor, group: ProcessGroup | None, name: str, comm_engine: str = "sm"
) -> Callable[[], torch.Tensor]:
    """One call of the public op with schedule ``name``: what a user's call (and ``ccoverlap bench``)
    runs, the per-call cross-rank check and the agreed comm engine's transport included."""
    op = _op(kind)
    weight = b.t()  # the ops take an nn.Linear weight [n, k] and compute a @ weight.T = a @ b
    return lambda: op(a, weight, group, schedule=name, comm_engine=comm_engine)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
