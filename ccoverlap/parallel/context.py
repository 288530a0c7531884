"""What the layer templates and the step's data-parallel hooks read of the step being built.

:class:`LayerCtx` holds one layer's sizes on one rank (model, parallel degrees, micro-batch
tokens, group specs, knobs, framework profile) and builds its op specs; :class:`StepEmitter` is
what the DDP and FSDP hooks (:mod:`ccoverlap.parallel.ddp`, :mod:`ccoverlap.parallel.fsdp`) use
of the step builder (:mod:`ccoverlap.parallel.step`). Both sit below the templates
(:mod:`ccoverlap.parallel.layer`, ``attention``, ``cp``, ``flash``, ``pointwise``, ``tp``) and the
hooks, so those import them without a cycle.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from ccoverlap.catalog.frameworks import FrameworkProfile, get_framework
from ccoverlap.specs import Collective, CollectiveSpec, GemmSpec, MemorySpec

if TYPE_CHECKING:
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.parallel.config import OverlapKnobs, ParallelConfig
    from ccoverlap.parallel.layout import Layout
    from ccoverlap.sim.graph import OpGraph

GRAD_BYTES = 4  # fp32 gradients / main grads (Megatron-LM main_grad, PyTorch AMP fp32 params)


class LayerCtx:
    """Everything a template needs: model and parallel sizes, micro-batch tokens (``frac`` of
    them, for a half micro-batch under two-batch EP overlap; ``1/cp`` of them on each
    context-parallel rank), group specs, comm knobs and the framework profile ``fw``."""

    def __init__(self, model: ModelSpec, parallel: ParallelConfig, micro_batch: int, seq_len: int, layout: Layout,
                 knobs: OverlapKnobs, frac: float = 1.0,
                 framework: str | os.PathLike[str] | FrameworkProfile | None = None) -> None:
        self.model = model
        self.p = parallel
        self.fw = get_framework(framework)
        self.b = micro_batch
        self.s = seq_len
        self.frac = frac
        self.cp = parallel.cp
        self.tokens = max(1, int(round(micro_batch * seq_len * frac / self.cp)))
        self.tp = parallel.tp
        self.sp = parallel.sequence_parallel and parallel.tp > 1
        self.local_tokens = max(1, self.tokens // self.tp) if self.sp else self.tokens
        self.d = parallel.dtype_bytes
        self.fp8 = bool(getattr(parallel, "fp8", False))
        self.h = model.hidden
        self.hd = model.hd
        self.nq = model.heads // self.tp
        self.nkv = model.kv_heads // self.tp
        self.layout = layout
        self.knobs = knobs
        self.tp_overlap = knobs.tp_overlap
        self.tp_chunks = knobs.tp_chunks
        self.recompute = parallel.recompute
        self._groups = {"tp": layout.tp, "dp": layout.dp, "ep": layout.ep, "edp": layout.edp,
                        "embd": layout.embd, "world": layout.world, "mp": layout.mp, "cp": layout.cp,
                        "dp_rep": layout.dp_rep}

    def coll(self, collective: Collective, nbytes: float, group: str) -> CollectiveSpec:
        """A collective of ``nbytes`` (nccl-tests size) on named group, with the knobs' config."""
        return CollectiveSpec(collective=collective, bytes=float(nbytes), group=self._groups[group],
                              config=self.knobs.config_for(group), transport=self.knobs.comm_transport)

    def mem(self, nbytes: float) -> MemorySpec:
        """A memory-bound op moving ``nbytes`` (read + written), one kernel."""
        return MemorySpec(bytes=float(nbytes), host_kernels=1 if self.fw.eager else 0)

    def gemm(self, m: int, n: int, k: int, name: str = "") -> GemmSpec:
        """A linear layer's GEMM: FP8 operands with ``fp8`` (every linear but the LM head, as
        TransformerEngine / torchao float8 keep the output layer in bf16), else the compute dtype."""
        fp8 = self.fp8 and linear_kind(name) != "lm_head"
        return GemmSpec(m=m, n=n, k=k, dtype_bytes=1 if fp8 else self.d, host_kernels=1 if self.fw.eager else 0)

    def fp8_weight_cast_bytes(self, name: str) -> float:
        """Bytes per weight element the forward of FP8 linear ``name`` spends casting its weight
        (the profile's ``fp8_weight_cast_bytes``; 0 without FP8 and for the bf16 LM head). With
        ``fp8_param_allgather`` the weight arrives in FP8 (torchao casts the local shard before
        the all-gather, 1/shard of the work, not charged), so nothing is cast per use."""
        if not self.fp8 or linear_kind(name) == "lm_head" or getattr(self.p, "fp8_param_allgather", False):
            return 0.0
        return self.fw.fp8_weight_cast_bytes

    def fp8_tp_collective(self, name: str, which: str) -> bool:
        """Whether the TP all-gather ``which`` (``input_ag``: a column-parallel linear's input;
        ``grad_ag``: a row-parallel linear's output gradient) of linear ``name`` moves 1-byte
        FP8 elements: with ``fp8``, sequence parallelism and ``which`` in the profile's
        ``fp8_tp_collectives`` (torchao's Float8 TP styles cast before the all-gather); never
        for the bf16 LM head."""
        return (self.fp8 and self.sp and linear_kind(name) != "lm_head"
                and which in self.fw.fp8_tp_collectives)

    def tp_gather_bytes(self, name: str, which: str) -> int:
        """Bytes per element of TP all-gather ``which`` of linear ``name``: 1 when it moves FP8
        (:meth:`fp8_tp_collective`), else the compute dtype's ``d``."""
        return 1 if self.fp8_tp_collective(name, which) else self.d

    def fp8_cast(self, name: str, direction: str) -> bool:
        """Whether the linear ``name`` needs its own FP8 cast kernel in ``direction`` (fwd: its
        input; bwd: its output gradient), per the framework profile."""
        if not self.fp8:
            return False
        kind = linear_kind(name)
        casts = self.fw.fp8_cast_kernels_fwd if direction == "fwd" else self.fw.fp8_cast_kernels_bwd
        return kind in casts

    @property
    def qkv_n(self) -> int:
        """Local width of the fused QKV projection: (heads + 2·kv_heads)·head_dim / tp."""
        return (self.nq + 2 * self.nkv) * self.hd

    def ffn_local(self, ffn: int) -> int:
        """Local share of an MLP inner size under TP."""
        return ffn // self.tp

    def up_mult(self) -> int:
        """Matrices on the up side of the MLP: 2 (gate, up) for SwiGLU, 1 for GELU."""
        return self.model.mlp_mats - 1


def linear_kind(name: str) -> str:
    """``qkv``, ``proj``, ``fc1``, ``fc2`` or ``lm_head`` for a linear op's name (``mlp_fc1``,
    ``shared_fc2``, ... map to their kind)."""
    for kind in ("qkv", "proj", "fc1", "fc2", "lm_head"):
        if name == kind or name.endswith("_" + kind):
            return kind
    return name


class StepEmitter(Protocol):
    """What the data-parallel hooks use of the step builder: the graph being built, the layer
    context, the workload's parts, the real stream of a logical one and a unit's layer label."""

    g: OpGraph
    ctx: LayerCtx
    model: ModelSpec
    parallel: ParallelConfig
    knobs: OverlapKnobs
    framework: FrameworkProfile

    def stream(self, name: str) -> str:
        """The real stream for a logical one."""
        ...

    def layer_of(self, unit: str) -> int:
        """Layer label of a unit's ops."""
        ...
