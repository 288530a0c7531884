"""Transformer model shapes, the catalog of models the papers evaluate, parameter and FLOP counts.

A :class:`ModelSpec` holds only what the step builders, the memory estimate and the MFU
definition need: dimensions, the MLP flavour (gated SwiGLU: three matrices, or plain GELU:
two), mixture-of-experts routing, norm / bias / embedding details that change parameter
counts. Every catalog entry names its source (HF ``config.json`` or the paper's table).

Parameter counts are exact for the catalog (they reproduce the published totals, e.g.
Llama-3-8B = 8,030,261,248 and Mixtral-8x7B = 46,702,792,704).

Model FLOPs per token follow the PaLM MFU definition (Chowdhery et al., 2022, "PaLM",
Appendix B): ``6 N + 12 L H Q T`` where ``N`` is the number of (active) matmul parameters,
``L`` layers, ``H`` heads, ``Q`` head dim and ``T`` the sequence length; this equals the
Megatron-LM count (Narayanan et al., SC'21, §5.1 eq. 3: ``72 B s l h² (1 + s/6h + V/12hl)``
per batch) for a GPT with 4h MLP, which also counts the LM-head matmul.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, NamedTuple

from ccoverlap.config import (
    MAX_MODEL_SIZE,
    ModelSize,
    ModelSize0,
    check_fields,
    check_keys,
    field_names,
    short,
    suggest,
    typed,
)
from ccoverlap.errors import ConfigError

Norm = Literal["rmsnorm", "layernorm"]
Position = Literal["rope", "learned", "alibi"]


class ParamCount(NamedTuple):
    """Total and active (per token: routed experts counted ``top_k`` times out of ``experts``)."""

    total: int
    active: int


@dataclass(frozen=True, kw_only=True)
class ParamTensor:
    """One weight tensor of a layer: ``numel`` elements; ``tp_split`` if tensor parallelism
    shards it; ``expert`` if it belongs to the routed experts (sharded by expert parallelism)."""

    name: str
    numel: int
    tp_split: bool = True
    expert: bool = False


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer.

    ``ffn_hidden`` is the dense MLP's inner size (for MoE models: of the ``first_k_dense``
    dense layers); ``expert_ffn_hidden`` the inner size of one routed (and one shared)
    expert. ``gated_mlp``: SwiGLU (gate, up, down: 3 matrices) vs GELU MLP (2 matrices).
    ``parallel_attn_mlp``: attention and MLP read the same normed input and their outputs
    are summed (GPT-J / Phi-2). ``seq_len`` is the pre-training sequence length.
    """

    name: str
    hidden: ModelSize
    ffn_hidden: ModelSize
    heads: ModelSize
    kv_heads: ModelSize
    layers: ModelSize
    vocab: ModelSize
    seq_len: ModelSize
    head_dim: ModelSize0 = 0  # 0: hidden // heads
    experts: ModelSize0 = 0
    top_k: ModelSize0 = 0
    expert_ffn_hidden: ModelSize0 = 0  # 0: ffn_hidden
    shared_experts: ModelSize0 = 0
    first_k_dense: ModelSize0 = 0
    gated_mlp: bool = True
    tied_embeddings: bool = False
    parallel_attn_mlp: bool = False
    norm: Norm = "rmsnorm"
    bias: bool = False  # biases on linear layers (and layernorm)
    position: Position = "rope"
    qk_norm: bool = False
    dropout: bool = False  # dropout masks stored for backward (memory estimate only)
    source: str = ""

    def __post_init__(self) -> None:
        check_fields(self, f"model {short(self.name)}")  # types, sizes and choices: the annotations
        if self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name!r}: kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.head_dim == 0 and self.hidden % self.heads:
            raise ConfigError(f"model {self.name!r}: heads ({self.heads}) must divide hidden ({self.hidden}) "
                              f"unless head_dim is given")
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise ConfigError(f"model {self.name!r}: top_k must be between 1 and experts ({self.experts}), "
                                  f"got {self.top_k}")
            if self.first_k_dense >= self.layers:
                raise ConfigError(f"model {self.name!r}: first_k_dense ({self.first_k_dense}) must be less than "
                                  f"layers ({self.layers})")
        elif self.top_k or self.shared_experts or self.first_k_dense:
            raise ConfigError(f"model {self.name!r}: top_k, shared_experts and first_k_dense need experts > 0")

    # ------------------------------------------------------------------ shapes
    @property
    def hd(self) -> int:
        """Head dimension."""
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection (heads × head_dim)."""
        return self.heads * self.hd

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection (kv_heads × head_dim)."""
        return self.kv_heads * self.hd

    @property
    def is_moe(self) -> bool:
        """Whether the model has routed experts."""
        return self.experts > 0

    @property
    def efh(self) -> int:
        """Inner size of one expert MLP."""
        return self.expert_ffn_hidden or self.ffn_hidden

    @property
    def mlp_mats(self) -> int:
        """Matrices per MLP: 3 for gated (SwiGLU), 2 for plain GELU."""
        return 3 if self.gated_mlp else 2

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has a routed-expert MLP."""
        return self.is_moe and layer >= self.first_k_dense

    def _norm_numel(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" and self.bias else 1)

    def layer_tensors(self, layer: int) -> list[ParamTensor]:
        """The weight tensors of layer ``layer`` in registration (forward) order; numels unsharded."""
        h, b = self.hidden, int(self.bias)
        qkv_out = self.q_dim + 2 * self.kv_dim
        t = [ParamTensor(name="attn_norm", numel=self._norm_numel(), tp_split=False),
             ParamTensor(name="qkv", numel=h * qkv_out + b * qkv_out)]
        if self.qk_norm:
            t.append(ParamTensor(name="qk_norm", numel=self.q_dim + self.kv_dim, tp_split=False))
        t.append(ParamTensor(name="proj", numel=self.q_dim * h + b * h))
        if not self.parallel_attn_mlp:
            t.append(ParamTensor(name="mlp_norm", numel=self._norm_numel(), tp_split=False))
        up = self.mlp_mats - 1  # matrices on the up side (gate+up, or up)
        if self.is_moe_layer(layer):
            f, e = self.efh, self.experts
            t.append(ParamTensor(name="router", numel=h * e, tp_split=False))
            if self.shared_experts:
                fs = f * self.shared_experts
                t.append(ParamTensor(name="shared_fc1", numel=up * h * fs))
                t.append(ParamTensor(name="shared_fc2", numel=fs * h))
            t.append(ParamTensor(name="experts_fc1", numel=e * up * h * f, expert=True))
            t.append(ParamTensor(name="experts_fc2", numel=e * f * h, expert=True))
        else:
            f = self.ffn_hidden
            t.append(ParamTensor(name="fc1", numel=up * h * f + b * up * f))
            t.append(ParamTensor(name="fc2", numel=f * h + b * h))
        return t

    def embedding_tensors(self) -> list[ParamTensor]:
        """Input embedding (and learned positions), final norm and LM head (absent if tied)."""
        t = [ParamTensor(name="embedding", numel=self.vocab * self.hidden)]
        if self.position == "learned":
            t.append(ParamTensor(name="pos_embedding", numel=self.seq_len * self.hidden, tp_split=False))
        t.append(ParamTensor(name="final_norm", numel=self._norm_numel(), tp_split=False))
        if not self.tied_embeddings:
            t.append(ParamTensor(name="lm_head", numel=self.vocab * self.hidden + int(self.bias) * self.vocab))
        return t

    # ------------------------------------------------------------------ counts
    def layer_param_count(self, layer: int) -> ParamCount:
        """(total, active) parameters of one layer."""
        total = active = 0
        for p in self.layer_tensors(layer):
            total += p.numel
            active += p.numel * self.top_k // self.experts if p.expert else p.numel
        return ParamCount(total, active)

    def param_count(self) -> ParamCount:
        """Total and active parameters of the whole model (embeddings included)."""
        emb = sum(p.numel for p in self.embedding_tensors())
        total = active = emb
        for i in range(self.layers):
            pc = self.layer_param_count(i)
            total += pc.total
            active += pc.active
        return ParamCount(total, active)

    def matmul_params_per_token(self) -> int:
        """Active parameters a token multiplies with: every active layer weight (norms and
        biases included, a negligible excess) plus the LM-head matrix (vocab × hidden,
        counted even when tied, as Megatron does); the input embedding lookup is excluded."""
        n = sum(self.layer_param_count(i).active for i in range(self.layers))
        return n + self.vocab * self.hidden

    def flops_per_token(self, seq_len: int | None = None, *, causal: bool = False) -> float:
        """Model FLOPs per trained token (forward + backward, no recomputation), for MFU.

        PaLM (Chowdhery et al., 2022, App. B): ``6 N + 12 L H Q T`` with ``N`` =
        :meth:`matmul_params_per_token`, ``T`` = ``seq_len`` (default: the model's). The
        attention term counts the full ``T × T`` score matrix as PaLM and Megatron-LM
        (Narayanan et al., 2021, eq. 3) do; ``causal=True`` halves it (FlashAttention's
        accounting), which is what the simulated kernels execute.
        """
        t = self.seq_len if seq_len is None else seq_len
        if t <= 0:
            raise ConfigError(f"seq_len must be positive, got {t}")
        attn = 12.0 * self.layers * self.heads * self.hd * t
        if causal:
            attn /= 2.0
        return 6.0 * self.matmul_params_per_token() + attn

    def to_dict(self) -> dict:
        """Field name -> value (what :func:`model_from_dict` reads back)."""
        return asdict(self)


# ----------------------------------------------------------------------------- catalog
# Sources (all numbers copied from the cited config/table):
#  [L3]    meta-llama/Meta-Llama-3-8B and -70B config.json (hidden_size, intermediate_size,
#          num_attention_heads, num_key_value_heads, num_hidden_layers, vocab_size 128256);
#          seq_len 8192 (Llama 3 paper, "The Llama 3 Herd of Models", §3.4: 8K pre-training).
#  [L3.1]  meta-llama/Llama-3.1-405B config.json; Llama 3 paper Table 3 (126 layers, 16384
#          hidden, 53248 FFN, 128 heads, 8 KV heads); pre-trained at 8K before long-context.
#  [L2]    meta-llama/Llama-2-70b-hf config.json (vocab 32000, max_position_embeddings 4096).
#  [L2S]   meta-llama/Llama-2-7b-hf and Llama-2-13b-hf config.json (7B: hidden 4096, intermediate
#          11008, 32 layers, 32 heads = KV heads; 13B: hidden 5120, intermediate 13824, 40 layers,
#          40 heads = KV heads; vocab 32000, 4096 positions, untied); Touvron et al. 2023 Table 1.
#  [GPT3]  Brown et al., 2020, "Language Models are Few-Shot Learners", Table 2.1 (175B:
#          96 layers, d_model 12288, 96 heads, context 2048); GPT-2 vocabulary 50257, learned
#          positions, tied embeddings, LayerNorm and biases (GPT-2 architecture).
#  [PHI2]  microsoft/phi-2 config.json (hidden 2560, intermediate 10240, 32 layers, 32 heads,
#          vocab 51200, max_position_embeddings 2048, partial rotary 0.4, gelu_new); PhiDecoderLayer
#          runs attention and MLP in parallel on one LayerNorm output; lm_head has a bias.
#  [MPT]   mosaicml/mpt-7b config.json (d_model 4096, n_heads 32, n_layers 32, expansion_ratio 4,
#          vocab 50432, max_seq_len 2048, alibi, no_bias, tied wte).
#  [MIX]   mistralai/Mixtral-8x7B-v0.1 config.json (hidden 4096, intermediate 14336, 32 layers,
#          32 heads, 8 KV heads, 8 local experts, 2 per token, vocab 32000); 32k context
#          (Jiang et al., 2024, "Mixtral of Experts", §2).
#  [DSMOE] deepseek-ai/deepseek-moe-16b-base config.json (hidden 2048, intermediate 10944,
#          moe_intermediate_size 1408, 28 layers, 16 heads, 64 routed + 2 shared experts,
#          6 per token, first_k_dense_replace 1, vocab 102400, max_position_embeddings 4096).
#  [OLMOE] allenai/OLMoE-1B-7B-0924 config.json (hidden 2048, intermediate 1024, 16 layers,
#          16 heads, 64 experts, 8 per token, vocab 50304, 4096 positions, qk-norm, untied).
_CATALOG = (
    ModelSpec(name="Llama-3-8B", hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, layers=32,
              vocab=128256, seq_len=8192, source="[L3] meta-llama/Meta-Llama-3-8B config.json"),
    ModelSpec(name="Llama-3-70B", hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, layers=80,
              vocab=128256, seq_len=8192, source="[L3] meta-llama/Meta-Llama-3-70B config.json"),
    ModelSpec(name="Llama-3-405B", hidden=16384, ffn_hidden=53248, heads=128, kv_heads=8, layers=126,
              vocab=128256, seq_len=8192, source="[L3.1] meta-llama/Llama-3.1-405B config.json; Llama 3 paper Table 3"),
    ModelSpec(name="Llama-2-7B", hidden=4096, ffn_hidden=11008, heads=32, kv_heads=32, layers=32,
              vocab=32000, seq_len=4096, source="[L2S] meta-llama/Llama-2-7b-hf config.json"),
    ModelSpec(name="Llama-2-13B", hidden=5120, ffn_hidden=13824, heads=40, kv_heads=40, layers=40,
              vocab=32000, seq_len=4096, source="[L2S] meta-llama/Llama-2-13b-hf config.json"),
    ModelSpec(name="Llama-2-70B", hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, layers=80,
              vocab=32000, seq_len=4096, source="[L2] meta-llama/Llama-2-70b-hf config.json"),
    ModelSpec(name="GPT-3-175B", hidden=12288, ffn_hidden=49152, heads=96, kv_heads=96, layers=96,
              vocab=50257, seq_len=2048, gated_mlp=False, tied_embeddings=True, norm="layernorm",
              bias=True, position="learned", dropout=True, source="[GPT3] Brown et al. 2020 Table 2.1"),
    ModelSpec(name="Phi-2", hidden=2560, ffn_hidden=10240, heads=32, kv_heads=32, layers=32,
              vocab=51200, seq_len=2048, gated_mlp=False, parallel_attn_mlp=True, norm="layernorm",
              bias=True, source="[PHI2] microsoft/phi-2 config.json"),
    ModelSpec(name="MPT-7B", hidden=4096, ffn_hidden=16384, heads=32, kv_heads=32, layers=32,
              vocab=50432, seq_len=2048, gated_mlp=False, tied_embeddings=True, norm="layernorm",
              position="alibi", source="[MPT] mosaicml/mpt-7b config.json"),
    ModelSpec(name="Mixtral-8x7B", hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, layers=32,
              vocab=32000, seq_len=32768, experts=8, top_k=2,
              source="[MIX] mistralai/Mixtral-8x7B-v0.1 config.json"),
    ModelSpec(name="DeepSeek-MoE-16B", hidden=2048, ffn_hidden=10944, heads=16, kv_heads=16, layers=28,
              vocab=102400, seq_len=4096, experts=64, top_k=6, expert_ffn_hidden=1408, shared_experts=2,
              first_k_dense=1, source="[DSMOE] deepseek-ai/deepseek-moe-16b-base config.json"),
    ModelSpec(name="OLMoE-1B-7B", hidden=2048, ffn_hidden=1024, heads=16, kv_heads=16, layers=16,
              vocab=50304, seq_len=4096, experts=64, top_k=8, qk_norm=True,
              source="[OLMOE] allenai/OLMoE-1B-7B-0924 config.json"),
)
MODELS: dict[str, ModelSpec] = {m.name: m for m in _CATALOG}
_ALIASES = {"llama3-8b": "Llama-3-8B", "llama-3.1-8b": "Llama-3-8B", "llama3-70b": "Llama-3-70B",
            "llama-3.1-70b": "Llama-3-70B", "llama-3.1-405b": "Llama-3-405B", "llama3-405b": "Llama-3-405B",
            "llama2-70b": "Llama-2-70B", "llama2-7b": "Llama-2-7B",
            "llama2-13b": "Llama-2-13B", "gpt3-175b": "GPT-3-175B", "gpt-3": "GPT-3-175B", "phi-2-2b": "Phi-2",
            "phi2": "Phi-2", "mpt7b": "MPT-7B", "mixtral": "Mixtral-8x7B", "deepseek-moe": "DeepSeek-MoE-16B",
            "olmoe": "OLMoE-1B-7B"}


def model_names() -> list[str]:
    """Names of the catalog models."""
    return list(MODELS)


def get_model(name: str) -> ModelSpec:
    """The catalog model called ``name`` (case-insensitive, a few aliases), else ConfigError
    listing the known names."""
    if not isinstance(name, str):
        raise ConfigError(f"model name must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    for n, m in MODELS.items():
        if n.lower() == key:
            return m
    if key in _ALIASES:
        return MODELS[_ALIASES[key]]

    raise ConfigError(f"unknown model {short(name)}{suggest(name, list(MODELS) + list(_ALIASES))}; "
                      f"known: {', '.join(MODELS)} (or describe one in a file)")


_HF_KEYS = {  # Hugging Face config.json names -> ModelSpec fields
    "hidden_size": "hidden", "intermediate_size": "ffn_hidden", "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads", "num_hidden_layers": "layers", "vocab_size": "vocab",
    "max_position_embeddings": "seq_len", "num_local_experts": "experts", "num_experts": "experts",
    "n_routed_experts": "experts", "num_experts_per_tok": "top_k", "moe_intermediate_size": "expert_ffn_hidden",
    "n_shared_experts": "shared_experts", "first_k_dense_replace": "first_k_dense",
    "tie_word_embeddings": "tied_embeddings",
}


def model_from_dict(d: dict, where: str = "model") -> ModelSpec:
    """A ModelSpec from a mapping of ModelSpec field names (Hugging Face ``config.json`` key
    names are accepted too). ``kv_heads`` defaults to ``heads`` and ``name`` to ``"custom"``.
    Unknown keys and wrong types raise ConfigError naming ``where`` and the field."""

    names = field_names(ModelSpec)
    check_keys(d, names | set(_HF_KEYS), where)
    data = {_HF_KEYS.get(k, k): v for k, v in d.items() if v is not None}
    data.setdefault("name", "custom")
    if "heads" in data:
        data.setdefault("kv_heads", data["heads"])
    missing = [f for f in ("hidden", "ffn_hidden", "heads", "layers", "vocab", "seq_len") if f not in data]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {missing}")
    for k, v in data.items():  # sizes: typed below; bounded here (no model has 2**31 of anything)
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_MODEL_SIZE:
            raise ConfigError(f"{where}: field {short(k)}: more than {MAX_MODEL_SIZE} (2**31 - 1)")
    return typed(data, ModelSpec, where)
