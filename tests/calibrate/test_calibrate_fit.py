"""The fit recovers known cost-model parameters from synthetic measurements (model + noise),
its held-out error is low, and its model functions agree with the CostModel the planner uses."""

import math

import calibrate_synth as synth
import numpy as np
import pytest

from ccoverlap.calibrate import fit as F
from ccoverlap.calibrate import grids
from ccoverlap.cost import CostModel
from ccoverlap.cost.compute import split_gemm_time_s
from ccoverlap.specs import CommConfig, CopySpec, GemmSpec, MemorySpec, P2PSpec

MiB = 1 << 20


def all_values(result):
    out = {}
    for info in result.stages.values():
        out.update(info["values"])
    return out


# ------------------------------------------------------------------ least squares

def test_least_squares_recovers_an_exponential_within_bounds():
    t = np.linspace(0, 4, 40)
    y = 3.0 * np.exp(-1.7 * t) + 0.5
    res = F.least_squares(lambda x: x[0] * np.exp(-x[1] * t) + x[2] - y, [1.0, 0.5, 0.0], [0.1, 0.01, -1], [10, 10, 2])
    assert res.x == pytest.approx([3.0, 1.7, 0.5], rel=1e-6)
    assert res.cost < 1e-12


def test_least_squares_stays_inside_bounds():
    # the unconstrained optimum (x = 5) is outside [0, 2]: the answer sits at the bound
    res = F.least_squares(lambda x: np.array([x[0] - 5.0]), [1.0], [0.0], [2.0])
    assert 1.99 < res.x[0] <= 2.0


# ------------------------------------------------------------------ recovery

def test_noise_free_measurements_give_back_the_parameters_exactly(gpu, base, truth):
    records = synth.records(gpu, truth, noise=0.0, quick=True)
    res = F.fit(records, gpu, base, tile_choices=[(128, 256, 1), (256, 128, 1), (128, 128, 2)])
    got = all_values(res)
    for name, want in synth.TRUE.items():
        if name == "threads_bw_exponent":  # the quick plan's NT sweep is held out: not fitted
            assert name in res.stages["channel"]["unconstrained"]
            continue
        assert got[name] == pytest.approx(want, rel=1e-4), name


def test_no_tile_choice_is_one_config_error_not_a_crash(gpu, base, truth):
    # the GEMM stage searches the tile shapes it is given: none to search is a bad argument
    from ccoverlap.errors import ConfigError

    records = [r for r in synth.records(gpu, truth, noise=0.0, quick=True) if r["kind"] == "gemm"]
    with pytest.raises(ConfigError, match="tile_choices"):
        F.fit(records, gpu, base, tile_choices=[])


# Tolerances by how well the full plan identifies each field with 3 % noise per measurement
# (checked over several seeds): bandwidths and peak fractions to a few %, overheads and the
# memory-overlap / L2 factors to ~15-25 %, the weakly identified ones only loosely.
TIGHT = ("mem_bw_fraction", "dma_engine_bytes_per_s", "host_link_bytes_per_s", "gemm_peak_fraction",
         "gemm_small_tile_efficiency", "comm_hbm_bytes_per_wire_byte", "channel_bytes_per_s")
MEDIUM = ("kernel_launch_overhead_s", "dma_copy_latency_s", "gemm_tile_overhead_ksteps", "gemm_mem_overlap",
          "comm_compute_interference", "l2_inflight_chunks", "channel_saturation_sharpness",
          "chunk_step_overhead_s", "chunk_pipeline_depth", "dma_hbm_bytes_per_wire_byte")
LOOSE = ("l2_pollution_penalty", "mem_sm_saturation_fraction", "dma_compute_interference")


def test_three_percent_noise_recovers_the_parameters(noisy_fit):
    got = all_values(noisy_fit)
    for name in TIGHT:
        assert got[name] == pytest.approx(synth.TRUE[name], rel=0.08), name
    for name in MEDIUM:
        assert got[name] == pytest.approx(synth.TRUE[name], rel=0.25), name
    for name in LOOSE:
        assert got[name] == pytest.approx(synth.TRUE[name], rel=0.5), name
    assert (got["gemm_tile_m"], got["gemm_tile_n"]) == (synth.TRUE["gemm_tile_m"], synth.TRUE["gemm_tile_n"])
    assert got["comm_sm_fraction_per_channel"] == pytest.approx(synth.TRUE["comm_sm_fraction_per_channel"], abs=0.1)


