"""Where independent pieces of work run: a small engine interface and its implementations.

An engine has one method, ``map(fn, items)``: call ``fn(item)`` for every item, possibly in other
processes or on other machines, and yield the results in the order of ``items``. ``fn`` and the
items must be picklable. ``ccoverlap analyze`` maps :func:`ccoverlap.trace.summary.summarize_rank`
over ``(path or URL, JobContext)`` pairs (each result is a small
:class:`~ccoverlap.trace.summary.RankSummary`); ``ccoverlap plan --search`` maps the simulation of
candidate layouts (:mod:`ccoverlap.planning.search`).

:class:`SerialEngine` runs in this process, :class:`LocalEngine` on a pool of worker processes
forked from this one; :func:`local_engine` picks one of the two. :class:`~ccoverlap.trace.ray_engine.RayEngine`
runs on a Ray cluster's workers; :func:`make_engine` builds the engine a command line names
(``--engine local|ray``, ``--address``) and imports Ray only for ``ray``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from ccoverlap.errors import ConfigError

# the per-rank work pays for a worker process from about this much trace data (on disk)
PARALLEL_MIN_BYTES = 2 << 20
#: items queued per forked worker of :class:`LocalEngine` (one running, one waiting)
AHEAD_PER_WORKER = 2


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
    """``jobs`` processes on this machine: this one and ``jobs - 1`` workers forked from it (where
    the platform allows: no re-import, a few milliseconds to start, the imported modules' pages
    shared with this process)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        """``fn(item)`` for each item, results in item order. The workers are kept
        :data:`AHEAD_PER_WORKER` items ahead; this process takes the next item itself whenever
        they are, so no process waits idle while there is work and none is started for
        nothing."""
        import multiprocessing as mp
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait  # only when used: start-up

        items = list(items)
        workers = min(self.jobs, len(items)) - 1
        if workers < 1:
            yield from map(fn, items)
            return
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        done: dict[int, object] = {}
        pending: dict = {}
        nxt = out = 0
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            while out < len(items):
                while nxt < len(items) and len(pending) < AHEAD_PER_WORKER * workers:
                    pending[pool.submit(fn, items[nxt])] = nxt
                    nxt += 1
                if nxt < len(items):
                    done[nxt] = fn(items[nxt])
                    nxt += 1
                elif pending:
                    wait(pending, return_when=FIRST_COMPLETED)
                for f in [f for f in pending if f.done()]:
                    done[pending.pop(f)] = f.result()
                while out in done:
                    yield done.pop(out)
                    out += 1


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


#: the engines a command line may name (``--engine``)
ENGINES = ("local", "ray")


def make_engine(name: str | None, *, address: str | None = None, n_items: int = 0, total_bytes: int = 0,
                jobs: int | None = None):
    """The engine ``--engine NAME [--address ADDR]`` asks for: ``local`` (or None) is
    :func:`local_engine` for ``n_items`` files of ``total_bytes``; ``ray`` a
    :class:`~ccoverlap.trace.ray_engine.RayEngine` connected to ``address`` (default: a Ray
    instance started on this machine). Ray is imported only here, only for ``ray``."""
    if name in (None, "local"):
        if address:
            raise ConfigError("--address is for --engine ray")
        return local_engine(n_items, total_bytes, jobs)
    if name == "ray":
        if jobs is not None:
            raise ConfigError("--jobs is for the local engine; on Ray every worker CPU takes tasks")
        from ccoverlap.trace.ray_engine import RayEngine

        return RayEngine(address)
    raise ConfigError(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
