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
from typing import TYPE_CHECKING, Literal, TypeAlias

from ccoverlap.outputs import check_out_dir, check_out_file

if TYPE_CHECKING:
    from ccoverlap.predict.workload import Workload
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


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that describe a workload (all optional: defaults are the built-in example)."""
    from ccoverlap.catalog.frameworks import DEFAULT_FRAMEWORK  # only the workload commands need the catalog

    g = parser.add_argument_group("workload (defaults: the built-in example)")
    g.add_argument("--config", help="JSON/TOML/YAML file describing the workload (flags override it)")
    g.add_argument("--model", help="model name (e.g. llama-3-70b; `ccoverlap list models`) or a model file")
    g.add_argument("--cluster", help="cluster or GPU name (dgx-h100, a40-pcie, H100-SXM, ...; "
                                     "`ccoverlap list clusters`) or a cluster file")
    g.add_argument("--nodes", type=int, help="number of nodes")
    for dim in ("tp", "pp", "dp", "ep", "cp"):
        g.add_argument(f"--{dim}", type=int, help=f"{dim.upper()} degree")
    g.add_argument("--data-parallel", choices=["ddp", "fsdp"], help="data-parallel flavour")
    g.add_argument("--sequence-parallel", action="store_true", default=None, help="TP with sequence parallelism")
    g.add_argument("--pp-schedule", choices=["gpipe", "1f1b", "interleaved", "dualpipe"])
    g.add_argument("--virtual-stages", type=int, help="virtual stages per rank (interleaved 1F1B)")
    g.add_argument("--recompute", choices=["none", "selective", "full"])
    g.add_argument("--global-batch", type=int, help="global batch (sequences)")
    g.add_argument("--micro-batch", type=int, help="micro-batch size (sequences)")
    g.add_argument("--seq-len", type=int, help="sequence length (tokens)")
    g.add_argument("--dtype", choices=list(DTYPES),
                   help="compute dtype: bfloat16 (default), float16, float32, or fp8 linear layers")
    g.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="overlap knob as given, e.g. --knob fsdp_prefetch=2 --knob bucket_cap_mb=50")
    g.add_argument("--calibration", help="calibration file written by `ccoverlap calibrate`")
    g.add_argument("--framework", help=f"framework profile ({DEFAULT_FRAMEWORK} by default; "
                                       "`ccoverlap list frameworks`) or a profile file (docs/model.md)")


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload described by the command line (config file first, then flags)."""
    from ccoverlap.config import read_config_file, short
    from ccoverlap.errors import ConfigError
    from ccoverlap.predict.workload import INIT_OPTIONS, parse_scalar, workload_from_options

    options = {k: getattr(args, k, None) for k in INIT_OPTIONS}
    options.update({k: getattr(args, k, None) for k in ("model", "cluster", "calibration", "framework")})
    knobs = {}
    for item in getattr(args, "knob", None) or []:
        if "=" not in item:
            raise ConfigError(f"--knob {short(item)}: expected NAME=VALUE")
        name, value = item.split("=", 1)
        knobs[name.strip()] = parse_scalar(value.strip())
    options["knobs"] = knobs
    options = {k: v for k, v in options.items() if v is not None and v != {}}
    if args.config:
        return workload_from_options(read_config_file(args.config), options, source=args.config)
    return workload_from_options(None, options, source="command line" if options else "built-in example")
