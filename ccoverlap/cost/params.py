"""Every achievable-fraction, derating and contention factor of the cost model, by name.

Datasheet peaks live in :mod:`ccoverlap.catalog.hardware`; what fraction of them a real kernel gets,
and how much one kernel slows another, lives here, so that ``ccoverlap calibrate`` can fit
these numbers on a real GPU and write them to a JSON calibration file::

    {"params": {"gemm_peak_fraction": 0.78, ...}, "gpu": "H100-SXM", "fit_error": 0.04}

which ``plan`` / ``simulate`` read back with :meth:`CostParams.load`.

Each field is fittable from one family of microbenchmarks (the ``fit:`` note in its comment):

* GEMM sweep (shapes × sizes, alone)               -> ``gemm_*``, ``kernel_launch_overhead_s``
* memcpy / streaming-kernel bandwidth              -> ``mem_*``, ``host_link_bytes_per_s``
* nccl-tests-like sweeps over NC, NT, C, protocol  -> ``link_efficiency_*``, ``channel_*``, ``proto_*``,
                                                      ``chunk_*``, ``comm_base_latency_s``, ``tree_*``
* a copy kernel with NC blocks and chunk C beside a GEMM (lagom §3.2, Fig. 3)
                                                   -> ``comm_sm_fraction_per_channel``, ``comm_hbm_*``,
                                                      ``l2_*``, ``nt_contention_coeff``, ``comm_compute_interference``
* copy-engine copies beside a GEMM (ficco §IV-D)   -> ``dma_*``

Values marked *assumption* are modelling guesses of the right order of magnitude, to be
replaced by calibration.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ccoverlap.catalog.hardware import ClusterSpec, GPUSpec
from ccoverlap.config import read_json_object, short
from ccoverlap.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class CostParams:
    """Named factors of the cost model (see the module docstring for how each is fitted).

    Units: fractions are in [0, 1] unless stated; times in seconds; bandwidths in bytes/s.
    """

    # ------------------------------------------------------------------ compute (compute.py)
    # Fraction of the datasheet dense peak one SM sustains inside a large, well-shaped GEMM tile
    # loop. Public cuBLAS bf16 numbers on H100 SXM are ~700-800 TFLOP/s of 989 (~0.75-0.8 end to
    # end, this factor excludes wave/tile losses modelled separately). fit: GEMM sweep.
    # FITTED (H100 SXM): 0.933 on the fit half of the GEMM corpus (vidur H100 + OpenXLA H100 tables;
    # benchmarks/fit_kernel_params.py), with the GEMM fields below marked so.
    gemm_peak_fraction: float = 0.933
    # Output tile (CTA) shape of the main GEMM kernel, and the K step of its main loop.
    # Hopper cuBLAS/CUTLASS warp-specialised kernels: 128x256x64, one CTA per SM. fit: GEMM sweep
    # (wave steps appear at multiples of sms*tiles_per_sm tiles).
    gemm_tile_m: int = 128
    gemm_tile_n: int = 256
    gemm_tile_k: int = 64
    gemm_tiles_per_sm: int = 1
    # Libraries also ship half-size tiles (tile_m x tile_n/2, tile_m/2 x tile_n, ...) and pick one
    # per shape; a smaller tile loads more operand bytes per FLOP (its reuse, tm*tn/(tm+tn),
    # is lower) and runs at this per-SM efficiency for each halving of that reuse: s ** log2(main
    # tile's reuse / its reuse) (H100: 128x128 at s^0.42, 64x256 at s^0.74, 64x128 at s). 0
    # disables the smaller tiles. [REUSE]
    gemm_small_tile_efficiency: float = 0.571  # FITTED (H100 SXM), see gemm_peak_fraction
    # Per-tile prologue/epilogue (pipeline fill, output store), in units of main-loop K steps:
    # a tile with K/tile_k steps costs (K/tile_k + this) steps. Makes small-K (K-split) GEMMs
    # inefficient (ficco §IV-C1). assumption; fit: GEMM sweep over K.
    gemm_tile_overhead_ksteps: float = 8.10  # FITTED (H100 SXM), see gemm_peak_fraction
    # Fraction of the shorter of (compute, memory) time per wave hidden under the longer.
    # 0 is lagom eq. 6 literally (f = theta + D/B); 1 is a pure roofline per wave. assumption.
    gemm_mem_overlap: float = 0.865  # FITTED (H100 SXM), see gemm_peak_fraction
    # Hopper's cuBLAS / CUTLASS 3 GEMMs are persistent (one CTA per SM looping over output tiles,
    # KernelTmaWarpSpecializedCooperative / Pingpong): the TMA producer loads a tile's first K
    # steps while the consumers store the previous tile, so a CTA pays the per-tile overhead
    # whole on its first tile only. Fraction of gemm_tile_overhead_ksteps each later tile still
    # pays (1: not persistent, every wave pays it). FITTED (H100 SXM), see gemm_peak_fraction
    # (OpenXLA's multi-wave rows of k = 256-1024 ran 12-26% faster than every wave paying it);
    # 1 on Ampere and MI300X ([PERSIST]).
    gemm_persistent_overhead_fraction: float = 0.249
    # Power limiter (docs/model.md "Kernels"): a GEMM that keeps every SM's tensor cores busy
    # draws more than the board's power limit at the clock short loops start at, and the limiter
    # pulls the clock down while it runs: clock(t) = c + (1 - c) e^(-t / gemm_power_settle_s),
    # c = gemm_power_clock_fraction / sustained_clock_fraction (at most 1), t from the kernel's
    # start. The compute of a GEMM of T seconds runs at that clock's mean over T (its memory
    # traffic does not slow), so GEMMs much longer than the time constant run at c.
    # gemm_power_clock_fraction: the clock a power-limited GEMM settles to, as a fraction of the
    # clock of short loops (the boost clock); 1: no limiter (the class default). In a training
    # step the clock starts at sustained_clock_fraction and c is the rest of the way down.
    # H100 SXM: FITTED 0.778 ([REUSE]), A100: FITTED 0.887 ([POWER]); measured elsewhere: 1485-1530 of 1980 MHz (0.75-0.77)
    # through a back-to-back GEMM on this project's H200 (full_load_clock_fraction below),
    # 1980 -> 1575 MHz (0.795) on H800/H100 GEMMs past the power limit (deepseek-ai/DeepGEMM#120).
    gemm_power_clock_fraction: float = 1.0
    # Time constant of that clock drop, seconds (0 with gemm_power_clock_fraction < 1: every
    # GEMM runs at the limited clock). H100 SXM: FITTED 142 us ([REUSE]), A100 257 us ([POWER]). For scale: on a B200,
    # back-to-back kernels lose their clock after ~5 ms of sustained compute
    # (flashinfer-ai/flashinfer#2899, 1965 -> ~1580 MHz); a loop timing one kernel repeats it, so
    # the loop's busy time is a multiple of the kernel's and the constant per kernel is shorter.
    gemm_power_settle_s: float = 0.0
    # Split-K: with fewer output tiles than SM slots, libraries cut K into up to this many pieces
    # run side by side and reduce their fp32 partials (cuBLAS split-K / CUTLASS stream-K). The
    # model tries powers of two up to it. assumption (cuBLASLt's split-K heuristics go to 16-32).
    gemm_max_split_k: int = 16
    # Seconds each K piece past the first adds to a split-K GEMM: the pieces of an output tile
    # fold their fp32 partial tiles into it one after another (a serial reduction behind a
    # semaphore, as CUTLASS's serial split-K and stream-K fixups do), each a store and a load of
    # the partial tile through L2 that the next piece waits for. 0: the partials reduce in
    # parallel. fit: GEMM corpus rows split 2-16 ways ([POWER], [REUSE]: H100 SXM 0.43 us, A100 0.13 us).
    gemm_split_k_fixup_s: float = 0.0
    # 1: a GEMM may split K any number of ways (2, 3, ..., gemm_max_split_k), its pieces filling
    # one or more waves, as cuBLASLt's split-K does on Ampere (e.g. 32 output tiles on 108 SMs
    # run as 3 x 32 pieces, not 2 x 32; 256 tiles, a partial third wave, as 7 x 256 pieces in
    # nearly full waves); 0: powers of two
    # while the pieces fit in one wave. Per GPU type (_GPU_OVERRIDES, [SPLITK]); a switch, not fitted.
    gemm_split_k_any_count: int = 0
    # Matrix-vector-like GEMMs (min(m, n) <= this) may run as gemv / small batched kernels that
    # stream the operands once (no tile padding of the short side); the faster path is taken.
    # 0: no gemv path. assumption; fit: GEMM sweep of m = 1-16.
    gemm_gemv_max_dim: int = 8
    # Fraction of the achievable bandwidth those gemv kernels reach. fit: GEMM corpus rows of m <= 8.
    gemm_gemv_efficiency: float = 0.547  # FITTED (H100 SXM), see gemm_peak_fraction
    # A GEMM whose n or k is not a multiple of 16 bytes of elements cannot use the TMA / 16-byte
    # vector kernels: cuBLAS falls back to a CUTLASS sm75/sm80-class kernel. Fraction of the
    # per-SM rate it keeps. source: H100 SXM bf16 GEMMs with a dimension not a multiple of 8 ran
    # at 51-107 TFLOP/s (a user report of real kernel times; ~0.1 of the 0.82 x 989 the tile loop
    # reaches) -> 0.12 on Hopper; on Ampere the fallback is the same class of kernel as the
    # aligned one with narrower loads (assumption 0.5).
    gemm_misaligned_efficiency: float = 0.12
    # Fixed cost of every kernel (launch gap + ramp/tail), seconds. ficco §IV-A "other losses".
    # assumption (~2-5 us on recent GPUs); fit: intercept of the GEMM / memcpy sweeps.
    kernel_launch_overhead_s: float = 3.0e-6
    # The part of kernel_launch_overhead_s between one kernel's end and the next one's start on a
    # busy stream: a profiler's kernel duration does not contain it (validate kernels compares a
    # kernel duration with the model's time less this). source: the H200 layer trace
    # (benchmarks/data/gpu-h200/layer), lower quartile of the gaps between consecutive kernels
    # 1.1 us (median 2.0 us, host-bound eager gaps included).
    kernel_gap_s: float = 1.0e-6
    # Host time eager PyTorch spends to dispatch one kernel (Python op, dispatcher, autograd
    # recording, cudaLaunchKernel). A kernel shorter than this leaves the GPU waiting for the host
    # (docs/model.md). assumption: ~5-20 us per op is the range PyTorch reports as CPU launch
    # overhead motivating CUDA graphs ("Accelerating PyTorch with CUDA Graphs", PyTorch blog, 2021)
    # and torch.compile; fit: a trace of an eager step (analyze: gaps between short kernels).
    eager_host_overhead_s: float = 8.0e-6
    # Fused (flash) attention, fraction of the dense bf16 peak, forward and backward, for the GPU's
    # native kernel and for an FA2-class kernel. H100 SXM5, head dim 128, seq 4k-8k (Shah et al.
    # 2024, FlashAttention-3, arXiv:2407.08608, Figs. 5-6): cuDNN forward ~600-610 TFLOP/s (0.61),
    # backward ~500-520 (0.51) -- the TransformerEngine backend; FA3 ~640 / ~550; FlashAttention-2
    # ~368-370 forward (0.37), ~310-318 backward (0.32) -- PyTorch SDPA's flash backend on H100.
    # source: published microbenchmarks (FA3 paper); fit: attention sweep.
    attention_peak_fraction: float = 0.61
    attention_bwd_peak_fraction: float = 0.51
    attention_fa2_peak_fraction: float = 0.37
    attention_fa2_bwd_peak_fraction: float = 0.32
    # Flash kernels with a known shape run heads x ceil(seq/128) query-block tiles; each tile
    # pays this many 128-key-block iterations of prologue / epilogue (Q load, output rescale and
    # store), and a causal kernel's blocks run at attention_causal_efficiency of the plateau
    # (masking on the diagonal, uneven tiles). FITTED (H100) on the fit half of the attention
    # corpus (FA3 paper Fig. 5, FA2 and cuDNN causal curves; benchmarks/fit_kernel_params.py).
    attention_tile_overhead_iters: float = 1.06
    attention_causal_efficiency: float = 0.945
    # PyTorch SDPA's memory-efficient backend (xFormers' CUTLASS kernel) relative to
    # FlashAttention-2. assumption: FlashAttention-2's paper (Dao 2023, arXiv:2307.08691, Figs.
    # 4-5, A100) shows it 1.3-2x faster than xFormers' kernel -> ~0.65.
    attention_efficient_relative: float = 0.65
    # Fraction of the clock behind the datasheet dense peak that the SMs sustain through a long
    # training step, with every GPU of the node busy at its power limit. The fractions above
    # come from microbenchmarks that ran at whatever clock the chip held for a short loop;
    # a power- or thermally-limited job runs slower (NVIDIA quotes A100's HPL Rpeak at the
    # 1305 MHz it sustains at its power limit, not the 1410 MHz boost behind the 312 TFLOP/s
    # datasheet figure: G. Lockwood, "Peak FLOPS", glennklockwood.com/garden/peak-FLOPS).
    # Scales GEMM, attention and CUDA-core throughput, not HBM bandwidth. 1.0 = the
    # microbenchmarks' clock (assumption: the sustained clock of a user's job is unknown until
    # measured); fit: `validate --fit sustained_clock_fraction` on measured steps, or the
    # clock a long GEMM loop settles at (nvidia-smi).
    sustained_clock_fraction: float = 1.0

    # ------------------------------------------------------------------ memory
    # Achievable fraction of datasheet HBM bandwidth for streaming kernels (~3.0 of 3.35 TB/s
    # on H100 in STREAM-like copies). fit: memcpy bandwidth.
    mem_bw_fraction: float = 0.90
    # Fraction of that bandwidth a row-wise kernel keeps (fused RMSNorm / LayerNorm, rotary
    # embedding, vLLM's activations: one thread block per token row, often a reduction across
    # it, vs a vectorised grid-stride element-wise kernel, which reaches the achievable bandwidth).
    # FITTED (H100 SXM) on the memory corpus's fit half (vidur H100: its RMSNorm, rotary and
    # SiluAndMul rows; benchmarks/fit_kernel_params.py).
    mem_rowwise_efficiency: float = 0.518
    # A row-wise kernel takes at least this long beyond its launch overhead: each block reads its
    # row, reduces across it and writes it back, latency-bound chains of HBM accesses when few
    # rows leave most SMs idle. FITTED (H100 SXM) with mem_rowwise_efficiency.
    mem_rowwise_latency_s: float = 1.1e-6
    # Rows (thread blocks) per SM a row-wise kernel needs to reach that bandwidth; with fewer rows
    # (few tokens: small micro-batches, decode) its bandwidth falls in proportion. FITTED (H100
    # SXM) with mem_rowwise_efficiency.
    mem_rowwise_blocks_per_sm: float = 1.46
    # A memory-bound kernel whose bytes fit in L2 reads its inputs where the kernel before it
    # (the GEMM or element-wise op that produced them) left them, and its writes stay in the
    # write-back L2 until evicted: up to mem_l2_capacity_fraction x the GPU's L2 of its bytes
    # move at mem_l2_bandwidth_ratio x the HBM bandwidth it would reach (a larger kernel keeps
    # that many of its bytes in L2, the rest streams from HBM). 1.0 = no L2 effect. FITTED
    # (H100 SXM) with mem_rowwise_efficiency (vidur's residual add of 19-38 MB ran at 3.4-3.9
    # TB/s, kernel durations, past the 3.35 TB/s of the H100's HBM). H200 and GPUs without a
    # memory table: the H100 values (assumption).
    mem_l2_capacity_fraction: float = 0.582
    mem_l2_bandwidth_ratio: float = 1.51
    # Fraction of the SMs a streaming kernel needs to saturate HBM; with fewer SMs (taken by
    # communication) its bandwidth falls proportionally. assumption; fit: memcpy with NC blocks beside.
    mem_sm_saturation_fraction: float = 0.5
    # Host link for h2d / d2h copies (PCIe 5.0 x16 on H100 SXM: 63 GB/s raw, ~55 achieved).
    # fit: pinned-memory memcpy.
    host_link_bytes_per_s: float = 55e9

    # ------------------------------------------------------------------ communication (comm.py)
    # Achieved fraction of a link's per-direction line rate with the Simple protocol and
    # enough channels. NVLink: NCCL reaches ~370 of 450 GB/s on H100 ("protocol overhead ~20%",
    # NVIDIA/nccl-tests#212). Network: 46-48 GB/s per NDR 400G NIC (NVIDIA/nccl-tests#290).
    # PCIe / xGMI: assumption. fit: nccl-tests busbw at large sizes.
    # Corpus fits (`python benchmarks/fit_collectives.py`, each on its tables' fit half):
    # PCIe 0.44 on H100: microsoft/vidur h100_pairwise_nvlink all-reduce, 4 x H100 NVL whose
    # ring joins two NVLink-bridged pairs over PCIe 5.0 (49 GB/s busbw at 64 MiB of 2 x 63
    # line: the path between the pairs crosses the host, which the source does not describe);
    # Network: the NIC's large-message peak (above); what fewer channels reach is
    # net_channel_bytes_per_s (below). Ethernet 0.89: GPUDirect-TCPXO of Google Cloud A3 Mega
    # (8 x 200 Gb/s a node), fitted with its hop latency (catalog [TCPXOLAT]) on the fit half of
    # nccl_tests_a3mega_h100_2x8_all_reduce (180 GB/s algbw at 8 GiB on 2 x 8 H100); the only
    # Ethernet table, so every GPU takes it (it was 0.70, an assumption).
    link_efficiency_nvlink: float = 0.83
    link_efficiency_pcie: float = 0.44
    link_efficiency_xgmi: float = 0.80
    link_efficiency_network: float = 0.93
    link_efficiency_ethernet: float = 0.752
    # AWS EFA (catalog fabric "efa": an RDMA transport NCCL drives through the aws-ofi-nccl plugin):
    # the achieved fraction of the EFA line rate. FITTED per GPU, with its EFA cluster's hop
    # latency (catalog [EFALAT]; validation.collectives.FIT_CLUSTER), on the fit half of that
    # cluster's table: H100 0.76 on 2 x p5.48xlarge (nccl_tests_aws_p5_h100_2x8_all_reduce: 256 GB/s
    # algbw at 16 GiB through NCCL's tree on 400 GB/s of EFA a node); A100 below.
    link_efficiency_efa: float = 0.736
    # Where a ring joins NVLink-bridged pairs across two CPU sockets (catalog LinkSpec
    # pairs_per_socket), the fraction of the in-socket PCIe rate it keeps: the traffic between
    # the sockets goes through the CPUs' own link (NVIDIA/nccl-tests#74: on a dual-socket EPYC
    # 8 x A40 node, P2P across the sockets is slower than host memory). 1.0 = no loss (no
    # measurement for this GPU's servers). A40: fitted (below).
    pcie_socket_crossing_fraction: float = 1.0
    # One channel (one thread block on one SM) moves at most this many bytes/s; NC channels
    # approach the link rate with diminishing returns (lagom §3.2, Fig. 3b). assumption
    # (NCCL reaches ~370 GB/s with 16 channels on H100, so >= ~25 GB/s each); fit: NC sweep.
    channel_bytes_per_s: float = 45e9
    # A send/recv between nodes runs on NCCL_NCHANNELS_PER_NET_PEER = 2 channels, each moving
    # at most this many bytes/s (its proxy thread posts the RDMA writes of its chunks).
    # Collectives over the network run on more channels and reach the NIC's peak (above).
    # FITTED (H100): vidur h100_dgx send_recv between 2 nodes, fit half (36 GB/s at 64 MiB,
    # below the NDR NIC's 46-48 GB/s peak), with the send/recv slot pipeline and rendezvous
    # (comm.p2p_chunk_efficiency, comm.p2p_network_latency_s; it was 20 GB/s without them).
    net_channel_bytes_per_s: float = 18.1e9
    # Sharpness p of the soft minimum min(NC*channel_bw, link_bw) = x / (1 + x^p)^(1/p).
    # Larger -> sharper knee. assumption; fit: NC sweep.
    channel_saturation_sharpness: float = 4.0
    # NT threads per channel: per-channel bandwidth scales as (NT/512)^exponent below 512
    # threads (lagom §3.2: NT has a small effect). assumption; fit: NT sweep.
    threads_bw_exponent: float = 0.15
    # Protocols (NVIDIA/nccl#281, sjeaugey): LL carries 4 B of flag per 8 B -> 50% of link
    # bandwidth; LL128 carries 8 B of flag per 128 B -> 120/128. Their latency per step is a
    # fraction of Simple's (NCCL's tuning model gives LL/LL128 ~0.2/0.5 of Simple's per-hop
    # latency on NVLink). fit: nccl-tests with NCCL_PROTO forced.
    proto_ll_bw_factor: float = 0.5
    proto_ll128_bw_factor: float = 120.0 / 128.0
    proto_ll_latency_factor: float = 0.25
    proto_ll128_latency_factor: float = 0.55
    # Fixed cost of one collective launch + final synchronisation, seconds (NCCL's tuning model
    # base latencies are ~5-10 us: LL 6.6-6.8, Simple 8.4). MI300X: RCCL's own, 12 us (below).
    # fit: nccl-tests / rccl-tests time at 8 bytes.
    comm_base_latency_s: float = 6.0e-6
    # Host seconds to issue one collective or send/recv from PyTorch (c10d dispatch, NCCL's
    # enqueue and launch). A loop of calls -- a benchmark -- runs no faster than this a call,
    # so the small-message "latency" such loops measure is this floor: microsoft/vidur's
    # eager torch.distributed loops give NCCL kernels of 4-8 GPUs 20-42 us (H100) and ~60 us
    # (A100) up to ~1 MiB, where NCCL's own latency model gives ~10 us. Used where the corpus
    # is judged (comm.back_to_back_time_s); a training step's host time is the simulator's.
    # The time is the node's host's: a catalog cluster whose tables measure it carries its own
    # (ClusterSpec.host_issue_s, catalog [HOST]); this GPU-wide value is for the others.
    # fit: the collective corpus' fit half (`python benchmarks/fit_collectives.py`), over the
    # GPU's tables with each cluster's own value set aside.
    comm_host_issue_s: float = 33.5e-6  # H100 fit (A100, A40 below)
    # Every chunk step of a channel pays this handshake (flag write / poll), seconds: small
    # chunks C pay it more often (lagom §3.2, Fig. 3c). assumption; fit: C sweep.
    chunk_step_overhead_s: float = 1.0e-6
    # Pipeline fill + drain of the chunk pipeline, in chunk steps per channel: with k chunk
    # steps per channel the bandwidth term is (k + depth) / k of ideal, so very large chunks
    # (k small) lose pipelining. assumption; fit: C sweep at fixed size.
    chunk_pipeline_depth: float = 0.5
    # NCCL's tuner rates tree lower than ring in bandwidth; fraction of ring's achieved
    # bandwidth a (double binary) tree reaches. assumption; fit: nccl-tests with NCCL_ALGO=Tree.
    tree_bw_efficiency: float = 0.8
    # NVLink SHARP (NVLS) all-reduce on an NVSwitch node (NCCL >= 2.17 on Hopper): the switch
    # reduces and multicasts, so each GPU moves M(1 + 1/n) bytes each way instead of ring's
    # 2M(n-1)/n. Fraction of the NVLink line rate that traffic reaches. source: 8 x H100,
    # "peak busBw of ~480GB/s (algbw ~275GB/s)" at large sizes (S. Jeaugey, NVIDIA/nccl-tests#212),
    # 476 GB/s (NVIDIA/nccl-tests#290, 8 x H100), 475 GB/s (NVIDIA/nccl-tests#272, 8 x H200):
    # 275 GB/s x 9/8 / 450 GB/s = 0.69. 0 = the GPU has no NVLS (Ampere, A40, MI300X).
    nvls_link_efficiency: float = 0.69
    # Fixed seconds an NVLS all-reduce pays on top of comm_base_latency_s (multicast object set
    # up, switch round trips). FITTED (`python benchmarks/fit_collectives.py`) on the fit halves of
    # vidur's h100_dgx all-reduce (NVLS where NCCL chose it, 16-64 MiB) and of an nccl-tests run
    # forced to NVLS at every size on 8 x H100 (Azure ND H100 v5, NCCL 2.18.5:
    # azure_nd_h100_v5_1x8_all_reduce, 27-45 us from 4 KiB to 2 MiB). It was 62 us fitted on
    # vidur's rows alone, which see NVLS only inside its bandwidth ramp.
    nvls_latency_s: float = 27.5e-6
    # Copy-engine (DMA) transport: fraction of link rate a cudaMemcpyPeerAsync / hipMemcpy
    # reaches, bandwidth of one copy engine, and per-copy issue+completion latency
    # (ficco §IV-D, DMA-latte: DMA is latency-bound for small copies). assumption; fit:
    # copy-engine peer copies over a size sweep.
    dma_link_efficiency: float = 0.85
    dma_engine_bytes_per_s: float = 200e9
    dma_copy_latency_s: float = 8.0e-6
    # Share of that per-copy latency spent outside the transfer (the host building and
    # enqueueing the commands, the doorbell and the engine fetching them, the completion
    # reaching the host); the rest is the transfer's own fixed start. Only what the copy's
    # time is made of, not how long it takes: the share of a copy outside its transfer is
    # this x dma_copy_latency_s over the copy's time. 1: not measured for this GPU. [DMALAT]
    dma_copy_outside_fraction: float = 1.0
    # Copy-engine collectives pay command scheduling and cross-GPU synchronisation that SM
    # collectives do not: at latency-bound sizes a DMA all-gather (all-to-all) takes this many
    # times as long as the SM (NCCL/RCCL) one. Applied as a fixed cost per DMA collective: this
    # factor x the SM collective's time at a latency-bound size (comm.dma_collective_latency_s).
    # source: DMA-Latte (Pati et al., arXiv:2511.06605v1, abstract), 8 x MI300X: DMA all-gather
    # 4.5x and all-to-all 2.5x slower than RCCL at small sizes. 0 = not measured for this GPU
    # (the per-copy dma_copy_latency_s alone). fit: copy-engine collectives over a size sweep.
    dma_allgather_latency_factor: float = 0.0
    dma_alltoall_latency_factor: float = 0.0

    # ------------------------------------------------------------------ contention (contention.py)
    # Contention of communication with the computation beside it: lagom §3.2, eqs. 4-6 (NC and
    # C first-order, NT negligible). Values per GPU type are in _GPU_OVERRIDES; each says
    # where it comes from. One value per GPU type, never per workload.
    #
    # SMs one channel removes from a GEMM beside it (lagom eq. 5 uses 1). source: an NCCL
    # channel is one thread block that holds its SM alone: "NCCL CTAs won't share an SM with
    # compute kernels" (S. Jeaugey, NVIDIA/nccl#689). Check: Lagom Fig. 3(b), FFN beside a
    # 32 MB all-reduce on 8 A40 at NC=32 vs 16 (C = 16 KB): +30.2% measured, +27% modelled
    # (ccoverlap reproduce --paper lagom --case fig3-nc16-vs-nc32). fit: GEMM beside a copy
    # kernel of NC blocks, over NC.
    comm_sm_fraction_per_channel: float = 1.0
    # NT's effect on SM and memory contention: factor 1 + coeff*(NT/512 - 1). source: lagom
    # §3.2, "the effect of NT is negligible". fit: same, over NT.
    nt_contention_coeff: float = 0.02
    # HBM bytes an SM-driven collective moves per byte it sends on the wire: read what it sends,
    # write what it receives; reductions also read the local operand (+extra). source: "needs
    # to be multiplied by at least 2x for memory bandwidth ... If you add reading from or
    # writing to user data, it can be 3x" (S. Jeaugey, NVIDIA/nccl#1428). fit: GEMM slowdown
    # beside a copy kernel vs its rate.
    comm_hbm_bytes_per_wire_byte: float = 2.0
    comm_reduce_extra_hbm_bytes: float = 1.0
    dma_hbm_bytes_per_wire_byte: float = 2.0
    # L2 (lagom §3.2, global resource competition: "larger values of NC and C generate more
    # intensive contention"). A channel's FIFO holds l2_inflight_chunks chunks of C bytes: the
    # collective keeps NC x C x this bytes hot in L2. source: NCCL's Simple protocol buffer is
    # NCCL_STEPS (8) steps and a chunk ALL{REDUCE,GATHER}_CHUNKSTEPS (NCCL_STEPS/2) steps
    # (src/include/collectives.h), so NCCL_BUFFSIZE 4 MiB = 2 chunks of 2 MiB. (Our H200 sweep's
    # fit gives 0.27 for the channel-copy stand-in, which keeps no FIFO: not NCCL's value.)
    l2_inflight_chunks: float = 2.0
    # The GEMM keeps its hot operands in l2_gemm_working_set of L2: buffers up to the rest fit
    # beside them for free; beyond, they evict a growing share of the working set, all of it
    # once they fill L2 (contention.l2_share_taken). 1.0 = any footprint counts (no measurement
    # says otherwise for this GPU: assumption). A40: 0.5 (below).
    l2_gemm_working_set: float = 1.0
    # Growth of a GEMM's HBM traffic when communication buffers evict all of its working set
    # (reuse of operand panels between thread blocks lost); compute.py caps the traffic at
    # every tile reading its own panels (~9-11x for these tiles). FITTED (A100) on the fit row of
    # contention/nccl-1428 (a GEMM of a GPT step on A100-SXM4-80GB took 2.08 ms beside an NCCL
    # all-gather at NCCL's defaults vs 1.18 ms alone, NVIDIA/nccl#1428; the corpus row's GEMM
    # 8192x8192x4096 beside a 256 MiB all-gather): 4.67 gives its 1.76x with the A100's
    # corpus-fitted GEMM parameters (4.56 before the A100's power limiter [POWER]; check in
    # tests/cost/test_cost_contention.py). H100, H200,
    # MI300X: no public measurement of NCCL beside a GEMM found, the A100 value (assumption; the
    # forum's one-wave H100 GEMM beside a 24-channel all-gather, 1.70x measured, is 1.80x with
    # it, 1.76x with our H200 sweep's 1.63). A40: 1.14 (below). fit: GEMM beside copy kernel over C.
    l2_pollution_penalty: float = 4.67
    # Copy engines pollute L2 less than SM copies (ficco §IV-A: DMA removes "a portion of cache
    # interference"). assumption; fit: GEMM beside copy-engine copies.
    dma_l2_pollution_fraction: float = 0.25
    # Communication slowed by compute beside it: time x (1 + coeff * u), u = the other ops' HBM
    # utilisation. ficco §IV-D2 measures geomean 1.03 (shard-based) to 1.12 (FiCCO) slowdowns.
    # fit: collective time beside GEMMs of growing memory traffic.
    comm_compute_interference: float = 0.3
    dma_compute_interference: float = 0.3
    # SM clock a GEMM holds with every SM busy, as a fraction of the clock it reaches with few
    # SMs busy (the boost clock): the chip is power-capped, its draw grows with busy SMs x
    # clock, so a wave that leaves SMs idle runs faster (contention.clock_fraction). It sets
    # how much a one-wave GEMM loses when communication takes k SMs and pushes k tiles into a
    # second wave (the forum's "tail effect"). 1.0 = no power cap seen (A100, A40, MI300X: not
    # measured, _GPU_OVERRIDES). H100-SXM, H200: 0.76 = 1485-1530 MHz held through a back-to-back 8192^3 bf16 GEMM
    # at the 700 W limit against the 1980 MHz boost clock (our H200 run, nvidia-smi;
    # docs/gpu-h200.md "Sustained clock"; the H100 SXM shares the die and the 700 W limit:
    # assumption). fit: nvidia-smi clocks during a long GEMM loop.
    full_load_clock_fraction: float = 0.76
    # Floor on the HBM share any op keeps, fraction of achievable bandwidth (keeps eq. 6's
    # B - V positive). assumption.
    min_bandwidth_share: float = 0.1

    # ------------------------------------------------------------------ copy engines beside compute (copy_engine.py)
    # A GEMM beside copy-engine (DMA) traffic that moves a share u of the achievable HBM
    # bandwidth takes t x (1 + copy_engine_gemm_slowdown + copy_engine_gemm_interference x
    # min(u, 1)): the memory-subsystem interference that DMA offload leaves (ficco §IV-A:
    # "memory interference still remains"), which the bandwidth term above does not show on
    # compute-bound GEMMs; the first part comes with any copy-engine activity, the second
    # grows with its bytes. 0 = not measured for this GPU (the class default: no public
    # measurement found for NVIDIA copy engines). MI300X: both FITTED on FiCCO §IV-D1 /
    # Fig. 9's geometric means over Table I -- GEMM 1.11x slower beside a FiCCO transfer step,
    # 1.07x beside a shard transfer (reproduction cases ficco-gemm-cil and ficco-gemm-cil-shard,
    # marked as fit cases) -- and judged on the other cases.
    copy_engine_gemm_slowdown: float = 0.0
    copy_engine_gemm_interference: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"cost parameter {f.name}: expected a finite number, got {v!r}")
            if v < 0:
                raise ConfigError(f"cost parameter {f.name} must be non-negative, got {v}")
        for name in ("gemm_tile_m", "gemm_tile_n", "gemm_tile_k", "gemm_tiles_per_sm", "gemm_max_split_k",
                     "gemm_gemv_max_dim"):
            v = getattr(self, name)
            if int(v) != v or v < (0 if name == "gemm_gemv_max_dim" else 1):
                raise ConfigError(f"cost parameter {name} must be a positive integer, got {v}")
            if v > MAX_TILE:  # GEMM kernels tile at most 256 per side (CUTLASS, cuBLAS); past this the model pads nonsense
                raise ConfigError(f"cost parameter {name} must be at most {MAX_TILE}, got {short(v)}")
            object.__setattr__(self, name, int(v))
        for name in ("gemm_split_k_any_count",):
            if getattr(self, name) not in (0, 1):
                raise ConfigError(f"cost parameter {name} is a switch, must be 0 or 1, got {short(getattr(self, name))}")
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("gemm_peak_fraction", "attention_peak_fraction", "attention_bwd_peak_fraction",
                     "attention_fa2_peak_fraction", "attention_fa2_bwd_peak_fraction", "mem_bw_fraction",
                     "sustained_clock_fraction", "dma_link_efficiency", "dma_copy_outside_fraction", "tree_bw_efficiency",
                     "proto_ll_bw_factor",
                     "proto_ll128_bw_factor", "mem_sm_saturation_fraction", "min_bandwidth_share",
                     "channel_bytes_per_s", "net_channel_bytes_per_s", "host_link_bytes_per_s", "dma_engine_bytes_per_s",
                     "channel_saturation_sharpness", "l2_gemm_working_set", "full_load_clock_fraction",
                     "mem_rowwise_efficiency", "mem_rowwise_blocks_per_sm", "gemm_gemv_efficiency",
                     "mem_l2_bandwidth_ratio", "gemm_power_clock_fraction") + tuple(
                         f.name for f in fields(self) if f.name.startswith("link_efficiency_")):
            if getattr(self, name) <= 0:
                raise ConfigError(f"cost parameter {name} must be positive, got {getattr(self, name)}")
        for name in ("gemm_peak_fraction", "attention_peak_fraction", "attention_bwd_peak_fraction",
                     "attention_fa2_peak_fraction", "attention_fa2_bwd_peak_fraction", "mem_bw_fraction",
                     "sustained_clock_fraction", "gemm_mem_overlap", "gemm_small_tile_efficiency", "dma_link_efficiency",
                     "gemm_persistent_overhead_fraction", "gemm_power_clock_fraction",
                     "gemm_misaligned_efficiency", "mem_rowwise_efficiency", "gemm_gemv_efficiency",
                     "attention_causal_efficiency", "attention_efficient_relative",
                     "tree_bw_efficiency", "proto_ll_bw_factor", "proto_ll128_bw_factor",
                     "mem_sm_saturation_fraction", "min_bandwidth_share",
                     "dma_l2_pollution_fraction", "dma_copy_outside_fraction", "l2_gemm_working_set", "nvls_link_efficiency",
                     "mem_l2_capacity_fraction",
                     "pcie_socket_crossing_fraction") + tuple(
                         f.name for f in fields(self) if f.name.startswith("link_efficiency_")):
            if getattr(self, name) > 1:
                raise ConfigError(f"cost parameter {name} is a fraction, must be <= 1, got {getattr(self, name)}")

    def __hash__(self) -> int:
        """Hash of the field values, computed once per instance: the model's memo tables key on
        the parameters, and a fit looks the same instance up hundreds of thousands of times."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, float]:
        """All fields as a plain ``{name: number}`` mapping (JSON-ready)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, base: CostParams | None = None,
                  where: str = "cost params") -> CostParams:
        """Parameters from a mapping; missing fields come from ``base`` (default: class defaults).

        Unknown keys raise :class:`ConfigError` naming them (a typo must not silently fall
        back to a default).
        """
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a mapping of cost parameters, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{where}: unknown cost parameter(s) {unknown}")
        start = base if base is not None else cls()
        try:
            return replace(start, **d)
        except TypeError as exc:  # pragma: no cover - unknown keys are caught above
            raise ConfigError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike, *, base: CostParams | None = None,
             for_gpu: str | None = None) -> CostParams:
        """Parameters from a JSON file: a calibration file ``{"params": {...}, "gpu": ...,
        "fit_error": ...}`` or a bare ``{name: value}`` mapping. Fields it lacks come from
        ``base`` (e.g. :func:`default_params` of the GPU). ``for_gpu``: the GPU the parameters
        will model; a calibration file of another GPU is a ConfigError (parameters are one GPU
        type's), as is a file format newer than this version reads."""

        p = Path(path)
        data = read_json_object(p, "calibration file")
        if "params" in data:
            extra = sorted(set(data) - {"params", "gpu", "fit_error", "source", "notes", "version"})
            if extra:
                raise ConfigError(f"{p}: unknown calibration key(s) {extra}")
            _check_meta(p, data, for_gpu)
            data = data["params"]
        return cls.from_dict(data, base=base, where=str(p))

    def save(self, path: str | os.PathLike, **meta: Any) -> None:
        """Write a calibration file ``{"params": ..., **meta}`` (meta: ``gpu``, ``fit_error``),
        atomically (:func:`ccoverlap.outputs.write_text`; ConfigError when it cannot be written)."""
        from ccoverlap.outputs import write_text

        write_text(path, json.dumps({"params": self.to_dict(), **meta}, indent=2, sort_keys=True) + "\n")

    def with_overrides(self, **kw: Any) -> CostParams:
        """A copy with some fields replaced; unknown names raise :class:`ConfigError`."""
        return self.from_dict(kw, base=self, where="with_overrides")

    def link_efficiency(self, fabric: str) -> float:
        """Achieved fraction of line rate (Simple protocol) on a fabric of :data:`hardware.FABRICS`."""
        if fabric in ("nvswitch", "nvlink_pair"):
            return self.link_efficiency_nvlink
        if fabric == "pcie":
            return self.link_efficiency_pcie
        if fabric == "full_mesh":
            return self.link_efficiency_xgmi
        if fabric in ("infiniband", "roce"):
            return self.link_efficiency_network
        if fabric == "efa":
            return self.link_efficiency_efa
        return self.link_efficiency_ethernet


# ----------------------------------------------------------------------------- defaults per GPU
# Per-GPU overrides of the class defaults (which are the H100 values, less the H100 SXM's power-limiter
# fit [POWER], which moves its GEMM fields and is kept to that GPU). Sources:
#  [KFIT]  FITTED on the declared fit half of the kernel corpus (ccoverlap/data/corpus: gemm/vidur-a100,
#          vidur-a40, h200-sweep; memory/vidur-a100, vidur-a40) by benchmarks/fit_kernel_params.py
#          (Nelder-Mead on mean |log(pred/measured)|), judged on the held-out half by
#          `ccoverlap validate kernels`. H200 has no memory table: the H100 values (assumption).
#          H100-96GB-HBM2e-500W: sustained_clock_fraction on gemm/fbgemm-2546-h100-500w's fit half.
#  [COMM]  communication fitted on the collective corpus' declared fit half, one value per GPU
#          (`python benchmarks/fit_collectives.py`; docs/model.md "Communication"):
#          A100: vidur a100_dgx all_reduce / send_recv and a100_pairwise_nvlink (4 x A100 PCIe,
#          bridged pairs) tables: host issue time 54 us, PCIe 0.42 (4 GPUs over two bridged pairs,
#          24 GB/s busbw: the path between the pairs crosses the host); NVLink stays at the
#          large-message 0.78 above (the tables stop at 64 MiB, inside NCCL's ramp). A40: vidur a40 all_reduce (8 x A40,
#          bridged pairs, two sockets): host issue time 7 us, NVLink 1.0 (2 GPUs of a pair reach
#          45-46 GB/s of the 50 GB/s line the catalog takes from lagom; the bridge is 56.25),
#          PCIe 0.88 (4 GPUs of one socket: 58 GB/s busbw of 2 x 31.5), socket crossing 0.48
#          (8 GPUs: 26 GB/s).
#  [SPLITK] A100: gemm_split_k_any_count 1. The held-out GEMMs of gemm/vidur-a100 under one wave
#          with a long K (m 96-512, k 7-28k) ran up to 1.6x faster than the model with power-of-two
#          splits inside one wave (256x4096x14336: 135 us measured, 221 us predicted; 223 TFLOP/s
#          needs ~96 of the 108 SMs: a 3-way split of its 32 tiles). The fitted GEMM fields keep
#          their earlier fit: refitting them with the switch (benchmarks/fit_kernel_params.py)
#          moves the large training GEMMs ~1-3% faster and `validate published` from 8.3% to
#          8.4%; refitting gemm_mem_overlap alone (0.645 -> 0.680) moves the nccl-1428 contention
#          fit row (1.76x -> 1.73x) that l2_pollution_penalty is fitted on. On H100, H200 and
#          A40 the switch does not help the held-out half (H100 6.2%/9.1% -> 6.4%/9.3%): 0 there.
#          Past one wave too (a partial last wave split K any number of ways): 64 of the 78
#          vidur-a100 fit rows it changes move closer (256x8192x8192: 184.5 us measured, 200 ->
#          187 us), held-out A100 GEMMs 5.4%/7.1% -> 5.3%/6.9%. Refitting the five GEMM fields
#          with it (fit_kernel_params.py: peak 0.830, tile overhead 1.46 K steps, overlap 0.666,
#          gemv 0.228) gives 4.9%/6.7% held-out but takes `validate published` from 8.2%/-0.2%
#          to 8.3%/-0.7% and the nccl-1428 contention row (1.76x) to 2.66x: not taken, the
#          earlier fit kept.
#  [PERSIST] gemm_persistent_overhead_fraction 1 (every wave pays the tile overhead) where the
#          GEMM kernels are not persistent: Ampere (A100, A40) and MI300X (not fitted). H200: its
#          fit half refitted with the field gives 1.0 (its tile overhead is 1.09 K steps, little
#          to amortise), so its fitted fields stay as they were, the bandwidth of its gemv path
#          pinned at the 0.547 it was fitted with.
#          H100 SXM: with it (0.249) the held-out H100 GEMMs go from 6.2% / 9.1% to 5.9% / 8.4%
#          median / mean |error| (OpenXLA 9.1% / 11.1% -> 4.4% / 7.3%, vidur 5.6% / 8.6% ->
#          6.1% / 8.6%). Tried and rejected by the fit half: stream-K (Osama et al. 2023,
#          arXiv:2301.03598) for the last partial wave or a sub-wave GEMM, the fixup fitted to
#          ~78 K steps (never chosen); with the sub-wave GEMMs too, vidur's held-out rows went to
#          8.3% median.
#  [POWER] H100 SXM: the power limiter (gemm_power_clock_fraction, gemm_power_settle_s) and the
#          serial split-K fixup (gemm_split_k_fixup_s) FITTED with the GEMM fields on the fit
#          half of gemm/vidur-h100 and gemm/xla-h100 (benchmarks/fit_kernel_params.py). On that
#          half, before: vidur's GEMMs of 0.3-3 ms ran 7-16% slower than predicted (-13% to -16%
#          signed error from 0.5 ms on, 1/0.865 as the sustained clock would give), those of
#          30-200 us within 1%; GEMMs split K 4-8 ways 11-14% slower in both tables. The
#          held-out H100 GEMM rows: 5.9% / 8.4% -> 5.1% / 7.4% median / mean |error| (vidur
#          6.1% / 8.6% -> 5.3% / 7.7%, OpenXLA 4.4% / 7.3% -> 3.9% / 5.8%).
#          gemm_peak_fraction runs into its bound (1.0: the datasheet's 989 TFLOP/s is at
#          1830 MHz, the boost clock short loops start at is 1980).
#          A100: the limiter and the fixup FITTED with gemm_peak_fraction on the fit half of
#          gemm/vidur-a100 (started at the H100's scale: from the limiter off, Nelder-Mead leaves
#          the time constant and the fixup at ~0 and the clock fraction acts as a lower peak;
#          rerun from the result until it stays), its other GEMM fields kept ([SPLITK]: refitted
#          they move the nccl-1428 contention row). On that half, before: GEMMs of 32-256 us ran
#          2-5% faster than predicted (signed error +1.9% to +5.1%), those past 0.5 ms 1-3%
#          slower. Fitted: c 0.887 (1251 of 1410 MHz; NVIDIA's A100 HPL Rpeak takes 1305 MHz at
#          the power limit: sustained_clock_fraction), 257 us, 0.13 us a K piece, peak 0.847 ->
#          0.920; a long GEMM runs at 0.816 of peak where it ran at 0.847. Held-out A100 GEMMs
#          5.3% / 6.9% -> 4.8% / 6.5% median / mean |error|; fit half 5.6% / 7.1% -> 5.1% / 6.6%.
#          l2_pollution_penalty refitted with them on nccl-1428 (4.56 -> 4.67). Refitting the
#          other four GEMM fields too gives 4.6% / 6.2% held-out (from an earlier start) but
#          takes the nccl-1428 fit row from 1.76x to 1.70x: not taken. A40, H200 and MI300X
#          keep 1 (not fitted).
#  [REUSE] A smaller tile's per-SM rate follows its operand reuse (the FLOPs per byte it loads
#          into shared memory, tm*tn/(tm+tn)), not the count of halvings: 128x128 keeps 75% of
#          128x256's reuse, 64x256 60%, 64x128 50%, where one value per halving charged 128x128
#          and 64x256 alike. On the H100's fit half the model's GEMMs on 128x128 tiles were 4-9%
#          too slow (mean signed error, per table) and those on 64x256 tiles 6-10% too fast. Refitted with every
#          H100 SXM GEMM field (benchmarks/fit_kernel_params.py): s 0.756 per halving -> 0.571
#          per halving of reuse (128x128 0.79, 64x256 0.66, 64x128 0.57); fit-half mean |log
#          error| 0.0655 -> 0.0641; held-out H100 GEMM rows 5.1% / 7.4% -> 5.0% / 7.3% median /
#          mean |error|. A100 and A40 (s = 1) are unchanged; the H200's fitted 0.984 and the
#          MI300X's assumed 0.621 are kept (the H200's tiles move < 1%).
#  [A100]  cuBLAS bf16 large GEMMs ~260-280 of 312 TFLOP/s and NCCL ring busbw ~230 of 300 GB/s on
#          DGX A100 are the commonly reported figures (assumption until calibrated); Ampere
#          kernels use a 32-deep K step.
#  [FA2]   FlashAttention-2 is the native flash kernel on Ampere: Dao 2023 (arXiv:2307.08691)
#          Figs. 4-6, A100, head dim 128, long sequences: forward ~0.65-0.73 of peak (causal at the
#          low end), backward ~0.5-0.6 -> 0.65 / 0.55 (read from the figures, approximate). A40 and
#          MI300X: the same forward/backward ratio (~0.84) applied to their assumed forward value.
#  [A40]   GA102, 100 KB shared memory per SM -> 128x128 tiles; board power limits sustained
#          tensor throughput (assumption ~0.7 of peak); GDDR6 ~0.85 of 696 GB/s; PCIe 4.0 host.
#  [A40c]  contention on A40 (lagom §3.2-§4.3, the paper's own GPU):
#          channel_bytes_per_s 20 GB/s: lagom §4.3, NC=2 "slightly reduces communication speed"
#          against NC=8 on cluster A's 400 Gb/s (50 GB/s) NVLink, so two channels reach most of
#          that link (at 20 GB/s each ~80% of it);
#          l2_gemm_working_set 0.5: lagom §4.3, (NC=2, C=684 KB) "significantly alleviates
#          contention": 2 x 684 KB x 2 chunks = 2.7 MB in flight, 45% of the 6 MB L2, leaves
#          the GEMMs their reuse; l2_pollution_penalty 1.14: FITTED on lagom §1, "our analysis
#          reveals that communication contention still degrades the performance of the
#          bottlenecked computation by up to 35%", read on that analysis' own setting (§3.2,
#          Fig. 3: an FFN beside a 32 MB all-reduce on 8 A40 PCIe) at NCCL's defaults there
#          (NC=2, C=2 MB): Phi-2's FFN (4096 tokens) takes 1.35x its time alone with 1.14
#          (1.28x at 1.0, 1.38x at 1.2), refitted on the same statement with the A40 GEMM
#          parameters fitted on the kernel corpus [KFIT] (it was 1.95 with the older ones). Checked in tests/cost/test_cost_contention.py and
#          judged on the paper's other figures (docs/seeds.md).
#  [MI300X] hipBLASLt bf16 GEMMs reach roughly half of the 1307 TFLOP/s datasheet peak in public
#          benchmarks; 256x256 macro tiles; ~4.0-4.3 of 5.3 TB/s HBM3; one SDMA engine per
#          xGMI link at ~50 GB/s (ficco §IV-B1, 64 GB/s links); DMA all-gather / all-to-all 4.5x /
#          2.5x RCCL's time at latency-bound sizes (DMA-Latte, arXiv:2511.06605v1).
#  [LLSTEP] H100 SXM: proto_ll_latency_factor 0.374 (class default 0.25), FITTED with the H100's
#          other communication values on the fit halves of its collective tables, among them the
#          one-node nccl-tests sweep of NVIDIA/dgxc-benchmarking (8 B-16 GiB, NCCL's own
#          choices), whose small all-reduces (64 B-512 KiB: 15-21 us) are LL rings:
#          6 us + 14 steps x 0.75 us (`python benchmarks/fit_collectives.py --gpu H100-SXM`).
#          NCCL's tuning model rates an NVLink ring step 0.6 us in LL, 3.4 us in Simple
#          (src/graph/tuning.cc). The two-node H100 clusters' step latencies refitted with it
#          (a3-mega 262 -> 169 us a Simple step, aws-p5 152 -> 96 us; their LL steps 65 -> 63
#          and 38 -> 36 us). Held-out dgxc rows below 16 MiB: 16.5% / -21.2% -> 9.0% / -6.0%
#          median / mean signed error.
#  [DMALAT] MI300X: dma_copy_outside_fraction 0.71, FITTED on the 1 KB row of AMD-DMA-Latte's
#          copy-phase breakdown (contention corpus table dma-latte-phases, role fit): a 1 KB
#          SDMA peer copy spends 71% of its time outside the transfer (control, schedule,
#          sync) and 29% in it, where the bytes take nothing, so that 29% is the transfer's own
#          fixed start. The table's other seven sizes (64 KB-16 MB) are judged with it.
#  [RCCLLAT] comm_base_latency_s 12 us: RCCL's time model (ROCm/rccl src/graph/tuning.cc,
#          RCCL 2.21.5) starts every collective at baseLat 12 us for LL / LL128 (17 us Simple),
#          where NCCL's starts at 6.6-6.8 (8.4); the per-step latencies RCCL uses for 8 x MI300X
#          on xGMI (tuning_model_5, set for these nodes by ROCm/rccl#1047: 0.8 us LL, 2.1 us
#          Simple per ring step) are close to the catalog's mesh hop (2.0 us Simple, 0.5 us LL,
#          left as they are). RCCL's model thus puts a 1 KiB all-gather of 8 x MI300X at
#          12 + 7 x 0.8 = 17.6 us, this model at 15.8 us (9.8 us with the 6 us default).
#          Measured, RCCL is not faster: Azure ND MI300X v5 (RCCL 2.22.3, rccl-tests
#          all-reduce, busbw 0.04 GB/s at 1 KB) takes ~45 us; on MI250X, rccl-tests took
#          25-31 us for a 16-GCD all-reduce of 8 B-1 KB and 34-35 us for an all-gather of
#          64 B-8 KB (ROCm/rccl#929, #930).
_GPU_OVERRIDES: dict[str, dict[str, Any]] = {
    "H100-SXM": {"gemm_power_clock_fraction": 0.778, "gemm_power_settle_s": 1.42e-4,  # [POWER]
                 "gemm_split_k_fixup_s": 4.34e-7, "gemm_peak_fraction": 1.0, "gemm_small_tile_efficiency": 0.571,
                 "gemm_tile_overhead_ksteps": 9.84, "gemm_mem_overlap": 0.894, "gemm_gemv_efficiency": 0.688,
                 "gemm_persistent_overhead_fraction": 0.209,
                 "proto_ll_latency_factor": 0.374},  # [LLSTEP]
    # [KFIT] FBGEMM's H100 500 W GEMM loops (fit half: the FP8 rows) run 0.735 of the clock behind
    # the power-scaled peak the catalog assumes for this part (fitted from the class defaults)
    "H100-96GB-HBM2e-500W": {"sustained_clock_fraction": 0.735},
    "H200": {"mem_bw_fraction": 0.88,  # [KFIT]
             "gemm_peak_fraction": 0.727, "gemm_small_tile_efficiency": 0.984, "gemm_tile_overhead_ksteps": 1.09,
             "gemm_mem_overlap": 1.0, "gemm_gemv_efficiency": 0.547,
             "gemm_persistent_overhead_fraction": 1.0},  # [PERSIST]
    "A100-80GB-SXM": {"full_load_clock_fraction": 1.0, "nvls_link_efficiency": 0.0,
                      "gemm_split_k_any_count": 1,  # [SPLITK]
                      "gemm_persistent_overhead_fraction": 1.0,  # [PERSIST]
                      "gemm_power_clock_fraction": 0.887, "gemm_power_settle_s": 2.57e-4,  # [POWER]
                      "gemm_split_k_fixup_s": 1.31e-7, "gemm_peak_fraction": 0.920,  # [POWER]
                      "gemm_small_tile_efficiency": 1.0,  # [KFIT]
                      "gemm_tile_overhead_ksteps": 5.46, "gemm_mem_overlap": 0.645, "gemm_gemv_efficiency": 0.597,
                      "mem_rowwise_efficiency": 0.488, "mem_rowwise_latency_s": 1.0e-6,
                      "mem_rowwise_blocks_per_sm": 1.12, "mem_l2_capacity_fraction": 0.459, "mem_l2_bandwidth_ratio": 1.24,
                      "gemm_misaligned_efficiency": 0.5, "gemm_tile_k": 32, "channel_bytes_per_s": 30e9,
                      "link_efficiency_nvlink": 0.78, "link_efficiency_pcie": 0.42,  # [COMM]
                      "comm_host_issue_s": 54.0e-6,  # [COMM]
                      # FITTED with aws-p4d's hop latency on nccl_tests_aws_p4d_a100_2x8_all_reduce's
                      # fit half (NCCL 2.8.3 over 4 x 100 Gb/s EFA a node: 32.7 GB/s busbw at 1 GiB,
                      # through the ring NCCL's tuner picks there: comm.tuner_time_s)
                      "link_efficiency_efa": 0.53,
                      "host_link_bytes_per_s": 25e9,
                      # forward: [KFIT] on attention/pytorch-126122-a100's fit half (FA2 0.61, cuDNN
                      # 0.58; the FA2 paper's figures read ~0.65); backward: [FA2]
                      "attention_peak_fraction": 0.575, "attention_bwd_peak_fraction": 0.55,
                      "attention_fa2_peak_fraction": 0.611, "attention_fa2_bwd_peak_fraction": 0.55},
    "A40": {"full_load_clock_fraction": 1.0, "nvls_link_efficiency": 0.0, "link_efficiency_nvlink": 1.0, "link_efficiency_pcie": 0.88,  # [COMM]
            "pcie_socket_crossing_fraction": 0.48, "comm_host_issue_s": 7.0e-6,  # [COMM]
            "gemm_persistent_overhead_fraction": 1.0,  # [PERSIST]
            "gemm_peak_fraction": 0.916, "gemm_small_tile_efficiency": 1.0, "gemm_tile_overhead_ksteps": 0.375,  # [KFIT]
            "gemm_mem_overlap": 0.664, "gemm_gemv_efficiency": 0.925, "mem_rowwise_efficiency": 0.892, "mem_rowwise_blocks_per_sm": 0.728,
            "mem_rowwise_latency_s": 1.0e-6, "mem_l2_capacity_fraction": 0.629, "mem_l2_bandwidth_ratio": 1.53,
            "gemm_misaligned_efficiency": 0.5, "gemm_tile_m": 128, "gemm_tile_n": 128, "gemm_tile_k": 32,
            "mem_bw_fraction": 0.85, "host_link_bytes_per_s": 25e9,
            "channel_bytes_per_s": 20e9, "l2_pollution_penalty": 1.14, "l2_gemm_working_set": 0.5,  # [A40c]
            "attention_peak_fraction": 0.5, "attention_bwd_peak_fraction": 0.42,
            "attention_fa2_peak_fraction": 0.5, "attention_fa2_bwd_peak_fraction": 0.42},
    "MI300X": {"full_load_clock_fraction": 1.0, "nvls_link_efficiency": 0.0, "gemm_persistent_overhead_fraction": 1.0,
               # the H100 GEMM fields fitted without persistence (no MI300X GEMM table: assumption)
               "gemm_small_tile_efficiency": 0.621, "gemm_tile_overhead_ksteps": 5.54, "gemm_mem_overlap": 0.930,
               "gemm_peak_fraction": 0.55, "gemm_tile_m": 256, "gemm_tile_n": 256,
               "mem_bw_fraction": 0.80, "channel_bytes_per_s": 20e9, "attention_peak_fraction": 0.4,
               "attention_bwd_peak_fraction": 0.33, "attention_fa2_peak_fraction": 0.4,
               "attention_fa2_bwd_peak_fraction": 0.33,
               "dma_engine_bytes_per_s": 50e9, "dma_link_efficiency": 0.8,
               "dma_allgather_latency_factor": 4.5, "dma_alltoall_latency_factor": 2.5,
               "dma_copy_outside_fraction": 0.71,  # [DMALAT]
               "comm_base_latency_s": 12.0e-6,  # [RCCLLAT]
               "copy_engine_gemm_slowdown": 0.054, "copy_engine_gemm_interference": 0.266},  # fitted: see the fields
}
# Causal-mask derating of flash attention on Hopper, by the kernel's sequence length. Source:
# FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608) Fig. 5, H100 80GB SXM5, head dim
# 128, forward TFLOP/s (causal FLOPs counted as half): FlashAttention-2 non-causal plateaus at
# 370 (the attention_fa2_peak_fraction 0.37), causal 191 / 260 / 298 / 319 / 333 / 335 at
# 512 / 1k / 2k / 4k / 8k / 16k; cuDNN non-causal ~600 (attention_peak_fraction 0.61), causal
# 315 / 410 / 484 / 518 / 529 / 539. The factor is causal / non-causal plateau, interpolated in
# log2(seq), held at the ends. ASSUMPTION: the backward kernel is derated by the same factor
# (the paper's backward figure is non-causal), and the A100 fractions (read from the FA2 paper
# at the causal low end) are not derated again.
CAUSAL_ATTENTION_FACTOR_HOPPER: dict[str, tuple[tuple[int, float], ...]] = {
    "fa2": tuple((s, v / 370.0) for s, v in ((512, 191), (1024, 260), (2048, 298), (4096, 319),
                                             (8192, 333), (16384, 335))),
    "native": tuple((s, v / 600.0) for s, v in ((512, 315), (1024, 410), (2048, 484), (4096, 518),
                                                (8192, 529), (16384, 539))),
}


def causal_attention_factor(kernel: str, seq_len: int) -> float:
    """Fraction of its non-causal speed a causal flash kernel of ``seq_len`` keeps on Hopper
    (:data:`CAUSAL_ATTENTION_FACTOR_HOPPER`, FA3 paper Fig. 5); 1.0 for ``seq_len`` <= 0."""
    import math

    if seq_len <= 0:
        return 1.0
    pts = CAUSAL_ATTENTION_FACTOR_HOPPER["fa2" if kernel == "fa2" else "native"]
    if seq_len <= pts[0][0]:
        return pts[0][1]
    if seq_len >= pts[-1][0]:
        return pts[-1][1]
    x = math.log2(seq_len)
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if s0 <= seq_len <= s1:
            t = (x - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
            return v0 + t * (v1 - v0)
    return pts[-1][1]


_VENDOR_OVERRIDES: dict[str, dict[str, Any]] = {"nvidia": {}, "amd": _GPU_OVERRIDES["MI300X"]}

# Clock a GPU sustains through a long training step, where its kernel parameters above were fitted
# on short microbenchmarks at the clock the chip holds for them (the kernel corpus: vidur's and
# OpenXLA's single-op timings). H100 SXM: 0.865, measured on this project's H200 (the same GH100
# at 700 W) after 20 s of a GEMM loop (calibrations/h200.json, docs/gpu-h200.md) -- a
# measurement, not a fit to step times. H200 itself is not listed: its GEMM parameters were fitted
# on a 20-s graph-replayed sweep that already ran at that clock.
_SUSTAINED_CLOCK: dict[str, float] = {"H100-SXM": 0.865}

#: the largest GEMM tile side (and tiles per SM) a parameter may give
MAX_TILE = 4096
#: the calibration file format this version reads (ccoverlap.calibrate.fileformat writes it)
CALIBRATION_VERSION = 1


def _gpu_key(name: str) -> str:
    """A GPU name as the catalog spells it (aliases resolved), else lower-cased."""
    from ccoverlap.catalog.hardware import get_gpu

    try:
        return get_gpu(name).name
    except ConfigError:
        return name.strip().lower()


def _check_meta(p: Path, data: dict, for_gpu: str | None) -> None:
    """ConfigError when calibration file ``p``'s ``version`` is not one this version reads or its
    ``gpu`` is not text or not ``for_gpu``."""
    v = data.get("version", CALIBRATION_VERSION)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{p}: field 'version': expected a positive integer, got {short(v)}")
    if v > CALIBRATION_VERSION:
        raise ConfigError(f"{p}: file format version {short(v)} is newer than this ccoverlap reads "
                          f"({CALIBRATION_VERSION}); upgrade ccoverlap")
    gpu = data.get("gpu")
    if gpu is not None and (not isinstance(gpu, str) or not gpu.strip()):
        raise ConfigError(f"{p}: field 'gpu': expected a GPU name, got {short(gpu)}")
    if gpu and for_gpu and _gpu_key(gpu) != _gpu_key(for_gpu):
        raise ConfigError(f"{p}: a calibration of {short(gpu)}, not of the cluster's {for_gpu} GPUs "
                          f"(its parameters are one GPU type's: calibrate that GPU, or leave the file out)")


def default_params(gpu: GPUSpec | None = None, *, sustained: bool = True) -> CostParams:
    """The default :class:`CostParams` for ``gpu`` (catalog name match first, then vendor),
    or the H100-based class defaults when ``gpu`` is None or unknown. ``sustained=False``: at
    the microbenchmarks' clock (without :data:`_SUSTAINED_CLOCK`), as kernel tables were timed."""
    if gpu is None:
        return CostParams()
    if not isinstance(gpu, GPUSpec):
        raise ConfigError(f"default_params: gpu must be a GPUSpec (ccoverlap.catalog.hardware.get_gpu(name) gives "
                          f"one) or None, got {short(gpu)}")
    over = _GPU_OVERRIDES.get(gpu.name)
    if over is None:
        over = _VENDOR_OVERRIDES.get(gpu.vendor.lower(), {})
    if sustained and gpu.name in _SUSTAINED_CLOCK:
        over = {**over, "sustained_clock_fraction": _SUSTAINED_CLOCK[gpu.name]}
    return CostParams(**over)


def checked_inputs(function: str, spec: Any, kind: type, hardware: Any, params: Any,
                   **amounts: float | None) -> CostParams:
    """``params`` (default :class:`CostParams`) once ``spec`` is a ``kind``, ``hardware`` the
    GPUSpec (compute ops) or ClusterSpec (communication) the function takes, ``params`` None or
    a CostParams and each of ``amounts`` (SMs, bytes/s, a pollution fraction: the functions
    clamp them to their range) None or a finite number; else one ConfigError naming
    ``function`` and the argument. The entry check of the cost model's public functions."""
    if not isinstance(spec, kind):
        raise ConfigError(f"{function} needs a {kind.__name__}, got {type(spec).__name__}")
    compute = kind.__name__ in ("GemmSpec", "AttentionSpec", "MemorySpec")
    want, name, how = (GPUSpec, "gpu", "get_gpu") if compute else (ClusterSpec, "cluster", "get_cluster")
    if not isinstance(hardware, want):
        raise ConfigError(f"{function}: {name} must be a {want.__name__} (ccoverlap.catalog.hardware.{how}(name) "
                          f"gives one), got {short(hardware)}")
    if params is not None and not isinstance(params, CostParams):
        raise ConfigError(f"{function}: params must be a CostParams or None, got {short(params)}")
    for arg, value in amounts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise ConfigError(f"{function}: {arg} must be a finite number, got {short(value)}")
    if params is not None:
        return params
    # communication defaults follow the cluster's GPU (its fitted link efficiencies and
    # latencies); compute keeps the class defaults, as before
    return default_params(hardware.gpu) if isinstance(hardware, ClusterSpec) else CostParams()
