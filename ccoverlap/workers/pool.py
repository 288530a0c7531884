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
        yield from (_forked_map if hasattr(os, "fork") else _claimed_map)(fn, items, workers)


_HEAD = "<qqq"          # a result's header in a worker's pipe: item index, 1 if a value (0: an exception), bytes
_HEAD_SIZE = 24


def _forked_map(fn: Callable, items: list, workers: int) -> Iterator:
    """:meth:`LocalEngine.map` with ``workers`` processes forked by ``os.fork``: the counter is
    eight bytes of shared memory behind a one-byte pipe token as its lock, and each worker writes
    its results to a pipe of its own from a thread, so that its next item never waits for this
    process to read them. What :mod:`multiprocessing` would do, without importing it and starting
    its machinery (about 14 ms before the first item, while the other CPUs wait)."""
    import mmap

    counter = _Counter(mmap.mmap(-1, 8))
    inbox = _Inbox()
    done: dict[int, object] = {}
    out = 0
    try:
        _flush_std_streams()            # else a worker would write this process's pending output again
        for _ in range(workers):
            r, w = os.pipe()
            try:
                pid = os.fork()
            except OSError:             # no process to be had: this pipe is nobody's
                os.close(r)
                os.close(w)
                raise
            if pid == 0:                # the worker: never returns
                os.close(r)
                _forked_worker(fn, items, counter, w, inbox.fds())
            os.close(w)
            inbox.add(r, pid)
        while (i := counter.claim(len(items))) is not None:
            replaced = _whole_lines()   # this process computes items too, beside its workers
            try:
                done[i] = fn(items[i])
            finally:
                _restore_streams(replaced)
            inbox.read(done, 0)
            while out in done:
                yield done.pop(out)
                out += 1
        while out < len(items):
            while out not in done:
                if not inbox.read(done, 0.2) and out not in done:
                    inbox.check()
            yield done.pop(out)
            out += 1
    finally:
        counter.claim_all(len(items))       # nothing more to claim (an error here, or all done)
        inbox.close(stop=out < len(items))
        counter.close()


class _Counter:
    """The next unclaimed item's index, shared by forked processes (see :func:`_forked_map`)."""

    def __init__(self, mem: Any) -> None:
        self.mem = mem
        self.lock_r, self.lock_w = os.pipe()
        os.write(self.lock_w, b"\0")

    def claim(self, n: int) -> int | None:
        """The next unclaimed index below ``n`` (None when all are claimed)."""
        os.read(self.lock_r, 1)         # the token: one process at a time
        try:
            i = int.from_bytes(self.mem[:8], "little")
            if i >= n:
                return None
            self.mem[:8] = (i + 1).to_bytes(8, "little")
            return i
        finally:
            os.write(self.lock_w, b"\0")

    def claim_all(self, n: int) -> None:
        """Leave nothing to claim."""
        os.read(self.lock_r, 1)
        self.mem[:8] = n.to_bytes(8, "little")
        os.write(self.lock_w, b"\0")

    def close(self) -> None:
        """Release the token's pipe and the memory (this process's view)."""
        os.close(self.lock_r)
        os.close(self.lock_w)
        self.mem.close()


def _forked_worker(fn: Callable, items: list, counter: _Counter, w: int, inherited: list[int]) -> None:
    """A forked worker: claim, compute and send back items until none is left (or ``fn`` raised),
    then end the process without the interpreter's teardown (exit code 1 if that went wrong)."""
    code = 1
    try:
        import pickle
        import struct

        for fd in inherited:            # the parent's ends of the other workers' pipes
            os.close(fd)
        _whole_lines()
        sender = _Sender(w)
        while (i := counter.claim(len(items))) is not None:
            try:
                payload, ok = pickle.dumps(fn(items[i]), pickle.HIGHEST_PROTOCOL), 1
            except BaseException as exc:      # noqa: BLE001 - sent to the caller, who raises it
                payload, ok = _pickled_error(exc), 0
            sender.send(struct.pack(_HEAD, i, ok, len(payload)) + payload)
            if not ok:
                break
        sender.close()
        code = 0
    finally:
        _flush_std_streams()            # what fn printed
        os._exit(code)


def _whole_lines() -> dict[str, Any]:
    """Unbuffered stdout / stderr (``python -u``, ``PYTHONUNBUFFERED``) made line-buffered, so
    that each line ``fn`` prints reaches the shared stream in one write: unbuffered, ``print``
    writes its text and its newline separately, and another process's line can land between
    them. Returns the streams replaced (name -> the original), for :func:`_restore_streams`."""
    import io
    import sys

    replaced: dict[str, Any] = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not getattr(stream, "write_through", False):
            continue                    # buffered: flushed whole at a worker's end
        try:
            raw = io.FileIO(stream.fileno(), "w", closefd=False)
        except (AttributeError, OSError, ValueError):
            continue                    # not a file (a test's capture): left as it is
        replaced[name] = stream
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding,
                                            errors=stream.errors, line_buffering=True))
    return replaced


