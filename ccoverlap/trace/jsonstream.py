"""Tolerant, bounded streaming reader of a Chrome-trace JSON document, one event at a time.

A trace is ``{"k": v, ..., "traceEvents": [ev, ev, ...], "k": v}`` (Kineto, ``export_chrome_trace``)
or a bare ``[ev, ev, ...]`` (the Chrome "JSON Array Format"). This module walks the outer object
and the events list itself and hands each event to the C-accelerated :class:`json.JSONDecoder`
(``raw_decode``), so

* the file is read in 256 KiB chunks (gzip or plain) and never held whole: memory is bounded by
  the largest single event, which is capped (:data:`MAX_VALUE_CHARS`);
* one bad event costs only that event: ``NaN`` / ``Infinity`` parse as floats (the caller's
  range checks reject them), an over-long integer (more than Python's 4300 digits) or any
  other lexical error inside an event is reported as :class:`BadEvent` (its index and
  character offset) and reading goes on after the event's closing brace;
* nesting is bounded by Python's recursion limit (~1000 levels) and a single value by
  :data:`MAX_VALUE_CHARS` characters: an event nested deeper, or longer, is skipped and counted
  like any bad event (reading goes on after it, scanning without keeping it, so memory stays
  about one cap); a header value that is either raises :class:`StreamError` (:class:`TooBig`) at
  once, without building the structure (bounded time and memory).

Offsets are character offsets into the (decompressed) JSON text; for ASCII files, as Kineto
writes them, they are byte offsets.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import IO, TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias, Union, cast

try:
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; the stdlib path still works
    msgspec = None  # type: ignore[assignment]  # typed as the module; None only without msgspec


class _Total(Protocol):
    """A compiled pattern that matches (maybe empty) at every position: ``match`` never returns None."""

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str]: ...


CHUNK_BYTES = 1 << 18
MAX_VALUE_CHARS = 32 << 20          # one event / header value: 32 Mi characters at most
BATCH_CHARS = 2 * CHUNK_BYTES      # text decoded per batch: fewer, larger batches (a fixed cost per batch)
_WS = cast(_Total, re.compile(r"[ \t\n\r]*"))
_SURROGATE = re.compile("[\udc80-\udcff]")
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_UNREADABLE = object()      # a header value that is valid JSON but cannot be built
_STR_WINDOW = 1 << 16
_STR_BODY = cast(_Total, re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL))   # a string's text up to its closing quote
_STRUCT = re.compile(r'["{}\[\]]')          # what opens or closes a value outside strings
_SEP = re.compile(r"[ \t\n\r]*([,\]}:])")
# strings (with escapes) or single structural characters: used to find the end of a bad event
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]"]', re.DOTALL)


# args keys kept for collective ops (decoded only for the events that carry a collective)
COMM_ARG_FIELDS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
                   "Process Group Name", "Process Group Description", "Process Group Ranks",
                   "Input Dims", "Input type", "In split size", "Out split size")
ARG_FIELDS = ("correlation", "External id", "stream", "device", "grid", "block", "ccoverlap_kind",
              "wait_on_stream", "wait_on_cuda_event_record_corr_id", "name")
# kept as raw JSON text too (a list per kernel is not built; :func:`arg_value` decodes one distinct text)
RAW_ARG_FIELDS = ("grid", "block")
_ATTR = {k: k.lower().replace(" ", "_") for k in ARG_FIELDS + COMM_ARG_FIELDS}
ABSENT = None       # what an args attribute reads when the key is not there (a JSON null reads None too)
#: An event as :meth:`EventStream.batches` yields it: a :class:`TraceEvent`, :class:`MetaEvent` or
#: other-phase struct (typed path) or an :class:`LooseEvent` (tolerant path), read by attribute; the field
#: values are unchecked (the caller validates), so it is typed loosely.
Event: TypeAlias = Any


class _NotComplete:
    """What ``cat`` reads on a typed event that is not a complete event (never a JSON value), so
    that one look at ``cat`` sorts a whole batch."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}>"


META_CAT = _NotComplete("metadata event")
OTHER_PHASE_CAT = _NotComplete("event of another phase")

