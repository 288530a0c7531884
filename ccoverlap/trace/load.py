"""Stream torch.profiler (Kineto) Chrome-trace files into compact columns.

One file per rank, ``.json`` or ``.json.gz`` (``export_chrome_trace``, or
``tensorboard_trace_handler``'s ``<worker>.<ts>.pt.trace.json.gz``). The file is never
loaded as a whole: the events are streamed by :mod:`ccoverlap.trace.jsonstream` (the C JSON
decoder of the standard library, one event at a time, bad events skipped one by one) and
only what the analysis needs is kept, in numpy columns (:mod:`ccoverlap.trace.columns`):

* device events (GPU kernels, memcpy/memset, CUDA syncs): name, ts, dur, stream,
  correlation, External id, collective args when Kineto attached them;
* CPU ops and user annotations (``cpu_op``, ``user_annotation``): name, ts, dur, thread,
  External id, and the collective args of ``record_param_comms`` / ``nccl:*`` /
  ``gloo:*`` / ``c10d::*`` ops;
* launches: every other CPU-side event that carries a ``correlation`` (``cudaLaunchKernel``
  and friends), to join kernels to the CPU step that launched them;
* ``ProfilerStep#N`` annotations.

Times stay in the file's unit, microseconds: the Chrome trace format defines ``ts``/``dur``
in µs and ``displayTimeUnit`` ("ms" or "ns") only says how a viewer should *display* them.
Kineto writes ``"displayTimeUnit": "ns"`` when it records nanosecond resolution, i.e. µs
with three decimals; that is kept (HolisticTraceAnalysis instead rounds every event inward
to whole µs, see :mod:`ccoverlap.trace.steps`). Epoch-based µs timestamps (~1.7e15) hold
about 0.25 µs of resolution in a float64, which bounds every time this module returns.

Which rank a file is (``distributedInfo``, file name, file order) is decided in
:mod:`ccoverlap.trace.rank_assign`.
"""

from __future__ import annotations

import errno
import gc
import gzip
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from ccoverlap.config import PATH_CHARS, clip_middle
from ccoverlap.errors import TraceError
from ccoverlap.trace.columns import Columns
from ccoverlap.trace.consistency import check_times
from ccoverlap.trace.jsonstream import EventStream, StreamError, Truncated
from ccoverlap.trace.rank_assign import assign_ranks, rank_from_meta
from ccoverlap.trace.sources import GZIP_ERRORS, Source, as_source, discover_url, file_name, is_url, open_binary

TRACE_SUFFIXES = (".json", ".json.gz")
HEADER_KEYS = ("distributedInfo", "deviceProperties", "displayTimeUnit", "baseTimeNanoseconds",
               "traceName", "schemaVersion")


@dataclass
class RawTrace:
    """What one trace file holds, in columns (times in µs as written in the file).

    ``k_*``: device events; ``c_*``: CPU ops / annotations; ``l_*``: launches (CPU events with
    a correlation id); ``steps``: ``(N, ts_us, dur_us, is_gpu_annotation)`` per
    ``ProfilerStep#N``. ``names`` is the interned string table the ``*_nid`` columns index;
    ``infos`` holds the kept collective args that ``k_info``/``c_info`` index (-1: none).
    """

    path: Source
    meta: dict[str, Any]
    names: list[str]
    infos: list[dict[str, Any]]
    threads: list[str]
    k_nid: np.ndarray
    k_ts: np.ndarray
    k_dur: np.ndarray
    k_stream: np.ndarray
    k_device: np.ndarray
    k_corr: np.ndarray
    k_ext: np.ndarray
    k_info: np.ndarray
    k_kind: np.ndarray          # ccoverlap_kind written by ccoverlap.sim.chrome_trace (-1: none)
    k_cat: np.ndarray           # index into DEVICE_CAT_LIST
    k_shape: np.ndarray         # hash of the launch (grid, block); 0 when not recorded
    c_nid: np.ndarray
    c_ts: np.ndarray
    c_dur: np.ndarray
    c_tid: np.ndarray
    c_ext: np.ndarray
    c_info: np.ndarray
    c_annot: np.ndarray         # 1 for user_annotation, 0 for cpu_op
    l_corr: np.ndarray
    l_ts: np.ndarray
    l_tid: np.ndarray
    steps: list[tuple[int, float, float, bool]]
    n_events: int = 0
    n_malformed: int = 0
    n_dropped: int = 0          # events dropped for inconsistent timestamps (ccoverlap.trace.consistency)
    float_ts: bool = False
    rank: int | None = None
    world_size: int | None = None
    rank_source: str = ""
    warnings: list[str] = field(default_factory=list)
    ts_min: float | None = None          # earliest ts of any kept-or-dropped event (µs)
    # only with ``load_trace(..., keep_runtime=True)`` (replay): the launch's name and duration,
    # and for each ``cuda_sync`` device event the stream / cudaEventRecord correlation it waits on
    l_nid: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    l_dur: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float64))
    k_wait_stream: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    k_wait_corr: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    # only with ``load_trace(..., keep_op_args=True)``: per CPU op the index into ``infos`` of its
    # ``Input Dims`` / ``Input type`` (-1: none); ``c_ext`` then holds every op's External id
    c_args: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def has_device_events(self) -> bool:
        """Whether the file holds any GPU (device) event."""
        return len(self.k_ts) > 0




