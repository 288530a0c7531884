"""Which layers each pipeline stage holds, and each unit's weights as one rank holds them.

A *unit* is what FSDP wraps and DDP buckets walk through: ``"emb"`` (input embedding, learned
positions), ``"L<i>"`` (transformer layer i), ``"head"`` (final norm and LM head).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.parallel.config import ParallelConfig


@dataclass(frozen=True, slots=True)
class LocalTensor:
    """A weight on one rank: ``numel`` local elements, gradients reduced over ``group``
    (``"dp"``, or ``"edp"`` for routed-expert weights)."""

    unit: str
    name: str
    numel: int
    group: str


def stage_units(model: ModelSpec, stages: int, stage: int) -> list[str]:
    """Units of model stage ``stage`` of ``stages`` (equal layer counts), in forward order."""
    per = model.layers // stages
    units = ["emb"] if stage == 0 else []
    units += [f"L{i}" for i in range(stage * per, (stage + 1) * per)]
    if stage == stages - 1:
        units.append("head")
    return units


def layer_index(unit: str) -> int:
    """Layer number of a unit (-1 for embedding / head)."""
    return int(unit[1:]) if unit.startswith("L") else -1


def unit_tensors(model: ModelSpec, parallel: ParallelConfig, unit: str) -> list[LocalTensor]:
    """The unit's weights on one rank, registration order: TP-split tensors divided by tp,
    routed-expert tensors by tp·ep. A tied LM head on a separate pipeline stage is a copy of
    the embedding (Megatron-LM keeps one on the last stage and all-reduces their gradients)."""
    tp, ep = parallel.tp, parallel.ep
    out: list[LocalTensor] = []
    if unit in ("emb", "head"):
        for t in model.embedding_tensors():
            is_head = t.name in ("final_norm", "lm_head")
            if is_head != (unit == "head"):
                continue
            out.append(LocalTensor(unit, t.name, t.numel // tp if t.tp_split else t.numel, "dp"))
        if unit == "head" and model.tied_embeddings and parallel.pp > 1:
            out.append(LocalTensor(unit, "lm_head", model.vocab * model.hidden // tp, "dp"))
        return out
    for t in model.layer_tensors(layer_index(unit)):
        if t.expert:
            out.append(LocalTensor(unit, t.name, t.numel // (tp * ep), "edp"))
        else:
            out.append(LocalTensor(unit, t.name, t.numel // tp if t.tp_split else t.numel, "dp"))
    return out


_GRAD_SUFFIX = re.compile(r"_(dgrad|wgrad)\d*$")
#: the tensor names :meth:`ModelSpec.layer_tensors` and ``embedding_tensors`` give
TENSOR_NAMES = ("qkv", "proj", "fc1", "fc2", "router", "shared_fc1", "shared_fc2", "experts_fc1",
                "experts_fc2", "embedding", "pos_embedding", "lm_head")


def tensor_of(op_name: str, names: Collection[str] = TENSOR_NAMES) -> str | None:
    """The weight tensor (one of ``names``) an op of the step builders reads, from its name:
    ``mlp_fc1`` / ``mlp_fc1_dgrad`` / ``recompute_mlp_fc1`` -> ``fc1``, ``qkv0`` (a TP chunk)
    -> ``qkv``, ``embedding`` -> ``embedding``; None for an op that reads no weight (norms,
    attention, element-wise kernels, a gradient of the embedding lookup)."""
    base = _GRAD_SUFFIX.sub("", op_name.removeprefix("recompute_"))
    while base:
        for cand in (base, base.removeprefix("mlp_")):
            if cand in names:
                return cand
        if not base[-1].isdigit():
            return None
        base = base[:-1]  # a chunk index
    return None
