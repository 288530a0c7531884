"""benchmarks/published_breakdown.py: NCCL 2021's LL128 / Simple crossover from its constants,
the kernel corpus's error near a GEMM, and one run's predicted step split by term."""

from __future__ import annotations

import dataclasses

import pytest
from bench_scripts import load_script

from ccoverlap.specs import GemmSpec
from ccoverlap.validation.reader import PUBLISHED, load_runs

pb = load_script("published_breakdown")


def test_nccl_2021_crossover_is_where_the_two_ratings_meet():
    r = pb.NCCL_2021_A100
    simple_bus = min(r.graph_bytes_per_s, r.cap_bytes_per_s)
    assert simple_bus == 235e9  # the compute-capability-8.0 cap binds 12 x 21 GB/s
    ll128_bus = min(r.ll128_fraction * simple_bus, r.ll128_cap_bytes_per_s)
    assert ll128_bus == pytest.approx(202.8e9)  # the per-channel cap binds, not 0.92 x 235
    for n in (2, 4, 8):
        m = r.crossover_bytes(n)
        steps = 2 * (n - 1)

        def rated(base: float, step: float, bus: float, size: float) -> float:
            return (base + steps * step) * 1e-6 + size / (bus * n / steps)  # noqa: B023

        simple = rated(r.base_latency_us[0], r.nvlink_step_us[0], simple_bus, m)
        ll128 = rated(r.base_latency_us[1], r.nvlink_step_us[1], ll128_bus, m)
        assert simple == pytest.approx(ll128)
        assert rated(r.base_latency_us[1], r.nvlink_step_us[1], ll128_bus, 2 * m) > \
            rated(r.base_latency_us[0], r.nvlink_step_us[0], simple_bus, 2 * m)
    # every tensor-parallel all-reduce of the PTD-P runs (12-100 MiB) is above it
    assert r.crossover_bytes(2) < 12 * 2**20 and r.crossover_bytes(4) < 16 * 2**20
    assert r.crossover_bytes(8) < 24 * 2**20


def test_near_error_averages_only_rows_within_the_factor():
    rows = [(2048, 4096, 4096, 0.10), (2048, 4096, 5000, -0.02), (2048, 4096, 8192, 0.5), (512, 4096, 4096, 0.9)]
    assert pb.near_error(GemmSpec(m=2048, n=4096, k=4096), rows) == pytest.approx(0.04)
    assert pb.near_error(GemmSpec(m=64, n=64, k=64), rows) is None


def test_breakdown_splits_a_run_and_its_floor_is_below_the_all_reduces():
    run = next(r for r in load_runs(PUBLISHED).runs if r.name == "ptdp-gpt-3.6b-a100x64")
    b = pb.breakdown(run, busbw=231.58e9, rows=[])
    assert b.gemm_s > 0 and b.memory_s > 0 and b.tp_s > 0
    assert 0 < b.tp_floor_s < b.tp_s  # no all-reduce of its sizes beats the corpus's best busbw
    assert b.floor_s == pytest.approx(b.predicted_s - b.tp_s + b.tp_floor_s)
    # the terms account for the step (no pipeline here: nothing waits)
    assert abs(b.rest_s) < 0.01 * b.predicted_s
    # a faster floor bandwidth lowers only the floor
    faster = pb.breakdown(run, busbw=2 * 231.58e9, rows=[])
    assert faster.tp_floor_s == pytest.approx(b.tp_floor_s / 2)
    assert dataclasses.replace(faster, tp_floor_s=b.tp_floor_s) == b


def test_best_node_busbw_reads_the_a100_single_node_tables():
    assert pb.best_node_busbw("A100-80GB-SXM") == pytest.approx(231.58e9)
