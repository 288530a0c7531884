"""Published measurements of real LLM training runs, as data, for validating the planner (issue 2).

Every case records what the source states (model shape, GPU count and type, parallel degrees,
batch, sequence length, measured throughput) and, separately, what we had to assume where the
source is silent (``assumptions``). Only numbers read in the cited source are used; where a
source gives throughput rather than iteration time, the iteration time follows from it by the
source's own FLOP-counting rule (``measured_step_time_s``):

* ``tokens_per_s_per_gpu``   t = global_batch x seq_len / (GPUs x tokens/s/GPU)
* ``tflops_per_gpu``         t = F / (GPUs x TFLOP/s/GPU), F the FLOPs per iteration as the
                             source counts them (``flops_rule``):

  - ``megatron_core``: Megatron-LM ``num_floating_point_operations`` (megatron/training/training.py
    at commit f2e5db402c, the commit that published the H100 table): model FLOPs, no
    recomputation, full (non-causal) attention score matrix;
    12 B s l h^2 [ (1 + g/a + s/h) q/h + (f/h) x (3/2 if SwiGLU) + V/(2 l h) ]
    (g KV heads, a heads, q = a x head_dim, f FFN size); = 72 B s l h^2 (1 + s/6h + V/12lh) for a GPT.
  - ``megatron_ptdp_recompute``: Narayanan et al. 2021 (SC'21, arXiv:2104.04473) §5.1 eq. 3, the
    count behind their Table 1: 96 B s l h^2 (1 + s/6h + V/16lh) -- hardware FLOPs *including*
    one extra forward pass for full activation recomputation (the factor 4 = 1 fwd + 2 bwd +
    1 recompute fwd; see bigcode-project/Megatron-LM PR #33, which copies eq. 3 with
    ``checkpoint_activations_factor = 4``, and NVIDIA/Megatron-LM PR #995 for the expansion).

Sources (URLs; the text of each was read, the tables are quoted per case below):

[MCORE24] NVIDIA/Megatron-LM README, section "Training Speed and Scalability", table image
          images/model_table.png, added by commit f2e5db402c (2024-07-15, "New scaling figures on
          H100 GPUs", Megatron-Core r0.8.0). https://github.com/NVIDIA/Megatron-LM/blob/f2e5db402c/README.md
          Text: GPT models, vocabulary 131,072, sequence length 4096, up to 6144 H100 GPUs;
          "--overlap-grad-reduce --overlap-param-gather", "--tp-comm-overlap" and PP overlap on;
          throughput "measured for end-to-end training" incl. data loading, optimizer, logging.
[PTDP21]  NVIDIA/Megatron-LM README at commit 50a4b5fa02 (2021-04-08, "Release fixes"), table image
          images/cases_april2021.png = Narayanan et al., "Efficient Large-Scale Language Model
          Training on GPU Clusters Using Megatron-LM", SC'21, arXiv:2104.04473, Table 1 (weak
          scaling). Text: vocabulary 51,200, sequence length 2048, Selene, "Each cluster node has
          8 NVIDIA 80GB A100 GPUs"; FLOPs "measured for end-to-end training".
          https://github.com/NVIDIA/Megatron-LM/blob/50a4b5fa02/README.md
[TT24]    pytorch/torchtitan docs/performance.md at commit d4c86e375 (2025-01-30), Tables 1 and 3;
          hardware: Grand Teton, 8 H100 per host on NVLink, "96GB HBM2e with 2.4 TB/sec",
          "400 Gb/s per GPU" RDMA backend, "default 500W power limit"; torchtitan commit 9dec370.
          https://github.com/pytorch/torchtitan/blob/d4c86e375/docs/performance.md
[TT24A]   pytorch/torchtitan docs/performance.md at commit 1ea476e9f (2024-04-24), "Llama 3
          performance numbers" on 64 A100 80GB, FSDP2; train_configs/llama3_70b.toml at that
          commit: seq_len 8192; train.py: wps = local tokens / (time x model-parallel size), i.e.
          tokens/s per GPU. https://github.com/pytorch/torchtitan/blob/1ea476e9f/docs/performance.md
[LLAMA3]  Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 4 (405B
          pre-training configurations): GPUs 8,192, TP 8, CP 1, PP 16, 16M tokens per batch,
          430 TFLOPs/GPU; as reproduced in https://glennklockwood.com/garden/llama-3.1 from
          P. Balaji, "Herding Llamas", SC'24. §3.3.1: 8 GPUs per server on NVLink, RoCE with 400 Gbps
          per GPU, H100 80GB HBM3 at 700 W (https://ai-papers.xuzou.cn/papers/llama3_2024 summary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MEASURED_KINDS = ("tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s")
FLOPS_RULES = ("megatron_core", "megatron_ptdp_recompute")


def gpt_model(name: str, hidden: int, heads: int, layers: int, vocab: int, seq_len: int, *,
              tied: bool, position: str, bias: bool) -> dict:
    """A GPT-style ModelSpec mapping (GELU MLP of 4h, multi-head attention, LayerNorm)."""
    return {"name": name, "hidden": hidden, "ffn_hidden": 4 * hidden, "heads": heads, "kv_heads": heads,
            "layers": layers, "vocab": vocab, "seq_len": seq_len, "gated_mlp": False, "norm": "layernorm",
            "bias": bias, "position": position, "tied_embeddings": tied}


@dataclass(frozen=True)
class PublishedRun:
    """One published training measurement.

    ``model``: a catalog model name or a ModelSpec field mapping. ``cluster``: a catalog cluster
    name, or a key of :data:`CUSTOM_CLUSTERS` (built by the validation script from the catalog
    with ``dataclasses.replace``). ``parallel`` / ``batch`` / ``knobs``: the workload mapping's
    sections, as the run used them. ``measured_kind`` / ``measured_value``: the published number.
    ``flops_model``: the model shape the source's FLOP count refers to when it differs from
    ``model`` (see the Llama 3 case).
    """

    name: str
    source: str
    gpu: str
    gpus: int
    model: Any
    cluster: str
    parallel: dict
    batch: dict
    knobs: dict
    measured_kind: str
    measured_value: float
    flops_rule: str = ""
    flops_model: dict | None = None
    assumptions: tuple = ()
    group: str = ""

    # ------------------------------------------------------------------ derived
    @property
    def degrees(self) -> dict:
        p = self.parallel
        return {k: int(p.get(k, 1)) for k in ("tp", "pp", "dp")}

    def model_shape(self) -> dict:
        """Shape fields the FLOP count needs (from the mapping, or the catalog)."""
        if self.flops_model is not None:
            return dict(self.flops_model)
        if isinstance(self.model, dict):
            return dict(self.model)
        from ccoverlap.models import get_model

        return get_model(self.model).to_dict()

    def flops_per_iteration(self) -> float:
        """FLOPs of one iteration as the source counts them (``flops_rule``)."""
        m = self.model_shape()
        B, s = self.batch["global_batch"], self.batch["seq_len"]
        h, l, V = m["hidden"], m["layers"], m["vocab"]
        if self.flops_rule == "megatron_ptdp_recompute":
            return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        if self.flops_rule == "megatron_core":
            a = m["heads"]
            g = m.get("kv_heads") or a
            hd = m.get("head_dim") or h // a
            q_ratio = a * hd / h
            glu = 1.5 if m.get("gated_mlp", True) else 1.0
            return 12.0 * B * s * l * h * h * (
                (1 + g / a + s / h) * q_ratio + (m["ffn_hidden"] / h) * glu + V / (2 * l * h))
        raise ValueError(f"{self.name}: unknown flops_rule {self.flops_rule!r}")

    @property
    def measured_step_time_s(self) -> float:
        """The iteration time the published number implies (see the module docstring)."""
        if self.measured_kind == "step_time_s":
            return float(self.measured_value)
        if self.measured_kind == "tokens_per_s_per_gpu":
            return self.batch["global_batch"] * self.batch["seq_len"] / (self.gpus * self.measured_value)
        if self.measured_kind == "tflops_per_gpu":
            return self.flops_per_iteration() / (self.gpus * self.measured_value * 1e12)
        raise ValueError(f"{self.name}: unknown measured_kind {self.measured_kind!r}")


def _mcore(size: str, hidden: int, heads: int, layers: int, tp: int, pp: int, dp: int, gpus: int,
           batch: int, tflops: float) -> PublishedRun:
    """One row of the [MCORE24] table (Megatron-Core r0.8.0, H100, BF16)."""
    return PublishedRun(
        name=f"MCore-GPT-{size} H100x{gpus}",
        group="Megatron-Core r0.8.0 weak scaling (H100)",
        source=(f"[MCORE24] NVIDIA/Megatron-LM README @f2e5db402c, images/model_table.png, row {size}: "
                f"heads {heads}, hidden {hidden}, layers {layers}, TP {tp}, PP {pp}, DP {dp}, {gpus} GPUs, "
                f"batch {batch}, {tflops} TFLOP/s per GPU"),
        gpu="H100-SXM", gpus=gpus,
        model=gpt_model(f"GPT-{size}", hidden, heads, layers, 131072, 4096, tied=False, position="rope", bias=False),
        cluster="dgx-h100",
        parallel={"tp": tp, "pp": pp, "dp": dp, "sequence_parallel": tp > 1, "distributed_optimizer": True,
                  "pp_schedule": "1f1b", "recompute": "none"},
        batch={"global_batch": batch, "micro_batch": 1, "seq_len": 4096},
        knobs={"overlap": True, "tp_overlap": "chunked" if tp > 1 else "none", "pp_p2p_overlap": True},
        measured_kind="tflops_per_gpu", measured_value=tflops, flops_rule="megatron_core",
        assumptions=(
            "cluster: DGX H100 (NVSwitch 450 GB/s, one 400G NDR NIC per GPU); the README says only 'H100 GPUs'",
            "BF16 (MFU column = TFLOP/s / 989 TFLOP/s dense BF16 peak: 408.8 -> 41%)",
            "micro-batch 1, no activation recomputation, 1F1B without interleaving (not stated)",
            "sequence parallelism with TP (required by --tp-comm-overlap); distributed optimizer "
            "(required by --overlap-param-gather)",
            "GELU MLP of 4h, untied embeddings: these reproduce the table's parameter counts "
            "(1.7B -> 1.745e9, 7.1B -> 7.114e9, 462B -> 4.614e11)",
        ),
    )


def _ptdp(size: str, hidden: int, layers: int, mp: int, gpus: int, batch: int, tflops: float) -> PublishedRun:
    """One row of [PTDP21] (Narayanan et al. 2021 Table 1; A100 80GB, mixed precision)."""
    tp = min(mp, 8)
    pp = mp // tp
    dp = gpus // mp
    heads = hidden // 128
    return PublishedRun(
        name=f"PTD-P-GPT-{size} A100x{gpus}",
        group="Megatron-LM PTD-P 2021 weak scaling (A100)",
        source=(f"[PTDP21] Narayanan et al. SC'21 Table 1 / Megatron-LM README @50a4b5fa02 "
                f"images/cases_april2021.png, row {size}: hidden {hidden}, layers {layers}, model-parallel size "
                f"{mp}, {gpus} GPUs, batch {batch}, {tflops} TFLOP/s per GPU"),
        gpu="A100-80GB-SXM", gpus=gpus,
        model=gpt_model(f"GPT-{size}", hidden, heads, layers, 51200, 2048, tied=True, position="learned", bias=True),
        cluster="dgx-a100",
        parallel={"tp": tp, "pp": pp, "dp": dp, "sequence_parallel": False, "pp_schedule": "1f1b",
                  "recompute": "full"},
        batch={"global_batch": batch, "micro_batch": 1, "seq_len": 2048},
        knobs={"overlap": False},
        measured_kind="tflops_per_gpu", measured_value=tflops, flops_rule="megatron_ptdp_recompute",
        assumptions=(
            f"model-parallel size {mp} split as TP = min(8, mp) = {tp} (within a DGX node), PP = mp / TP = {pp}: "
            "the README table gives only the product",
            "full activation recomputation (the paper's eq. 3 FLOP count includes the recompute pass)",
            f"heads = hidden / 128 = {heads} (head count not in the README table)",
            "micro-batch 1, non-interleaved 1F1B (not stated)",
            "no communication overlap: Megatron-LM of April 2021 all-reduced gradients after the "
            "backward pass and blocked on TP all-reduces and PP send/recv (knobs overlap=False)",
            "GPT-2 style: learned positions, biases, tied embeddings (Megatron GPT of 2021); these "
            "reproduce the table's parameter counts",
            "cluster: DGX A100 with one 200G HDR NIC per GPU (Selene)",
        ),
    )


CASES: tuple[PublishedRun, ...] = (
    # --- [MCORE24] Megatron-Core r0.8.0, H100, seq 4096, vocab 131072 (5 of the 9 rows) ---------
    _mcore("1.7B", 2048, 16, 24, tp=1, pp=1, dp=48, gpus=48, batch=192, tflops=408.8),
    _mcore("7.1B", 4096, 32, 30, tp=2, pp=1, dp=48, gpus=96, batch=192, tflops=465.9),
    _mcore("32B", 7168, 56, 48, tp=8, pp=1, dp=48, gpus=384, batch=192, tflops=459.6),
    _mcore("177B", 12288, 96, 96, tp=8, pp=6, dp=48, gpus=2304, batch=1152, tflops=432.8),
    _mcore("462B", 18432, 144, 112, tp=8, pp=16, dp=48, gpus=6144, batch=3072, tflops=459.9),
    # --- [PTDP21] Narayanan et al. 2021, A100, seq 2048, vocab 51200 (4 of the 10 rows) --------
    _ptdp("1.7B", 2304, 24, mp=1, gpus=32, batch=512, tflops=137),
    _ptdp("18B", 6144, 40, mp=8, gpus=256, batch=1024, tflops=135),
    _ptdp("145B", 12288, 80, mp=64, gpus=1536, batch=2304, tflops=148),
    _ptdp("1T", 25600, 128, mp=512, gpus=3072, batch=3072, tflops=163),
    # --- [TT24] torchtitan, Llama 3.1 8B, FSDP2 on 8 H100 (Table 1, row "FSDP": BF16, eager) ----
    PublishedRun(
        name="torchtitan-Llama3.1-8B H100x8",
        group="torchtitan FSDP2",
        source=("[TT24] pytorch/torchtitan docs/performance.md @d4c86e375, Table 1 (1D FSDP, Llama 3.1 8B, "
                "8 GPUs, local batch 2, global batch 16, selective activation checkpointing), row 'FSDP': "
                "5,762 TPS/GPU; seq_len 8192 from train_configs/llama3_8b.toml at torchtitan 9dec370"),
        gpu="H100 (96GB HBM2e, 500 W)", gpus=8,
        model="Llama-3-8B", cluster="grand-teton-h100-96gb",
        parallel={"dp": 8, "data_parallel": "fsdp", "recompute": "selective"},
        batch={"global_batch": 16, "micro_batch": 2, "seq_len": 8192},
        knobs={"overlap": True, "fsdp_prefetch": 1, "fsdp_reshard_after_forward": True},
        measured_kind="tokens_per_s_per_gpu", measured_value=5762,
        assumptions=(
            "GPU: H100 with 96 GB HBM2e at 2.4 TB/s (stated) and the H100 SXM dense BF16 peak; the "
            "500 W power limit lowers sustained clocks by an amount the source does not know "
            "(its footnote 2: 'the actual peak TFLOPs number is between SXM and NVL')",
            "selective *op* activation checkpointing (torchtitan) modelled as 'selective' "
            "(recompute the attention core)",
            "FSDP2 defaults: reshard after forward, one unit prefetched (fsdp_prefetch=1)",
            "row 'FSDP' = BF16 without torch.compile and without Float8",
        ),
    ),
    # --- [TT24A] torchtitan, Llama 3 70B, FSDP2 on 64 A100 --------------------------------------
    PublishedRun(
        name="torchtitan-Llama3-70B A100x64",
        group="torchtitan FSDP2",
        source=("[TT24A] pytorch/torchtitan docs/performance.md @1ea476e9f, 'Llama 3 performance numbers' "
                "(FSDP2 on 64 A100 80GB), row 70B: local batch 1, full activation checkpointing, WPS 331 "
                "(tokens/s per GPU), MFU 51.7%; seq_len 8192 from train_configs/llama3_70b.toml @1ea476e9f"),
        gpu="A100-80GB-SXM", gpus=64,
        model="Llama-3-70B", cluster="dgx-a100",
        parallel={"dp": 64, "data_parallel": "fsdp", "recompute": "full"},
        batch={"global_batch": 64, "micro_batch": 1, "seq_len": 8192},
        knobs={"overlap": True, "fsdp_prefetch": 1, "fsdp_reshard_after_forward": True},
        measured_kind="tokens_per_s_per_gpu", measured_value=331,
        assumptions=(
            "cluster: DGX-A100-like (NVSwitch, one 200G HDR NIC per GPU); the source says only '64 A100 (80GB)'",
            "FSDP2 defaults: reshard after forward, one unit prefetched",
        ),
    ),
    # --- [LLAMA3] Llama 3 405B pre-training, 8,192 H100 -----------------------------------------
    PublishedRun(
        name="Llama3-405B H100x8192",
        group="Llama 3 405B pre-training",
        source=("[LLAMA3] Dubey et al. 2024 (arXiv:2407.21783) Table 4, first row: 8,192 GPUs, TP 8, CP 1, "
                "PP 16, 16M tokens per batch, 430 TFLOPs/GPU (BF16 MFU 43%); row as reproduced at "
                "glennklockwood.com/garden/llama-3.1 (Balaji, SC'24)"),
        gpu="H100-SXM", gpus=8192,
        # Modelled with 128 layers = 16 stages x 8: the paper removes one layer from the first and
        # the last stage (126 layers); the middle stages, which set the pipeline's pace, hold 8.
        model={"name": "Llama-3-405B (128-layer pipeline proxy)", "hidden": 16384, "ffn_hidden": 53248,
               "heads": 128, "kv_heads": 8, "layers": 128, "vocab": 128256, "seq_len": 8192},
        flops_model={"hidden": 16384, "ffn_hidden": 53248, "heads": 128, "kv_heads": 8, "layers": 126,
                     "vocab": 128256, "gated_mlp": True},
        cluster="meta-roce-h100",
        parallel={"tp": 8, "pp": 16, "dp": 64, "sequence_parallel": True, "distributed_optimizer": True,
                  "pp_schedule": "interleaved", "virtual_stages": 2, "recompute": "none"},
        batch={"global_batch": 2048, "micro_batch": 1, "seq_len": 8192},
        knobs={"overlap": True, "pp_p2p_overlap": True},
        measured_kind="tflops_per_gpu", measured_value=430, flops_rule="megatron_core",
        assumptions=(
            "sequence length 8192 (the initial pre-training stage) so 16M tokens = 2048 sequences; "
            "DP = 8192 / (8 x 16) = 64",
            "Meta's FLOP count is not spelled out; we apply Megatron-LM's rule (non-causal attention, "
            "SwiGLU, GQA) to the 126-layer model -- counting attention causally instead would lower the "
            "implied time by ~4%",
            "pipeline: 128-layer proxy (8 layers per stage), interleaved with 2 virtual stages per rank "
            "(the paper uses a modified interleaved schedule; the number of virtual stages is ours)",
            "DP state sharding modelled as a distributed optimizer (ZeRO-1-like); micro-batch 1; no "
            "activation recomputation; sequence parallelism with TP",
            "network: RoCE, 400 Gb/s (50 GB/s) per GPU; NVSwitch inside the 8-GPU server",
        ),
    ),
)


# Clusters not in the catalog, as changes to a catalog cluster (applied by the validation script
# with dataclasses.replace): {"base": catalog name, "gpu": {GPUSpec field: value},
# "inter": {LinkSpec field: value}, "intra": {...}}.
CUSTOM_CLUSTERS: dict[str, dict] = {
    # [TT24]: Grand Teton hosts, 8 H100 on NVLink, 96 GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per GPU.
    "grand-teton-h100-96gb": {
        "base": "dgx-h100",
        "gpu": {"name": "H100-96GB-HBM2e-500W", "hbm_bytes_per_s": 2.4e12, "memory_bytes": 96e9,
                "source": "[TT24] torchtitan docs/performance.md: 96GB HBM2e, 2.4 TB/s, 500 W limit"},
        "inter": {"fabric": "roce", "bandwidth_bytes_per_s": 50e9,
                  "source": "[TT24] 400 Gb/s per GPU RDMA backend network"},
    },
    # [LLAMA3]: Meta's 24K-GPU RoCE cluster, 400 Gbps per GPU.
    "meta-roce-h100": {
        "base": "dgx-h100",
        "inter": {"fabric": "roce", "bandwidth_bytes_per_s": 50e9,
                  "source": "[LLAMA3] §3.3.1: RoCE, 400 Gbps interconnect per GPU"},
    },
}


def case_by_name(name: str) -> PublishedRun:
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(f"no published case {name!r}; known: {', '.join(c.name for c in CASES)}")


# Alternative assumptions where the sources are silent, for the sensitivity table of
# docs/validation.md (``validate_published.py --sensitivity``): (case, label, changes to the
# case's parallel / batch / knobs sections). None of these is used by the main table.
SENSITIVITY: tuple[tuple[str, str, dict], ...] = (
    ("MCore-GPT-1.7B H100x48", "micro-batch 4 (one micro-batch per step)", {"batch": {"micro_batch": 4}}),
    ("MCore-GPT-7.1B H100x96", "micro-batch 4 (one micro-batch per step)", {"batch": {"micro_batch": 4}}),
    ("MCore-GPT-32B H100x384", "micro-batch 2", {"batch": {"micro_batch": 2}}),
    ("MCore-GPT-32B H100x384", "micro-batch 4 (one micro-batch per step)", {"batch": {"micro_batch": 4}}),
    ("MCore-GPT-32B H100x384", "no TP comm overlap", {"knobs": {"tp_overlap": "none"}}),
    ("MCore-GPT-177B H100x2304", "interleaved 1F1B, 2 virtual stages",
     {"parallel": {"pp_schedule": "interleaved", "virtual_stages": 2}}),
    ("MCore-GPT-177B H100x2304", "interleaved 1F1B, 4 virtual stages",
     {"parallel": {"pp_schedule": "interleaved", "virtual_stages": 4}}),
    ("MCore-GPT-462B H100x6144", "interleaved 1F1B, 7 virtual stages",
     {"parallel": {"pp_schedule": "interleaved", "virtual_stages": 7}}),
    ("PTD-P-GPT-145B A100x1536", "interleaved 1F1B, 2 virtual stages",
     {"parallel": {"pp_schedule": "interleaved", "virtual_stages": 2}}),
    ("Llama3-405B H100x8192", "plain 1F1B", {"parallel": {"pp_schedule": "1f1b", "virtual_stages": 1}}),
    ("Llama3-405B H100x8192", "interleaved 1F1B, 4 virtual stages",
     {"parallel": {"pp_schedule": "interleaved", "virtual_stages": 4}}),
)


def with_changes(case: PublishedRun, changes: dict) -> PublishedRun:
    """``case`` with some entries of its parallel / batch / knobs sections replaced."""
    from dataclasses import replace as _replace

    unknown = set(changes) - {"parallel", "batch", "knobs"}
    if unknown:
        raise ValueError(f"with_changes: unknown section(s) {sorted(unknown)}")
    return _replace(case, **{k: {**getattr(case, k), **v} for k, v in changes.items()})
