"""Command-line entry point: ``ccoverlap <command> ...`` (also ``python -m ccoverlap``).

Thin by design: each command lives in :mod:`ccoverlap.commands.<name>` and exposes
``register(subparsers)`` and ``run(args) -> int``; the flags every command shares are defined
once in :mod:`ccoverlap.commands.options`. Errors derived from
:class:`ccoverlap.errors.CCOverlapError` become one line on stderr and exit code 2; a usage
error prints the usage line, the error and the closest known flag or name; with ``--json`` a
failing command still prints one JSON object (``{"error": ...}``); a closed pipe
(``ccoverlap analyze ... | head -1``) ends quietly with exit code 0.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import re
import sys
from collections.abc import Iterable
from typing import NoReturn

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
    "list": "ccoverlap.commands.listing",
}
#: Most characters of the error line main prints (a longer message keeps its start and end).
MESSAGE_CHARS = 500
#: Commands that print their own JSON object when they fail (with more than the message).
OWN_JSON_ERRORS = ("analyze", "validate")
#: Commands that do no matrix products: numpy's OpenBLAS is told to start no threads for them
#: (unless the environment says otherwise). On import it starts one per CPU, which spin for a
#: while: about 40 ms of CPU before the first trace is read, on two cores.
NO_BLAS_THREADS = ("analyze",)
#: Commands whose process, run as the program (not ``main([...])`` from Python), ends with
#: ``os._exit`` once its output is flushed: the interpreter's teardown (freeing every module and
#: object one by one) costs ``analyze`` about 28 ms of CPU after its work is done, on one core
#: while the other idles. Only with the local engine: Ray's shutdown runs at exit.
FAST_EXIT = ("analyze",)


def _closest(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def _cut(word: str, limit: int = 60) -> str:
    """``word``, its first ``limit`` characters and ``...`` when longer."""
    return word if len(word) <= limit else word[:limit] + "..."


def _shorten_quotes(message: str) -> str:
    """A usage error with every quoted value longer than 60 characters cut (``'xxxx...'``) and
    the whole line capped at :data:`MESSAGE_CHARS`: a 5000-digit flag value is not echoed whole."""
    from ccoverlap.config import clip_line

    message = re.sub(r"'([^'\n]{60})[^'\n]+'", r"'\1...'", message)
    return clip_line(message, MESSAGE_CHARS)


class _Parser(argparse.ArgumentParser):
    """argparse with the usage line and the closest known choice on a usage error (exit 2)."""

    def error(self, message: str) -> NoReturn:
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            near = _closest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
            if near:
                message += f"; did you mean {near!r}?"
        message = _shorten_quotes(message)
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)

    def option_strings(self) -> list[str]:
        """Every flag this parser knows."""
        return [s for a in self._actions for s in a.option_strings if s != argparse.SUPPRESS]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``ccoverlap`` parser with every command's subparser, or with only command ``only``'s
    (each command module imports what its flags need: ``analyze`` need not import the catalog,
    the planner or rich to start)."""
    from ccoverlap.version import __version__

    parser = _Parser(prog="ccoverlap", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ccoverlap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # command not built in this checkout
                continue
            raise
        module.register(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is a usage error of its command that names the closest
    known flag (``--modle``: did you mean ``--model``?)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = _subparser(parser, getattr(args, "command", None))
        known = sub.option_strings() if isinstance(sub, _Parser) else []
        hints = [f"{_cut(x)} (did you mean {near}?)" if (near := _closest(x.split("=")[0][:100], known)) else _cut(x)
                 for x in extra[:5]] + ([f"... ({len(extra)} in all)"] if len(extra) > 5 else [])
        sub.error("unrecognized arguments: " + " ".join(hints))
    return args


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (``| head``): send what is left to /dev/null, exit 0."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def _stdout_is_devnull() -> bool:
    """Whether stdout now points at /dev/null, as rich leaves it when the reader went away
    (rich's Console then raises SystemExit(1))."""
    try:
        out, null = os.fstat(sys.stdout.fileno()), os.stat(os.devnull)
    except (OSError, ValueError):
        return False
    return (out.st_dev, out.st_ino) == (null.st_dev, null.st_ino)


def _exit_now(code: int) -> NoReturn:
    """End the process with ``code`` at once, skipping the interpreter's teardown: every output is
    flushed first, the worker processes are already joined and nothing else waits for exit."""
    sys.stderr.flush()
    if "logging" in sys.modules:        # its handlers flush at exit (nothing imports it on this path)
        sys.modules["logging"].shutdown()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (0 ok, 2 error, 130 interrupted). When the first
    argument names a command, only that command's module is imported."""
    first = (sys.argv[1:] if argv is None else argv)[:1]
    if first and first[0] in NO_BLAS_THREADS:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # before anything imports numpy
    parser = build_parser(first[0] if first and first[0] in COMMANDS else None)
    try:
        args = parse(parser, argv)
        if not getattr(args, "command", None):
            parser.print_help()
            sys.stderr.write("ccoverlap: error: no command given; `ccoverlap --help` lists them\n")
            return 2
        code = int(args.run(args) or 0)
        sys.stdout.flush()
        if argv is None and args.command in FAST_EXIT and getattr(args, "engine", "local") == "local":
            _exit_now(code)
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except SystemExit as exc:
        if exc.code == 1 and _stdout_is_devnull():  # a rich Console met the closed pipe
            return 0
        raise
    except CCOverlapError as exc:
        from ccoverlap.config import clip_line

        message = clip_line(str(exc), MESSAGE_CHARS)  # one line of a readable length, whatever a message holds
        if getattr(args, "json", False) and args.command not in OWN_JSON_ERRORS:
            sys.stdout.write(json.dumps({"tool": f"ccoverlap {args.command}", "error": message}) + "\n")
        sys.stderr.write(f"ccoverlap {args.command}: error: {message}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("ccoverlap: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
