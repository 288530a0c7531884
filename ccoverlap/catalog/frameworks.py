"""Framework profiles: what the kernels of one training step are in a given framework and era.

The same model computes different kernels under Megatron-LM of 2021 (unfused core attention,
dropout, bias adds), Megatron-Core with TransformerEngine (flash attention, fused norms, no
dropout) or eager torchtitan (flash attention through SDPA, composite RMSNorm, every kernel
dispatched by the host). A profile says which; it is data, one YAML file per profile in
``ccoverlap/data/frameworks/NAME.yaml``, every entry ``{value: ..., source: "..."}``::

    name: megatron-core
    description: Megatron-Core with TransformerEngine ...
    entries:
      attention: {value: flash, source: "Megatron-Core TransformerEngine DotProductAttention ..."}
      ...

A variant of another profile names it as ``base: NAME`` (a built-in profile) and lists only the
entries it changes; every other entry, with its source, is the base's.

Entries (see :class:`FrameworkProfile` for types and defaults):

* ``attention``: ``flash`` (one fused kernel per direction) or ``unfused`` (batched QKᵀ GEMM,
  scale + causal mask + softmax over the s×s scores, dropout, PV GEMM: Megatron-LM's
  ``CoreAttention`` before FlashAttention); ``softmax_fused``: scale+mask+softmax in one kernel
  (Megatron's ``FusedScaleMaskSoftmax``) or three. ``flash_kernel``: the attention backend the
  framework runs: ``native`` (the GPU's own: cuDNN on Hopper, FlashAttention-2 on Ampere),
  ``fa2`` (FlashAttention-2, e.g. PyTorch SDPA's flash backend, on any GPU), ``fa3``
  (FlashAttention-3, Hopper), ``cudnn`` (cuDNN fused attention, SDPA's cuDNN backend),
  ``efficient`` (SDPA's memory-efficient backend) or ``math`` (SDPA's unfused math backend).
* ``selective_recompute`` (what ``recompute="selective"`` means in this framework):
  ``attention`` (Megatron-LM, Korthikanti et al. 2022: the core attention is recomputed) or
  ``op`` (torchtitan's per-op selective AC: matmul and attention outputs are saved except every
  second matmul of a layer, everything element-wise is recomputed).
* ``attention_dropout`` / ``hidden_dropout``: dropout after the softmax / on each sublayer output.
* ``norm_fused``: one norm kernel per direction (apex / TE) or ``norm_kernels`` (fwd, bwd)
  elementwise kernels of a composite eager norm.
* ``bias_act_fused``, ``bias_dropout_add_fused``, ``rope_fused``: element-wise fusions.
* ``cross_entropy_fused``: a fused vocab-parallel cross-entropy, or the several fp32 passes of
  Megatron-LM's ``vocab_parallel_cross_entropy`` / ``F.cross_entropy(logits.float())``.
* ``eager``: kernels are dispatched one by one by eager PyTorch on the host, so a kernel
  shorter than the host's per-kernel dispatch cost (``CostParams.eager_host_overhead_s``)
  takes that long.
* ``fsdp_copies``: FSDP2's copy-out of gathered parameters and copy-in (fp32 cast) of
  gradients for the reduce-scatter (:mod:`ccoverlap.parallel.fsdp`).
* ``cp_merge_unfused``: ring context parallelism merges each step's partial attention output
  and accumulates dQ, dK, dV in fp32 with separate element-wise kernels (PyTorch's
  ``context_parallel``, :mod:`ccoverlap.parallel.cp`) rather than in a fused correction kernel.
* ``norm_bytes`` (optional, with ``norm_fused: false``): HBM bytes per element of [Tl, h] the
  composite norm's kernels move, [forward, backward]; unset: ``2 x kernels`` passes of the
  compute dtype (one read and one write per kernel). Set when the composite upcasts to fp32
  (torchtitan's ``RMSNorm``: ``x.float()``, ``pow``, ``mean``, ``x * rsqrt``, ``type_as``,
  ``* weight`` and their autograd backward).
* ``rope_bytes`` (optional, with ``rope_fused: false``): [bytes per element of Q and K, kernels]
  of the unfused rotary embedding, per direction; unset: torchtitan's eager complex multiply
  (fp32 cast, complex multiply, cast back: 20 bytes, 3 kernels per tensor).
* ``optimizer_bytes_per_param``: HBM bytes the optimizer step moves per local parameter
  (default 30: a fused Adam over fp32 master weights, gradients and moments that also writes
  the bf16 copy, Megatron-LM / Apex); torchtitan's ``torch.optim.AdamW(foreach=True)`` runs
  one pass per ``torch._foreach_*`` op.
* ``grad_clip_bytes_per_param``: HBM bytes the gradient-norm clipping moves per local
  parameter (default 4: read every fp32 gradient for the norm); ``torch.nn.utils.
  clip_grad_norm_`` also multiplies every gradient by the clamped coefficient (+8).
* ``fp8_weight_cast_bytes``: with ``fp8=True``, HBM bytes per weight element each FP8 linear's
  forward moves to cast its bf16 weight (torchao ``Float8Linear`` with tensorwise scaling and
  no float8 all-gather: amax read 2 + cast read 2, write 1 = 5); 0 where the weight is cast
  once per step and cached (TransformerEngine), which is not modelled.
* ``tp_sp_save_gathered_input``: with sequence parallelism, autograd saves a column-parallel
  linear's *all-gathered* input for its weight gradient (PyTorch DTensor TP: the
  ``Shard(1) -> Replicate`` redistribute of ``PrepareModuleInput`` happens before the matmul,
  whose autograd saves the gathered tensor), so the backward has no second all-gather of it
  (Megatron-LM saves the ``[T/t, h]`` shard and all-gathers it again: ``input_ag``); the
  activation estimate charges the gathered ``[T, h]`` tensor. Under torchtitan's per-op
  selective recompute the all-gather is not on the save list, so the recompute re-runs it.
* ``fp8_tp_collectives``: with ``fp8=True`` and sequence parallelism, which TP all-gathers move
  1-byte FP8 elements because the tensor is cast before the all-gather: ``input_ag`` (the
  all-gather of a column-parallel linear's input, forward, its recomputation and any backward
  re-gather) and ``grad_ag`` (the backward all-gather of a row-parallel linear's output
  gradient, whose cast then runs on the local ``[T/t, n]`` shard before it). Reductions
  (reduce-scatter / all-reduce) stay in the compute dtype; so does the LM head. Empty: every TP
  collective in the compute dtype. :mod:`ccoverlap.parallel.tp`.
* ``fp8_cast_kernels_fwd`` / ``fp8_cast_kernels_bwd``: with ``fp8=True``, which linear
  layers' inputs need their own cast(+transpose) kernel (others are fused into the preceding
  norm / activation).
* ``ddp_grad_prescale``: data parallelism with replicated weights (DDP / distributed
  optimizer) multiplies each gradient bucket by 1/dp on the compute stream before its
  all-reduce / reduce-scatter (Megatron-LM ``grad_data *= gradient_scaling_factor``);
  ``ddp_grad_nan_check``: it also reads the bucket once for a NaN check (``grad_data.norm()``,
  Megatron-Core ``check_for_nan_in_grad``). :mod:`ccoverlap.parallel.ddp`.
* ``ddp_buckets``: how DDP / distributed-optimizer gradients are bucketed: ``pytorch``
  (PyTorch DDP: a 1 MiB first bucket, then ``bucket_cap_mb``), ``megatron`` (Megatron-Core:
  ``bucket_cap_mb`` buckets on pipeline rank 0's first model chunk, one bucket elsewhere) or
  ``single`` (one bucket per model chunk). :mod:`ccoverlap.parallel.ddp`.
* ``ddp_reduce_dtype``: ``fp32`` (fp32 main gradients, reduced in fp32) or ``param`` (the
  gradients stay in the parameter dtype and are reduced in it); ``ddp_coalesce_copies``: the
  gradients are copied into a flat buffer before the all-reduce and back after it (Megatron-LM
  2021 without contiguous buffers). :mod:`ccoverlap.parallel.ddp`.
* ``fsdp_reduce_dtype``: ``fp32`` or ``bf16``, the dtype FSDP reduce-scatters (and HSDP
  all-reduces) gradients in (the mixed-precision policy's ``reduce_dtype``).
* ``fsdp_pp_deferred_sync``: with pipeline parallelism, FSDP gradients are accumulated
  unsharded over the micro-batches and reduce-scattered after the stage's last backward, and
  parameters stay gathered between micro-batches (``torch.distributed.pipelining``).
* ``loss_bytes_per_logit`` (optional): bytes per logit (token x local vocabulary entry) the
  loss holds at its peak, the logits included; the other micro-batches in flight keep their
  fp32 (log-)softmax (4 bytes). Unset: the compute-dtype logits and the fp32 softmax for every
  micro-batch in flight (Megatron-LM's vocab-parallel cross entropy, which works in place).
  :mod:`ccoverlap.parallel.memory`.
* ``fsdp_flat_param``: FSDP1's ``FlatParameter`` (``use_orig_params=False``): the unit's
  gradients are concatenated into the flat gradient by autograd on the compute stream, the
  unsharded gradient is pre-divided and the shard post-divided around the reduce-scatter
  and cast to the fp32 shard, and the fp32 shard is cast to bf16 before the all-gather
  (:mod:`ccoverlap.parallel.fsdp`).

A profile is chosen by name (``megatron-lm-2021``, ``megatron-core``, ``torchtitan`` (eager),
``torchtitan-compile`` (torch.compile per block), ``torchtitan-compile-2025`` (blocks and loss
compiled, fused AdamW), ``torchtitan-fused-rmsnorm`` (eager with the
Triton RMSNorm), ``fms-fsdp``, ``deepspeed``, ``megatron-bridge`` (megatron-core with NVIDIA
Megatron-Bridge's benchmark settings)) or by a path to a YAML / JSON / TOML file with the
same schema.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from ccoverlap.config import read_config_file, short, suggest
from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    from ccoverlap.catalog.models import ModelSpec

DEFAULT_FRAMEWORK = "megatron-core"
_DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "frameworks"
ATTENTION_IMPLS = ("flash", "unfused")
FlashKernel = Literal["native", "fa2", "fa3", "cudnn", "efficient", "math"]
FLASH_KERNELS = get_args(FlashKernel)
SELECTIVE_RECOMPUTE = ("attention", "op")
LINEARS = ("qkv", "proj", "fc1", "fc2")
REDUCE_DTYPES = ("fp32", "bf16")
DDP_BUCKET_RULES = ("pytorch", "megatron", "single")
DDP_REDUCE_DTYPES = ("fp32", "param")
FP8_TP_COLLECTIVES = ("input_ag", "grad_ag")


@dataclass(frozen=True, kw_only=True)
class FrameworkProfile:
    """What the kernels of a step are in one framework (module doc). ``sources`` maps every
    entry name to where its value comes from."""

    name: str
    description: str = ""
    attention: str = "flash"
    flash_kernel: FlashKernel = "native"
    selective_recompute: str = "attention"
    softmax_fused: bool = True
    attention_dropout: bool = False
    hidden_dropout: bool = False
    norm_fused: bool = True
    norm_kernels: tuple = (1, 1)
    norm_bytes: tuple | None = None
    rope_bytes: tuple | None = None
    optimizer_bytes_per_param: float = 30.0
    grad_clip_bytes_per_param: float = 4.0
    fp8_weight_cast_bytes: float = 0.0
    bias_act_fused: bool = True
    bias_dropout_add_fused: bool = True
    rope_fused: bool = True
    cross_entropy_fused: bool = False
    eager: bool = False
    fsdp_copies: bool = False
    cp_merge_unfused: bool = False
    fp8_cast_kernels_fwd: tuple = ("proj", "fc2")
    fp8_cast_kernels_bwd: tuple = LINEARS
    fp8_tp_collectives: tuple = ()
    tp_sp_save_gathered_input: bool = False
    ddp_buckets: str = "pytorch"
    ddp_grad_prescale: bool = False
    ddp_grad_nan_check: bool = False
    ddp_reduce_dtype: str = "fp32"
    ddp_coalesce_copies: bool = False
    fsdp_reduce_dtype: str = "fp32"
    fsdp_flat_param: bool = False
    fsdp_pp_deferred_sync: bool = False
    loss_bytes_per_logit: float | None = None
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        where = f"framework profile {self.name!r}"
        if self.attention not in ATTENTION_IMPLS:
            raise ConfigError(f"{where}: attention must be one of {ATTENTION_IMPLS}, got {self.attention!r}")
        if self.flash_kernel not in FLASH_KERNELS:
            raise ConfigError(f"{where}: flash_kernel must be one of {FLASH_KERNELS}, got {self.flash_kernel!r}")
        if self.selective_recompute not in SELECTIVE_RECOMPUTE:
            raise ConfigError(f"{where}: selective_recompute must be one of {SELECTIVE_RECOMPUTE}, "
                              f"got {self.selective_recompute!r}")
        for f in ("softmax_fused", "attention_dropout", "hidden_dropout", "norm_fused", "bias_act_fused",
                  "bias_dropout_add_fused", "rope_fused", "cross_entropy_fused", "eager", "fsdp_copies", "cp_merge_unfused",
                  "ddp_grad_prescale", "ddp_grad_nan_check", "fsdp_flat_param", "fsdp_pp_deferred_sync",
                  "ddp_coalesce_copies", "tp_sp_save_gathered_input"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"{where}: {f} must be true or false, got {getattr(self, f)!r}")
        if self.ddp_buckets not in DDP_BUCKET_RULES:
            raise ConfigError(f"{where}: ddp_buckets must be one of {DDP_BUCKET_RULES}, got {self.ddp_buckets!r}")
        if self.ddp_reduce_dtype not in DDP_REDUCE_DTYPES:
            raise ConfigError(f"{where}: ddp_reduce_dtype must be one of {DDP_REDUCE_DTYPES}, "
                              f"got {self.ddp_reduce_dtype!r}")
        if self.fsdp_reduce_dtype not in REDUCE_DTYPES:
            raise ConfigError(f"{where}: fsdp_reduce_dtype must be one of {REDUCE_DTYPES}, "
                              f"got {self.fsdp_reduce_dtype!r}")
        nk = self.norm_kernels
        if (not isinstance(nk, (tuple, list)) or len(nk) != 2
                or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in nk)):
            raise ConfigError(f"{where}: norm_kernels must be [forward kernels, backward kernels], "
                              f"positive integers, got {nk!r}")
        object.__setattr__(self, "norm_kernels", tuple(nk))
        nb = self.norm_bytes
        if nb is not None:
            if (not isinstance(nb, (tuple, list)) or len(nb) != 2
                    or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 for b in nb)):
                raise ConfigError(f"{where}: norm_bytes must be [forward, backward] bytes per element, "
                                  f"positive numbers, got {nb!r}")
            object.__setattr__(self, "norm_bytes", (float(nb[0]), float(nb[1])))
        rb = self.rope_bytes
        if rb is not None:
            if (not isinstance(rb, (tuple, list)) or len(rb) != 2 or isinstance(rb[0], bool)
                    or not isinstance(rb[0], (int, float)) or not rb[0] > 0
                    or not isinstance(rb[1], int) or isinstance(rb[1], bool) or rb[1] < 1):
                raise ConfigError(f"{where}: rope_bytes must be [bytes per element (positive), kernels "
                                  f"(positive integer)], got {rb!r}")
            object.__setattr__(self, "rope_bytes", (float(rb[0]), int(rb[1])))
        lb = self.loss_bytes_per_logit
        if lb is not None:
            if isinstance(lb, bool) or not isinstance(lb, (int, float)) or not 0 < lb < float("inf"):
                raise ConfigError(f"{where}: loss_bytes_per_logit must be a positive number of bytes, got {lb!r}")
            object.__setattr__(self, "loss_bytes_per_logit", float(lb))
        for f in ("optimizer_bytes_per_param", "grad_clip_bytes_per_param", "fp8_weight_cast_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
                raise ConfigError(f"{where}: {f} must be a non-negative number of bytes, got {v!r}")
            object.__setattr__(self, f, float(v))
        for f in ("fp8_cast_kernels_fwd", "fp8_cast_kernels_bwd"):
            v = getattr(self, f)
            if not isinstance(v, (tuple, list)) or any(x not in LINEARS for x in v):
                raise ConfigError(f"{where}: {f} must be a list of some of {LINEARS}, got {v!r}")
            object.__setattr__(self, f, tuple(v))
        v = self.fp8_tp_collectives
        if not isinstance(v, (tuple, list)) or any(x not in FP8_TP_COLLECTIVES for x in v):
            raise ConfigError(f"{where}: fp8_tp_collectives must be a list of some of {FP8_TP_COLLECTIVES}, got {v!r}")
        object.__setattr__(self, "fp8_tp_collectives", tuple(v))

    @property
    def flash(self) -> bool:
        """Whether attention is one fused flash kernel per direction."""
        return self.attention == "flash"

    @property
    def fsdp_reduce_bytes(self) -> int:
        """Bytes per gradient element FSDP reduces in (``fsdp_reduce_dtype``)."""
        return 4 if self.fsdp_reduce_dtype == "fp32" else 2

    def ddp_grad_bytes(self, param_bytes: int) -> int:
        """Bytes per main-gradient element of replicated weights (``ddp_reduce_dtype``): 4 for
        fp32 main gradients, else the parameters' ``param_bytes``."""
        return 4 if self.ddp_reduce_dtype == "fp32" else param_bytes

    def to_dict(self) -> dict:
        """Entry name -> value (sources left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"}


_ENTRY_FIELDS = tuple(f.name for f in fields(FrameworkProfile) if f.name not in ("name", "description", "sources"))


def profile_from_mapping(data: Any, where: str) -> FrameworkProfile:
    """A profile from its file contents (``name``, ``description``, optional ``base``, ``entries``
    of ``{value, source}``; with ``base: NAME`` the entries not listed, and their sources, are
    those of the built-in profile NAME). Unknown keys, an entry without ``source``, an unknown
    base or a bad value raise one ConfigError naming ``where`` and the entry."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a framework profile must be a mapping")
    unknown = sorted(set(data) - {"name", "description", "base", "entries"})
    if unknown:
        raise ConfigError(f"{where}: unknown top-level key(s) {unknown}; expected name, description, base, entries")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: 'name' must be a non-empty string")
    entries = data.get("entries") or {}
    if not isinstance(entries, dict):
        raise ConfigError(f"{where}: 'entries' must be a mapping of entry name to {{value, source}}")
    values: dict = {}
    sources: dict = {}
    base = data.get("base")
    if base is not None:
        if not isinstance(base, str) or base not in builtin_frameworks() or base == name:
            raise ConfigError(f"{where}: 'base' must name another built-in profile "
                              f"({', '.join(builtin_frameworks())}), got {base!r}")
        parent = _load(base)
        values = {key: getattr(parent, key) for key in parent.sources}
        sources = dict(parent.sources)
    for key, entry in entries.items():
        if key not in _ENTRY_FIELDS:
            raise ConfigError(f"{where}: unknown entry {key!r}; expected some of {sorted(_ENTRY_FIELDS)}")
        if not isinstance(entry, dict) or "value" not in entry:
            raise ConfigError(f"{where}: entry {key!r} must be a mapping with 'value' and 'source'")
        src = entry.get("source")
        if not isinstance(src, str) or not src.strip():
            raise ConfigError(f"{where}: entry {key!r} has no 'source' (every entry says where it comes from)")
        extra = sorted(set(entry) - {"value", "source"})
        if extra:
            raise ConfigError(f"{where}: entry {key!r}: unknown key(s) {extra}; expected value, source")
        values[key] = entry["value"]
        sources[key] = src
    try:
        return FrameworkProfile(name=name, description=str(data.get("description", "")), sources=sources, **values)
    except TypeError as exc:  # pragma: no cover - guarded by the key check above
        raise ConfigError(f"{where}: {exc}") from None