# ----------------------------------------------------------------------------- files

def discover(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Source], list[str]]:
    """Trace files named by ``paths`` (files, or directories searched one level deep; URLs
    - an object or a prefix - through fsspec, see :mod:`ccoverlap.trace.sources`).

    Returns ``(files, problems)``; a path that does not exist or a directory without
    ``*.json``/``*.json.gz`` files is a problem (one line naming it), not an exception.
    """
    files: list[Source] = []
    problems: list[str] = []
    for p in paths:
        if is_url(p):
            urls, why = discover_url(p, TRACE_SUFFIXES)
            files.extend(urls)
            problems.extend(why)
            continue
        path = Path(p)
        try:
            if path.is_dir():
                found = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
                if not found:
                    problems.append(f"{clip_middle(str(path))}: no *.json or *.json.gz trace files in this directory")
                files.extend(found)
            elif path.is_file():
                files.append(path)
            else:
                problems.append(f"{clip_middle(str(path))}: {_why_not_there(path)}")
        except OSError as exc:      # a name longer than the system allows, a directory that cannot be listed
            problems.append(f"{clip_middle(str(path))}: cannot read ({exc.strerror or type(exc).__name__})")
    seen: set[Source] = set()
    unique: list[Source] = []
    for f in files:
        key = f.resolve() if isinstance(f, Path) else f      # a URL string is kept verbatim
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, problems


def _why_not_there(path: Path) -> str:
    """Why ``path`` is neither a file nor a directory we can read, in words."""
    if not os.path.lexists(path):
        return "no such file or directory"
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop (the link resolves back to itself) - not a trace file"
        if exc.errno == errno.ENOENT and path.is_symlink():
            return f"broken symlink (points to {os.readlink(path)!r}, which does not exist)"
        return f"cannot read ({exc.strerror or exc})"
    return "not a regular file or directory (a device, socket or pipe?)"


def _open(path: Source) -> IO[bytes]:
    """A binary stream of the JSON text (gunzipped when the file is gzip), checked up front."""
    try:
        with open_binary(path) as fh:
            head = fh.read(2)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not head:
        raise TraceError(f"{path}: file is empty")
    if head == b"\x1f\x8b":
        return open_binary(path, gzipped=True)
    if file_name(path).endswith(".gz"):
        raise TraceError(f"{path}: named .gz but is not gzip-compressed (first bytes {head!r})")
    return open_binary(path)


def _sniff(path: Source) -> None:
    """Reject at once what is not JSON text at all (one clear line naming the first bytes)."""
    with _open(path) as fh:
        first = b""
        chunk = b""
        read = 0
        while not first:
            chunk = fh.read(64)
            if not chunk:
                raise TraceError(f"{path}: contains only whitespace, not a JSON trace")
            if read == 0 and chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]                # a UTF-8 byte-order mark: accepted
            read += len(chunk)
            first = chunk.lstrip()[:1]
            if read > (1 << 20) and not first:
                raise TraceError(f"{path}: more than 1 MiB of whitespace, not a JSON trace")
        if first not in (b"[", b"{"):
            raise TraceError(f"{path}: not JSON (starts with {chunk.lstrip()[:16]!r})")


# ----------------------------------------------------------------------------- parsing

