"""Import a script of ``benchmarks/`` as a module, for the tests of this folder (the scripts are
not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def load_script(name: str):
    """``benchmarks/<name>.py`` imported as module ``name`` and registered in ``sys.modules``
    (so its dataclasses and pickled functions resolve)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
