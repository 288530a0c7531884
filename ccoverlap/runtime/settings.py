"""Framework settings from an ``--emit`` directory, applied in a PyTorch job (docs/emit.md).

``DIR/framework.json`` holds what the strategy changes as PyTorch takes it: FSDP2
``fully_shard`` keywords, the FSDP2 prefetch depth, DDP keywords, and the TP plan for
ccoverlap's overlapped ParallelStyles (module names as in torchtitan's Llama). Here:

* :func:`fully_shard_kwargs` / :func:`ddp_kwargs`: keyword arguments for ``fully_shard`` /
  ``DistributedDataParallel``;
* :func:`apply_fsdp_prefetch`: the prefetch depth through ``FSDPModule``'s
  ``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``;
* :func:`tp_plan`: ``{module: ParallelStyle}`` for ``parallelize_module`` from the emitted
  plan (:class:`~ccoverlap.runtime.tp.ColwiseParallel`, ``RowwiseParallel``,
  ``PrepareModuleInput`` with their ``schedule`` / ``comm_engine``, and torch's
  ``SequenceParallel``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor.parallel.style import ParallelStyle

from ccoverlap.errors import ConfigError
from ccoverlap.nccl.apply import pinned_options
from ccoverlap.runtime import tp as _tp

__all__ = ["load_framework", "fully_shard_kwargs", "ddp_kwargs", "apply_fsdp_prefetch", "tp_plan"]

#: An ``--emit`` directory, or its ``framework.json`` already read (a JSON object).
Source = str | os.PathLike[str] | dict[str, Any]

_STYLES: dict[str, type[ParallelStyle]] = {"ColwiseParallel": _tp.ColwiseParallel, "RowwiseParallel": _tp.RowwiseParallel,
           "PrepareModuleInput": _tp.PrepareModuleInput, "SequenceParallel": _tp.SequenceParallel}
_PLACEMENT = re.compile(r"^(Shard)\((-?\d+)\)$|^(Replicate)\(\)$")


def load_framework(source: Source) -> dict[str, Any]:  # JSON
    """``framework.json`` of an ``--emit`` directory (or the mapping itself)."""
    if isinstance(source, dict):
        return source
    p = Path(source) / "framework.json"
    if not p.is_file():
        raise ConfigError(f"{p}: missing (write it with ccoverlap plan --emit)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping")
    return data


def _checked(kv: Mapping[str, Any], allowed: Collection[str], where: str) -> dict[str, Any]:
    bad = sorted(set(kv) - set(allowed))
    if bad:
        raise ConfigError(f"{where}: {bad[0]!r} is not one of {sorted(allowed)}")
    return dict(kv)


def fully_shard_kwargs(source: Source) -> dict[str, Any]:
    """Keyword arguments for ``fully_shard`` (e.g. ``{"reshard_after_forward": False}``);
    empty when the strategy changes none."""
    kv = load_framework(source).get("pytorch", {}).get("fully_shard", {})
    return _checked(kv, pinned_options()["frameworks"]["fsdp2"]["fully_shard"], "framework.json pytorch.fully_shard")


def ddp_kwargs(source: Source) -> dict[str, Any]:
    """Keyword arguments for ``DistributedDataParallel`` (e.g. ``{"bucket_cap_mb": 50.0}``)."""
    kv = load_framework(source).get("pytorch", {}).get("ddp", {})
    return _checked(kv, pinned_options()["frameworks"]["ddp"]["keywords"], "framework.json pytorch.ddp")


def apply_fsdp_prefetch(source: Source, blocks: Sequence[Any]) -> int:  # FSDPModules
    """Give each FSDP2 module of ``blocks`` (in forward order, ``fully_shard`` applied) the
    next ``depth`` blocks to prefetch in forward and the previous ``depth`` in backward
    (``FSDPModule.set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``).
    Returns the depth applied; 0 (nothing called) when the settings keep FSDP2's own one-ahead
    prefetch."""
    pf = load_framework(source).get("pytorch", {}).get("fsdp2_prefetch", {})
    depth = pf.get("forward", 0)
    if not depth:
        return 0
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1 or pf.get("backward", depth) != depth:
        raise ConfigError(f"framework.json pytorch.fsdp2_prefetch: expected one positive depth, got {pf}")
    for i, block in enumerate(blocks):
        if i + 1 < len(blocks):
            block.set_modules_to_forward_prefetch(list(blocks[i + 1:i + 1 + depth]))
        if i > 0:
            block.set_modules_to_backward_prefetch(list(reversed(blocks[max(0, i - depth):i])))
    return depth


def _placement(text: object, where: str) -> Placement | tuple[Placement, ...]:
    """One placement, or a tuple of them from a list (one level: a list in the list is refused)."""
    if isinstance(text, list):
        return tuple(_one_placement(t, where) for t in text)
    return _one_placement(text, where)


def _one_placement(text: object, where: str) -> Placement:
    m = _PLACEMENT.match(str(text))
    if not m:
        raise ConfigError(f"{where}: placement must be 'Shard(d)' or 'Replicate()', got {text!r}")
    return Shard(int(m.group(2))) if m.group(1) else Replicate()


def tp_plan(source: Source) -> dict[str, ParallelStyle]:
    """``{module name: ParallelStyle}`` from ``framework.json``'s ``tp_plan`` (ccoverlap's
    overlapped styles), for ``parallelize_module(model, mesh["tp"], plan)``; empty when the
    workload has no tensor parallelism."""
    plan = load_framework(source).get("tp_plan") or {}
    allowed = set(pinned_options()["frameworks"]["ccoverlap"]["style_arguments"])
    out: dict[str, ParallelStyle] = {}
    for module, spec in plan.items():
        where = f"framework.json tp_plan[{module!r}]"
        if not isinstance(spec, dict) or spec.get("style") not in _STYLES:
            raise ConfigError(f"{where}: style must be one of {sorted(_STYLES)}")
        kw = _checked({k: v for k, v in spec.items() if k != "style"}, allowed, where)
        for k in ("input_layouts", "output_layouts", "desired_input_layouts"):
            if k in kw:
                kw[k] = _placement(kw[k], where)
        out[module] = _STYLES[spec["style"]](**kw)
    return out
