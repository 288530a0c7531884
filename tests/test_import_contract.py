"""The README Layout's one-way import order, enforced with import-linter (contract: .importlinter)."""

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
