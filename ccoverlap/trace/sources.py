"""Where trace files are: local paths, or URLs read through fsspec.

A trace source is a local path (a :class:`~pathlib.Path`) or a URL string with a scheme
(``s3://bucket/job/rank-0.json.gz``, ``gs://…``, ``hdfs://…``, ``file:///data/job``,
``memory://…``). URLs are opened with `fsspec <https://filesystem-spec.readthedocs.io>`_, which
ships with ``pip install 'ccoverlap[ray]'``; each object store needs fsspec's own extra
(``s3fs`` for ``s3://``, ``gcsfs`` for ``gs://``, ``pyarrow`` for ``hdfs://``). fsspec is
imported only when a URL is given, so local paths need nothing beyond the core dependencies.
A source is opened where the work runs - on a cluster's worker for ``--engine ray`` - so a
worker reads its rank straight from the store and the driver never holds the bytes.
"""

from __future__ import annotations

import io
import os
import re
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, TypeGuard, Union

from ccoverlap.errors import TraceError

_inflate_lib: ModuleType
try:  # ISA-L's inflate reads the same gzip streams as zlib in about a third of the CPU time
    from isal import isal_zlib as _inflate_lib
except ImportError:      # a platform without its wheel: the standard library's zlib, the same interface
    _inflate_lib = zlib

Source = Union[Path, str]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(source: object) -> TypeGuard[str]:
    """Whether ``source`` is a URL (``scheme://…``) rather than a local path."""
    return isinstance(source, str) and bool(_SCHEME.match(source))


def as_source(source: str | os.PathLike[str]) -> Source:
    """``source`` as a URL string (kept verbatim: ``Path`` would fold its ``//``) or a Path."""
    return source if is_url(source) else Path(source)


def file_name(source: Source) -> str:
    """The last component of a path or URL (``rank-3.json.gz``)."""
    return str(source).rstrip("/").rsplit("/", 1)[-1] if is_url(source) else Path(source).name


def _fsspec() -> ModuleType:
    try:
        import fsspec  # type: ignore[import-untyped]  # fsspec ships no type information
    except ImportError:
        raise TraceError("reading trace URLs needs fsspec: pip install 'ccoverlap[ray]' (or fsspec)") from None
    return fsspec


def _filesystem(url: str) -> tuple[Any, str]:
    """``(filesystem, path inside it)`` for ``url`` (an ``fsspec.AbstractFileSystem``, untyped); TraceError naming what is missing."""
    fsspec = _fsspec()
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:   # e.g. s3:// without s3fs: fsspec says which package
        raise TraceError(f"{url}: {exc} (fsspec's extra for this scheme)") from None
    except ValueError as exc:
        raise TraceError(f"{url}: {exc}") from None


#: Most bytes a gzip trace may expand to per compressed byte read so far; real Kineto traces
#: compress 10-25x, a decompression bomb (a run of one byte) ~1000x.
MAX_GZIP_RATIO = 200
#: Decompressed bytes below which the ratio is not checked (a small file's header may compress well).
RATIO_FREE_BYTES = 16 * 2**20
#: Most bytes one gzip trace may expand to in all (several times the largest real traces).
MAX_GZIP_BYTES = 32 * 2**30


#: Compressed bytes read from the file at a time.
_PACKED_READ = 1 << 16

#: What a broken gzip stream raises: zlib's error, and ISA-L's where it inflates.
GZIP_ERRORS: tuple[type[Exception], ...] = (zlib.error, _inflate_lib.error)