def builtin_frameworks() -> list[str]:
    """Names of the profiles shipped in ``ccoverlap/data/frameworks``."""
    return sorted(p.stem for p in _DATA_DIR.glob("*.yaml"))


@lru_cache(maxsize=64)
def _load(key: str) -> FrameworkProfile:

    try:
        path = _DATA_DIR / f"{key}.yaml"
        found = path.is_file()
        if not found:
            path = Path(key)
            found = key.lower().endswith((".yaml", ".yml", ".json", ".toml")) and path.is_file()
    except (OSError, ValueError):  # a name no file system takes (too long, a NUL byte)
        found = False
    if not found:
        raise ConfigError(f"framework: unknown profile {short(key)}{suggest(key, builtin_frameworks())}; "
                          f"built-in: {', '.join(builtin_frameworks())} (or a path to a profile file)")
    return profile_from_mapping(read_config_file(path), f"framework {key!r}")


def get_framework(framework: str | os.PathLike | FrameworkProfile | None) -> FrameworkProfile:
    """The profile named ``framework`` (a built-in name or a file path); None gives the default
    (``megatron-core``); a FrameworkProfile is returned as is."""
    if isinstance(framework, FrameworkProfile):
        return framework
    if framework is None:
        framework = DEFAULT_FRAMEWORK
    if not isinstance(framework, (str, os.PathLike)):
        raise ConfigError(f"framework: expected a profile name or file, got {type(framework).__name__}")
    return _load(str(framework))


class _ContextParallel(Protocol):
    """What :func:`check_framework` reads of a parallel configuration (a ``ParallelConfig``,
    which lives in a package above this one)."""

    @property
    def cp(self) -> int: ...


def check_framework(fw: FrameworkProfile, model: ModelSpec, parallel: _ContextParallel) -> None:
    """Combinations a profile cannot run: one ConfigError naming the field."""
    if parallel.cp > 1 and not fw.flash:
        raise ConfigError(f"cp={parallel.cp}: context parallelism needs flash attention, but framework "
                          f"{fw.name!r} has attention={fw.attention!r} (Megatron-LM / TransformerEngine "
                          f"context parallelism runs on fused attention only)")
