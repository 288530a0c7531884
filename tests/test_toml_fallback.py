"""TOML configs read on every supported Python: ``tomllib`` from 3.11, the ``tomli`` package
(a dependency on 3.10) before it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ccoverlap.config import read_config_file
from ccoverlap.errors import ConfigError
from ccoverlap.predict.workload import Workload

TOML = 'model = "llama-3-8b"\nnodes = 1\n[parallel]\ntp = 2\ndp = 4\n[batch]\nglobal_batch = 8\n'
ROOT = Path(__file__).resolve().parents[1]


def test_toml_is_read_without_tomllib(tmp_path, monkeypatch):
    pytest.importorskip("tomli")
    p = tmp_path / "w.toml"
    p.write_text(TOML)
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10: `import tomllib` fails
    assert read_config_file(p)["parallel"] == {"tp": 2, "dp": 4}
    assert Workload.from_file(p).parallel.tp == 2


def test_without_tomllib_or_tomli_the_error_says_what_to_install(tmp_path, monkeypatch):
    p = tmp_path / "w.toml"
    p.write_text(TOML)
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(ConfigError, match="needs the 'tomli' package"):
        read_config_file(p)


def _python310() -> str | None:
    """A Python 3.10 that has this package's dependencies, if this machine has one."""
    exe = shutil.which("python3.10")
    if exe is None:
        return None
    probe = subprocess.run([exe, "-c", "import msgspec, numpy, yaml, tomli"], capture_output=True)
    return exe if probe.returncode == 0 else None


@pytest.mark.skipif(_python310() is None, reason="no Python 3.10 with the dependencies installed")
def test_toml_workload_on_python_310(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text(TOML)
    code = "import sys; from ccoverlap.predict.workload import Workload; print(Workload.from_file(sys.argv[1]))"
    r = subprocess.run([_python310(), "-c", code, str(p)], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "TP2 x DP4" in r.stdout
