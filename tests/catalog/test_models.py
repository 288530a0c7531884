"""Model catalog, parameter counts against published totals, FLOPs per token, user models."""

from __future__ import annotations

import pytest

from ccoverlap.catalog.models import MODELS, ModelSpec, get_model, model_from_dict, model_names
from ccoverlap.errors import ConfigError

# published totals: HF model cards / papers (exact where the card gives the exact number)
PUBLISHED = {
    "Llama-3-8B": (8_030_261_248, None),  # HF safetensors metadata
    "Llama-3-70B": (70_553_706_496, None),  # HF safetensors metadata
    "Llama-3-405B": (405.85e9, None),  # Llama 3 paper: 405B
    "Llama-2-70B": (68.98e9, None),  # Llama 2 paper: 70B class (68.98B)
    "GPT-3-175B": (174.6e9, None),  # Brown et al.: 175.0B
    "Phi-2": (2_779_683_840, None),  # HF safetensors metadata
    "MPT-7B": (6.65e9, None),  # MosaicML: 6.7B
    "Mixtral-8x7B": (46_702_792_704, 12.9e9),  # Mixtral paper: 47B total, 13B active
    "DeepSeek-MoE-16B": (16.4e9, 2.8e9),  # DeepSeekMoE paper Table: 16.4B total, 2.8B activated
    "OLMoE-1B-7B": (6.9e9, 1.3e9),  # OLMoE paper: 6.9B total, 1.3B active
}


def test_catalog_has_every_model_the_papers_evaluate_with_a_source():
    assert set(PUBLISHED) <= set(MODELS)
    for m in MODELS.values():
        assert m.source, m.name


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published(name):
    total, active = PUBLISHED[name]
    pc = get_model(name).param_count()
    assert pc.total == pytest.approx(total, rel=0.005)
    if active is None:
        assert pc.active == pc.total
    else:
        assert pc.active == pytest.approx(active, rel=0.02)
        assert pc.active < pc.total


def test_exact_llama3_8b_count_by_hand():
    h, f, L, V, kv = 4096, 14336, 32, 128256, 1024
    layer = h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h
    assert get_model("Llama-3-8B").param_count().total == L * layer + 2 * V * h + h


def test_get_model_case_insensitive_and_clear_error():
    assert get_model("llama-3-70b") is MODELS["Llama-3-70B"]
    assert get_model("MIXTRAL-8X7B").experts == 8
    assert get_model("phi2").parallel_attn_mlp
    with pytest.raises(ConfigError, match=r"unknown model 'llama-5' \(did you mean '.*'\?\); known: Llama-3-8B, Llama-3-70B"):
        get_model("llama-5")
    assert model_names()[0] == "Llama-3-8B"


def test_flops_per_token_palm_and_megatron_agree():
    # GPT with 4h GELU MLP, no biases, untied: Megatron eq. 3 per token = 72 l h² (1 + s/6h + V/12hl) / 3 * ...
    h, a, L, V, s = 4096, 32, 24, 50000, 2048
    m = model_from_dict({"hidden": h, "ffn_hidden": 4 * h, "heads": a, "layers": L, "vocab": V, "seq_len": s,
                         "gated_mlp": False, "norm": "layernorm"})
    megatron = 72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L)) / s
    # norms (2h per layer) add 6 * 2h * L FLOPs to the PaLM count: negligible, but exact here
    assert m.flops_per_token() == pytest.approx(megatron + 6 * 2 * h * L, rel=1e-12)
    assert m.flops_per_token(causal=True) == pytest.approx(m.flops_per_token() - 6 * L * h * s, rel=1e-12)
    assert m.flops_per_token(4096) > m.flops_per_token(2048)
    moe = get_model("Mixtral-8x7B")
    assert moe.flops_per_token(4096) < 6.0 * moe.param_count().total


def test_model_from_dict_accepts_hf_keys_and_reports_errors():
    m = model_from_dict({"hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 16,
                         "num_hidden_layers": 4, "vocab_size": 1000, "max_position_embeddings": 512})
    assert (m.hidden, m.kv_heads, m.name) == (2048, 16, "custom")
    with pytest.raises(ConfigError, match="unknown field 'hiden'"):
        model_from_dict({"hiden": 1})
    with pytest.raises(ConfigError, match=r"missing field\(s\) \['vocab', 'seq_len'\]"):
        model_from_dict({"hidden": 64, "ffn_hidden": 256, "heads": 4, "layers": 2})
    with pytest.raises(ConfigError, match="hidden must be an integer >= 1, got -64"):
        model_from_dict({"hidden": -64, "ffn_hidden": 256, "heads": 4, "layers": 2, "vocab": 10, "seq_len": 8})
    with pytest.raises(ConfigError, match=r"kv_heads \(3\) must divide heads \(4\)"):
        model_from_dict({"hidden": 64, "ffn_hidden": 256, "heads": 4, "kv_heads": 3, "layers": 2, "vocab": 10,
                         "seq_len": 8})
    with pytest.raises(ConfigError, match="gated_mlp must be true or false"):
        model_from_dict({"hidden": 64, "ffn_hidden": 256, "heads": 4, "layers": 2, "vocab": 10, "seq_len": 8,
                         "gated_mlp": "yes"})
    with pytest.raises(ConfigError, match="expected a mapping"):
        model_from_dict([1, 2])


def test_moe_checks():
    base = dict(name="x", hidden=64, ffn_hidden=256, heads=4, kv_heads=4, layers=4, vocab=10, seq_len=8)
    with pytest.raises(ConfigError, match="top_k must be between 1 and experts"):
        ModelSpec(**base, experts=4, top_k=5)
    with pytest.raises(ConfigError, match="need experts > 0"):
        ModelSpec(**base, top_k=2)
    with pytest.raises(ConfigError, match="first_k_dense"):
        ModelSpec(**base, experts=4, top_k=1, first_k_dense=4)
    ds = get_model("DeepSeek-MoE-16B")
    assert not ds.is_moe_layer(0) and ds.is_moe_layer(1)
    assert {t.name for t in ds.layer_tensors(0)} >= {"fc1", "fc2"}
    assert {t.name for t in ds.layer_tensors(1)} >= {"router", "shared_fc1", "experts_fc1"}


def test_mlp_flavours_and_embeddings():
    gpt = get_model("GPT-3-175B")
    fc1 = next(t for t in gpt.layer_tensors(0) if t.name == "fc1")
    assert fc1.numel == 12288 * 49152 + 49152  # plain GELU MLP with bias: one up matrix
    llama = get_model("Llama-3-8B")
    fc1 = next(t for t in llama.layer_tensors(0) if t.name == "fc1")
    assert fc1.numel == 2 * 4096 * 14336  # gate + up
    assert "lm_head" not in {t.name for t in gpt.embedding_tensors()}  # tied
    assert "pos_embedding" in {t.name for t in gpt.embedding_tensors()}
    assert "mlp_norm" not in {t.name for t in get_model("Phi-2").layer_tensors(0)}  # parallel block
