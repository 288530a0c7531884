"""The calibration file ``ccoverlap calibrate`` writes and ``--calibration FILE`` reads.

A JSON object whose top level is what :meth:`ccoverlap.cost.params.CostParams.load` accepts
(``params``, ``gpu``, ``fit_error``, ``notes``, ``version``, ``source``), so the planner loads
it as is; everything about how the numbers were obtained lives under ``source``::

    {
      "version": 1,
      "gpu": "H100-SXM",                  # catalog GPU the parameters belong to
      "params": {"gemm_peak_fraction": ..., ...},   # only the fitted CostParams fields
      "fit_error": 0.04,                  # mean median |pred/meas - 1| on held-out data
      "notes": ["..."],                   # what was skipped and why
      "source": {
        "format": "ccoverlap-calibration",
        "tool": "ccoverlap calibrate 0.1.0",
        "created": "2026-01-01T00:00:00Z",
        "device": {"name": ..., "driver": ..., "torch": ..., "cuda": ..., "sms": ..., ...},
        "settings": {"quick": false, "reps": 7, "kernel_backend": "cuda", "split": "..."},
        "fit": {"gemm": {"values": ..., "stderr": ..., "rms_log_error": ...}, ...},
        "heldout": [{"group": "gemm", "n": 19, "median_rel_err": ..., ...}, ...],
        "train": [...],
        "decomposition": [{"name": "g1", "dim": "m", "ways": 8, "measured": ..., "predicted": ...}],
        "measurements": [{"kind": "gemm", "dtype": "bf16", "m": ..., "time_s": ...}, ...]
      }
    }

Measurement kinds and their required fields are :data:`KINDS` (see
:mod:`ccoverlap.calibrate.microbench`). :func:`read` and :func:`validate` raise
:class:`~ccoverlap.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from ccoverlap.config import read_json_object
from ccoverlap.cost.params import CALIBRATION_VERSION, CostParams
from ccoverlap.errors import ConfigError
from ccoverlap.outputs import write_files, write_text

FORMAT = "ccoverlap-calibration"
VERSION = CALIBRATION_VERSION  # the format CostParams.load reads
TOP_LEVEL = ("version", "gpu", "params", "fit_error", "notes", "source")

_POS = "positive number"
_INT = "positive integer"
_VICTIM = "victim"
_POS_LIST = "non-empty list of positive numbers"
# kind -> {field: expected}; expected is _POS, _INT, _VICTIM or a tuple of allowed strings
KINDS: dict[str, dict[str, Any]] = {
    "gemm": {"dtype": ("bf16", "fp16", "fp32"), "m": _INT, "n": _INT, "k": _INT, "time_s": _POS},
    "gemm_split": {"dtype": ("bf16", "fp16", "fp32"), "m": _INT, "n": _INT, "k": _INT, "dim": ("m", "k"),
                   "ways": _INT, "time_s": _POS, "whole_s": _POS},
    "copy": {"engine": ("sm", "ce"), "direction": ("d2d", "h2d", "d2h", "p2p"), "bytes": _POS, "time_s": _POS},
    "channel_copy": {"nc": _INT, "nt": _INT, "chunk_bytes": _INT, "bytes": _POS, "time_s": _POS},
    "sm_contention": {"victim": _VICTIM, "nc": _INT, "nt": _INT, "chunk_bytes": _INT, "copy_bytes": _POS,
                      "victim_alone_s": _POS, "victim_s": _POS, "copy_alone_s": _POS, "copy_s": _POS},
    "ce_contention": {"victim": _VICTIM, "direction": ("d2d", "h2d", "d2h"), "bytes": _POS,
                      "victim_alone_s": _POS, "victim_s": _POS, "copy_alone_s": _POS, "copy_s": _POS},
    "sustained": {"dtype": ("bf16", "fp16", "fp32"), "m": _INT, "n": _INT, "k": _INT, "seconds": _POS,
                  "iters_per_window": _INT, "window_time_s": _POS_LIST},
}
# kind -> {field: expected} of fields a record may have: a chunked copy-engine copy's chunk size
OPTIONAL: dict[str, dict[str, Any]] = {"ce_contention": {"chunk_bytes": _INT}}


def _err(where: str, field: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: field {field!r}: {problem}")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_value(where: str, name: str, v: Any, expected: Any) -> None:
    if isinstance(expected, tuple):
        if v not in expected:
            raise _err(where, name, f"expected one of {list(expected)}, got {v!r}")
    elif expected == _POS:
        if not _is_num(v) or v <= 0:
            raise _err(where, name, f"expected a {_POS}, got {v!r}")
    elif expected == _INT:
        if not _is_num(v) or v <= 0 or int(v) != v:
            raise _err(where, name, f"expected a {_INT}, got {v!r}")
    elif expected == _POS_LIST:
        if not isinstance(v, list) or not v or not all(_is_num(x) and x > 0 for x in v):
            raise _err(where, name, f"expected a {_POS_LIST}, got {v!r}"[:300])
    elif expected == _VICTIM:
        if not isinstance(v, dict) or v.get("op") not in ("gemm", "memory"):
            raise _err(where, name, f"expected a mapping with op 'gemm' or 'memory', got {v!r}")
        spec = KINDS["gemm"] if v["op"] == "gemm" else {"bytes": _POS}
        for sub, exp in spec.items():
            if sub == "time_s":
                continue
            if sub not in v:
                raise _err(where, f"{name}.{sub}", "missing")
            _check_value(where, f"{name}.{sub}", v[sub], exp)


def validate_measurement(rec: Any, where: str, field: str) -> None:
    """Check one measurement record (a mapping with a known ``kind`` and its fields)."""
    if not isinstance(rec, dict):
        raise _err(where, field, f"expected a mapping, got {type(rec).__name__}")
    kind = rec.get("kind")
    if kind not in KINDS:
        raise _err(where, f"{field}.kind", f"expected one of {sorted(KINDS)}, got {kind!r}")
    for name, expected in KINDS[kind].items():
        if name not in rec:
            raise _err(where, f"{field}.{name}", f"missing (required for kind {kind!r})")
        _check_value(where, f"{field}.{name}", rec[name], expected)
    for name, expected in OPTIONAL.get(kind, {}).items():
        if name in rec:
            _check_value(where, f"{field}.{name}", rec[name], expected)


def validate(data: Any, where: str = "calibration") -> dict:
    """Check a calibration mapping; return it. ConfigError names ``where`` and the field."""

    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object at the top level, got {type(data).__name__}")
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise _err(where, unknown[0], f"unknown top-level field; expected some of {list(TOP_LEVEL)}")
    for name in ("version", "gpu", "params"):
        if name not in data:
            raise _err(where, name, "missing")
    v = data["version"]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _err(where, "version", f"expected a positive integer, got {v!r}")
    if v > VERSION:
        raise _err(where, "version", f"file format version {v} is newer than this ccoverlap reads ({VERSION}); upgrade ccoverlap")
    if not isinstance(data["gpu"], str) or not data["gpu"]:
        raise _err(where, "gpu", f"expected a GPU name, got {data['gpu']!r}")
    params = data["params"]
    if not isinstance(params, dict):
        raise _err(where, "params", f"expected a mapping of cost parameters, got {type(params).__name__}")
    names = {f.name for f in fields(CostParams)}
    for name, value in params.items():
        if name not in names:
            raise _err(where, f"params.{name}", "not a cost parameter (see ccoverlap/cost/params.py)")
        if not _is_num(value):
            raise _err(where, f"params.{name}", f"expected a finite number, got {value!r}")
        try:  # the field's own range (fractions <= 1, integer tile sizes, ...)
            CostParams.from_dict({name: value}, where=where)
        except ConfigError as exc:
            raise _err(where, f"params.{name}", str(exc).split(": ", 1)[-1]) from None
    try:
        CostParams.from_dict(params, where=where)
    except ConfigError as exc:
        raise _err(where, "params", str(exc).removeprefix(f"{where}: ")) from None
    fe = data.get("fit_error")
    if fe is not None and (not _is_num(fe) or fe < 0):
        raise _err(where, "fit_error", f"expected a non-negative number or null, got {fe!r}")
    notes = data.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _err(where, "notes", "expected a list of strings")
    src = data.get("source")
    if src is not None:
        if not isinstance(src, dict):
            raise _err(where, "source", f"expected a mapping, got {type(src).__name__}")
        if src.get("format") != FORMAT:
            raise _err(where, "source.format", f"expected {FORMAT!r}, got {src.get('format')!r}")
        dev = src.get("device")
        if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
            raise _err(where, "source.device.name", "missing or not a string")
        meas = src.get("measurements", [])
        if not isinstance(meas, list):
            raise _err(where, "source.measurements", f"expected a list, got {type(meas).__name__}")
        for i, rec in enumerate(meas):
            validate_measurement(rec, where, f"source.measurements[{i}]")
    return data


def read(path: str | os.PathLike) -> dict:
    """Load and validate a calibration file; ConfigError names the file (and the field)."""

    p = Path(path)
    return validate(read_json_object(p, "calibration file"), str(p))


def write(path: str | os.PathLike, data: dict) -> Path:
    """Validate ``data`` and write it as indented JSON (atomically: temp file, then rename);
    creates the parent directory. Returns the path."""
    p = Path(path)
    validate(data, str(p))
    return write_text(p, json.dumps(data, indent=1, sort_keys=False, allow_nan=False) + "\n")


def build(*, gpu: str, params: dict, fit_error: float | None, notes: list[str], device: dict,
          settings: dict, fit: dict, heldout: list, train: list, decomposition: list,
          measurements: list, created: str, tool: str) -> dict:
    """Assemble a calibration mapping (see the module docstring for the layout)."""
    return {
        "version": VERSION,
        "gpu": gpu,
        "params": dict(params),
        "fit_error": fit_error,
        "notes": list(notes),
        "source": {
            "format": FORMAT, "tool": tool, "created": created, "device": device, "settings": settings,
            "fit": fit, "heldout": heldout, "train": train, "decomposition": decomposition,
            "measurements": measurements,
        },
    }


def write_result_files(doc: dict, out_dir: str, stem: str, markdown_text: str) -> list[Path]:
    """Write a measuring script's ``<stem>.json`` (``doc``) and ``<stem>.md`` (``markdown_text``)
    into ``out_dir`` (created); one-line :class:`ConfigError` when it cannot be written."""
    try:
        return write_files(out_dir, {f"{stem}.json": json.dumps(doc, indent=1) + "\n", f"{stem}.md": markdown_text})
    except ConfigError as exc:
        raise ConfigError(f"--out: {exc}") from None
