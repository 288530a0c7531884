"""Writing the user's files: atomically, one file or a set, and checked before the work.

Every file the package writes for a user (``--out`` directories, ``--emit`` settings,
``--png`` pictures, calibration files, reports) goes through this module:

* :func:`atomic_file` / :func:`write_text` / :func:`write_bytes`: one file, written to a
  temporary file in the same directory and renamed over the target (``os.replace``), so a
  reader sees the old file or the new one, never half of one;
* :func:`atomic_dir`: a set of files written into a temporary directory beside the target
  and moved into place only when every one was written; when anything fails, the user's
  directory is as it was (files of the target that the set does not name are kept);
* :func:`check_out_dir` / :func:`check_out_file`: a :class:`ConfigError` *before* the work
  when an output path cannot be written (an existing file where a directory goes, a
  directory that is not writable, a path too long), so minutes of work are not lost.

Every failure is one :class:`~ccoverlap.errors.ConfigError` naming the path (shortened when
it is longer than a file name may be) and the reason.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ccoverlap.config import short
from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Longest path the checks accept (Linux PATH_MAX); longer paths are quoted shortened.
MAX_PATH_CHARS = 4096


def path_name(path: str | os.PathLike) -> str:
    """``path`` as text, shortened (:func:`ccoverlap.config.short`) when it is longer than any
    file name can be, or holds characters a path cannot."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else text.decode(errors="replace")
    return text if len(text) <= 200 and "\x00" not in text else short(text)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _check_path(path: str | os.PathLike, flag: str) -> Path:
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{flag}: expected a path, got {short(text)}")
    if "\x00" in text:
        raise ConfigError(f"{flag} {path_name(text)}: a path cannot hold a NUL character")
    if len(text) > MAX_PATH_CHARS or any(len(part) > 255 for part in Path(text).parts):
        raise ConfigError(f"{flag} {path_name(text)}: path too long ({len(text)} characters; "
                          f"at most {MAX_PATH_CHARS}, 255 per name)")
    return Path(text)


def _probe(d: Path, p: Path, flag: str) -> None:
    """ConfigError unless a file can be made (and is removed again) in existing directory
    ``d``: the one test that also holds for root, read-only mounts and pseudo file systems."""
    try:
        fd, name = tempfile.mkstemp(prefix=".ccoverlap-probe.", dir=d)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{flag} {path_name(p)}: cannot write there ({path_name(d)}: {_reason(exc)})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


def _writable_parent(p: Path, flag: str) -> None:
    """ConfigError unless the nearest existing directory above ``p`` is a directory in which
    ``p``'s missing directories can be made."""
    parent = next((q for q in p.absolute().parents if q.exists()), Path("."))
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path_name(p)}: cannot create it ({path_name(parent)} is not a directory)")
    try:
        made = tempfile.mkdtemp(prefix=".ccoverlap-probe.", dir=parent)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{flag} {path_name(p)}: cannot create it ({path_name(parent)}: {_reason(exc)})") from None
    with contextlib.suppress(OSError):
        os.rmdir(made)


def check_out_dir(path: str | os.PathLike | None, flag: str) -> None:
    """ConfigError, before any work, when directory ``path`` (given with ``flag``) exists and
    is not a writable directory, or cannot be created; None passes. Writability is tried (a
    file made and removed), not guessed from permission bits."""
    if path is None:
        return
    p = _check_path(path, flag)
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"{flag} {path_name(p)}: exists and is not a directory")
        _probe(p, p, flag)
        return
    _writable_parent(p, flag)


def check_out_file(path: str | os.PathLike | None, flag: str) -> None:
    """ConfigError, before any work, when file ``path`` (given with ``flag``) is a directory,
    or its directory cannot be created or written (tried, as :func:`check_out_dir`); None
    passes. (The file is replaced by a rename, so its own permission bits do not matter.)"""
    if path is None:
        return
    p = _check_path(path, flag)
    if p.is_dir():
        raise ConfigError(f"{flag} {path_name(p)}: is a directory, expected a file name")
    if p.parent.exists() and not p.parent.is_dir():
        raise ConfigError(f"{flag} {path_name(p)}: {path_name(p.parent)} is not a directory")
    if p.parent.is_dir():
        _probe(p.parent, p, flag)
        return
    _writable_parent(p.parent, flag)


