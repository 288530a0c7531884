"""Every command of the README runs and exits 0; the figures it quotes are what the commands print.

The README's ``bash`` blocks are run line by line (a trailing ``\\`` joins lines), in order, in a
scratch directory that links the repository's files, with this environment's scripts first on
the ``PATH`` (so ``ccoverlap`` and ``python`` are this installation's); its ``python`` blocks run
in a fresh interpreter. Three kinds of command cannot run here as written, and are checked as
far as they can be:

* ``make test`` is this test suite: running it from inside the suite would recurse. The check is
  that the Makefile's ``test`` target runs pytest (the suite running this file).
* ``make run`` runs as written when ``.venv`` is this environment and up to date; otherwise the
  same recipe runs against this environment (``VENV=`` this prefix), never an install.
* ``pip install …`` would need the network: it runs with ``--dry-run --no-index --no-deps
  --no-build-isolation`` (builds the package metadata, installs nothing), and each extra it names
  must be declared in pyproject.toml.

Commands that need torch (the ``[torch]`` extra) are skipped, with that reason, where torch is
not installed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TIMEOUT_S = 600
# Entries of the repository root not linked into the scratch directory (outputs, caches, git).
NOT_LINKED = {".git", "ccoverlap-out", ".pytest_cache", ".hypothesis", "ccoverlap.egg-info", "build", "out"}


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a Markdown text, as (language, body)."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def commands(body: str) -> list[str]:
    """The commands of a shell block: one per line, ``\\`` continuations joined, comments dropped."""
    out, current = [], ""
    for line in body.splitlines():
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            out.append(current.strip())
        current = ""
    return out


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
COMMANDS = [c for lang, body in BLOCKS if lang == "bash" for c in commands(body)]
PYTHON_BLOCKS = [body for lang, body in BLOCKS if lang == "python"]


def torch_available() -> bool:
    """Whether the ``[torch]`` extra is installed in this environment."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def needs_torch(cmd: str) -> bool:
    """Commands that run the runtime (torch.distributed)."""
    return cmd.startswith("python examples/") or cmd.startswith("ccoverlap bench")


def scratch_dir(tmp: Path) -> Path:
    """A directory whose entries link to the repository's, so outputs land outside the checkout."""
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (tmp / entry.name).symlink_to(entry)
    return tmp


