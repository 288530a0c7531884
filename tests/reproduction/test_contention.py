"""The public contention figures (corpus kind ``contention``) against the cost model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ccoverlap.corpus.tables import load_kind
from ccoverlap.reproduction.contention import TOLERANCE, figure_rows, summary


@pytest.fixture(scope="module")
def rows():
    return {(r.table, r.id): r for r in figure_rows()}


def test_every_table_names_its_source():
    tables = load_kind("contention")
    assert {t.name for t in tables} >= {"nccl-1428", "nvforum-tail-effect", "nccl-1433", "arxiv-2507.03114",
                                        "lagom-fig3", "mori-fsdp-sdma", "concll-2412.14335", "rccl-1210",
                                        "h200-channel-copy"}
    for t in tables:
        assert t.source.repository and t.source.path and t.source.commit and t.source.licence, t.name
        assert all(r["role"] in ("judge", "fit", "info") for r in t.rows), t.name


def test_forum_one_wave_gemm_within_30_percent(rows):
    """132 blocks on 132 - 24 SMs: two waves, the second at the boost clock (1.70x measured)."""
    r = rows[("nvforum-tail-effect", "gemm-132-blocks-beside-24-channel-allgather")]
    assert r.measured == pytest.approx(80 / 47, rel=1e-3)
    assert abs(r.error) <= TOLERANCE and r.verdict == "match"
    # without the power-capped clock the second wave costs a full one: further from the measurement
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.cost.model import CostModel
    from ccoverlap.cost.params import default_params
    from ccoverlap.specs import CollectiveSpec, CommConfig, GemmSpec, GroupSpec

    cluster = get_cluster("dgx-h100")
    flat = CostModel(cluster, default_params(cluster.gpu).with_overrides(full_load_clock_fraction=1.0))
    gemm = GemmSpec(m=1536, n=2816, k=16384)
    ag = CollectiveSpec(collective="all_gather", bytes=256 << 20, group=GroupSpec(name="dp", size=8, local_size=8),
                        config=CommConfig(channels=24))
    assert flat.duration_s(gemm, [ag]) / flat.alone_s(gemm) - r.measured > abs(r.modelled - r.measured) + 0.2


def test_lagom_fig3_nc32_over_nc16_within_30_percent(rows):
    r = rows[("lagom-fig3", "ffn-beside-allreduce-nc32-vs-nc16")]
    assert r.measured == 1.302 and abs(r.error) <= TOLERANCE


def test_copy_side_waits_for_the_gemms_last_wave(rows):
    """The H200 stand-in copy at NC 16-64 with C <= 256 KiB (0.08-0.35 ms alone) ends
    1.55-1.63 ms after it starts beside the 1.38 ms GEMM: it gets SMs only at the GEMM's last
    wave. Without the dispatch delay the model said ~1.06x for all of them."""
    copy = [r for (t, i), r in rows.items() if t == "h200-channel-copy" and i.startswith("gemm8192-nc")
            and i.endswith("copy-side") and int(i.split("-nc")[1].split("-")[0]) in (16, 32, 64)
            and "-c4194304-" not in i]
    assert len(copy) == 6
    assert all(r.measured > 4 and abs(r.error) <= TOLERANCE for r in copy)
    # mori's RCCL rows are listed, not judged: the GEMM's time, which sets the delay, is not stated
    assert rows[("mori-fsdp-sdma", "rccl-allgather-33.6mb-beside-gemm")].verdict == "not stated"


def test_dispatch_delay_hand_checked():
    """8192^3 bf16 on an H200 at 128 x 256 tiles: 64 x 32 = 2048 tiles on 132 SMs, 16 waves:
    the delay is 15/16 of the GEMM's time; a one-wave GEMM has none; DMA waits for nothing."""
    from ccoverlap.catalog.hardware import get_gpu
    from ccoverlap.cost.compute import gemm_time_s
    from ccoverlap.cost.contention import dispatch_delay_s, launch_tile
    from ccoverlap.cost.params import default_params
    from ccoverlap.specs import GemmSpec, MemorySpec

    gpu = get_gpu("H200")
    p = default_params(gpu)
    big = GemmSpec(m=8192, n=8192, k=8192)
    assert launch_tile(big, gpu, p) == (128, 256)
    assert dispatch_delay_s(big, gpu, p) == pytest.approx(gemm_time_s(big, gpu, p) * 15 / 16)
    assert dispatch_delay_s(GemmSpec(m=1536, n=2816, k=4096), gpu, p) == 0.0
    assert dispatch_delay_s(MemorySpec(bytes=1 << 30), gpu, p) == 0.0


