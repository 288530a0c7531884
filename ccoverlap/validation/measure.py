"""Published measurements -> the iteration time they imply, by the source's own FLOP rule.

A source reports one of (``measured:`` key, unit):

* ``step_time_s``           seconds per optimizer step (iteration);
* ``tokens_per_s``          tokens per second of the whole job;
* ``tokens_per_s_per_gpu``  tokens per second per GPU (torchtitan's TPS/GPU, "WPS");
* ``tflops_per_gpu``        achieved TFLOP/s per GPU, counted by a named ``flop_rule``;
* ``mfu``                   a fraction of ``peak_tflops`` per GPU, counted by a named ``flop_rule``.

With ``B`` sequences of ``s`` tokens per step on ``G`` GPUs, the step time is

* ``t = B s / tokens_per_s``, ``t = B s / (G tokens_per_s_per_gpu)``;
* ``t = F / (G x tflops_per_gpu x 1e12)``, ``t = F / (G x mfu x peak_tflops x 1e12)``, with ``F``
  the FLOPs of one step as that source counts them (``flop_rule``):

  - ``megatron-2021``: Narayanan et al. 2021 (SC'21, arXiv:2104.04473) §5.1 eq. 3,
    ``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` -- a GPT with 4h MLP and multi-head attention,
    counting one extra forward pass for full activation recomputation (factor 4 = 1 fwd +
    2 bwd + 1 recompute); the count behind that paper's Table 1.
  - ``megatron-core``: Megatron-LM ``num_floating_point_operations`` (megatron/training/training.py
    at commit f2e5db402c, the commit of the published H100 table): model FLOPs, no
    recomputation, non-causal attention, GQA and SwiGLU aware,
    ``F = 12 B s l h^2 [(1 + g/a + s/h) q/h + (f/h) (3/2 if SwiGLU) + V/(2 l h)]``
    (``a`` heads, ``g`` KV heads, ``q`` = a x head_dim, ``f`` FFN size).
  - ``palm``: PaLM (Chowdhery et al. 2022, App. B) MFU, ``F = B s (6 N + 12 l a d s)`` with ``N``
    the matmul parameters a token meets (LM head included, input embedding excluded) and the
    full (non-causal) s x s attention; :meth:`ccoverlap.catalog.models.ModelSpec.flops_per_token`.
  - ``6n``: ``F = 6 N_total B s`` (the "6ND" rule, all parameters, no attention term).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.parallel.config import BatchConfig

    #: a batch as a BatchConfig or as a runs file's mapping (``global_batch``, ``seq_len``)
    Batch = BatchConfig | dict[str, Any]

MEASURE_KINDS = {"step_time_s": "seconds per step", "tokens_per_s": "tokens/s (whole job)",
                 "tokens_per_s_per_gpu": "tokens/s per GPU", "tflops_per_gpu": "TFLOP/s per GPU",
                 "mfu": "a fraction of peak_tflops"}
FLOP_RULES = {
    "megatron-2021": "Narayanan et al. 2021 eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh), incl. full recompute",
    "megatron-core": "Megatron-LM num_floating_point_operations (f2e5db402c): model FLOPs, non-causal, GQA/SwiGLU",
    "palm": "PaLM App. B: (6 N + 12 l a d s) per token, non-causal attention",
    "6n": "6 N_total per token",
}


@dataclass(frozen=True)
class Measurement:
    """One published number: ``kind`` (a key of :data:`MEASURE_KINDS`), ``value`` in that
    kind's unit, the ``flop_rule`` of FLOP-based kinds, the MFU denominator ``peak_tflops``,
    and optionally the measured peak memory (GiB) and a note."""

    kind: str
    value: float
    flop_rule: str | None = None
    peak_tflops: float | None = None
    memory_gib: float | None = None
    note: str = ""

    def describe(self) -> str:
        rule = f" ({self.flop_rule} FLOP rule)" if self.flop_rule and self.kind in ("tflops_per_gpu", "mfu") else ""
        peak = f" of {self.peak_tflops:g} TFLOP/s" if self.kind == "mfu" else ""
        return f"{self.kind} = {self.value:g}{peak}{rule}"


def _b(batch: Batch, key: str) -> Any:
    return batch[key] if isinstance(batch, dict) else getattr(batch, key)


def flops_per_step(rule: str, model: ModelSpec, batch: Batch) -> float:
    """FLOPs of one step (``batch``: global_batch sequences of seq_len tokens) under ``rule``."""
    B, s = _b(batch, "global_batch"), _b(batch, "seq_len")
    h, l, V = model.hidden, model.layers, model.vocab
    if rule == "megatron-2021":
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if rule == "megatron-core":
        a, g = model.heads, model.kv_heads
        q_ratio = a * model.hd / h
        glu = 1.5 if model.gated_mlp else 1.0
        return 12.0 * B * s * l * h * h * ((1 + g / a + s / h) * q_ratio + (model.ffn_hidden / h) * glu
                                           + V / (2 * l * h))
    if rule == "palm":
        return float(B * s) * model.flops_per_token(s, causal=False)
    if rule == "6n":
        return 6.0 * model.param_count().total * B * s
    raise ConfigError(f"unknown FLOP rule {rule!r}; expected one of {list(FLOP_RULES)}")


def implied_step_time_s(m: Measurement, *, model: ModelSpec, batch: Batch, gpus: int) -> float:
    """Seconds per step that measurement ``m`` implies (formulas in the module docstring)."""
    B, s = _b(batch, "global_batch"), _b(batch, "seq_len")
    if m.kind == "step_time_s":
        return m.value
    if m.kind == "tokens_per_s":
        return B * s / m.value
    if m.kind == "tokens_per_s_per_gpu":
        return B * s / (gpus * m.value)
    f = flops_per_step(m.flop_rule or "", model, batch)
    if m.kind == "tflops_per_gpu":
        return f / (gpus * m.value * 1e12)
    if m.kind == "mfu":
        return f / (gpus * m.value * (m.peak_tflops or 0.0) * 1e12)
    raise ConfigError(f"unknown measurement kind {m.kind!r}; expected one of {list(MEASURE_KINDS)}")


def model_tflops_per_gpu(model: ModelSpec, batch: Batch, gpus: int, step_time_s: float) -> float:
    """Achieved model TFLOP/s per GPU (PaLM rule) for a step of ``step_time_s`` seconds; used to
    catch numbers given in the wrong unit."""
    return flops_per_step("palm", model, batch) / (gpus * step_time_s * 1e12)
