"""Trace events into typed columns, one window of events at a time.

:class:`Columns` takes the batches of :meth:`ccoverlap.trace.jsonstream.EventStream.batches`
(events already decoded by msgspec into typed structs, or stand-ins from the tolerant
standard-library path) and keeps, per event kind, only what an analysis reads - in numpy
columns built per batch by list comprehensions, not per event by appends:

* device events (GPU kernels, memcpy/memset, syncs): name id, ts, dur, stream, device,
  correlation, External id, collective args when Kineto attached them, launch-shape hash;
* CPU ops and user annotations: name id, ts, dur, thread id, and for collective ops the
  External id and collective args; ``ProfilerStep#N`` annotations as steps;
* launches: every other CPU-side event with a ``correlation`` (``cudaLaunchKernel`` ...).

Flow events, python functions and every other kind are skipped after one look at ``ph`` and
``cat``. Each kept event costs a fixed number of bytes (about 40 for a kernel, 30 for a CPU op,
20 for a launch; collective args and names are kept once per distinct value), so memory is
bounded per event kind. Rows keep the order of the file. An event with a bad value (not a
number, NaN, out of range, a negative duration, a name that is not a string) is counted and
skipped; the first ones are remembered by index for the warning.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Hashable, Iterator, Mapping
from itertools import compress, repeat
from operator import attrgetter
from typing import Any, Union, overload

import numpy as np

from ccoverlap.trace.jsonstream import (
    META_CAT,
    OTHER_PHASE_CAT,
    Event,
    LooseEvent,
    TraceArgs,
    TraceEvent,
    arg_value,
    comm_args,
    has_collective_record,
    resolve_args,
)

try:
    from msgspec import Raw
except ImportError:  # pragma: no cover - msgspec is a dependency; the stdlib path still works
    Raw = None  # type: ignore[assignment, misc]  # typed as the class; None only without msgspec

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "mtia_ccp_events"})
CPU_OP_CATS = frozenset({"cpu_op", "user_annotation"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
SKIP_CATS = frozenset({"python_function", "Trace", "ac2g", "fwdbwd", "cuda_profiler_range"})
# CPU ops that carry or describe a collective (args kept for the join to kernels)
COMM_OP_PREFIXES = ("record_param_comms", "nccl:", "gloo:", "c10d::", "rccl:", "ucc:", "mpi:")
DEVICE_CAT_LIST = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "mtia_ccp_events", "other")
KIND_CODES = ("compute", "comm", "memcpy", "other")
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_I64 = 1 << 62          # ids beyond this are malformed (they would not fit the int64 columns)
_KIND = {k: i for i, k in enumerate(KIND_CODES)}
_DEV_CAT: dict[Hashable, int] = {c: i for i, c in enumerate(DEVICE_CAT_LIST)}


@overload
def _int_or(v: Any, default: int = -1) -> int: ...
@overload
def _int_or(v: Any, default: None) -> int | None: ...
def _int_or(v: Any, default: int | None = -1) -> int | None:
    return v if v.__class__ is int and -_I64 < v < _I64 else default


def _all_int(vals: list[Any]) -> bool:
    """Whether every value is an ``int`` (not a bool, float, None ...)."""
    return set(map(type, vals)) <= _INT_ONLY


_INT_ONLY = {int}
_NONE_ONLY = {type(None)}
_E_CAT, _E_NAME, _E_TS, _E_DUR, _E_ARGS = (attrgetter(k) for k in ("cat", "name", "ts", "dur", "args"))
_E_PID, _E_TID = attrgetter("pid"), attrgetter("tid")
_A_STREAM, _A_CORR, _A_EXT, _A_DEV, _A_KIND, _A_GRID, _A_BLOCK, _A_COLL, _A_NELEMS = (
    attrgetter(k) for k in ("stream", "correlation", "external_id", "device", "ccoverlap_kind", "grid", "block",
                            "collective_name", "in_msg_nelems"))


def _with_record(args: list[Any]) -> list[int]:
    """Indices of the events whose args hold a collective record (:func:`has_collective_record`)."""
    if args and args[0].__class__ is TraceArgs:     # typed: absent keys are empty raw text
        names = np.fromiter(map(len, map(_A_COLL, args)), dtype=np.int64, count=len(args))
        nelems = np.fromiter(map(len, map(_A_NELEMS, args)), dtype=np.int64, count=len(args))
        return np.flatnonzero((names > 0) | (nelems > 0)).tolist()
    return [i for i, a in enumerate(args) if has_collective_record(a)]


def _int64_or_none(vals: list[Any]) -> np.ndarray | None:
    """``vals`` (ints) as an int64 array when every one is inside the kept range (``|v| < 2**62``),
    else None."""
    try:
        arr = np.fromiter(vals, dtype=np.int64, count=len(vals))
    except OverflowError:
        return None
    return arr if ((arr > -_I64) & (arr < _I64)).all() else None


def _floats(vals: list[Any]) -> np.ndarray:
    """``vals`` (numbers, or None for a missing one: NaN) as a float64 array."""
    try:
        return np.fromiter(vals, dtype=np.float64, count=len(vals))    # numbers only: no type discovery
    except TypeError:
        return np.array(vals, dtype=np.float64)


def _shape_hash(grid: Any, block: Any) -> int:
    """Hash of a kernel's launch shape (``grid``, ``block`` as decoded; 0 when there is no grid)."""
    return zlib.crc32(f"{grid}{block}".encode()) if grid is not None else 0