def test_h200_gemm_side_at_nccl_channel_counts(rows):
    """The 8192^3 GEMM beside the stand-in at NC <= 16: measured <= 1.07, modelled within 30%
    (the copy runs beside the GEMM's last wave only)."""
    gemm = [r for (t, i), r in rows.items() if t == "h200-channel-copy" and i.startswith("gemm8192-")
            and i.endswith("gemm-side") and int(i.split("-nc")[1].split("-")[0]) <= 16]
    assert len(gemm) == 15
    assert all(r.measured < 1.07 and r.verdict == "match" for r in gemm)


def test_dma_latte_shares_judged_with_the_fraction_fitted_on_1kb(rows):
    """params.py [DMALAT]: the share of an SDMA peer copy outside its transfer, fitted on the
    1 KB row (71%), judges the seven other sizes (64 KB-16 MB: 54% down to 2%)."""
    dma = {k[1]: r for k, r in rows.items() if k[0] == "dma-latte-phases"}
    assert dma["copy-1KB-outside-transfer"].role == "fit"
    assert dma["copy-1KB-outside-transfer"].modelled == pytest.approx(0.71, abs=0.01)
    judged = [r for r in dma.values() if r.role == "judge"]
    assert len(judged) == 7 and all(r.verdict == "match" for r in judged)
    shares = [dma[f"copy-{s}-outside-transfer"].modelled for s in ("1KB", "64KB", "1MB", "16MB")]
    assert shares == sorted(shares, reverse=True)


def test_the_outside_fraction_splits_the_copy_time_and_does_not_change_it():
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.cost.model import CostModel
    from ccoverlap.cost.params import default_params
    from ccoverlap.specs import P2PSpec

    cluster = get_cluster("mi300x")
    copy = P2PSpec(bytes=1 << 20, inter_node=False, transport="dma")
    p = default_params(cluster.gpu)
    assert p.dma_copy_outside_fraction == pytest.approx(0.71)
    times = {CostModel(cluster, p.with_overrides(dma_copy_outside_fraction=f)).alone_s(copy) for f in (0.3, 0.71, 1.0)}
    assert len(times) == 1


def test_info_rows_are_never_modelled_and_fit_rows_never_counted(rows):
    s = summary(list(rows.values()))
    assert all(r.modelled is None for r in rows.values() if r.role == "info")
    assert s["judged"] == sum(1 for r in rows.values() if r.role == "judge")
    assert "nccl-1428" not in s["tables"]  # its GEMM row is the A100 fit row


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ccoverlap", "reproduce", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_prints_the_figures_and_rejects_case():
    out = _cli("--paper", "contention")
    assert out.returncode == 0, out.stderr
    assert "nvforum-tail-effect" in out.stdout and "judged figures within 30%" in out.stdout
    bad = _cli("--paper", "contention", "--case", "x")
    assert bad.returncode == 2 and "contention" in bad.stderr and "Traceback" not in bad.stderr
    both = _cli("--paper", "contention", "--paper", "lagom", "--json")
    assert both.returncode == 2 and "alone" in both.stderr
    assert "alone" in json.loads(both.stdout)["error"]  # --json: the error as one JSON object
