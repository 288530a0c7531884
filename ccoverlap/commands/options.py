"""The flags every command spells the same way, defined once.

* ``--out DIR``: where a command writes its artefacts (traces, pictures, files);
* ``--png [FILE]``: draw the picture (opt-in; default ``DIR/<command>.png``); ``--no-png`` is
  accepted and ignored (no picture is drawn unless asked);
* ``-q`` / ``--quiet``: no progress and no warnings on stderr (errors still go there);
* ``--json``: print one JSON object on stdout instead of tables, in every case;
* ``--cluster``: a catalog cluster (``ccoverlap list clusters``), a GPU name (its default
  cluster) or a cluster file;
* ``--dtype``: ``bfloat16``, ``float16``, ``float32`` or ``fp8``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypeAlias

from ccoverlap.outputs import check_out_dir, check_out_file  # noqa: F401 (re-exported: every command's checks)

#: what a command's ``register(sub)`` adds its subparser to (``parser.add_subparsers()``)
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

DTYPES = ("bfloat16", "float16", "float32", "fp8")
#: Element bytes of each ``--dtype``.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


def add_out(p: argparse.ArgumentParser, default: str | None, what: str = "artefacts") -> None:
    """``--out DIR`` (``default``: a directory under ``ccoverlap-out/``, or None: nothing written
    unless given)."""
    where = f" (default {default})" if default else ""
    p.add_argument("--out", metavar="DIR", default=default, help=f"directory for {what}{where}")


def add_png(p: argparse.ArgumentParser) -> None:
    """``--png [FILE]`` (opt-in picture) and the hidden, ignored ``--no-png``."""
    p.add_argument("--png", nargs="?", const="", default=None, metavar="FILE",
                   help="also draw the picture (default file: <out>/<command>.png)")
    p.add_argument("--no-png", action="store_true", help=argparse.SUPPRESS)


def png_path(args: argparse.Namespace, command: str, out: str | None = None) -> Path | None:
    """The picture to write: None unless ``--png`` was given; ``--png FILE`` as given, bare
    ``--png`` ``<out>/<command>.png``."""
    if getattr(args, "png", None) is None:
        return None
    if args.png:
        return Path(args.png)
    return Path(out or getattr(args, "out", None) or f"ccoverlap-out/{command}") / f"{command}.png"


def add_quiet(p: argparse.ArgumentParser) -> None:
    """``-q`` / ``--quiet``."""
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no warnings on stderr")


def add_json(p: argparse.ArgumentParser) -> None:
    """``--json``."""
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def add_dtype(p: argparse.ArgumentParser, *, default: str | None, choices: Sequence[str] = DTYPES, help_default: str = "") -> None:
    """``--dtype NAME``."""
    p.add_argument("--dtype", choices=list(choices), default=default,
                   help=f"element type: {', '.join(choices)}" + (f" (default {help_default or default})"
                                                                 if help_default or default else ""))


def add_common(p: argparse.ArgumentParser, *, out: str | None | Literal[False] = False, png: bool = False) -> None:
    """``--json``, ``-q`` and, when asked, ``--out`` (``out``: its default) and ``--png``."""
    add_json(p)
    add_quiet(p)
    if out is not False:
        add_out(p, out)
    if png:
        add_png(p)


def check_outputs(args: argparse.Namespace, command: str, *, out: str | None = None, out_used: bool = True) -> None:
    """ConfigError, before any work, when what the command will write cannot be: ``--out``
    (when ``out_used``: the command writes into it) and the ``--png`` picture
    (:func:`png_path`; ``out``: the directory a bare ``--png`` draws into)."""
    if out_used:
        check_out_dir(getattr(args, "out", None), "--out")
    png = png_path(args, command, out=out)
    if png is not None:
        check_out_file(png, "--png")