if msgspec is not None:
    _RAW0 = msgspec.Raw(b"")

    def _args_struct() -> type[msgspec.Struct]:
        # the args the analyser reads, typed loosely (the caller validates); the collective keys stay
        # raw JSON text, decoded only for the few events that are collective ops
        fields = [(_ATTR[k], msgspec.Raw if k in RAW_ARG_FIELDS else object,
                   msgspec.field(default=_RAW0 if k in RAW_ARG_FIELDS else None, name=k)) for k in ARG_FIELDS]
        fields += [(_ATTR[k], msgspec.Raw, msgspec.field(default=_RAW0, name=k)) for k in COMM_ARG_FIELDS]
        return msgspec.defstruct("TraceArgs", fields, gc=False)

    if TYPE_CHECKING:
        TraceArgs: TypeAlias = Any      # a msgspec.Struct built at run time (one field per ARG_FIELDS key)
    else:
        TraceArgs = _args_struct()

    class TraceEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
        """A complete event (``"ph": "X"``): the fields the analyser reads, decoded straight into
        typed fields; unknown fields are skipped without being built. ``args`` stays raw JSON text
        (empty when absent) until :func:`resolve_args` decodes it into :data:`TraceArgs` (or None),
        so the args of the events nobody reads (most CPU ops) are never built. Types are loose on
        purpose: the caller validates."""

        cat: Union[str, None] = None
        name: Union[str, None] = None
        pid: Union[int, str, None] = None
        tid: Union[int, str, None] = None
        ts: Union[int, float, None] = None
        dur: Union[int, float, None] = None
        args: msgspec.Raw = _RAW0         # a TraceArgs or None once resolve_args has run

    class MetaEvent(msgspec.Struct, gc=False, tag_field="ph", tag="M"):
        """A metadata event (``"ph": "M"``: thread and process names), ``args`` decoded; its
        ``cat`` reads :data:`META_CAT`."""

        cat: ClassVar[object] = META_CAT
        name: Union[str, None] = None
        pid: Union[int, str, None] = None
        tid: Union[int, str, None] = None
        args: Union[TraceArgs, None] = None

    # every other phase of the Chrome trace format (flow events "s"/"f", instants, counters ...):
    # the analyser skips them, so none of their fields is built; a phase outside this list, or an
    # event without one, makes the batch go through the tolerant reader, which decides
    OTHER_PHASES = tuple("BEiICbnestfPONDVvRc()")
    _OTHER = tuple(msgspec.defstruct(f"Phase{ord(p)}", [], tag_field="ph", tag=p, gc=False,
                                     namespace={"cat": OTHER_PHASE_CAT}) for p in OTHER_PHASES)
    _BATCH = msgspec.json.Decoder(list[Union[(TraceEvent, MetaEvent) + _OTHER]])  # type: ignore[misc]
    _ARGS_LIST = msgspec.json.Decoder(list[Union[TraceArgs, None]])

    class LaunchArgs(msgspec.Struct, gc=False):
        """The args of a CPU-side launch (``cudaLaunchKernel`` ...): only its correlation is read."""

        correlation: object = None

    _LAUNCH_ARGS_LIST = msgspec.json.Decoder(list[Union[LaunchArgs, None]])
    _ANY = msgspec.json.Decoder()
    _NULL = msgspec.Raw(b"null")
else:  # pragma: no cover
    TraceEvent = MetaEvent = TraceArgs = LaunchArgs = None  # type: ignore[misc]  # only without msgspec: the names exist, unusable
    _BATCH = _ANY = _ARGS_LIST = _LAUNCH_ARGS_LIST = None


class _Args:
    """Stand-in for :data:`TraceArgs` over a stdlib-decoded ``args`` dict (the tolerant path)."""

    __slots__ = tuple(_ATTR.values())

    def __init__(self, d: dict) -> None:
        g = d.get
        for k, a in _ATTR.items():
            object.__setattr__(self, a, g(k, _MISSING) if k in COMM_ARG_FIELDS else g(k))


class _Missing:
    """A collective key that is not in the args (the tolerant path's stand-in for an empty Raw)."""

    def __bool__(self) -> bool:
        return False


_MISSING = _Missing()
_NOARGS = _Args({})


class LooseEvent:
    """Stand-in for :class:`TraceEvent` built from a stdlib-decoded dict (the tolerant path):
    same attributes, the field values unchecked (NaN, wrong types ... are left for the caller)."""

    __slots__ = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")

    def __init__(self, d: dict) -> None:
        g = d.get
        self.ph, self.cat, self.name, self.pid, self.tid = g("ph"), g("cat"), g("name"), g("pid"), g("tid")
        self.ts, self.dur = g("ts"), g("dur")
        a = g("args")
        self.args = _Args(a) if a.__class__ is dict else _NOARGS