#: What reading a gzip trace raises when its stream is cut or damaged.
_BROKEN_GZIP: tuple[type[Exception], ...] = (EOFError, gzip.BadGzipFile, *GZIP_ERRORS)


def load_trace(path: str | os.PathLike[str], *, keep_cpu_ops: bool = True, keep_runtime: bool = False,
               keep_op_args: bool = False) -> RawTrace:
    """Stream one trace file into a :class:`RawTrace`.

    Raises :class:`TraceError` naming the file for: unreadable, empty, not JSON, truncated,
    named ``.gz`` but not gzip, a broken gzip stream, valid JSON that is not a trace (no
    ``traceEvents`` list, no event objects), a header value nested deeper than the recursion
    limit or longer than :data:`~ccoverlap.trace.jsonstream.MAX_VALUE_CHARS` characters (an
    event that is either is skipped and counted).
    ``keep_cpu_ops=False``: in a file with device events keep only the CPU ops the analyser
    joins to kernels (collective ops; ``ProfilerStep`` annotations are in ``steps``) - less memory
    per rank; ``ts_min`` still covers every event.
    A single bad event (invalid JSON inside it, NaN / Infinity / out-of-range numbers, wrong
    types, negative durations) is skipped and counted; the warning names the first ones by
    index and character offset. An event whose timestamps contradict the rest of the file (far
    outside its span, a GPU event before its launch, out of order on its stream) is dropped and
    counted in ``n_dropped`` (:mod:`ccoverlap.trace.consistency`), with a warning.
    ``keep_runtime`` also keeps what ``ccoverlap replay`` needs: the name and duration of every
    launch (``l_nid``/``l_dur``) and the wait args of ``cuda_sync`` events.
    ``keep_op_args`` also keeps every CPU op's External id (``c_ext``) and recorded shapes
    (``c_args``: ``Input Dims`` / ``Input type`` in ``infos``), for per-op attribution of kernels.
    """
    path = as_source(path)
    try:
        _sniff(path)
        raw = _parse_events(path, keep_cpu_ops, keep_runtime, keep_op_args)
    except TraceError as exc:
        name = str(path)
        if len(name) > PATH_CHARS:      # every message starts with the file's name: keep it short
            raise TraceError(str(exc).replace(name, clip_middle(name), 1)) from None
        raise
    except Truncated as exc:
        raise TraceError(f"{path}: truncated or invalid JSON ({exc})") from None
    except StreamError as exc:
        raise TraceError(f"{path}: invalid JSON ({str(exc)[:200]})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: invalid JSON ({exc.msg} at offset {exc.pos})") from None
    except _BROKEN_GZIP as exc:
        raise TraceError(f"{path}: broken gzip stream ({exc or 'compressed file ended early'})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, OverflowError) as exc:      # a value no check above foresaw: this file only
        raise TraceError(f"{path}: cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None
    return raw


def _parse_events(path: Source, keep_cpu_ops: bool = True, keep_runtime: bool = False,
                  keep_op_args: bool = False) -> RawTrace:
    cols = Columns(keep_runtime=keep_runtime, keep_op_args=keep_op_args)
    collecting = gc.isenabled()
    gc.disable()        # millions of short-lived event objects, no cycles: no collector passes over them
    try:
        with _open(path) as fh:
            es = EventStream(fh, prepare=cols.prepare)
            for batch in es.batches():
                cols.add_batch(batch)
    finally:
        if collecting:
            gc.enable()
    header = es.header
    n_bad, bad_at = cols.n_bad, cols.bad_at
    c = cols.finish()
    dropped = check_times(c, cols.steps)
    for k in ("k_seq", "c_seq", "l_seq"):
        del c[k]
    steps = [st[:4] for st in cols.steps]
    if not es.has_events:
        keys = ", ".join(repr(k)[:40] for k in list(header)[:6]) or "none"
        raise TraceError(f"{path}: valid JSON but not a Chrome/Kineto trace: no 'traceEvents' list "
                         f"(top-level keys: {keys})")
    if es.events_not_list:
        raise TraceError(f"{path}: valid JSON but not a Chrome/Kineto trace: 'traceEvents' is not a list")
    if es.count == 0:
        raise TraceError(f"{path}: 'traceEvents' is empty - nothing was recorded")
    if n_bad >= es.count and not (len(c["k_ts"]) or len(c["c_ts"]) or len(c["l_ts"]) or steps):
        raise TraceError(f"{path}: valid JSON but not a Chrome/Kineto trace: none of its {es.count} "
                         f"'traceEvents' entries is a usable event (an object with ph, name, ts, dur)"
                         + (f"; event #{es.bad[0].index} at offset {es.bad[0].offset}: {es.bad[0].reason}"
                            if es.bad else ""))
    n_events = es.count
    threads = cols.threads
    many = _many_pids(threads)
    thread_labels = []
    for key in threads:
        pid, tid = key
        label = cols.thread_names.get(key) or f"thread {tid}"
        thread_labels.append(f"{label} [pid {pid}]" if many else label)
    mins = [float(np.min(c[k])) for k in ("k_ts", "c_ts", "l_ts") if len(c[k])] + [st[1] for st in steps]
    ts_min = min(mins) if mins else None
    if not keep_cpu_ops and len(c["k_ts"]) and len(c["c_nid"]):
        # a GPU trace: only the collective ops are joined to kernels; drop the other CPU ops' rows
        keep = np.flatnonzero(c["c_info"] >= 0)
        for k in ("c_nid", "c_ts", "c_dur", "c_tid", "c_ext", "c_info", "c_annot") + (("c_args",) if keep_op_args else ()):
            c[k] = c[k][keep]
    raw = RawTrace(
        path=path, meta=header, names=cols.names, infos=cols.infos, threads=thread_labels,
        k_nid=c["k_nid"], k_ts=c["k_ts"], k_dur=c["k_dur"], k_stream=c["k_stream"], k_device=c["k_device"],
        k_corr=c["k_corr"], k_ext=c["k_ext"], k_info=c["k_info"], k_kind=c["k_kind"], k_cat=c["k_cat"],
        k_shape=c["k_shape"], c_nid=c["c_nid"], c_ts=c["c_ts"], c_dur=c["c_dur"], c_tid=c["c_tid"],
        c_ext=c["c_ext"], c_info=c["c_info"], c_annot=c["c_annot"], l_corr=c["l_corr"], l_ts=c["l_ts"],
        l_tid=c["l_tid"], steps=sorted(steps, key=lambda s: s[1]), n_events=n_events, n_malformed=n_bad,
        float_ts=cols.float_ts, ts_min=ts_min, n_dropped=dropped.count,
    )
    if keep_op_args:
        raw.c_args = c["c_args"]
    if keep_runtime:
        raw.l_nid, raw.l_dur, raw.k_wait_stream, raw.k_wait_corr = c["l_nid"], c["l_dur"], c["k_wstream"], c["k_wcorr"]
    if n_bad:
        lexical = {b.index: b for b in es.bad}
        where = []
        for i in sorted(set(bad_at) | set(lexical))[:3]:
            b = lexical.get(i)
            where.append(f"event #{i} at offset {b.offset} ({b.reason})" if b else f"event #{i}")
        raw.warnings.append(f"{path}: skipped {n_bad} malformed event(s) (invalid JSON inside the event, "
                            f"nested too deeply or too long, NaN/Infinity/out-of-range numbers, wrong types, "
                            f"missing ts, negative duration), "
                            f"first: {'; '.join(where)}")
    if es.n_bad_header:
        raw.warnings.append(f"{path}: skipped {es.n_bad_header} header value(s) that cannot be read, first: "
                            f"{'; '.join(es.bad_header)}")
    if dropped.count:
        raw.warnings.append(f"{path}: {dropped.describe()}")
    raw.warnings.extend(f"{path}: {note}" for note in dropped.notes)
    rank_from_meta(raw)
    return raw


def _many_pids(threads: list[tuple[Any, Any]]) -> bool:
    return len({p for p, _ in threads}) > 1


# ----------------------------------------------------------------------------- all files

def load_all(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[RawTrace], list[str]]:
    """Discover, stream and rank every trace; problems are collected, never raised."""
    files, problems = discover(list(paths))
    raws: list[RawTrace] = []
    for f in files:
        try:
            raw = load_trace(f)
        except TraceError as exc:
            problems.append(str(exc))
            continue
        problems.extend(raw.warnings)
        raws.append(raw)
    raws, rank_problems = assign_ranks(raws)
    return raws, problems + rank_problems
