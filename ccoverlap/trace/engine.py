"""Where the per-rank work runs: a small engine interface and its local implementations.

An engine has one method, ``map(fn, items)``: call ``fn(item)`` for every item, possibly in other
processes or on other machines, and yield the results in the order of ``items``. ``fn`` and the
items must be picklable (``ccoverlap analyze`` maps :func:`ccoverlap.trace.summary.summarize_rank`
over ``(path or URL, JobContext)`` pairs; each result is a small
:class:`~ccoverlap.trace.summary.RankSummary`). :class:`SerialEngine` runs in this process,
:class:`LocalEngine` on a pool of worker processes; :func:`local_engine` picks one. An engine for
a cluster plugs in the same way: any object with that ``map``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

# the per-rank work pays for a worker process from about this much trace data (on disk)
PARALLEL_MIN_BYTES = 2 << 20


class Engine(Protocol):
    """Runs ``fn`` over ``items``; results in item order."""

    def map(self, fn: Callable, items: Iterable) -> Iterator:  # pragma: no cover - a protocol
        ...


class SerialEngine:
    """Every item in this process, one after the other."""

    jobs = 1

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        """``fn(item)`` for each item, lazily."""
        return (fn(x) for x in items)


class LocalEngine:
    """A pool of ``jobs`` worker processes on this machine (forked where the platform allows:
    no re-import, a few milliseconds to start)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        """``fn(item)`` for each item in the pool; results in item order as they complete."""
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor  # imported only when used: start-up time

        items = list(items)
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=min(self.jobs, max(len(items), 1)), mp_context=ctx) as pool:
            yield from pool.map(fn, items)


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_engine(n_items: int, total_bytes: int, jobs: int | None = None):
    """The engine for ``n_items`` files of ``total_bytes``: ``jobs`` processes when given, else one
    per CPU (two cores included) when there are two or more files and at least
    :data:`PARALLEL_MIN_BYTES` of them, else this process."""
    if jobs is None:
        jobs = min(n_items, cpu_count()) if n_items > 1 and total_bytes >= PARALLEL_MIN_BYTES else 1
    return LocalEngine(jobs) if jobs > 1 and n_items > 1 else SerialEngine()