def comm_args(args: Any) -> dict[str, Any]:
    """The collective keys present in an event's ``args`` (:data:`COMM_ARG_FIELDS`), decoded; raises
    ValueError when one cannot be (an integer of more than 4300 digits ...): the caller skips the event."""
    out: dict[str, Any] = {}
    for k in COMM_ARG_FIELDS:
        v = getattr(args, _ATTR[k])
        if v.__class__ is _Missing:
            continue
        if msgspec is not None and v.__class__ is msgspec.Raw:
            if not v:
                continue
            try:
                v = _ANY.decode(v)
            except (msgspec.DecodeError, ValueError, RecursionError):
                try:
                    v = json.loads(bytes(v))      # NaN / Infinity: the caller's checks reject them
                except RecursionError:
                    raise ValueError("args nested too deeply") from None
        out[k] = v
    return out


def arg_value(v: Any) -> Any:
    """The value of an args field that may be kept as raw JSON text (:data:`RAW_ARG_FIELDS`):
    decoded (absent: None); any other value as it is. Raises ValueError when the text cannot be
    decoded (an integer of more than 4300 digits ...)."""
    if msgspec is None or v.__class__ is not msgspec.Raw:
        return v
    if not v:
        return None
    try:
        return _ANY.decode(v)
    except (msgspec.DecodeError, ValueError, RecursionError):
        try:
            return json.loads(bytes(v))
        except RecursionError:
            raise ValueError("args nested too deeply") from None


def _present(v: Any) -> bool:
    return v.__class__ is not _Missing and (msgspec is None or v.__class__ is not msgspec.Raw or len(v) > 0)


def has_collective_record(args: Any) -> bool:
    """Whether ``args`` holds a collective record (a ``Collective name`` or ``In msg nelems`` key)."""
    return _present(args.collective_name) or _present(args.in_msg_nelems)


def resolve_args(events: list[Any], launch: bool = False) -> bool:
    """Decode, in place, the raw ``args`` text of typed :class:`TraceEvent` objects into
    :data:`TraceArgs` (None when absent or null), all of them in one decoder call; ``launch``:
    into :data:`LaunchArgs` instead (a CPU-side launch: only its ``correlation`` is read). False, with
    nothing changed, when one cannot be decoded so (args that are not an object, a value the typed
    decoder refuses): the caller then reads the whole batch with the tolerant reader."""
    raws = list(map(_EV_ARGS, events))
    if not all(raws):
        raws = [r or _NULL for r in raws]
    try:
        vals = (_LAUNCH_ARGS_LIST if launch else _ARGS_LIST).decode(b"".join((b"[", b",".join(raws), b"]")))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        return False
    for e, v in zip(events, vals):
        e.args = v
    return True


_EV_ARGS = attrgetter("args")


def _convert(items: list[Any]) -> list[LooseEvent | None]:
    return [LooseEvent(d) if d.__class__ is dict else None for d in items]


class StreamError(ValueError):
    """The document cannot be read on (message says what and where; no file name)."""


class Truncated(StreamError):
    """The text ended inside the document."""


class TooBig(StreamError):
    """A value nested deeper than the recursion limit or longer than the value cap (an event that
    is one is skipped; a header value that is one ends the document)."""


@dataclass
class BadEvent:
    """An event skipped because it is not valid JSON, or nested too deeply / too long to build
    (index in the events list, char offset, why)."""

    index: int
    offset: int
    reason: str


