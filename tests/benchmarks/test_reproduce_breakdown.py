"""benchmarks/reproduce_breakdown.py: its no-contention parameters switch off every way
communication slows computation in the cost model (else its ``no-cont`` bound would be too
low), and its breakdown of one Lagom setting adds up."""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench_scripts import load_script

from ccoverlap.catalog.hardware import CLUSTERS
from ccoverlap.cost.model import CostModel
from ccoverlap.cost.params import default_params
from ccoverlap.specs import AttentionSpec, CollectiveSpec, CommConfig, GemmSpec, GroupSpec

rb = load_script("reproduce_breakdown")
NODE8 = GroupSpec(name="dp", size=8, local_size=8)


@pytest.mark.parametrize("cluster", ["a40-nvlink", "a40-pcie", "dgx-h100"])
def test_no_contention_params_leave_computation_alone(cluster):
    cl = CLUSTERS[cluster]
    base = default_params(cl.gpu)
    free = replace(base, **rb.NO_CONTENTION)
    ffn = GemmSpec(m=4096, n=10240, k=2560)
    attn = AttentionSpec(flops=2 * 4 * 2 * 32 * 2048 * 2048 * 80, bytes=4 * 2 * 2048 * 2560 * 2)
    ag = CollectiveSpec(collective="all_gather", bytes=150 << 20, group=NODE8,
                        config=CommConfig(channels=32, chunk_bytes=2 << 20))
    for op in (ffn, attn):
        assert CostModel(cl, params=base).duration_s(op, (ag,)) > CostModel(cl, params=base).duration_s(op)
        assert CostModel(cl, params=free).duration_s(op, (ag,)) == pytest.approx(
            CostModel(cl, params=free).duration_s(op), rel=1e-9)


def test_breakdown_of_one_setting():
    wl = {"model": "phi-2", "cluster": "a40-nvlink", "nodes": 1,
          "parallel": {"dp": 8, "data_parallel": "fsdp"},
          "batch": {"global_batch": 16, "micro_batch": 2, "seq_len": 2048}}
    b = rb.breakdown(wl)
    assert set(b) == {"nccl", "lagom", "autoccl"}
    for row in b.values():
        assert row["exposed"] <= row["comm"] + 1e-9
        assert row["step"] >= row["compute"]
    # Lagom is never slower than NCCL's defaults, and relieves contention: its computation is shorter
    assert b["lagom"]["step"] <= b["nccl"]["step"]
    assert b["lagom"]["compute"] < b["nccl"]["compute"]
    assert rb.without_contention(wl) < b["nccl"]["step"]
