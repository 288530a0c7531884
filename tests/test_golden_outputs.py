"""Every command's output on the built-in examples, byte for byte, against recorded copies.

A change of structure (modules moved, names unified) must not change what a user sees. Each
case runs one command line in a scratch directory that holds links to the repository's
``tests`` and ``examples`` (so printed paths are the same on every machine) and compares its
stdout, stderr and the SHA-256 of every file it wrote with ``tests/fixtures/golden/<case>.txt``.
A deliberate change of output is recorded again with ``CCOVERLAP_RECORD_GOLDEN=1 pytest
tests/test_golden_outputs.py``; the diff of the recorded files then shows what changed.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
from pathlib import Path

import pytest

from ccoverlap.cli import main

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "golden"
TPDP = "tests/fixtures/traces/gloo_tpdp_4rank"

#: wall-clock times in the output (how long the search took), the part that differs run to run
_WALL_CLOCK = (re.compile(r'("search_seconds": )[-+0-9.e]+'), re.compile(r"( simulations in )[0-9.]+ s"),
               re.compile(r"^()[0-9.]+(?= s of search)", re.M))
#: progress lines on stderr (``LABEL: [i/n] what``): written once the work has run a second, so
#: whether one shows depends on the machine's speed
_PROGRESS = re.compile(r"^[a-z]+: \[\d+/\d+\] .*\n", re.M)

#: case name -> the command lines run in order in one scratch directory (a later line may read
#: what an earlier one wrote); the output of every line is recorded.
CASES: dict[str, list[list[str]]] = {
    "plan": [["plan", "--emit", "emit"]],
    "plan-json": [["plan", "--json"]],
    "plan-a40": [["plan", "--config", "examples/llama3-8b-fsdp-a40.yaml"]],
    "simulate-replay-analyze": [["simulate", "--out", "sim"], ["replay", "sim", "--out", "whatif"],
                                ["analyze", "sim", "--vs", "whatif/copy-engine"]],
    "analyze": [["analyze", TPDP]],
    "analyze-json": [["analyze", TPDP, "--json"]],
    "tune": [["tune"]],
    "ficco": [["ficco"]],
    "validate-kernels": [["validate", "kernels"]],
    "validate-collectives": [["validate", "collectives"]],
    "reproduce-ficco": [["reproduce", "--paper", "ficco"]],
    "reproduce-contention": [["reproduce", "--paper", "contention"]],
    "list": [["list", what] for what in ("models", "clusters", "gpus", "frameworks", "strategies")],
}


def _written(workdir: Path, before: set[Path]) -> list[str]:
    """``sha256  path`` of every file under ``workdir`` that was not there before, sorted."""
    lines = []
    for path in sorted(p for p in workdir.rglob("*") if p.is_file() and p not in before):
        if any(part in ("tests", "examples") for part in path.relative_to(workdir).parts[:1]):
            continue
        data = path.read_bytes()
        if path.suffix == ".gz":  # the gzip header holds the time of writing: hash what it holds
            data = gzip.decompress(data)
        lines.append(f"{hashlib.sha256(_steady(data.decode('utf-8', 'replace'), workdir).encode()).hexdigest()}  "
                     f"{path.relative_to(workdir).as_posix()}")
    return lines


def _steady(text: str, workdir: Path) -> str:
    """``text`` with its wall-clock times replaced by ``<t>`` and the scratch directory by ``<dir>``."""
    for where in {str(workdir.resolve()), str(workdir)}:
        text = text.replace(where, "<dir>")
    for pattern in _WALL_CLOCK:
        text = pattern.sub(r"\1<t>", text)
    return _PROGRESS.sub("", text)


def _run_case(argvs: list[list[str]], workdir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The recorded text of one case: per command line its exit code, stdout, stderr, new files."""
    parts = []
    for argv in argvs:
        before = {p for p in workdir.rglob("*") if p.is_file()}
        code = main(list(argv))
        out, err = capsys.readouterr()
        parts.append(f"$ ccoverlap {' '.join(argv)}\n[exit {code}]\n[stdout]\n{_steady(out, workdir)}[stderr]\n{_steady(err, workdir)}[files]\n"
                     + "".join(f"{line}\n" for line in _written(workdir, before)))
    return "".join(parts)


@pytest.mark.parametrize("case", sorted(CASES))
def test_command_output_is_what_was_recorded(case, tmp_path, monkeypatch, capsys):
    for name in ("tests", "examples"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    text = _run_case(CASES[case], tmp_path, capsys)
    golden = GOLDEN / f"{case}.txt"
    if os.environ.get("CCOVERLAP_RECORD_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"no recorded output for {case}: record it with CCOVERLAP_RECORD_GOLDEN=1"
    assert text == golden.read_text(encoding="utf-8")


def test_a_changed_output_is_caught(tmp_path, monkeypatch, capsys):
    # the comparison is on the text: one changed flag gives other bytes than the recorded case
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    changed = _run_case([["list", "gpus", "--json"]], tmp_path, capsys)
    assert changed != (GOLDEN / "list.txt").read_text(encoding="utf-8")