class _Buffer:
    """A growing window of decoded text over a binary stream."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        # a UTF-8 byte-order mark is dropped; a byte that is not UTF-8 becomes a lone surrogate
        # (U+DC80..U+DCFF) and costs only the event that holds it (see EventStream._one)
        self.dec = codecs.getincrementaldecoder("utf-8-sig")(errors="surrogateescape")
        self.buf = ""
        self.base = 0         # characters dropped before buf[0]
        self.eof = False
        self.work = 0         # characters copied into the buffer: linear in the input, whatever its text

    def more(self, need: int = CHUNK_BYTES) -> bool:
        """Append at least ``need`` bytes' worth of text (False at end of file)."""
        if self.eof:
            return False
        self.take(self.read(need))
        return True

    def read(self, need: int) -> list[str]:
        """At least ``need`` bytes' worth of the text that follows the window, decoded but not yet
        added to it (fewer at the end of the file; nothing once it has ended)."""
        parts: list[str] = []
        got = 0
        while got < need and not self.eof:
            data = self.fh.read(CHUNK_BYTES)
            if not data:
                parts.append(self.dec.decode(b"", final=True))
                self.eof = True
                break
            got += len(data)
            parts.append(self.dec.decode(data))
        return parts

    def take(self, parts: list[str]) -> None:
        """Add text read by :meth:`read` to the window."""
        self.buf = "".join([self.buf, *parts])       # one copy of the window, not two
        self.work += len(self.buf)

    def skip_to(self, parts: list[str], k: int) -> None:
        """Make the window the text after ``parts[-1][:k]``: the window so far and ``parts`` up to
        there were consumed (as one batch)."""
        self.base += len(self.buf) + sum(map(len, parts[:-1])) + k
        self.buf = parts[-1][k:]

    def drop_all(self) -> None:
        """Forget the text read so far (it was all consumed)."""
        self.base += len(self.buf)
        self.buf = ""

    def compact(self, i: int) -> int:
        """Drop text before position ``i``; returns the new position of ``i``."""
        if i > CHUNK_BYTES:
            self.buf = self.buf[i:]
            self.work += len(self.buf)
            self.base += i
            return 0
        return i

    def ensure(self, i: int, n: int) -> None:
        """Make at least ``n`` characters available from ``i`` when the file has them."""
        while len(self.buf) - i < n and not self.eof:
            self.more(max(n - (len(self.buf) - i), CHUNK_BYTES))


def _decode_error_at_end(exc: json.JSONDecodeError, buf: _Buffer) -> bool:
    # the C scanner reports running off the text at (or just before) its end; before the end of
    # the file a token cut by the window (``Na|N``, ``tr|ue``) fails a few characters earlier
    if not buf.eof and exc.msg.startswith("Unterminated string"):
        return True     # reported at the string's start, whatever its length
    return exc.pos >= len(buf.buf) - (1 if buf.eof else 16)


