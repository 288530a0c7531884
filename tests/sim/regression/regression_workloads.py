"""The workloads of the simulator regression fixture (``step_baseline.json``).

Each entry is a workload mapping in the config-file schema of :mod:`ccoverlap.predict.workload`;
together they cover DDP (with and without the distributed optimizer), FSDP, TP+SP with
chunked TP overlap, every pipeline schedule (GPipe, 1F1B, interleaved, DualPipe), expert
parallelism with two-batch overlap, recomputation, a parallel-block model and overlap off.
Batches are small so the whole set simulates in a few seconds.
"""

from __future__ import annotations

WORKLOADS: dict[str, dict] = {
    "ddp-8b": {
        "model": "llama-3-8b", "cluster": "dgx-h100", "nodes": 1,
        "parallel": {"dp": 8},
        "batch": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048},
    },
    "ddp-distopt-no-overlap": {
        "model": "llama-3-8b", "cluster": "dgx-h100", "nodes": 2,
        "parallel": {"tp": 2, "dp": 8, "distributed_optimizer": True},
        "batch": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048},
        "knobs": {"overlap": False},
    },
    "ddp-distopt-overlap": {
        "model": "llama-3-8b", "cluster": "dgx-h100", "nodes": 2,
        "parallel": {"tp": 2, "dp": 8, "distributed_optimizer": True},
        "batch": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048},
        "knobs": {"bucket_cap_mb": 40},
    },
    "fsdp-a40-example": {
        "model": "llama-3-8b", "cluster": "a40-pcie", "nodes": 2,
        "parallel": {"dp": 16, "data_parallel": "fsdp"},
        "batch": {"global_batch": 32, "micro_batch": 1, "seq_len": 4096},
    },
    "tp-sp-fsdp-chunked": {
        "model": "llama-3-70b", "cluster": "dgx-h100", "nodes": 2,
        "parallel": {"tp": 8, "dp": 2, "data_parallel": "fsdp", "sequence_parallel": True},
        "batch": {"global_batch": 4, "micro_batch": 1, "seq_len": 4096},
        "knobs": {"tp_overlap": "chunked", "tp_chunks": 4, "fsdp_reshard_after_forward": False},
    },
    "pp-gpipe-full-recompute": {
        "model": "llama-3-8b", "cluster": "dgx-h100", "nodes": 1,
        "parallel": {"tp": 2, "pp": 4, "pp_schedule": "gpipe", "recompute": "full"},
        "batch": {"global_batch": 8, "micro_batch": 1, "seq_len": 2048},
    },
    "pp-1f1b-fsdp-sp": {
        "model": "llama-3-70b", "cluster": "dgx-h100", "nodes": 4,
        "parallel": {"tp": 8, "pp": 2, "dp": 2, "data_parallel": "fsdp", "sequence_parallel": True,
                     "pp_schedule": "1f1b"},
        "batch": {"global_batch": 8, "micro_batch": 1, "seq_len": 4096},
    },
    "pp-interleaved-gpt3": {
        "model": "gpt3-175b", "cluster": "dgx-a100", "nodes": 4,
        "parallel": {"tp": 8, "pp": 4, "dp": 1, "pp_schedule": "interleaved", "virtual_stages": 3,
                     "recompute": "selective"},
        "batch": {"global_batch": 8, "micro_batch": 1, "seq_len": 2048},
    },
    "pp-dualpipe-moe-ep": {
        "model": "deepseek-moe-16b", "cluster": "dgx-h100", "nodes": 4,
        "parallel": {"pp": 4, "dp": 8, "ep": 8, "pp_schedule": "dualpipe"},
        "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 2048},
        "knobs": {"ep_overlap": True},
    },
    "ep-mixtral-two-batch": {
        "model": "mixtral-8x7b", "cluster": "dgx-h100", "nodes": 2,
        "parallel": {"dp": 16, "ep": 8, "data_parallel": "fsdp"},
        "batch": {"global_batch": 32, "micro_batch": 1, "seq_len": 4096},
        "knobs": {"ep_overlap": True},
    },
    "ep-olmoe-tp-sp-ddp": {
        "model": "olmoe-1b-7b", "cluster": "dgx-h100", "nodes": 2,
        "parallel": {"tp": 2, "dp": 8, "ep": 4, "sequence_parallel": True},
        "batch": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048},
    },
    "pp-overlap-off-phi2": {
        "model": "phi-2", "cluster": "dgx-h100", "nodes": 1,
        "parallel": {"tp": 2, "pp": 2, "dp": 2, "pp_schedule": "1f1b"},
        "batch": {"global_batch": 8, "micro_batch": 1, "seq_len": 2048},
        "knobs": {"overlap": False},
    },
    "pp-blocking-p2p-interleaved": {
        "model": "llama-3-8b", "cluster": "dgx-h100", "nodes": 2,
        "parallel": {"tp": 2, "pp": 4, "dp": 2, "pp_schedule": "interleaved", "virtual_stages": 2,
                     "data_parallel": "fsdp"},
        "batch": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048},
        "knobs": {"pp_p2p_overlap": False, "fsdp_prefetch": 2},
    },
}


def metrics_of(step, tl) -> dict:
    """The numbers the fixture records for one simulated step (seconds; ratios unitless).

    ``ranks``: per simulated rank, its op count, the sums of its ops' start and end times
    (a fingerprint that any change of any op's timing moves) and its rank metrics."""
    import numpy as np

    from ccoverlap.sim.timeline import all_rank_metrics, step_time_s

    out = {"ops": len(step.graph), "step_time_s": step_time_s(tl), "ranks": {}}
    for m in all_rank_metrics(tl):
        sel = tl.rank == m.rank
        out["ranks"][str(m.rank)] = {
            "ops": int(np.sum(sel)),
            "sum_start_s": float(np.sum(tl.start_s[sel])),
            "sum_end_s": float(np.sum(tl.end_s[sel])),
            "step_time_s": m.step_time_s, "compute_s": m.compute_s, "comm_s": m.comm_s,
            "overlap_s": m.overlap_s, "exposed_comm_s": m.exposed_comm_s, "idle_s": m.idle_s,
        }
    return out
