"""Stream torch.profiler (Kineto) Chrome-trace files into compact columns.

One file per rank, ``.json`` or ``.json.gz`` (``export_chrome_trace``, or
``tensorboard_trace_handler``'s ``<worker>.<ts>.pt.trace.json.gz``). The file is never
loaded as a whole: the events are streamed by :mod:`ccoverlap.trace.jsonstream` (the C JSON
decoder of the standard library, one event at a time, bad events skipped one by one) and
only what the analysis needs is kept, in ``array``/numpy columns:

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
:mod:`ccoverlap.trace.rank_assign`; :func:`assign_ranks` is re-exported here.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ccoverlap.errors import TraceError

from ccoverlap.trace.jsonstream import EventStream, StreamError, Truncated, event_args
from ccoverlap.trace.rank_assign import assign_ranks, rank_from_meta  # assign_ranks: re-exported

TRACE_SUFFIXES = (".json", ".json.gz")
# categories of device-side events (HTA: stream >= 0 and correlation >= 0)
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "mtia_ccp_events"})
CPU_OP_CATS = frozenset({"cpu_op", "user_annotation"})
SKIP_CATS = frozenset({"python_function", "Trace", "ac2g", "fwdbwd", "cuda_profiler_range"})
# CPU ops that carry or describe a collective (args kept for the join to kernels)
COMM_OP_PREFIXES = ("record_param_comms", "nccl:", "gloo:", "c10d::", "rccl:", "ucc:", "mpi:")
COMM_ARG_KEYS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
                 "Process Group Name", "Process Group Description", "Process Group Ranks",
                 "Input Dims", "Input type", "In split size", "Out split size")
HEADER_KEYS = ("distributedInfo", "deviceProperties", "displayTimeUnit", "baseTimeNanoseconds",
               "traceName", "schemaVersion")
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_NUM = (int, float)
_EMPTY: dict = {}
_TAIL_BYTES = 1 << 16
_I64 = 1 << 62          # ids beyond this are malformed (they would not fit the int64 columns)


@dataclass
class RawTrace:
    """What one trace file holds, in columns (times in µs as written in the file).

    ``k_*``: device events; ``c_*``: CPU ops / annotations; ``l_*``: launches (CPU events with
    a correlation id); ``steps``: ``(N, ts_us, dur_us, is_gpu_annotation)`` per
    ``ProfilerStep#N``. ``names`` is the interned string table the ``*_nid`` columns index;
    ``infos`` holds the kept collective args that ``k_info``/``c_info`` index (-1: none).
    """

    path: Path
    meta: dict
    names: list[str]
    infos: list[dict]
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

    @property
    def has_device_events(self) -> bool:
        """Whether the file holds any GPU (device) event."""
        return len(self.k_ts) > 0


DEVICE_CAT_LIST = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "mtia_ccp_events", "other")
KIND_CODES = ("compute", "comm", "memcpy", "other")


# ----------------------------------------------------------------------------- files

def discover(paths: Sequence[str | Path]) -> tuple[list[Path], list[str]]:
    """Trace files named by ``paths`` (files, or directories searched one level deep).

    Returns ``(files, problems)``; a path that does not exist or a directory without
    ``*.json``/``*.json.gz`` files is a problem (one line naming it), not an exception.
    """
    files: list[Path] = []
    problems: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                problems.append(f"{path}: no *.json or *.json.gz trace files in this directory")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            problems.append(f"{path}: {_why_not_there(path)}")
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, problems


def _why_not_there(path: Path) -> str:
    """Why ``path`` is neither a file nor a directory we can read, in words."""
    import errno
    import os

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


def _open(path: Path):
    """A binary stream of the JSON text (gunzipped when the file is gzip), checked up front."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not head:
        raise TraceError(f"{path}: file is empty")
    if head == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if path.name.endswith(".gz"):
        raise TraceError(f"{path}: named .gz but is not gzip-compressed (first bytes {head!r})")
    return open(path, "rb")