class EventStream:
    """Iterate the events of a trace document; header keys are collected in :attr:`header`.

    ``open_binary`` returns a fresh binary file object each time it is called. After the
    iteration, :attr:`header` holds every top-level key but ``traceEvents`` (those written
    after the events list too), :attr:`bad` the skipped events, :attr:`is_array` whether the
    document is a bare events list and :attr:`has_events` whether a ``traceEvents`` list was
    found at all.

    ``prepare``, when given, is called with each batch the typed decoder produced (before it is
    yielded); when it returns False the same text is read again with the tolerant reader (the
    analyser's :meth:`~ccoverlap.trace.columns.Columns.prepare` decodes the args it needs there
    and refuses the batch when one cannot be decoded).
    """

    @property
    def work(self) -> int:
        """Characters copied into the reading window so far (linear in the input's length)."""
        return self._b.work

    def __init__(self, fh: IO[bytes], *, max_value_chars: int | None = None,
                 prepare: Callable[[list[Any]], bool] | None = None) -> None:
        self._b = _Buffer(fh)
        self._prepare = prepare
        self._dec = json.JSONDecoder()
        self._max = max_value_chars or MAX_VALUE_CHARS
        self.header: dict[str, Any] = {}
        self.bad: list[BadEvent] = []
        self.bad_header: list[str] = []     # the first header keys whose value could not be built (skipped)
        self.n_bad_header = 0
        self.n_bad = 0
        self.is_array = False
        self.has_events = False
        self.events_not_list = False
        self.count = 0                # events seen in the list (skipped ones included)

    # ------------------------------------------------------------------ primitives
    def _skip_ws(self, i: int) -> int:
        """Position of the next non-blank character (``len(buf)`` at the end of the text). A run of
        blanks that reaches the end of the window is dropped chunk by chunk, never accumulated, so
        any amount of whitespace costs linear time and one chunk of memory."""
        b = self._b
        j = _WS.match(b.buf, i).end()
        while j == len(b.buf):
            b.drop_all()
            if not b.more():
                return 0
            j = len(b.buf) - len(b.buf.lstrip(" \t\n\r"))
        return j

    def _char(self, i: int) -> tuple[str, int]:
        """Next non-blank character and its position ('' at end of text)."""
        i = self._skip_ws(i)
        buf = self._b.buf
        return (buf[i], i) if i < len(buf) else ("", i)

    def _value(self, i: int, what: str) -> tuple[Any, int]:
        """Decode one JSON value starting at ``i`` (whole, bounded); returns (value, end)."""
        b = self._b
        want = 1 << 16
        while True:
            b.ensure(i, want)
            try:
                return self._dec.raw_decode(b.buf, i)
            except json.JSONDecodeError as exc:
                if _decode_error_at_end(exc, b) and not b.eof:
                    if len(b.buf) - i >= self._max:
                        raise TooBig(f"{what} at offset {b.base + i} is longer than {self._max >> 20} Mi "
                                          f"characters (an over-long string or value) - not a profiler trace") from None
                    want = min(max(want * 2, len(b.buf) - i + CHUNK_BYTES), self._max + CHUNK_BYTES)
                    continue
                if _decode_error_at_end(exc, b):
                    raise Truncated(f"truncated JSON: the text ends inside {what} at offset {b.base + i}") from None
                raise
            except RecursionError:
                raise TooBig(f"{what} at offset {b.base + i} is nested deeper than "
                                  f"~{_depth_limit()} levels - not a profiler trace") from None

    def _end_of_bad_value(self, i: int) -> int:
        """Position just after the JSON value starting at ``i``, by bracket matching (strings respected)."""
        b = self._b
        depth = 0
        pos = i
        while True:
            for m in _TOKENS.finditer(b.buf, pos):
                t = m.group()
                if t == '"':          # an unterminated string: need more text
                    pos = m.start()
                    break
                if t in "{[":
                    depth += 1
                elif t in "}]":
                    depth -= 1
                    if depth <= 0:
                        return m.end()
                pos = m.end()
            else:
                pos = len(b.buf)
            if len(b.buf) - i > self._max:
                raise StreamError(f"malformed value at offset {b.base + i} runs past {self._max >> 20} Mi "
                                  f"characters - not a profiler trace")
            if not b.more(max(CHUNK_BYTES, len(b.buf) - i)):     # doubling: linear in the value's length
                raise Truncated(f"truncated JSON: the text ends inside the value at offset {b.base + i}")

    def _skip_value(self, i: int) -> int:
        """Position just after the JSON value starting at ``i`` (an object, array or string of any
        depth and length), found by scanning on without keeping it: the text read past is dropped
        chunk by chunk, so memory stays one window whatever the value's size."""
        b = self._b
        depth, pos, in_str = 0, i, False
        while True:
            buf, n = b.buf, len(b.buf)
            while pos < n:
                if in_str:                  # a window at a time: the regex's memory grows with its match
                    stop = min(n, pos + _STR_WINDOW)
                    e = _STR_BODY.match(buf, pos, stop).end()
                    if e < stop and buf[e] == '"':
                        in_str, pos = False, e + 1
                        if depth == 0:
                            return pos
                        continue
                    pos = e                 # the window's end, or a backslash just before it
                    if stop == n:
                        break               # the text (or the escape) goes on in the next chunk
                    continue
                m = _STRUCT.search(buf, pos)
                if m is None:
                    pos = n
                    break
                c, pos = m.group(), m.end()
                if c == '"':
                    in_str = True
                elif c in "{[":
                    depth += 1
                else:
                    depth -= 1
                    if depth <= 0:
                        return pos
            keep = buf[pos:]                    # empty, or one backslash
            b.base += pos
            b.buf = keep
            pos = 0
            if not b.more():
                raise Truncated(f"truncated JSON: the text ends inside the value at offset {b.base}")

    # ------------------------------------------------------------------ document
    def batches(self) -> Iterator[list[Any]]:
        """Yield the events in lists (one per window of text): each item a :class:`TraceEvent` (args
        still raw unless ``prepare`` resolved them), a :class:`MetaEvent`, an empty struct for an
        event of another phase, an equivalent object (stdlib path), or ``None`` for an item that is not a JSON object or not
        valid JSON (counted in :attr:`bad` when lexically invalid)."""
        c, i = self._char(0)
        if c == "[":
            self.is_array = self.has_events = True
            yield from self._events_list(i + 1)
            c, i = self._char(self._pos)
            if c:
                raise StreamError(f"unexpected text after the events list at offset {self._b.base + i}")
            return
        if c != "{":
            raise StreamError("not a JSON object or list")
        i += 1
        first = True
        while True:
            c, i = self._char(i)
            if c == "}":
                c2, j = self._char(i + 1)
                if c2:
                    raise StreamError(f"unexpected text after the JSON object at offset {self._b.base + j}")
                return
            if not first:
                if c != ",":
                    if not c:
                        raise Truncated("truncated JSON: the text ends inside the top-level object")
                    raise StreamError(f"expected ',' or '}}' at offset {self._b.base + i}, found {c!r}")
                c, i = self._char(i + 1)
            first = False
            if c != '"':
                if not c:
                    raise Truncated("truncated JSON: the text ends inside the top-level object")
                raise StreamError(f"expected a key at offset {self._b.base + i}, found {c!r}")
            key, i = self._value(i, "a top-level key")
            c, i = self._char(i)
            if c != ":":
                if not c:
                    raise Truncated("truncated JSON: the text ends inside the top-level object")
                raise StreamError(f"expected ':' after key {key[:40]!r} at offset {self._b.base + i}")
            c, i = self._char(i + 1)
            if key == "traceEvents" and c == "[":
                self.has_events = True
                yield from self._events_list(i + 1)
                i = self._pos
                continue
            if key == "traceEvents":
                self.has_events = True
                self.events_not_list = True
            if not c:
                raise Truncated("truncated JSON: the text ends inside the top-level object")
            value, i = self._header_value(i, key)
            if key != "traceEvents" and value is not _UNREADABLE:
                self.header[key] = value
            i = self._b.compact(i)

    def _header_value(self, i: int, key: str) -> tuple[Any, int]:
        """The value of top-level key ``key`` at ``i`` and its end; a value that is valid JSON text but
        cannot be built (an integer of more than 4300 digits) is skipped: :data:`_UNREADABLE` is
        returned and the key named in :attr:`bad_header`."""
        try:
            return self._value(i, f"the value of top-level key {key[:40]!r}")
        except (json.JSONDecodeError, StreamError):
            raise
        except ValueError as exc:
            c = self._b.buf[i]
            if c in "{[":
                end = self._end_of_bad_value(i)
            else:
                m = _NUMBER.match(self._b.buf, i)
                if m is None:
                    raise
                end = m.end()
            self.n_bad_header += 1
            if len(self.bad_header) < 3:
                self.bad_header.append(f"{key[:40]!r} at offset {self._b.base + i} ({str(exc).split(';')[0][:80]})")
            return _UNREADABLE, end

    def _events_list(self, i: int) -> Iterator[list[Any]]:
        """Yield the events of the list whose ``[`` ends before ``i``; sets ``self._pos`` after its ``]``.

        Fast path: the text up to the last ``},`` + ``{`` boundary of the window is decoded as one
        JSON array by the C decoder (no Python work per event); when that fails (a bad event, or
        the boundary was inside a string) the same text is decoded event by event, bad events
        skipped (:data:`SKIPPED` is yielded in their place, so indices stay true).
        """
        b = self._b
        index = 0
        c, i = self._char(i)
        if c == "]":
            self._pos = i + 1
            return
        while True:
            i = b.compact(i)
            batch, i, tried = self._fresh_batch(i)
            if batch is not None:
                index += len(batch)
                self.count = index
                yield batch
                continue
            b.ensure(i, BATCH_CHARS)
            buf = b.buf
            k = _last_boundary(buf, i, len(buf) - 1)
            if k > i and not tried:
                batch = self._decode_batch(buf, i, k)
                if batch is not None:
                    index += len(batch)
                    self.count = index
                    yield batch
                    i = _WS.match(buf, k + 1).end()      # after the ','
                    continue
            # slow path: one event at a time up to the end of the window (or of the list)
            stop = b.base + (k if k > i else len(buf))      # absolute: _char may drop consumed text
            while True:
                ev, j = self._one(i, index)
                index += 1
                self.count = index
                yield [LooseEvent(ev) if ev.__class__ is dict else None]
                c, k2 = self._char(j)
                if c == ",":
                    c, i = self._char(k2 + 1)
                    if not c:
                        raise Truncated(f"truncated JSON: the text ends after event #{index - 1}")
                    if b.base + i >= stop:
                        break
                    continue
                if c == "]":
                    self._pos = k2 + 1
                    return
                if not c:
                    raise Truncated(f"truncated JSON: the text ends after event #{index - 1} at offset "
                                    f"{b.base + k2}")
                raise StreamError(f"expected ',' or ']' after event #{index - 1} at offset {b.base + k2}, "
                                  f"found {c!r}")

    def _fresh_batch(self, i: int) -> tuple[list[Any] | None, int, bool]:
        """The next batch straight from newly read text, when the window holds less than a batch
        after ``i``: the window's rest and the new parts up to the last boundary of the last one,
        joined once (not into the window, then sliced, then joined again). Returns ``(batch,
        position after it, tried)``; with no batch the text read is in the window and the
        position unchanged, and ``tried`` says that text failed to decode up to that boundary
        (the caller then goes event by event rather than decode it again)."""
        b = self._b
        if b.eof or len(b.buf) - i >= BATCH_CHARS:
            return None, i, False
        parts = b.read(BATCH_CHARS - (len(b.buf) - i))
        last = parts[-1] if parts else ""
        k = _last_boundary(last, 0, len(last) - 1)
        if k <= 0:
            b.take(parts)
            return None, i, False
        text = "".join(["[", b.buf[i:], *parts[:-1], last[:k], "]"])
        b.work += len(text)
        batch = self._decode_text(text)
        if batch is None:
            b.take(parts)
            return None, i, True
        b.skip_to(parts, k + 1)             # after the ','
        return batch, _WS.match(b.buf).end(), False

    def _decode_batch(self, buf: str, i: int, k: int) -> list[Any] | None:
        """Events of ``buf[i:k]`` (complete events separated by commas) or None when that text holds
        a bad event (or the cut fell inside a string): the caller then goes event by event."""
        return self._decode_text("".join(("[", buf[i:k], "]")))

    def _decode_text(self, text: str) -> list[Any] | None:
        """:meth:`_decode_batch` of ``text``, the events already wrapped in ``[`` ``]``."""
        if _BATCH is not None:
            try:
                batch = _BATCH.decode(text)
                if self._prepare is None or self._prepare(batch):
                    return batch
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                pass            # NaN, wrong types, bad JSON ...: the tolerant stdlib path decides
            except UnicodeEncodeError:
                return None     # a byte that is not UTF-8: event by event, that event skipped
        if _SURROGATE.search(text):
            return None
        try:
            items = self._dec.decode(text)
        except (ValueError, RecursionError):
            return None
        return _convert(items)

    def _one(self, i: int, index: int) -> tuple[Any, int]:
        """Decode the event at ``i`` (or skip it when it is not valid JSON or holds a byte that is
        not UTF-8); returns (event, end)."""
        try:
            ev, j = self._value(i, f"event #{index}")
            m = _SURROGATE.search(self._b.buf, i, j)
            if m is None:
                return ev, j
            self._skip_bad(index, i, f"byte 0x{ord(m.group()) - 0xDC00:02x} is not UTF-8")
            return SKIPPED, j
        except json.JSONDecodeError as exc:
            self._skip_bad(index, i, exc.msg)
        except TooBig as exc:
            self._skip_bad(index, i, str(exc).split(" - ")[0].split(" is ", 1)[-1], lexical=False)
            return SKIPPED, self._skip_value(i)
        except Truncated:
            raise
        except StreamError:
            raise
        except ValueError as exc:       # e.g. an integer of more than 4300 digits
            self._skip_bad(index, i, str(exc).split(";")[0][:80])
        return SKIPPED, self._end_of_bad_value(i)

    def _skip_bad(self, index: int, i: int, reason: str, lexical: bool = True) -> None:
        self.n_bad += 1
        if len(self.bad) < 5:
            self.bad.append(BadEvent(index, self._b.base + i, f"invalid JSON: {reason}" if lexical else reason))


SKIPPED = None      # yielded in place of an event that is not valid JSON (already counted in ``bad``)


def _last_boundary(buf: str, lo: int, hi: int) -> int:
    """Position of the ``,`` of the last ``}`` ``,`` ``{`` (blanks allowed) in ``buf[lo:hi]``; -1 if none."""
    k = hi
    while True:
        k = buf.rfind("},", lo, k)
        if k < 0:
            return -1
        j = _WS.match(buf, k + 2).end()
        if j < len(buf) and buf[j] == "{":
            return k + 1
        if k <= lo:
            return -1


def _depth_limit() -> int:
    return sys.getrecursionlimit()
