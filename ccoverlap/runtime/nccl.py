"""Stock NCCL settings from an ``--emit`` directory, applied in a PyTorch job (docs/emit.md).

``ccoverlap plan --emit DIR`` (and ``tune --emit``) writes ``nccl.env`` (process-wide
``NCCL_*`` variables) and ``process_groups.json`` (min / max CTAs per process group). Here:

* :func:`apply_nccl_env` puts ``nccl.env`` into ``os.environ``; call it before the first NCCL
  process group is created (NCCL reads these once per process);
* :func:`process_group_options` gives ``ProcessGroupNCCL.Options`` with
  ``config.min_ctas`` / ``max_ctas`` (ncclConfig_t minCTAs / maxCTAs, NCCL >= 2.17) for one
  group, to pass as ``pg_options`` to ``init_process_group`` / ``new_group``;
  :func:`device_mesh_backend_override` the same per mesh dimension for
  ``init_device_mesh(..., backend_override=...)``.

Without NCCL (a CPU build, gloo) the options are None / empty, so one script runs on both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch.distributed as dist

from ccoverlap.deciders.nccl_apply import parse_nccl_env, pinned_options
from ccoverlap.errors import ConfigError

__all__ = ["load_nccl_env", "apply_nccl_env", "load_process_groups", "process_group_options",
           "device_mesh_backend_override", "options_from_config"]


def _dir(out_dir) -> Path:
    d = Path(out_dir)
    if not d.is_dir():
        raise ConfigError(f"{d}: no such --emit directory")
    return d


def load_nccl_env(out_dir) -> dict[str, str]:
    """``{NAME: value}`` of ``DIR/nccl.env`` (checked against the pinned NCCL variable list)."""
    p = _dir(out_dir) / "nccl.env"
    if not p.is_file():
        raise ConfigError(f"{p}: missing (write it with ccoverlap plan --emit)")
    return parse_nccl_env(p.read_text(encoding="utf-8"), str(p))


def apply_nccl_env(out_dir, *, override: bool = False) -> dict[str, str]:
    """Set ``DIR/nccl.env``'s variables in ``os.environ`` (a variable already set is kept
    unless ``override``); returns the ones set. NCCL reads them when it creates its first
    communicator in this process: call this before any NCCL process group exists."""
    done = {}
    for name, value in load_nccl_env(out_dir).items():
        if override or name not in os.environ:
            os.environ[name] = value
            done[name] = value
    return done


def load_process_groups(out_dir) -> dict[str, dict]:
    """``{group: {ranks, ranks_per_node, min_ctas, max_ctas}}`` of ``DIR/process_groups.json``
    (empty when the directory has none: no group's channels change); ConfigError on bad values."""
    p = _dir(out_dir) / "process_groups.json"
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not JSON ({exc})") from None
    cap = pinned_options()["nccl"]["communicator"]["max_ctas"]
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of group name to options")
    for name, cfg in data.items():
        vals = {k: cfg.get(k) if isinstance(cfg, dict) else None for k in ("min_ctas", "max_ctas")}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in vals.values()) \
                or not 1 <= vals["min_ctas"] <= vals["max_ctas"] <= cap:
            raise ConfigError(f"{p}: group {name!r} needs integers 1 <= min_ctas <= max_ctas <= {cap}, got {cfg}")
    return data


def options_from_config(cfg: dict, options_cls, *, is_high_priority_stream: bool = False):
    """``options_cls(is_high_priority_stream)`` with ``config.min_ctas`` / ``max_ctas`` from
    ``cfg`` (one ``process_groups.json`` entry); ``options_cls`` is
    ``torch.distributed.ProcessGroupNCCL.Options`` (or a stand-in with the same attributes)."""
    opts = options_cls(is_high_priority_stream=is_high_priority_stream)
    opts.config.min_ctas = int(cfg["min_ctas"])
    opts.config.max_ctas = int(cfg["max_ctas"])
    return opts


def _nccl_options_cls():
    if not dist.is_available() or not dist.is_nccl_available():
        return None
    return dist.ProcessGroupNCCL.Options


def process_group_options(out_dir, group: str, *, is_high_priority_stream: bool = False, options_cls=None):
    """``ProcessGroupNCCL.Options`` for ``group`` (a name of ``process_groups.json``: ``dp``,
    ``tp``, ``ep``, ...) with its min / max CTAs, for ``pg_options=``; None when the group
    keeps NCCL's defaults or this PyTorch has no NCCL. ``options_cls`` replaces
    ``ProcessGroupNCCL.Options`` (tests)."""
    cfg = load_process_groups(out_dir).get(group)
    cls = options_cls or _nccl_options_cls()
    if cfg is None or cls is None:
        return None
    return options_from_config(cfg, cls, is_high_priority_stream=is_high_priority_stream)


def device_mesh_backend_override(out_dir, mesh_dim_names: Sequence[str], *, options_cls=None) -> dict:
    """``{dim name: ("nccl", options)}`` for the mesh dimensions whose group has options, for
    ``init_device_mesh(..., mesh_dim_names=..., backend_override=...)``; empty without NCCL."""
    out = {}
    for name in mesh_dim_names:
        opts = process_group_options(out_dir, name, options_cls=options_cls)
        if opts is not None:
            out[name] = ("nccl", opts)
    return out