def environment() -> dict[str, str]:
    """This environment's scripts first on the PATH; wide, plain, non-interactive output."""
    env = dict(os.environ)
    env["PATH"] = sysconfig.get_path("scripts") + os.pathsep + env.get("PATH", "")
    env.update(COLUMNS="200", MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    return env


def make_run_command() -> str:
    """``make run`` as written when ``.venv`` is this environment and current, else its recipe here."""
    venv = ROOT / ".venv"
    current = subprocess.run(["make", "-q", ".venv/.installed"], cwd=ROOT, capture_output=True).returncode == 0
    if current and venv.resolve() == Path(sys.prefix).resolve():
        return "make run"
    return f"make run VENV={shlex.quote(sys.prefix)} -o {shlex.quote(sys.prefix + '/.installed')}"


def pip_dry_run(cmd: str) -> str:
    """``pip install SPEC`` as a metadata build that installs nothing and needs no network."""
    spec = shlex.split(cmd)[2]
    extras = re.findall(r"\[([^\]]*)\]", spec)
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in (e.strip() for group in extras for e in group.split(",")):
        assert extra in declared, f"README names the extra [{extra}], which pyproject.toml does not declare"
    return (f"{shlex.quote(sys.executable)} -m pip install --dry-run --no-index --no-deps --no-build-isolation "
            f"--quiet {shlex.quote(spec)}")


def run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    """One README command in the scratch directory, through bash with pipefail."""
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=environment(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


@lru_cache(maxsize=1)
def _results(tmp: str) -> dict[str, subprocess.CompletedProcess | str]:
    """Every README command's result (or the reason it was not run), in README order."""
    cwd = scratch_dir(Path(tmp))
    results: dict[str, subprocess.CompletedProcess | str] = {}
    for cmd in COMMANDS:
        if cmd.startswith("make test"):
            results[cmd] = "make test is this test suite (checked: its target runs pytest)"
        elif needs_torch(cmd) and not torch_available():
            results[cmd] = "needs torch (the [torch] extra), not installed here"
        elif cmd.startswith("make run"):
            results[cmd] = run(make_run_command(), cwd)
        elif cmd.startswith("pip install"):
            results[cmd] = run(pip_dry_run(cmd), cwd)
        else:
            results[cmd] = run(cmd, cwd)
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The README's commands, run once for all tests of this module."""
    return _results(str(tmp_path_factory.mktemp("readme")))


def test_readme_has_commands_and_is_short() -> None:
    """The README stays within 150 lines and shows a command for each verb."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert COMMANDS[:2] == [c for c in COMMANDS if c.startswith("make ")][:2]
    assert COMMANDS[0].startswith("make run") and COMMANDS[1].startswith("make test")
    for verb in ("analyze", "replay", "plan", "plan --search", "simulate", "tune", "validate", "bench"):
        assert any(c.startswith(f"ccoverlap {verb}") for c in COMMANDS), verb


@pytest.mark.slow  # runs in CI (nothing deselects slow); the commands spawn gloo processes and take ~1 min
@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command_exits_0(results, cmd) -> None:
    """Each command of the README exits 0 (stderr shown when it does not)."""
    result = results[cmd]
    if isinstance(result, str):
        pytest.skip(result)
    assert result.returncode == 0, f"{cmd!r} exited {result.returncode}:\n{result.stderr[-3000:]}"


def test_make_test_runs_the_test_suite() -> None:
    """``make test`` (the README's second command, and CI's) runs pytest on the repository's tests."""
    recipe = subprocess.run(["make", "-n", "test", "-o", ".venv/.installed"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    assert re.search(r"python -m pytest\b", recipe), recipe
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("body", PYTHON_BLOCKS)
def test_readme_python_block_runs(body) -> None:
    """Each Python block of the README runs in a fresh interpreter."""
    if "ccoverlap.runtime" in body and not torch_available():
        pytest.skip("needs torch (the [torch] extra), not installed here")
    result = subprocess.run([sys.executable, "-c", body], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def table_rows(output: str) -> dict[str, list[str]]:
    """Rows of the rich tables in a command's output, by first cell."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells:
            rows[cells[0]] = cells[1:]
    return rows


def test_plan_excerpt_is_what_make_run_prints(results) -> None:
    """The README's excerpt of the built-in plan has the numbers ``make run`` prints."""
    excerpt = next(body for lang, body in BLOCKS if lang == "text")
    out = results[COMMANDS[0]]
    assert not isinstance(out, str) and out.returncode == 0, out
    header, *lines = excerpt.strip().splitlines()
    columns = header.split()[1:]
    assert columns == ["step", "(ms)", "MFU", "exposed", "comm", "(ms)", "overlap", "vs", "as-given"], header
    printed = table_rows(out.stdout)
    for line in lines:
        name, step, mfu, exposed, overlap, ratio = line.split()
        row = printed[name]  # step, tokens/s, MFU, exposed comm, overlap, peak mem, vs as-given
        assert [row[0], row[2], row[3], row[4], row[6]] == [step, mfu, exposed, overlap, ratio], (name, row)


def test_accuracy_table_is_what_validate_prints(results) -> None:
    """The README's default-parameter accuracy rows are ``ccoverlap validate published``'s summary."""
    cmd = next(c for c in COMMANDS if c.startswith("ccoverlap validate published"))
    out = results[cmd]
    assert not isinstance(out, str) and out.returncode == 0, out
    text = README.read_text(encoding="utf-8")
    for label, line_start in (("published set, 38 runs, default parameters", "all runs:"),
                              ("its held-out half, 20 runs, default parameters", "held-out:")):
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        mean_abs, mean_signed, worst = (c.strip() for c in row.split("|")[2:5])
        summary = next(line for line in out.stdout.splitlines() if line.startswith(line_start))
        m = re.search(r"mean \|error\| ([\d.]+)%, mean signed error ([-+\d.]+)%, worst ([-+\d.]+)%", summary)
        assert m, summary
        assert mean_abs == f"{m.group(1)}%", (label, summary)
        assert mean_signed.replace("−", "-") == f"{m.group(2)}%", (label, summary)
        assert worst.split()[0].replace("−", "-") == f"{m.group(3)}%", (label, summary)


DOC_PYTHON_PAGES = ["docs/planner.md"]  # pages whose Python examples run as written (no GPU, no process group)


@pytest.mark.parametrize("page", DOC_PYTHON_PAGES)
def test_doc_python_examples_run(page) -> None:
    """The Python examples of these docs pages run in a fresh interpreter."""
    blocks = [body for lang, body in readme_blocks((ROOT / page).read_text(encoding="utf-8")) if lang == "python"]
    assert blocks, page
    for body in blocks:
        result = subprocess.run([sys.executable, "-c", body], cwd=ROOT, capture_output=True, text=True,
                                timeout=300, env=environment())
        assert result.returncode == 0, result.stderr[-3000:]