_SHAPE_KEY = b"|".join


def _num(v: Any) -> bool:
    return (v.__class__ is int or v.__class__ is float) and -1e300 < v < 1e300


#: A typed batch's complete events by category: the events and their indices in the batch.
_Groups = dict[Any, tuple[list[Event], np.ndarray]]
#: Row indices in the events list: a list (tolerant path) or an int array (typed path).
_Seq = Union[list[int], np.ndarray]


class Columns:
    """Accumulates the columns of one trace file (see the module docstring); :meth:`finish`
    returns them as numpy arrays in file order."""

    def __init__(self, keep_runtime: bool = False, keep_op_args: bool = False) -> None:
        self.keep_runtime = keep_runtime
        self.keep_op_args = keep_op_args
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self._name_comm = bytearray()      # per name id: 1 if a collective op name
        self._name_step: list[int] = []    # per name id: N of ProfilerStep#N, else -1
        self.infos: list[dict[str, Any]] = []
        self.threads: list[tuple[Any, Any]] = []           # (pid, tid) as written (int or str)
        self.thread_ids: dict[tuple[Any, Any], int] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.steps: list[tuple[int, float, float, bool, int]] = []
        self.k: dict[str, list[np.ndarray]] = {c: [] for c in ("seq", "nid", "ts", "dur", "stream", "device", "corr", "ext",
                                                    "info", "kind", "cat", "shape", "wstream", "wcorr")}
        self.c: dict[str, list[np.ndarray]] = {c: [] for c in ("seq", "nid", "ts", "dur", "tid", "ext", "info", "annot",
                                                    "args")}
        self.l: dict[str, list[np.ndarray]] = {c: [] for c in ("seq", "corr", "ts", "tid", "nid", "dur")}
        self.n_events = 0
        self.n_bad = 0
        self.bad_at: list[int] = []
        self.float_ts = False
        self._cat_ids: dict[Any, int] = {}
        self._cat_list: list[Any] = []
        self._shapes: dict[bytes, int] = {}
        self._comm_cache: dict[Any, bool] = {}
        self._prepared: tuple[list[Event], _Groups, list[int], dict[Any, list[Any]]] | None = None

    # ------------------------------------------------------------------ interning
    def intern(self, names: list[str]) -> np.ndarray:
        """Name ids of ``names`` (strings), new names added in first-seen order."""
        ids = self.name_ids
        out = np.fromiter(map(ids.get, names, repeat(-1)), dtype=np.int64, count=len(names))
        if not len(out) or out.min() >= 0:      # the common case: every name seen before
            return out
        for n in dict.fromkeys(names):
            if n not in ids:
                ids[n] = len(self.names)
                self.names.append(n)
                self._name_comm.append(n.startswith(COMM_OP_PREFIXES))
                m = _STEP_RE.match(n) if n.startswith("ProfilerStep") else None
                self._name_step.append(int(m.group(1)) if m and len(m.group(1)) < 16 else -1)
        return np.fromiter(map(ids.__getitem__, names), dtype=np.int64, count=len(names))

    def thread(self, keys: list[tuple[Any, Any]]) -> np.ndarray:
        """Thread ids of ``(pid, tid)`` keys, new ones added in first-seen order."""
        ids = self.thread_ids
        for k in dict.fromkeys(keys):
            if k not in ids:
                ids[k] = len(self.threads)
                self.threads.append(k)
        return np.fromiter(map(ids.__getitem__, keys), dtype=np.int64, count=len(keys))

    def _thread_ids(self, evs: list[Event]) -> np.ndarray:
        """Thread ids of the events' ``(pid, tid)``, as :meth:`thread`; a typed batch of one process
        (the common case) is looked up by ``tid`` alone, without a key tuple per event."""
        tids = list(map(_E_TID, evs))
        if evs and evs[0].__class__ is TraceEvent:
            pids = set(map(_E_PID, evs))
            if len(pids) == 1:      # typed: one value of one type (an int and a str are never equal)
                pid = evs[0].pid
                uniq = list(dict.fromkeys(tids))
                local = dict(zip(uniq, self.thread([(pid, t) for t in uniq]).tolist()))
                return np.fromiter(map(local.__getitem__, tids), dtype=np.int64, count=len(tids))
        return self.thread(list(zip(map(_E_PID, evs), tids)))

    def _bad(self, index: int) -> None:
        self.n_bad += 1
        if len(self.bad_at) < 5:
            self.bad_at.append(index)

    # ------------------------------------------------------------------ batches
    def prepare(self, batch: list[Event]) -> bool:
        """Given a typed batch by :class:`~ccoverlap.trace.jsonstream.EventStream` before it is
        yielded: sort its complete events by category and decode the args the analysis reads (every
        event of the kept categories but the CPU ops; of the CPU ops only the collective ones, or all
        with ``keep_op_args``), in one decoder call per category. False, with nothing kept, when some
        args cannot be decoded so: the stream then reads the batch with the tolerant reader. Nothing
        of this object changes here but the grouping kept for :meth:`add_batch` (and the cache of
        which names are collective)."""
        self._prepared = None
        groups, meta = self._partition(batch)
        names: dict[Any, list[Any]] = {}       # the CPU ops' names, read once for here and _cpu_ops
        for cat, (evs, _) in groups.items():
            if cat in CPU_OP_CATS and not self.keep_op_args:
                names[cat] = list(map(_E_NAME, evs))
                evs = list(compress(evs, self._comm_flags(names[cat])))
            if evs and not resolve_args(evs, launch=cat in RUNTIME_CATS):
                return False
        self._prepared = (batch, groups, meta, names)
        return True

    def _comm_flags(self, names: list[Any]) -> Iterator[bool]:
        """Whether each name is a collective CPU op's (:data:`COMM_OP_PREFIXES`; cached per name)."""
        cache = self._comm_cache
        for n in set(names).difference(cache):
            cache[n] = n.__class__ is str and n.startswith(COMM_OP_PREFIXES)
        return map(cache.__getitem__, names)

    def add_batch(self, batch: list[Event | None]) -> None:
        """Take one batch of events (typed structs, tolerant stand-ins, or None for a skipped one).
        A typed batch is the one just given to :meth:`prepare` (else it is prepared here, and a
        batch whose args cannot be decoded raises ValueError)."""
        base = self.n_events
        if not batch:
            return
        tolerant = batch[0].__class__ is LooseEvent or None in batch
        groups: Mapping[Any, tuple[list[Event], _Seq]]
        names: dict[Any, list[Any]] = {}
        if tolerant:
            groups = self._partition_tolerant(batch, base)
        else:
            prepared, self._prepared = self._prepared, None
            if prepared is None or prepared[0] is not batch:
                if not self.prepare(batch):
                    raise ValueError("event args that the typed decoder cannot read")
                prepared, self._prepared = self._prepared, None
            assert prepared is not None      # prepare() returned True: it set _prepared
            _, typed, meta, names = prepared
            for i in meta:
                self._meta(batch[i])
            groups = {cat: (evs, idx + base) for cat, (evs, idx) in typed.items()}
        self.n_events += len(batch)
        for cat, (evs, seq) in groups.items():
            if cat in SKIP_CATS:
                continue
            if tolerant:
                evs, seq = self._sanitize(evs, seq, cat)
                if not evs:
                    continue
            ts, dur, kept, seq = self._times(evs, seq)
            if not kept:
                continue
            if cat in CPU_OP_CATS:
                self._cpu_ops(cat, kept, seq, ts, dur, names.get(cat) if kept is evs else None)
            elif cat in RUNTIME_CATS:
                self._launches(kept, seq, ts, dur)
            else:
                self._others(cat, kept, seq, ts, dur)

    def _partition(self, batch: list[Event]) -> tuple[_Groups, list[int]]:
        """A typed batch's complete events by category with their indices in the batch (events of
        the skipped categories left out), and the indices of its metadata events. One look at each
        event's ``cat`` sorts them all (a metadata event's reads :data:`META_CAT`, an event of any
        other phase's :data:`OTHER_PHASE_CAT`); C-level maps and numpy, no per-event conditionals."""
        cats = list(map(_E_CAT, batch))
        cid = self._cat_ids
        cc = np.fromiter(map(cid.get, cats, repeat(-1)), dtype=np.int64, count=len(cats))
        if len(cc) and cc.min() < 0:                    # a category not seen before: ids in first-seen order
            for c in dict.fromkeys(cats):
                if c not in cid:
                    cid[c] = len(cid)
                    self._cat_list.append(c)
            cc = np.fromiter(map(cid.__getitem__, cats), dtype=np.int64, count=len(cats))
        out: _Groups = {}
        meta: list[int] = []
        present = np.flatnonzero(np.bincount(cc, minlength=len(cid))).tolist() if len(cc) else []
        for k in present:
            cat = self._cat_list[k]
            if cat is OTHER_PHASE_CAT or cat in SKIP_CATS:
                continue
            idx = np.flatnonzero(cc == k) if len(present) > 1 else np.arange(len(batch))
            if cat is META_CAT:
                meta = idx.tolist()
                continue
            out[cat] = (batch if len(idx) == len(batch) else list(map(batch.__getitem__, idx.tolist())), idx)
        return out, meta

    def _partition_tolerant(self, batch: list[Event | None], base: int) -> dict[Any, tuple[list[Event], list[int]]]:
        """The same for a batch from the tolerant path (any value may have any type)."""
        by_cat: dict[Any, tuple[list[Event], list[int]]] = {}
        for i, e in enumerate(batch):
            if e is None:
                self._bad(base + i)
                continue
            ph = e.ph
            if ph == "X":
                try:
                    g = by_cat.get(e.cat)
                except TypeError:           # an unhashable cat
                    self._bad(base + i)
                    continue
                if g is None:
                    g = by_cat[e.cat] = ([], [])
                g[0].append(e)
                g[1].append(base + i)
            elif ph == "M":
                self._meta(e)
            elif ph is None:
                self._bad(base + i)
        return by_cat

    def _meta(self, e: Event) -> None:
        if e.name == "thread_name" and e.args is not None:
            n = e.args.name
            if isinstance(n, str):
                try:
                    self.thread_names[(e.pid, e.tid)] = n
                except TypeError:       # an unhashable pid / tid (tolerant path)
                    pass

    def _sanitize(self, evs: list[Event], seq: _Seq, cat: Hashable) -> tuple[list[Event], list[int]]:
        """Tolerant path: drop (and count) events whose ts / dur / pid / tid / name have the wrong type."""
        keep_e: list[Event] = []
        keep_s: list[int] = []
        need_name = cat not in RUNTIME_CATS
        for e, s in zip(evs, seq):
            ok = (_num(e.ts) and (e.dur is None or _num(e.dur)) and e.pid.__hash__ is not None
                  and e.tid.__hash__ is not None and (not need_name or e.name.__class__ is str))
            if ok:
                keep_e.append(e)
                keep_s.append(s)
            else:
                self._bad(s)
        return keep_e, keep_s

    def _times(self, evs: list[Event], seq: _Seq) -> tuple[np.ndarray, np.ndarray, list[Event], _Seq]:
        """ts / dur columns (µs) of ``evs``; out-of-range ones (and nameless where a name is read)
        are counted and dropped."""
        ts_l = list(map(_E_TS, evs))
        ts = _floats(ts_l)                              # a missing ts reads NaN: rejected below
        dur = _floats(list(map(_E_DUR, evs)))
        missing = np.isnan(dur)         # a missing dur (None; a NaN never gets here): 0 µs
        if missing.any():
            dur[missing] = 0.0
        ok = (dur >= 0) & (dur < 1e15) & (ts > -1e18) & (ts < 1e18)
        if not ok.all():
            for s in np.asarray(seq)[~ok].tolist():
                self._bad(s)
            idx = np.flatnonzero(ok).tolist()
            evs = [evs[i] for i in idx]
            seq = [seq[i] for i in idx]
            ts_l = [ts_l[i] for i in idx]
            ts, dur = ts[ok], dur[ok]
        if not self.float_ts and float in set(map(type, ts_l)):
            self.float_ts = True
        return ts, dur, evs, seq

    def _cpu_ops(self, cat: Hashable, evs: list[Event], seq: _Seq, ts: np.ndarray, dur: np.ndarray,
                 names: list[Any] | None = None) -> None:
        """CPU ops and user annotations (``names``: their names when already read)."""
        names = list(map(_E_NAME, evs)) if names is None else names
        if None in names:
            named = [i for i, n in enumerate(names) if n is not None]
            for i in set(range(len(names))) - set(named):
                self._bad(seq[i])
            evs, seq, names = [evs[i] for i in named], [seq[i] for i in named], [names[i] for i in named]
            ts, dur = ts[named], dur[named]
            if not evs:
                return
        nid = self.intern(names)
        n = len(evs)
        ext = np.full(n, -1, dtype=np.int64)
        info = np.full(n, -1, dtype=np.int64)
        comm = np.frombuffer(bytes(self._name_comm), dtype=np.uint8)[nid].astype(bool)
        keep = np.ones(n, dtype=bool)
        for i in np.flatnonzero(comm).tolist():
            a = evs[i].args
            try:
                args = comm_args(a) if a is not None else {}
            except ValueError:
                keep[i] = False
                self._bad(seq[i])
                continue
            ext[i] = _int_or(a.external_id) if a is not None else -1
            info[i] = len(self.infos)
            self.infos.append(args)
        op_args = self._op_args(evs, ext) if self.keep_op_args else None
        step = np.asarray(self._name_step, dtype=np.int64)[nid]
        for i in np.flatnonzero((step >= 0) & ~comm).tolist():
            self.steps.append((int(step[i]), float(ts[i]), float(dur[i]), False, seq[i]))
        tid = self._thread_ids(evs)
        if not keep.all():
            nid, ts, dur, tid, ext, info = nid[keep], ts[keep], dur[keep], tid[keep], ext[keep], info[keep]
            op_args = op_args[keep] if op_args is not None else None
            seq = [s for s, k in zip(seq, keep.tolist()) if k]
        c = self.c
        c["seq"].append(np.asarray(seq, dtype=np.int64))
        c["nid"].append(nid)
        c["ts"].append(ts)
        c["dur"].append(dur)
        c["tid"].append(tid)
        c["ext"].append(ext)
        c["info"].append(info)
        c["annot"].append(np.full(len(nid), cat == "user_annotation"))
        if op_args is not None:  # only with keep_op_args: the analyser's path builds no such column
            c["args"].append(op_args)

    def _op_args(self, evs: list[Event], ext: np.ndarray) -> np.ndarray:
        """With ``keep_op_args``: every op's External id (into ``ext``, in place) and the index into
        :attr:`infos` of its decoded shape args (``Input Dims``, ``Input type``; -1: none)."""
        out = np.full(len(evs), -1, dtype=np.int64)
        for i, e in enumerate(evs):
            a = e.args
            if a is None:
                continue
            if ext[i] < 0:
                ext[i] = _int_or(a.external_id)
            try:
                d = comm_args(a)
            except ValueError:
                continue
            if d:
                out[i] = len(self.infos)
                self.infos.append(d)
        return out

    def _launches(self, evs: list[Event], seq: _Seq, ts: np.ndarray, dur: np.ndarray) -> None:
        args = list(map(_E_ARGS, evs))
        corr = list(map(_A_CORR, args)) if None not in args else [
            a.correlation if a is not None else None for a in args]
        if _all_int(corr):              # the common case: checked column-wise, no loop per event
            arr = _int64_or_none(corr)
            if arr is not None:
                self._add_launches(evs, seq, ts, dur, arr)
                return
        if not all(c.__class__ is int and -_I64 < c < _I64 for c in corr):
            corr = [_int_or(c, None) for c in corr]
        ok = [c is not None for c in corr]
        if not all(ok):
            idx = [i for i, k in enumerate(ok) if k]
            evs, seq, corr = [evs[i] for i in idx], [seq[i] for i in idx], [corr[i] for i in idx]
            ts, dur = ts[idx], dur[idx]
        if not evs:
            return
        self._add_launches(evs, seq, ts, dur, corr)

    def _add_launches(self, evs: list[Event], seq: _Seq, ts: np.ndarray, dur: np.ndarray,
                      corr: list[Any] | np.ndarray) -> None:
        lc = self.l
        lc["seq"].append(np.asarray(seq, dtype=np.int64))
        lc["corr"].append(np.asarray(corr, dtype=np.int64))
        lc["ts"].append(ts)
        lc["tid"].append(self._thread_ids(evs))
        if self.keep_runtime:
            lc["nid"].append(self.intern([e.name if e.name.__class__ is str else "?" for e in evs]))
            lc["dur"].append(dur)

    def _others(self, cat: Hashable, evs: list[Event], seq: _Seq, ts: np.ndarray, dur: np.ndarray) -> None:
        """Device events, and the launches / ProfilerStep annotations of the other CPU-side kinds."""
        names = list(map(_E_NAME, evs))
        if None in names:
            keep = [i for i, n in enumerate(names) if n is not None]
            for i in set(range(len(names))) - set(keep):
                self._bad(seq[i])
            evs, seq, names = [evs[i] for i in keep], [seq[i] for i in keep], [names[i] for i in keep]
            ts, dur = ts[keep], dur[keep]
        if cat in DEVICE_CATS:          # every one a device event
            self._device(evs, seq, names, ts, dur, cat)
            return
        dev_rows, launch_rows = [], []
        for i, e in enumerate(evs):
            a = e.args
            st = a.stream if a is not None else None
            co = a.correlation if a is not None else None
            if (st.__class__ is int and st >= 0 and co.__class__ is int and co >= 0
                          and cat != "gpu_user_annotation"):
                dev_rows.append(i)
                continue
            n = names[i]
            if n.startswith("ProfilerStep"):
                m = _STEP_RE.match(n)
                if m and len(m.group(1)) < 16:
                    self.steps.append((int(m.group(1)), float(ts[i]), float(dur[i]), cat == "gpu_user_annotation",
                                       seq[i]))
            if co.__class__ is int and -_I64 < co < _I64:
                launch_rows.append(i)
        if launch_rows:
            self._add_launches([evs[i] for i in launch_rows], [seq[i] for i in launch_rows], ts[launch_rows],
                               dur[launch_rows], [evs[i].args.correlation for i in launch_rows])
        if dev_rows:
            self._device([evs[i] for i in dev_rows], [seq[i] for i in dev_rows], [names[i] for i in dev_rows],
                         ts[dev_rows], dur[dev_rows], cat)

    def _device(self, evs: list[Event], seq: _Seq, names: list[str], ts: np.ndarray, dur: np.ndarray,
                cat: Hashable) -> None:
        if not self._device_fast(evs, seq, names, ts, dur, cat):
            self._device_each(evs, seq, names, ts, dur, cat)

    def _device_fast(self, evs: list[Event], seq: _Seq, names: list[str], ts: np.ndarray, dur: np.ndarray,
                     cat: Hashable) -> bool:
        """Device events of a typed batch, column by column; False (nothing added) when any value
        needs the per-event checks of :meth:`_device_each`."""
        args = list(map(_E_ARGS, evs))
        if None in args or self.keep_runtime:
            return False
        ints = {}
        for key, vals in (("stream", list(map(_A_STREAM, args))), ("corr", list(map(_A_CORR, args))),
                          ("ext", list(map(_A_EXT, args)))):
            kinds = set(map(type, vals))
            if kinds == _NONE_ONLY:             # the key is in no event of the batch
                vals = [-1] * len(vals)
            elif not kinds <= _INT_ONLY:
                vals = [v if v.__class__ is int else -1 for v in vals]
            ints[key] = vals
        dev = list(map(_A_DEV, args))
        if None in dev:
            dev = [d if d is not None else e.pid for d, e in zip(dev, evs)]
        if not _all_int(dev):
            dev = [v if v.__class__ is int else -1 for v in dev]
        ints["device"] = dev
        try:
            cols = {k: np.fromiter(v, dtype=np.int64, count=len(v)) for k, v in ints.items()}
        except OverflowError:
            return False
        if any(((c <= -_I64) | (c >= _I64)).any() for c in cols.values()):
            return False
        info = np.full(len(evs), -1, dtype=np.int64)
        for i in _with_record(args):
            try:
                d = comm_args(args[i])
            except ValueError:
                return False
            info[i] = len(self.infos)
            self.infos.append(d)
        kind_vals = list(map(_A_KIND, args))
        kind = (np.full(len(evs), -1, dtype=np.int64) if kind_vals.count(None) == len(kind_vals) else
                np.array([_KIND.get(kk, -1) if kk.__class__ is str else -1 for kk in kind_vals], dtype=np.int64))
        try:
            shape = self._shape_column(args)
        except ValueError:              # a grid / block that cannot be decoded: event by event
            return False
        k = self.k
        k["seq"].append(np.asarray(seq, dtype=np.int64))
        k["nid"].append(self.intern(names))
        k["ts"].append(ts)
        k["dur"].append(dur)
        for key in ("stream", "device", "corr", "ext"):
            k[key].append(cols[key])
        k["info"].append(info)
        k["kind"].append(kind)
        k["cat"].append(np.full(len(evs), _DEV_CAT.get(cat, len(DEVICE_CAT_LIST) - 1), dtype=np.int64))
        k["shape"].append(np.array(shape, dtype=np.int64))
        k["wstream"].append(np.full(len(evs), -1, dtype=np.int64))
        k["wcorr"].append(np.full(len(evs), -1, dtype=np.int64))
        return True

    def _shape_column(self, args: list[Any]) -> np.ndarray:
        """The launch-shape hash of each event (:func:`_shape_hash`), computed once per distinct
        grid / block text (typed batch: both kept as raw JSON text)."""
        grids, blocks = list(map(_A_GRID, args)), list(map(_A_BLOCK, args))
        if grids[0].__class__ is not Raw:             # the tolerant path: decoded values
            return np.array([_shape_hash(g, b) for g, b in zip(grids, blocks)], dtype=np.int64)
        # one bytes key per event, "grid|block": unambiguous, as each side is one whole JSON value
        # (none is a longer value's start followed by "|"); bytes cache their hash, tuples do not
        keys = list(map(_SHAPE_KEY, zip(grids, blocks)))
        cache = self._shapes
        new = set(keys).difference(cache)
        if len(cache) + len(new) > 65536:           # too many distinct shapes: no cache
            return np.array([_shape_hash(arg_value(g), arg_value(b)) for g, b in zip(grids, blocks)], dtype=np.int64)
        if new:
            where = dict(zip(keys, range(len(keys))))
            for key in new:
                cache[key] = _shape_hash(arg_value(grids[where[key]]), arg_value(blocks[where[key]]))
        return np.fromiter(map(cache.__getitem__, keys), dtype=np.int64, count=len(keys))

    def _device_each(self, evs: list[Event], seq: _Seq, names: list[str], ts: np.ndarray, dur: np.ndarray,
                     cat: Hashable) -> None:
        n = len(evs)
        cols = {k: np.empty(n, dtype=np.int64) for k in ("stream", "device", "corr", "ext", "info", "kind", "shape",
                                                         "wstream", "wcorr")}
        keep = np.ones(n, dtype=bool)
        cat_code = _DEV_CAT.get(cat, len(DEVICE_CAT_LIST) - 1)
        for i, e in enumerate(evs):
            a = e.args
            if a is None:
                st = dev = co = ext = None
                info, kk, grid, block = -1, None, None, None
                dev = e.pid
            else:
                st, co, ext, kk = a.stream, a.correlation, a.external_id, a.ccoverlap_kind
                dev = a.device if a.device is not None else e.pid
                info = -1
                try:
                    grid, block = arg_value(a.grid), arg_value(a.block)
                except ValueError:
                    keep[i] = False
                    self._bad(seq[i])
                    continue
                if has_collective_record(a):
                    try:
                        args = comm_args(a)
                    except ValueError:
                        keep[i] = False
                        self._bad(seq[i])
                        continue
                    info = len(self.infos)
                    self.infos.append(args)
            st = st if st.__class__ is int else -1
            dev = dev if dev.__class__ is int else -1
            co = co if co.__class__ is int else -1
            ext = ext if ext.__class__ is int else -1
            if not (-_I64 < st < _I64 and -_I64 < dev < _I64 and -_I64 < co < _I64 and -_I64 < ext < _I64):
                keep[i] = False
                self._bad(seq[i])
                continue
            cols["stream"][i], cols["device"][i], cols["corr"][i], cols["ext"][i] = st, dev, co, ext
            cols["info"][i] = info
            cols["kind"][i] = _KIND.get(kk, -1) if kk.__class__ is str else -1
            cols["shape"][i] = _shape_hash(grid, block)
            if self.keep_runtime:
                ws = a.wait_on_stream if a is not None else None
                wc = a.wait_on_cuda_event_record_corr_id if a is not None else None
                cols["wstream"][i], cols["wcorr"][i] = _int_or(ws), _int_or(wc)
        k = self.k
        nid = self.intern(names)
        for key, arr in cols.items():
            k[key].append(arr[keep])
        k["seq"].append(np.asarray(seq, dtype=np.int64)[keep])
        k["nid"].append(nid[keep])
        k["ts"].append(ts[keep])
        k["dur"].append(dur[keep])
        k["cat"].append(np.full(int(keep.sum()), cat_code, dtype=np.int64))

    # ------------------------------------------------------------------ result
    def finish(self) -> dict[str, np.ndarray]:
        """Every column as one numpy array, rows in file order (keys ``k_*``, ``c_*``, ``l_*``; ``*_seq``:
        each row's index in the events list). Each
        column's batches are dropped as soon as it is joined, so the peak is the columns plus one
        column's copy, not twice the columns. Called once."""
        out: dict[str, np.ndarray] = {}
        for prefix, cols in (("k", self.k), ("c", self.c), ("l", self.l)):
            seq = np.concatenate(cols["seq"]) if cols["seq"] else np.empty(0, dtype=np.int64)
            order = np.argsort(seq, kind="stable") if cols["seq"] else None
            out[f"{prefix}_seq"] = seq[order] if order is not None else seq     # file index of each row
            cols["seq"].clear()
            for key, parts in cols.items():
                if key == "seq":
                    continue
                dt = np.float64 if key in ("ts", "dur") else (bool if key == "annot" else np.int64)
                arr = np.concatenate(parts).astype(dt, copy=False) if parts else np.empty(0, dtype=dt)
                parts.clear()
                if order is not None and len(arr) == len(order):
                    arr = arr[order]
                out[f"{prefix}_{key}"] = arr
        self.steps.sort(key=lambda s: s[4])
        return out
