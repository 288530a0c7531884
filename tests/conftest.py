"""Fixtures shared by the top-level tests."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest


def _writable(d: Path) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=d)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


@pytest.fixture
def unwritable_dir(tmp_path):
    """An existing directory no file can be made in: a read-only one, or (as root, who may
    write anywhere permissions allow) /proc; skips where neither is at hand."""
    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o555)
    try:
        if not _writable(d):
            yield d
            return
        if Path("/proc").is_dir() and not _writable(Path("/proc")):
            yield Path("/proc")
            return
        pytest.skip("no unwritable directory on this machine")
    finally:
        d.chmod(0o755)