class _Gunzip(io.RawIOBase):
    """A gzip stream over a compressed file object that stops with :class:`TraceError` once the
    output passes :data:`MAX_GZIP_RATIO` times the compressed bytes read (beyond
    :data:`RATIO_FREE_BYTES`) or :data:`MAX_GZIP_BYTES` in all, checked at every read (256 KiB
    a read in the trace reader), so a bomb costs at most one read past the limit.

    The inflater (ISA-L's ``isal_zlib`` where installed, else :mod:`zlib`, the same interface) reads
    the gzip format itself (``wbits=31``: header, deflate data, and the trailer's CRC-32 and length
    checked as it inflates), without :mod:`gzip`'s separate CRC call and io buffers between it and
    the reader; members written one after another are read as one stream, zero bytes between them
    skipped, as :mod:`gzip` does. A file that ends inside a member raises EOFError, a bad header,
    deflate stream or trailer one of :data:`GZIP_ERRORS`."""

    def __init__(self, source: Source, raw: BinaryIO) -> None:
        self.source, self.raw = source, raw
        self.z = _inflate_lib.decompressobj(wbits=31)
        self.out = 0

    def readable(self) -> bool:
        return True

    def _inflate(self, n: int) -> bytes:
        """Up to ``n`` more bytes of the text (b"" at the end of the file)."""
        z = self.z
        while True:
            if z.eof:                               # a member ended: another may follow
                tail = z.unused_data.lstrip(b"\0")
                while not tail:
                    packed = self.raw.read(_PACKED_READ)
                    if not packed:
                        return b""
                    tail = packed.lstrip(b"\0")
                self.z = z = _inflate_lib.decompressobj(wbits=31)
                data = z.decompress(tail, n)
            elif z.unconsumed_tail:
                data = z.decompress(z.unconsumed_tail, n)
            else:
                packed = self.raw.read(_PACKED_READ)
                if not packed:
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                data = z.decompress(packed, n)
            if data:
                return data

    def read(self, n: int = -1) -> bytes:
        data = self._inflate(n if n is not None and n > 0 else 1 << 20)
        self.out += len(data)
        if self.out > RATIO_FREE_BYTES:
            packed = max(self.raw.tell(), 1)
            if self.out > MAX_GZIP_RATIO * packed:
                raise TraceError(f"{self.source}: gzip expands more than {MAX_GZIP_RATIO}x "
                                 f"({self.out >> 20} MiB from {packed >> 10} KiB read so far) - a decompression "
                                 f"bomb, not a profiler trace (limit MAX_GZIP_RATIO = {MAX_GZIP_RATIO})")
        if self.out > MAX_GZIP_BYTES:
            raise TraceError(f"{self.source}: gzip expands to more than {_size(MAX_GZIP_BYTES)} "
                             f"(limit MAX_GZIP_BYTES)")
        return data

    # the base class takes any writable buffer, which has no len() before Python 3.12's Buffer;
    # io's readers pass a bytearray or memoryview
    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self.raw.close()
        finally:
            super().close()


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def open_binary(source: Source, gzipped: bool = False) -> BinaryIO:
    """A binary file object of ``source``, gunzipped with ``gzipped`` within the limits above
    (OSError when it cannot be read, TraceError past a limit); closing it closes everything it
    opened."""
    raw = _open_raw(source)
    return _Gunzip(source, raw) if gzipped else raw   # type: ignore[return-value]


def _open_raw(source: Source) -> BinaryIO:
    if not is_url(source):
        return open(source, "rb")
    fs, path = _filesystem(source)
    try:
        return fs.open(path, "rb")
    except OSError:
        raise
    except Exception as exc:   # a store's own error types (credentials, permissions, network)
        raise OSError(f"{type(exc).__name__}: {exc}") from None


def size(source: Source) -> int:
    """Bytes of ``source`` on disk or in its store (0 when unknown)."""
    try:
        if is_url(source):
            fs, path = _filesystem(source)
            return int(fs.size(path) or 0)
        return Path(source).stat().st_size
    except (OSError, TraceError):
        return 0


def discover_url(url: str, suffixes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Trace files named by ``url``: the object itself, or the ``suffixes`` files directly under
    it when it is a directory / prefix. Returns ``(urls, problems)``, one line per problem."""
    try:
        fs, path = _filesystem(url)
    except TraceError as exc:
        return [], [str(exc)]
    try:
        if fs.isdir(path):
            found = sorted(e["name"] for e in fs.ls(path, detail=True)
                           if e.get("type") == "file" and str(e["name"]).endswith(suffixes))
            if not found:
                return [], [f"{url}: no *.json or *.json.gz trace files under this URL"]
            return [fs.unstrip_protocol(name) for name in found], []
        if fs.isfile(path):
            return [url], []
        return [], [f"{url}: no such file or directory"]
    except Exception as exc:   # a store's own error types (credentials, permissions, network)
        return [], [f"{url}: cannot list ({type(exc).__name__}: {str(exc)[:200]})"]
