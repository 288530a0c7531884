"""Resolve ``schedule="auto"`` (FiCCO §V-C heuristic) and ``schedule="tune"`` (live timing).

Both decisions must be identical on every rank, or ranks would run different collectives
and hang. Both are cached per key ``(kind, shapes, dtype, device, group)``, and both assume
(the ops check it when the shape check runs) that every rank passes the same shapes, so a
key is new on all ranks at once:

* ``auto``: rank 0's heuristic answer is broadcast once per key (so ranks agree even if
  they saw different devices);
* ``tune``: each candidate schedule runs ``warmup`` + ``reps`` times on the live backend;
  per-rank mean times are combined with an all-reduce MAX (an op is as slow as its slowest
  rank), so every rank picks the same argmin (ties: the earlier candidate).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from ccoverlap.deciders.ficco_heuristic import choose_schedule
from ccoverlap.runtime import comm
from ccoverlap.runtime.machine import MachineSpec, machine_for
from ccoverlap.runtime.schedules import SCHEDULES, ag_matmul, matmul_rs

__all__ = ["Decision", "resolve", "auto_choice", "tune_choice", "tuning_cache", "clear_tuning_cache"]

_lock = threading.Lock()
_cache: dict[tuple, Decision] = {}


@dataclass(frozen=True)
class Decision:
    """A resolved schedule with how it was chosen (``timings_s`` only for ``tune``)."""

    schedule: str
    how: str
    reason: str
    timings_s: tuple[tuple[str, float], ...] = ()


def _key(kind, a, b, group, mode, extra=()) -> tuple:
    return (kind, mode, tuple(a.shape), tuple(b.shape), a.dtype, a.device.type, id(group) if group else 0, extra)


def tuning_cache() -> dict[tuple, Decision]:
    """A copy of the decisions made so far in this process."""
    with _lock:
        return dict(_cache)


def clear_tuning_cache() -> None:
    """Forget every cached decision (call it on every rank, or on none)."""
    with _lock:
        _cache.clear()


def auto_choice(
    kind: str, a: torch.Tensor, b: torch.Tensor, group, *, comm_engine: str = "sm", spec: MachineSpec | None = None
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
        comm_engine=comm_engine,
    )  # fmt: skip
    return name, f"{reason} [{spec.name}]"


def tune_choice(
    kind: str,
    a: torch.Tensor,
    b: torch.Tensor,
    group,
    *,
    candidates: tuple[str, ...] = SCHEDULES,
    warmup: int = 1,
    reps: int = 3,
) -> Decision:
    """Time every candidate schedule on the live backend and agree on the fastest (all ranks).

    Collective: every rank of ``group`` must call it with the same shapes and candidates.
    Times are seconds per call (mean of ``reps`` after ``warmup``), MAX over ranks.
    """
    times = []
    with torch.no_grad():
        for name in candidates:
            run = _runner(kind, a, b, group, name)
            for _ in range(warmup):
                run()
            _sync(a.device)
            comm.barrier(group)
            t0 = time.perf_counter()
            for _ in range(reps):
                run()
            _sync(a.device)
            times.append((time.perf_counter() - t0) / reps)
    t = torch.tensor(times, dtype=torch.float64, device=comm.comm_device(group))
    comm.all_reduce(t, group=group, op=torch.distributed.ReduceOp.MAX, async_op=False)
    worst = t.cpu().tolist()
    best = min(range(len(candidates)), key=lambda i: (worst[i], i))
    table = tuple(zip(candidates, worst))
    shown = ", ".join(f"{c}={s * 1e3:.3g}ms" for c, s in table)
    return Decision(candidates[best], "tune", f"fastest measured (max over ranks): {shown}", table)


def resolve(
    kind: str, a: torch.Tensor, b: torch.Tensor, group, schedule: str, *, comm_engine: str = "sm"
) -> Decision:
    """Turn ``schedule`` (a name, ``"auto"`` or ``"tune"``) into a concrete schedule (collective for auto/tune on first use)."""
    if schedule in SCHEDULES:
        return Decision(schedule, "given", "named by the caller")
    if schedule not in ("auto", "tune"):
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {(*SCHEDULES, 'auto', 'tune')}")
    if comm.group_size(group) == 1:
        return Decision("serial", schedule, "one rank: nothing to overlap")
    key = _key(kind, a, b, group, schedule, (comm_engine,))
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    if schedule == "auto":
        name, reason = auto_choice(kind, a, b, group, comm_engine=comm_engine)
        idx = torch.tensor([SCHEDULES.index(name)], dtype=torch.int64, device=comm.comm_device(group))
        comm.broadcast(idx, 0, group=group, async_op=False)  # rank 0's answer, on every rank
        agreed = SCHEDULES[int(idx.item())]
        if agreed != name:
            reason = f"rank 0's choice (this rank's heuristic said {name})"
        decision = Decision(agreed, "auto", reason)
    else:
        decision = tune_choice(kind, a, b, group)
    with _lock:
        _cache[key] = decision
    return decision


def _runner(kind, a, b, group, name):
    if kind == "ag":
        return lambda: ag_matmul(a, b, group, name)
    if kind == "rs":
        return lambda: matmul_rs(a, b, group, name)
    raise ValueError(f"unknown op kind {kind!r}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