def test_held_out_error_is_at_the_noise_level(noisy_fit, gpu):
    rows = F.heldout_errors(noisy_fit, gpu)
    groups = {r["group"] for r in rows}
    assert {"gemm", "split", "copy_sm", "copy_ce", "sm_victim", "sm_copy", "ce_victim", "ce_copy", "channel"} <= groups
    for r in rows:
        assert r["n"] >= 1
        assert r["median_rel_err"] < 0.06, r  # 3 % noise on each side of a ratio: ~4 % typical
    assert F.overall_error(rows) < 0.04


def test_fitted_params_are_only_the_stages_fields(noisy_fit):
    written = {n for name, groups, bounds in F.STAGES for n in bounds} | {"gemm_tile_m", "gemm_tile_n",
                                                                         "gemm_tiles_per_sm"}
    assert set(noisy_fit.params) <= written
    assert "channel_bytes_per_s" not in noisy_fit.params  # informational stage only
    assert noisy_fit.stages["channel"]["written_to_params"] is False


def test_fit_detects_wrong_defaults(noisy_fit, base):
    """Sanity of the test itself: the defaults are far from the truth, so recovery means something."""
    assert abs(base.comm_hbm_bytes_per_wire_byte / synth.TRUE["comm_hbm_bytes_per_wire_byte"] - 1) > 0.15
    assert abs(base.gemm_peak_fraction / synth.TRUE["gemm_peak_fraction"] - 1) > 0.08
    assert base.gemm_tile_m != synth.TRUE["gemm_tile_m"]


# ------------------------------------------------------------------ degenerate data

def test_too_few_observations_keep_defaults_with_a_note(gpu, base, truth):
    records = [r for r in synth.records(gpu, truth, noise=0.0, quick=True) if r["kind"] == "copy"]
    res = F.fit(records, gpu, base)
    assert set(res.stages) == {"copy_sm", "copy_ce"}
    assert any(n.startswith("gemm:") and "too few" in n for n in res.notes)
    assert res.cost_params.gemm_peak_fraction == base.gemm_peak_fraction


def test_a_parameter_without_effect_is_reported_not_written(gpu, base, truth):
    # SM copies alone cannot say anything about the copy-engine latency
    records = [r for r in synth.records(gpu, truth, noise=0.0, quick=True) if r["kind"] == "copy"]
    stages = (("copy_sm", ("copy_sm",), {"mem_bw_fraction": (0.2, 1.0), "kernel_launch_overhead_s": (1e-8, 5e-5),
                                         "dma_copy_latency_s": (1e-8, 1e-4)}),)
    res = F.fit(records, gpu, base, stages=stages, info_stages=())
    assert res.stages["copy_sm"]["unconstrained"] == ["dma_copy_latency_s"]
    assert "dma_copy_latency_s" not in res.params
    assert res.params["mem_bw_fraction"] == pytest.approx(0.85, rel=1e-4)
    assert any("dma_copy_latency_s is not constrained" in n for n in res.notes)


def test_uncovered_overlap_runs_are_left_out(gpu, truth):
    rec = next(r for r in synth.records(gpu, truth, noise=0.0, quick=True) if r["kind"] == "sm_contention")
    groups = {o.group for o in F.observations([dict(rec, covered_victim=False)])}
    assert groups == {"sm_copy"}
    groups = {o.group for o in F.observations([dict(rec, covered_copy=False)])}
    assert groups == {"sm_victim"}


# ------------------------------------------------------------------ split

def test_split_is_deterministic_and_ignores_measured_values(gpu, truth):
    records = synth.records(gpu, truth, noise=0.03, seed=3, quick=True)
    held = [grids.is_held_out(r) for r in records]
    assert held == [grids.is_held_out(dict(r, time_s=1.0, victim_s=2.0, copy_s=3.0, samples_s=[1])) for r in records]
    frac = sum(held) / len(held)
    assert 0.15 < frac < 0.35
    assert grids.record_key({"kind": "gemm", "m": 1, "n": 2, "k": 3, "dtype": "bf16"}) == \
        grids.record_key({"dtype": "bf16", "k": 3, "n": 2, "m": 1, "kind": "gemm", "time_s": 9})


# ------------------------------------------------------------------ same model as the planner

def test_split_time_matches_the_cost_model(gpu, truth):
    for spec in (GemmSpec(m=10000, n=4096, k=8192), GemmSpec(m=4096, n=4096, k=100003)):
        for dim, ways in (("m", 8), ("m", 64), ("k", 8), ("k", 64)):
            assert F.split_time_s(spec, ways, dim, gpu, truth) == pytest.approx(
                split_gemm_time_s(spec, ways, dim, gpu, truth), rel=1e-12)