@functools.cache
def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mkdir(d: Path) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path_name(d)}: cannot make the directory ({_reason(exc)})") from None


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` (its directory created) for the caller to write; when
    the block ends without an error it is renamed onto ``path``, else removed (``path`` is left
    as it was). An OSError inside the block, or in the rename, becomes one ConfigError naming
    ``path``."""
    p = Path(path)
    _mkdir(p.parent)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{p.name[:100]}.", suffix=".tmp", dir=p.parent)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path_name(p)}: cannot write ({_reason(exc)})") from None
    os.close(fd)
    tmp = Path(name)
    with contextlib.suppress(OSError):  # mkstemp makes it private: the old file's mode, or a new file's
        tmp.chmod(stat.S_IMODE(p.stat().st_mode) if p.is_file() else 0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, p)
    except OSError as exc:
        raise ConfigError(f"{path_name(p)}: cannot write ({_reason(exc)})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_file`); returns the path."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_file`); returns the path."""
    return write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary directory beside directory ``path`` for the caller to fill; when the block
    ends without an error, each file in it (subdirectories kept) is moved onto the same name
    under ``path`` (created), else the temporary directory is removed and ``path`` is left as
    it was. Files of ``path`` the set does not name are kept. An OSError becomes one
    ConfigError naming ``path``.

    Everything that can be checked (a directory where a file of the set goes, a file where a
    directory goes) is checked before the first file is moved; the moves are renames within
    one file system, so only an I/O error during them could leave part of the set moved."""
    p = Path(path)
    _mkdir(p.parent if p.parent != p else p)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{p.name[:100]}.", suffix=".tmp", dir=p.parent))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path_name(p)}: cannot write ({_reason(exc)})") from None
    try:
        yield tmp
        _move_into(tmp, p)
    except OSError as exc:
        raise ConfigError(f"{path_name(p)}: cannot write ({_reason(exc)})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into(src: Path, dst: Path) -> None:
    """Each file under ``src`` renamed onto the same relative name under ``dst`` (directories
    created). The directories are made first, so the renames are the last step."""
    files = sorted(f for f in src.rglob("*") if not f.is_dir())
    for f in files:
        target = dst / f.relative_to(src)
        for q in (target.parent, *target.parent.parents):
            if q.exists() and not q.is_dir():
                raise ConfigError(f"{path_name(q)}: exists and is not a directory")
        if target.is_dir():
            raise ConfigError(f"{path_name(target)}: is a directory, cannot write a file there")
    for f in files:
        (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
    for f in files:
        os.replace(f, dst / f.relative_to(src))


def save_figure(fig: Figure, path: str | os.PathLike[str], **savefig_kwargs: Any) -> Path:
    """``fig.savefig`` (a matplotlib Figure) to ``path`` atomically (:func:`atomic_file`); the
    format from ``path``'s suffix when matplotlib knows it, else PNG. Returns the path."""
    p = Path(path)
    fmt = p.suffix[1:].lower()
    if fmt not in fig.canvas.get_supported_filetypes():
        fmt = "png"
    with atomic_file(p) as tmp:
        fig.savefig(tmp, format=fmt, **savefig_kwargs)
    return p


def write_files(path: str | os.PathLike, files: dict[str, bytes | str]) -> list[Path]:
    """Write ``{name: content}`` (bytes, or text as UTF-8) into directory ``path`` as one set
    (:func:`atomic_dir`: all of them or, on failure, none). Returns the paths, in order."""
    out = Path(path)
    with atomic_dir(out) as tmp:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return [out / name for name in files]