def _restore_streams(replaced: dict[str, Any]) -> None:
    """Flush the line-buffered streams :func:`_whole_lines` made and put the originals back."""
    import sys

    _flush_std_streams()
    for name, original in replaced.items():
        setattr(sys, name, original)


def _flush_std_streams() -> None:
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


class _Sender:
    """A worker's end of its pipe: each message written whole by a thread of its own (one at a
    time), so the worker goes on with its next item while this process has not read it yet.
    Low-level threads (:mod:`_thread`, built in): a worker imports nothing to send."""

    def __init__(self, w: int) -> None:
        import _thread

        self.w = w
        self._thread = _thread
        self.one_at_a_time = _thread.allocate_lock()
        self.pending: list[Any] = []        # per message a lock held until it is written

    def send(self, msg: bytes) -> None:
        """Write ``msg`` to the pipe from a thread (returns at once)."""
        written = self._thread.allocate_lock()
        written.acquire()
        self.pending.append(written)
        self._thread.start_new_thread(self._write, (msg, written))

    def _write(self, msg: bytes, written: Any) -> None:
        try:
            with self.one_at_a_time:
                view = memoryview(msg)
                while view:
                    view = view[os.write(self.w, view):]
        finally:
            written.release()

    def close(self) -> None:
        """Wait until every message is written, then close the pipe."""
        for written in self.pending:
            written.acquire()
        os.close(self.w)


def _pickled_error(exc: BaseException) -> bytes:
    """``exc`` pickled, or a RuntimeError naming it when it cannot be."""
    import pickle

    try:
        return pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))


class _Inbox:
    """This process's ends of the workers' pipes and what has come through them so far."""

    def __init__(self) -> None:
        self.pid: dict[int, int] = {}           # read end -> worker pid
        self.buf: dict[int, bytearray] = {}     # read end -> bytes not yet a whole result (open pipes only)

    def add(self, r: int, pid: int) -> None:
        """A worker's pipe (made non-blocking here)."""
        os.set_blocking(r, False)
        self.pid[r], self.buf[r] = pid, bytearray()

    def fds(self) -> list[int]:
        """The read ends held (a new worker closes them)."""
        return list(self.pid)

    def read(self, done: dict[int, object], timeout: float) -> bool:
        """Whole results sent so far into ``done`` (index -> value), waiting up to ``timeout`` s
        for something to read; an exception sent is raised. False when nothing came."""
        import select

        if not self.buf:
            return False
        ready, _, _ = select.select(list(self.buf), [], [], timeout)
        for r in ready:
            self._take(r, done)
        return bool(ready)

    def _take(self, r: int, done: dict[int, object]) -> None:
        import pickle
        import struct

        buf = self.buf[r]
        while True:
            try:
                chunk = os.read(r, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                del self.buf[r]         # the worker closed its pipe: it is ending
                break
            buf += chunk
        while len(buf) >= _HEAD_SIZE:
            i, ok, n = struct.unpack_from(_HEAD, buf)
            if len(buf) < _HEAD_SIZE + n:
                break
            value = pickle.loads(buf[_HEAD_SIZE:_HEAD_SIZE + n])
            del buf[:_HEAD_SIZE + n]
            if not ok:
                raise value
            done[i] = value

    def check(self) -> None:
        """Raise when a result can no longer come: a worker ended with an error code, or every
        worker has ended (its pipe closed after all it sent was read)."""
        for r, pid in self.pid.items():
            if pid <= 0:                # reaped before
                continue
            if r in self.buf:           # still open: ended only if the system says so
                try:
                    ended, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    continue
            else:                       # closed: it is ending, wait for its code
                try:
                    ended, status = os.waitpid(pid, 0)
                except ChildProcessError:
                    continue
            if ended:
                self.pid[r] = -1        # reaped
                code = os.waitstatus_to_exitcode(status)
                if code:
                    raise RuntimeError(f"a worker process ended with exit code {code} before returning its results")
        if not self.buf:
            raise RuntimeError("the worker processes ended without returning every result")

    def close(self, stop: bool) -> None:
        """Stop the workers (``stop``: results are still due - an error here), reap them, close the pipes."""
        import signal

        for r, pid in self.pid.items():
            if pid > 0:
                if stop:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
            os.close(r)


def _claimed_map(fn: Callable, items: list, workers: int) -> Iterator:
    """:meth:`LocalEngine.map` with ``workers`` worker processes besides this one, by
    :mod:`multiprocessing` (where ``os.fork`` is not available)."""
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
