"""The README Layout's one-way import order, enforced with import-linter (contract: .importlinter)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter (test extra) not installed")


def _lint(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--config", str(config), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_layers_contract_is_kept():
    out = _lint(ROOT / ".importlinter")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "KEPT" in out.stdout


def test_contract_checker_reports_a_violation(tmp_path):
    # config imports errors, so a contract putting errors above config must be broken
    cfg = tmp_path / "broken.ini"
    cfg.write_text("[importlinter]\nroot_package = ccoverlap\n\n[importlinter:contract:x]\nname = upside down\n"
                   "type = layers\nlayers =\n    ccoverlap.errors\n    ccoverlap.config\n")
    out = _lint(cfg)
    assert out.returncode != 0
    assert "ccoverlap.config -> ccoverlap.errors" in out.stdout


def test_cycle_checker_counts_imports_inside_functions(tmp_path):
    # a <-> b where b imports a only inside a function: still a cycle for the acyclic contract
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyclepkg import a\n    return a\n")
    cfg = tmp_path / "cycle.ini"
    cfg.write_text("[importlinter]\nroot_package = cyclepkg\n\n[importlinter:contract:c]\nname = no cycle\n"
                   "type = acyclic_siblings\nancestors =\n    cyclepkg\n")
    out = subprocess.run([LINT, "--config", str(cfg), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode != 0, out.stdout
    assert "BROKEN" in out.stdout


def _architecture_tree() -> list[str]:
    """The names of docs/architecture.md's package tree, in its order (``api``, ``commands``, ...)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```text\nccoverlap/\n", 1)[1].split("```", 1)[0]
    return [line.split()[0].rstrip("/").removesuffix(".py") for line in block.splitlines() if line.strip()]


def _layers() -> list[set[str]]:
    """The layers contract of .importlinter, top first, each a set of top-level names."""
    text = (ROOT / ".importlinter").read_text(encoding="utf-8")
    block = text.split("[importlinter:contract:layers]", 1)[1].split("layers =", 1)[1].split("\n\n", 1)[0]
    return [{name.strip().removeprefix("ccoverlap.") for name in line.split("|")}
            for line in block.splitlines() if line.strip()]


def test_architecture_page_lists_every_package_once():
    pkg = ROOT / "ccoverlap"
    actual = {p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    actual |= {p.stem for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__")} | {"data"}
    names = _architecture_tree()
    assert len(names) == len(set(names)), names
    assert set(names) == actual


def test_architecture_page_lists_the_packages_in_the_contracts_order():
    position = {name: i for i, name in enumerate(_architecture_tree())}
    layers = _layers()
    assert set().union(*layers) <= set(position)
    for upper, lower in zip(layers, layers[1:]):
        assert max(position[n] for n in upper) < min(position[n] for n in lower), (upper, lower)
