"""Type aliases shared across the package (no imports of its own: importable from every layer)."""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[int, int, str], None]
"""A progress callback: ``progress(done, total, what)`` — ``done`` of ``total`` items finished,
``what`` naming the one just finished or started (a candidate, a run, or ``"ops"`` for the
simulator's ops)."""
