"""Where independent pieces of work run: a small engine interface and its implementations.

An engine has one method, ``map(fn, items)``: call ``fn(item)`` for every item, possibly in other
processes or on other machines, and yield the results in the order of ``items``. ``fn`` and the
items must be picklable. ``ccoverlap analyze`` maps :func:`ccoverlap.trace.summary.summarize_rank`
over ``(path or URL, JobContext)`` pairs (each result is a small
:class:`~ccoverlap.trace.summary.RankSummary`); ``ccoverlap plan --search`` maps the simulation of
candidate layouts (:mod:`ccoverlap.planning.search`).

:class:`SerialEngine` runs in this process, :class:`LocalEngine` on a pool of worker processes
forked from this one; :func:`local_engine` picks one of the two. :class:`~ccoverlap.workers.ray_cluster.RayEngine`
runs on a Ray cluster's workers; :func:`make_engine` builds the engine a command line names
(``--engine local|ray``, ``--address``) and imports Ray only for ``ray``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue
    from multiprocessing.sharedctypes import Synchronized

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
    """``jobs`` processes on this machine: this one and ``jobs - 1`` workers forked from it (where
    the platform allows: no re-import, a few milliseconds to start, the imported modules' pages
    shared with this process)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        """``fn(item)`` for each item, results in item order. Every process - this one and each
        worker - claims the next unclaimed item from one shared counter whenever it is free, so no
        process waits while another holds work it has not started, and at the end each waits for
        at most the one item another is still running. A worker sends each result back (pickled)
        as soon as it has it and goes on with the next item. An exception of ``fn`` in a worker is
        raised here; a worker that dies is an error too, never a hang."""
        items = list(items)
        workers = min(self.jobs, len(items)) - 1
        if workers < 1:
            yield from map(fn, items)
            return
        yield from _claimed_map(fn, items, workers)


def _claimed_map(fn: Callable, items: list, workers: int) -> Iterator:
    """:meth:`LocalEngine.map` with ``workers`` worker processes besides this one."""
    import multiprocessing as mp
    import pickle
    import queue

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    counter = ctx.Value("q", 0)
    results = ctx.Queue()
    procs = [ctx.Process(target=_work, args=(fn, items, counter, results), daemon=True) for _ in range(workers)]
    done: dict[int, object] = {}
    out = 0
    try:
        for p in procs:
            p.start()
        while (i := _claim(counter, len(items))) is not None:
            done[i] = fn(items[i])
            while out in done:
                yield done.pop(out)
                out += 1
        while out < len(items):
            while out not in done:
                try:
                    i, ok, payload = results.get(timeout=0.2)
                except queue.Empty:
                    _check_workers(procs, results)
                    continue
                value = pickle.loads(payload)
                if not ok:
                    raise value
                done[i] = value
            yield done.pop(out)
            out += 1
    finally:
        with counter.get_lock():
            counter.value = len(items)          # nothing more to claim (an error here, or all done)
        for p in procs:
            if p.exitcode is None and out < len(items):
                p.terminate()
            p.join()
        results.close()


def _check_workers(procs: Sequence[BaseProcess], results: Queue[tuple[int, bool, bytes]]) -> None:
    """Raise when a result can no longer come: a worker ended with an error code, or every worker
    has ended and nothing is left to read."""
    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
    if dead:
        raise RuntimeError(f"a worker process ended with exit code {dead[0]} before returning its results")
    if all(p.exitcode is not None for p in procs) and results.empty():
        raise RuntimeError("the worker processes ended without returning every result")


def _claim(counter: Synchronized[int], n: int) -> int | None:
    """The next unclaimed item's index (None when all are claimed)."""
    with counter.get_lock():
        i = counter.value
        if i >= n:
            return None
        counter.value = i + 1
    return i


def _work(fn: Callable[[Any], Any], items: list[Any], counter: Synchronized[int],
          results: Queue[tuple[int, bool, bytes]]) -> None:
    """A worker: claim, compute and send back items until none is left."""
    import pickle

    while (i := _claim(counter, len(items))) is not None:
        try:
            payload, ok = pickle.dumps(fn(items[i]), pickle.HIGHEST_PROTOCOL), True
        except BaseException as exc:      # noqa: BLE001 - sent to the caller, who raises it
            try:
                payload = pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
            except Exception:
                payload = pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
            ok = False
        results.put((i, ok, payload))
        if not ok:
            break


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_engine(n_items: int, total_bytes: int, jobs: int | None = None) -> LocalEngine | SerialEngine:
    """The engine for ``n_items`` files of ``total_bytes``: ``jobs`` processes when given, else one
    per CPU (two cores included) when there are two or more files and at least
    :data:`PARALLEL_MIN_BYTES` of them, else this process."""
    if jobs is None:
        jobs = min(n_items, cpu_count()) if n_items > 1 and total_bytes >= PARALLEL_MIN_BYTES else 1
    return LocalEngine(jobs) if jobs > 1 and n_items > 1 else SerialEngine()


#: the engines a command line may name (``--engine``)
ENGINES = ("local", "ray")


def make_engine(name: str | None, *, address: str | None = None, n_items: int = 0, total_bytes: int = 0,
                jobs: int | None = None) -> Engine:
    """The engine ``--engine NAME [--address ADDR]`` asks for: ``local`` (or None) is
    :func:`local_engine` for ``n_items`` files of ``total_bytes``; ``ray`` a
    :class:`~ccoverlap.workers.ray_cluster.RayEngine` connected to ``address`` (default: a Ray
    instance started on this machine). Ray is imported only here, only for ``ray``."""
    if name in (None, "local"):
        if address:
            raise ConfigError("--address is for --engine ray")
        return local_engine(n_items, total_bytes, jobs)
    if name == "ray":
        if jobs is not None:
            raise ConfigError("--jobs is for the local engine; on Ray every worker CPU takes tasks")
        from ccoverlap.workers.ray_cluster import RayEngine

        return RayEngine(address)
    raise ConfigError(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