def test_contention_predictions_match_cost_model(gpu, truth):
    """With the copy's measured time equal to the CostModel's own, the fit's model functions give
    exactly CostModel.duration_s ratios (so fitted parameters mean what the planner uses)."""
    ctx = F.make_context(gpu)
    cm = CostModel(ctx.cluster, truth)
    victims = (GemmSpec(m=8192, n=8192, k=8192), GemmSpec(m=65536, n=512, k=512), MemorySpec(bytes=1536 * MiB))
    vdesc = ({"op": "gemm", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192},
             {"op": "gemm", "dtype": "bf16", "m": 65536, "n": 512, "k": 512},
             {"op": "memory", "bytes": 1536 * MiB})
    for v, d in zip(victims, vdesc):
        for nc, nt, c in ((4, 512, 1 * MiB), (32, 128, 64 * 1024), (64, 512, 4 * MiB)):
            comm = P2PSpec(bytes=256 * MiB, inter_node=False, config=CommConfig(channels=nc, threads=nt, chunk_bytes=c))
            rec = {"victim": d, "nc": nc, "nt": nt, "chunk_bytes": c, "copy_bytes": 256 * MiB,
                   "copy_alone_s": cm.alone_s(comm)}
            assert F.predict_sm_victim(rec, truth, ctx) == pytest.approx(cm.duration_s(v, (comm,)) / cm.alone_s(v), rel=1e-9)
            assert F.predict_sm_copy(rec, truth, ctx) == pytest.approx(cm.duration_s(comm, (v,)) / cm.alone_s(comm), rel=1e-9)
        for direction in ("h2d", "d2h"):
            copy = CopySpec(bytes=256 * MiB, direction=direction)
            rec = {"victim": d, "direction": direction, "bytes": 256 * MiB, "copy_alone_s": cm.alone_s(copy)}
            assert F.predict_ce_victim(rec, truth, ctx) == pytest.approx(cm.duration_s(v, (copy,)) / cm.alone_s(v), rel=1e-9)
            assert F.predict_ce_copy(rec, truth, ctx) == pytest.approx(cm.duration_s(copy, (v,)) / cm.alone_s(copy), rel=1e-9)
        dma = P2PSpec(bytes=256 * MiB, inter_node=False, transport="dma")
        rec = {"victim": d, "direction": "d2d", "bytes": 256 * MiB, "copy_alone_s": cm.alone_s(dma)}
        assert F.predict_ce_victim(rec, truth, ctx) == pytest.approx(cm.duration_s(v, (dma,)) / cm.alone_s(v), rel=1e-9)


def test_gemm_prediction_is_the_cost_models(gpu, truth):
    ctx = F.make_context(gpu)
    cm = CostModel(ctx.cluster, truth)
    for dtype, m, n, k in grids.gemm_sweep(quick=True):
        spec = GemmSpec(m=m, n=n, k=k, dtype_bytes=grids.DTYPE_BYTES[dtype])
        assert F.predict_gemm({"dtype": dtype, "m": m, "n": n, "k": k}, truth, ctx) == cm.alone_s(spec)


def test_decomposition_table_has_measured_and_predicted(noisy_fit, gpu):
    rows = F.decomposition_table(noisy_fit, gpu)
    assert rows and {r["dim"] for r in rows} == {"m", "k"} and {r["ways"] for r in rows} == {8, 64}
    for r in rows:
        assert math.isfinite(r["predicted"]) and r["predicted"] > 0.9
        assert r["measured"] == pytest.approx(r["predicted"], rel=0.15)


def test_peer_copies_are_kept_but_not_modelled(gpu, truth):
    recs = [{"kind": "copy", "engine": "ce", "direction": "p2p", "bytes": MiB, "time_s": 1e-5},
            {"kind": "copy", "engine": "ce", "direction": "h2d", "bytes": MiB, "time_s": 3e-5}]
    assert [o.group for o in F.observations(recs)] == ["copy_ce"]


def test_record_specs_are_memoised_by_identity_not_by_value():
    """The fit builds a record's specs once per record; two records with equal keys but other
    values are two records (the memo is keyed by identity and checks it)."""
    from ccoverlap.catalog.hardware import GPUS

    ctx = F.make_context(GPUS["H100-SXM"])
    a = {"m": 128, "n": 256, "k": 64, "dtype": "bf16"}
    b = dict(a, m=256)
    calls = []

    def build(rec):
        calls.append(rec["m"])
        return rec["m"]

    assert [ctx.of_record("g", r, build) for r in (a, b, a, b)] == [128, 256, 128, 256]
    assert calls == [128, 256]