def _sniff(path: Path) -> None:
    """Reject at once what is not JSON text at all (one clear line naming the first bytes)."""
    with _open(path) as fh:
        first = b""
        chunk = b""
        read = 0
        while not first:
            chunk = fh.read(64)
            if not chunk:
                raise TraceError(f"{path}: contains only whitespace, not a JSON trace")
            read += len(chunk)
            first = chunk.lstrip()[:1]
            if read > (1 << 20) and not first:
                raise TraceError(f"{path}: more than 1 MiB of whitespace, not a JSON trace")
        if first not in (b"[", b"{"):
            raise TraceError(f"{path}: not JSON (starts with {chunk.lstrip()[:16]!r})")


# ----------------------------------------------------------------------------- parsing

def load_trace(path: str | Path, *, keep_cpu_ops: bool = True, keep_runtime: bool = False) -> RawTrace:
    """Stream one trace file into a :class:`RawTrace`.

    Raises :class:`TraceError` naming the file for: unreadable, empty, not JSON, truncated,
    named ``.gz`` but not gzip, a broken gzip stream, valid JSON that is not a trace (no
    ``traceEvents`` list, no event objects), nesting deeper than the recursion limit or a
    single value longer than :data:`~ccoverlap.trace.jsonstream.MAX_VALUE_CHARS` characters.
    ``keep_cpu_ops=False``: in a file with device events keep only the CPU ops the analyser
    joins to kernels (collective ops; ``ProfilerStep`` annotations are in ``steps``) - less memory
    per rank; ``ts_min`` still covers every event.
    A single bad event (invalid JSON inside it, NaN / Infinity / out-of-range numbers, wrong
    types, negative durations) is skipped and counted; the warning names the first ones by
    index and character offset.
    ``keep_runtime`` also keeps what ``ccoverlap replay`` needs: the name and duration of every
    launch (``l_nid``/``l_dur``) and the wait args of ``cuda_sync`` events.
    """
    path = Path(path)
    try:
        _sniff(path)
        raw = _parse_events(path, keep_cpu_ops, keep_runtime)
    except TraceError:
        raise
    except Truncated as exc:
        raise TraceError(f"{path}: truncated or invalid JSON ({exc})") from None
    except StreamError as exc:
        raise TraceError(f"{path}: invalid JSON ({str(exc)[:200]})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: invalid JSON ({exc.msg} at offset {exc.pos})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: broken gzip stream ({exc or 'compressed file ended early'})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return raw


def _parse_events(path: Path, keep_cpu_ops: bool = True, keep_runtime: bool = False) -> RawTrace:
    # The loop below is the analyser's hot path (one pass of a possibly multi-GB file):
    # subscripts instead of .get, bound appends, one chained comparison to validate ts/dur.
    names: list[str] = []
    name_ids: dict[str, int] = {}
    infos: list[dict] = []
    threads: list = []
    thread_ids: dict = {}
    thread_names: dict = {}
    k_nid, k_stream, k_device, k_corr, k_ext, k_info, k_kind, k_cat, k_shape = (array("q") for _ in range(9))
    k_ts, k_dur = array("d"), array("d")
    c_nid, c_tid, c_ext, c_info = (array("q") for _ in range(4))
    c_annot = array("b")
    c_ts, c_dur = array("d"), array("d")
    l_corr, l_tid = array("q"), array("q")
    l_ts = array("d")
    l_nid, l_dur, k_wstream, k_wcorr = array("q"), array("d"), array("q"), array("q")   # keep_runtime only
    steps: list[tuple[int, float, float, bool]] = []
    n_events = 0
    n_bad = 0
    float_ts = False
    kind_code = {k: i for i, k in enumerate(KIND_CODES)}
    dev_cat_code = {c: i for i, c in enumerate(DEVICE_CAT_LIST)}
    c_nid_a, c_ts_a, c_dur_a, c_tid_a, c_ext_a, c_info_a, c_annot_a = (
        c_nid.append, c_ts.append, c_dur.append, c_tid.append, c_ext.append, c_info.append, c_annot.append)
    l_corr_a, l_ts_a, l_tid_a = l_corr.append, l_ts.append, l_tid.append
    comm_prefixes = COMM_OP_PREFIXES
    device_cats = DEVICE_CATS
    skip_cats = SKIP_CATS
    _int, _float, _dict, _str = int, float, dict, str

    bad_at: list[tuple[int, int]] = []

    with _open(path) as fh:
        es = EventStream(fh)
        for batch in es.batches():
          for ev in batch:   # noqa: E111 - one indentation level less keeps the hot loop's diff small
            n_events += 1
            try:
                ph = ev.ph
                if ph != "X":
                    if ph == "M":
                        if ev.name == "thread_name":
                            a = event_args(ev.args)
                            if isinstance(a.get("name"), str):
                                thread_names[(ev.pid, ev.tid)] = a["name"]
                        continue
                    if ph is None:
                        raise KeyError("ph")
                    continue
                cat = ev.cat
                if cat in skip_cats:
                    continue
                ts = ev.ts
                dur = ev.dur
                if dur is None:
                    dur = 0
                # one chained comparison rejects non-numbers (TypeError), NaN, negatives, absurd values
                if not (0 <= dur < 1e15 and -1e18 < ts < 1e18):
                    n_bad += 1
                    if len(bad_at) < 5:
                        bad_at.append(n_events - 1)
                    continue
                if ts.__class__ is _float:
                    float_ts = True
                if cat == "cpu_op" or cat == "user_annotation":
                    name = ev.name
                    if name.__class__ is not _str:
                        n_bad += 1
                        if len(bad_at) < 5:
                            bad_at.append(n_events - 1)
                        continue
                    nid = name_ids.get(name)
                    if nid is None:
                        nid = name_ids[name] = len(names)
                        names.append(name)
                    key = (ev.pid, ev.tid)
                    tid = thread_ids.get(key)
                    if tid is None:
                        tid = thread_ids[key] = len(threads)
                        threads.append(key)
                    if name.startswith(comm_prefixes):
                        args = event_args(ev.args)
                        ext = args.get("External id", -1)
                        if ext.__class__ is not _int or not -_I64 < ext < _I64:
                            ext = -1
                        c_ext_a(ext)
                        c_info_a(len(infos))
                        infos.append({k: args[k] for k in COMM_ARG_KEYS if k in args})
                    else:
                        c_ext_a(-1)
                        c_info_a(-1)
                        if name.startswith("ProfilerStep"):
                            m = _STEP_RE.match(name)
                            if m and len(m.group(1)) < 16:
                                steps.append((int(m.group(1)), _float(ts), _float(dur), False))
                    c_nid_a(nid); c_ts_a(ts); c_dur_a(dur); c_tid_a(tid); c_annot_a(cat == "user_annotation")
                    continue
                args = event_args(ev.args)
                if cat == "cuda_runtime" or cat == "cuda_driver":
                    corr = args.get("correlation")
                    if corr.__class__ is _int and -_I64 < corr < _I64:
                        key = (ev.pid, ev.tid)
                        tid = thread_ids.get(key)
                        if tid is None:
                            tid = thread_ids[key] = len(threads)
                            threads.append(key)
                        l_corr_a(corr); l_ts_a(ts); l_tid_a(tid)
                        if keep_runtime:
                            _keep_launch(ev.name, dur, names, name_ids, l_nid, l_dur)
                    continue
                name = ev.name
                if name.__class__ is not _str:
                    n_bad += 1
                    if len(bad_at) < 5:
                        bad_at.append(n_events - 1)
                    continue
                stream = args.get("stream")
                corr = args.get("correlation")
                if cat in device_cats or (
                        stream.__class__ is _int and stream >= 0 and corr.__class__ is _int and corr >= 0
                        and cat != "gpu_user_annotation"):
                    nid = name_ids.get(name)
                    if nid is None:
                        nid = name_ids[name] = len(names)
                        names.append(name)
                    info = -1
                    if "Collective name" in args or "In msg nelems" in args:
                        info = len(infos)
                        infos.append({k: args[k] for k in COMM_ARG_KEYS if k in args})
                    kk = args.get("ccoverlap_kind")
                    dev = args.get("device", ev.pid)
                    ext = args.get("External id", -1)
                    # validate every integer before the first append: the columns stay aligned
                    stream = stream if stream.__class__ is _int else -1
                    dev = dev if dev.__class__ is _int else -1
                    corr = corr if corr.__class__ is _int else -1
                    ext = ext if ext.__class__ is _int else -1
                    if not (-_I64 < stream < _I64 and -_I64 < dev < _I64 and -_I64 < corr < _I64
                            and -_I64 < ext < _I64):
                        n_bad += 1
                        if len(bad_at) < 5:
                            bad_at.append(n_events - 1)
                        continue
                    k_nid.append(nid); k_ts.append(ts); k_dur.append(dur)
                    k_stream.append(stream)
                    k_device.append(dev)
                    k_corr.append(corr)
                    k_ext.append(ext)
                    k_info.append(info)
                    k_kind.append(kind_code.get(kk, -1) if kk.__class__ is _str else -1)
                    k_cat.append(dev_cat_code.get(cat, len(DEVICE_CAT_LIST) - 1))
                    grid = args.get("grid")
                    k_shape.append(zlib.crc32(f"{grid}{args.get('block')}".encode()) if grid is not None else 0)
                    if keep_runtime:
                        ws, wc = args.get("wait_on_stream", -1), args.get("wait_on_cuda_event_record_corr_id", -1)
                        k_wstream.append(ws if ws.__class__ is _int and -_I64 < ws < _I64 else -1)
                        k_wcorr.append(wc if wc.__class__ is _int and -_I64 < wc < _I64 else -1)
                    continue
                if name.startswith("ProfilerStep"):
                    m = _STEP_RE.match(name)
                    if m and len(m.group(1)) < 16:
                        steps.append((int(m.group(1)), _float(ts), _float(dur), cat == "gpu_user_annotation"))
                if corr.__class__ is _int and -_I64 < corr < _I64:
                    key = (ev.pid, ev.tid)
                    tid = thread_ids.get(key)
                    if tid is None:
                        tid = thread_ids[key] = len(threads)
                        threads.append(key)
                    l_corr_a(corr); l_ts_a(ts); l_tid_a(tid)
                    if keep_runtime:
                        _keep_launch(name, dur, names, name_ids, l_nid, l_dur)
            except (AttributeError, TypeError, ValueError, KeyError, OverflowError):
                n_bad += 1
                if len(bad_at) < 5:
                    bad_at.append(n_events - 1)
    header = es.header
    if not es.has_events:
        keys = ", ".join(repr(k)[:40] for k in list(header)[:6]) or "none"
        raise TraceError(f"{path}: valid JSON but not a Chrome/Kineto trace: no 'traceEvents' list "
                         f"(top-level keys: {keys})")
    if es.events_not_list:
        raise TraceError(f"{path}: valid JSON but not a Chrome/Kineto trace: 'traceEvents' is not a list")
    if es.count == 0:
        raise TraceError(f"{path}: 'traceEvents' is empty - nothing was recorded")
    if n_bad >= es.count and not (len(k_ts) or len(c_ts) or len(l_ts) or steps):
        raise TraceError(f"{path}: valid JSON but not a Chrome/Kineto trace: none of its {es.count} "
                         f"'traceEvents' entries is a usable event (an object with ph, name, ts, dur)")
    n_events = es.count

    thread_labels = []
    for key in threads:
        pid, tid = key
        label = thread_names.get(key) or f"thread {tid}"
        thread_labels.append(f"{label} [pid {pid}]" if _many_pids(threads) else label)

    def f64(a):
        if isinstance(a, np.ndarray):
            return a
        return np.frombuffer(a, dtype=np.float64).copy() if len(a) else np.empty(0, dtype=np.float64)

    def i64(a):
        if isinstance(a, np.ndarray):
            return a
        return np.frombuffer(a, dtype=np.int64).copy() if len(a) else np.empty(0, dtype=np.int64)

    mins = [float(np.min(a)) for a in (k_ts, c_ts, l_ts) if len(a)] + [st[1] for st in steps]
    ts_min = min(mins) if mins else None
    if not keep_cpu_ops and len(k_ts) and len(c_nid):
        # a GPU trace: only the collective ops are joined to kernels; drop the other CPU ops' rows
        keep = np.flatnonzero(np.frombuffer(c_info, dtype=np.int64) >= 0)
        c_nid, c_ts, c_dur, c_tid, c_ext, c_info = (
            np.frombuffer(a, dtype=np.int64 if a.typecode == "q" else np.float64)[keep].copy()
            for a in (c_nid, c_ts, c_dur, c_tid, c_ext, c_info))
        c_annot = np.frombuffer(c_annot, dtype=np.int8)[keep].copy()

    raw = RawTrace(
        path=path, meta=header, names=names, infos=infos, threads=thread_labels,
        k_nid=i64(k_nid), k_ts=f64(k_ts), k_dur=f64(k_dur), k_stream=i64(k_stream),
        k_device=i64(k_device), k_corr=i64(k_corr), k_ext=i64(k_ext), k_info=i64(k_info),
        k_kind=i64(k_kind), k_cat=i64(k_cat), k_shape=i64(k_shape),
        c_nid=i64(c_nid), c_ts=f64(c_ts), c_dur=f64(c_dur), c_tid=i64(c_tid), c_ext=i64(c_ext),
        c_info=i64(c_info), c_annot=np.asarray(np.frombuffer(c_annot, dtype=np.int8) if not isinstance(
            c_annot, np.ndarray) else c_annot).astype(bool) if len(c_annot) else np.empty(0, dtype=bool), l_corr=i64(l_corr), l_ts=f64(l_ts), l_tid=i64(l_tid),
        steps=sorted(steps, key=lambda s: s[1]), n_events=n_events, n_malformed=n_bad, float_ts=float_ts,
        ts_min=ts_min,
    )
    if keep_runtime:
        raw.l_nid, raw.l_dur, raw.k_wait_stream, raw.k_wait_corr = i64(l_nid), f64(l_dur), i64(k_wstream), i64(k_wcorr)
    if n_bad:
        lexical = {b.index: b for b in es.bad}
        where = []
        for i in sorted(set(bad_at) | set(lexical))[:3]:
            b = lexical.get(i)
            where.append(f"event #{i} at offset {b.offset} (invalid JSON: {b.reason})" if b else f"event #{i}")
        raw.warnings.append(f"{path}: skipped {n_bad} malformed event(s) (invalid JSON inside the event, "
                            f"NaN/Infinity/out-of-range numbers, wrong types, missing ts, negative duration), "
                            f"first: {'; '.join(where)}")
    rank_from_meta(raw)
    return raw


def _keep_launch(name, dur, names: list, name_ids: dict, l_nid: array, l_dur: array) -> None:
    """Append a launch's interned name and duration (µs) to the replay-only columns."""
    if name.__class__ is not str:
        name = "?"
    nid = name_ids.get(name)
    if nid is None:
        nid = name_ids[name] = len(names)
        names.append(name)
    l_nid.append(nid)
    l_dur.append(float(dur))


def _many_pids(threads: list) -> bool:
    return len({p for p, _ in threads}) > 1


# ----------------------------------------------------------------------------- all files

def load_all(paths: Iterable[str | Path]) -> tuple[list[RawTrace], list[str]]:
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
