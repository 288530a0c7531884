"""Command-line entry point: ``ccoverlap <command> ...`` (also ``python -m ccoverlap``).

Thin by design: each command lives in :mod:`ccoverlap.commands.<name>` and exposes
``register(subparsers)`` and ``run(args) -> int``. Errors derived from
:class:`ccoverlap.errors.CCOverlapError` become one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ccoverlap.errors import CCOverlapError

# command name -> module; the order is the order of `ccoverlap --help`.
COMMANDS = {
    "plan": "ccoverlap.commands.plan",
    "simulate": "ccoverlap.commands.simulate",
    "analyze": "ccoverlap.commands.analyze",
    "replay": "ccoverlap.commands.replay",
    "tune": "ccoverlap.commands.tune",
    "ficco": "ccoverlap.commands.ficco",
    "bench": "ccoverlap.commands.bench",
    "calibrate": "ccoverlap.commands.calibrate",
    "validate": "ccoverlap.commands.validate",
    "reproduce": "ccoverlap.commands.reproduce",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every usage error here
        sys.stderr.write(f"ccoverlap: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ccoverlap", description=__doc__.splitlines()[0])
    from ccoverlap.version import __version__

    parser.add_argument("--version", action="version", version=f"ccoverlap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # command not built in this checkout
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except CCOverlapError as exc:
        sys.stderr.write(f"ccoverlap {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("ccoverlap: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
