"""Replay on synthetic traces with hand-computed answers (µs in the comments)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ccoverlap.replayer import whatif as W
from ccoverlap.replayer.core import gpu_times, load_job
from ccoverlap.replayer.graph import EDGE_KINDS
from ccoverlap.replayer.run import replay

from .conftest import SHARED
from .synth import Rank, allreduce_args, two_rank_job

US = 1e-6


def _step1(res_scn, rank=None):
    per = res_scn.measured.steps
    if rank is None:
        return max(per[r][1].step_time_s for r in per)
    return per[rank][1].step_time_s


def test_dependency_kinds_found(tmp_path):
    job = load_job([str(p) for p in two_rank_job(tmp_path)], steps="all")
    for gi, g in enumerate(job.graph.ranks):
        inf = g.inferred
        assert inf["cross_stream_inferred_from_timing"] == 2          # C waits for A, B for C
        assert inf["host_sync_blocking_calls"] == 1                   # cudaDeviceSynchronize
        assert abs(inf["launch_latency_us"] - 10.0) < 1e-6            # A and D: 10 µs after launch
        off = job.graph.offset[gi]
        own = (job.graph.dst >= off) & (job.graph.dst < off + g.n_nodes)
        kinds = {EDGE_KINDS[k] for k in job.graph.ekind[own]}
        assert {"cpu", "launch", "stream", "xstream", "sync"} <= kinds
    assert len(job.graph.collectives) == 1                             # matched across the two ranks
    c = job.graph.collectives[0]
    assert np.allclose(c.xfer, [400 * US, 400 * US])


def test_replay_reproduces_measured(tmp_path):
    res = replay([str(p) for p in two_rank_job(tmp_path)], steps="all", whatifs=["none"])
    for row in res.fidelity:
        assert abs(row["error_pct"]) < 1e-6
    # step 1 window: A start (10) .. D start (2935)
    assert _step1(res.replay, 0) == pytest.approx(2925 * US)


def test_no_comm(tmp_path):
    res = replay([str(p) for p in two_rank_job(tmp_path)], steps="all", whatifs=["no-comm"])
    s = res.whatifs[0]
    # rank 1: B right after A (1510-2510), sync returns 2515, D launched 2525, starts 2535 -> 2525
    # rank 0: B 1010-2010, D at 2035 -> 2025; slowest rank: 2525
    assert _step1(s, 0) == pytest.approx(2025 * US)
    assert _step1(s, 1) == pytest.approx(2525 * US)
    # step time = slowest rank per step, mean over steps 1 (2925 -> 2525) and 2 (D alone, 100 both)
    assert s.gain_s == pytest.approx((2925 - 2525) / 2 * US)


def test_comm_hidden(tmp_path):
    res = replay([str(p) for p in two_rank_job(tmp_path)], steps="all", whatifs=["comm-hidden"])
    s = res.whatifs[0]
    # nothing waits for C: same as no-comm here (C sits between A and B), but C still runs
    assert _step1(s, 0) == pytest.approx(2025 * US)
    assert _step1(s, 1) == pytest.approx(2525 * US)
    assert s.comm_s > 0


def test_network_cross_rank(tmp_path):
    # group of 16 GPUs: inter-node; 2x faster network -> transfer 200 µs, C ends 1710 on both ranks
    paths = [str(p) for p in two_rank_job(tmp_path, group_size=16)]
    res = replay(paths, steps="all", whatifs=["network-2x", "network-0.5x"], keep_times=True)
    fast, slow = res.whatifs
    assert _step1(fast, 0) == pytest.approx((2925 - 200) * US)
    assert _step1(fast, 1) == pytest.approx((2925 - 200) * US)
    assert _step1(slow, 0) == pytest.approx((2925 + 400) * US)
    # the slower rank 1 still sets the end of the collective on rank 0
    ends = {}
    for r, e in gpu_times(res.job, fast.times, fast.dur)[1].items():
        kind = res.job.rts[r].timeline.kind
        ends[r] = float(e[kind == "comm"][0])
    assert ends[0] == pytest.approx(ends[1])


def _contention_trace(d: Path) -> Path:
    """gemm_K x3 alone (100 µs), x3 overlapped with a 390 µs all-gather (150 µs), then Z (100 µs)."""
    k = Rank(0, 1)
    t = 10.0
    for i in range(3):
        k.launch("gemm_K", 0.0 + i, 7, t, 100.0)
        t += 100.0
    k.launch("ncclDevKernel_AllGather_RING_LL", 3.0, 20, 310.0, 390.0,
             **{"Collective name": "allgather", "In msg nelems": 1 << 20, "Out msg nelems": 8 << 20,
                "dtype": "Float", "Group size": 8, "Process Group Name": "0"})
    for i in range(3):
        k.launch("gemm_K", 4.0 + i, 7, t, 150.0)
        t += 150.0
    k.launch("gemm_Z", 8.0, 7, t, 100.0)
    return k.write(d / "rank-0.json")


def test_no_contention_and_whole_window(tmp_path):
    res = replay([str(_contention_trace(tmp_path))], whatifs=["no-contention"])
    assert any("whole window" in p for p in res.job.problems)
    s = res.whatifs[0]
    # measured 10..860; overlapped K at 100 µs: K 310-610, Z 610-710, all-gather ends 700 -> 700 µs
    assert res.replay.step_time_s == pytest.approx(850 * US)
    assert s.step_time_s == pytest.approx(700 * US)
    assert s.gain_s == pytest.approx(150 * US)


def test_copy_engine_scales_by_cost_model(tmp_path):
    from ccoverlap.catalog.hardware import get_cluster

    res = replay([str(_contention_trace(tmp_path))], whatifs=["copy-engine"], cluster="dgx-h100", keep_times=True)
    s = res.whatifs[0]
    ratio = W.dma_ratio("all_gather", 8 * 4 * (1 << 20), 8, get_cluster("dgx-h100"))
    assert ratio is not None
    comm = res.job.rts[0].timeline.kind == "comm"
    starts, ends = gpu_times(res.job, s.times, s.dur)
    assert float((ends[0] - starts[0])[comm][0]) == pytest.approx(390 * US * ratio)
    assert W.dma_ratio("all_reduce", 1e6, 8, get_cluster("dgx-h100")) is None    # reductions stay on SMs


def test_centauri(tmp_path):
    from ccoverlap.deciders.centauri.rules import MAX_CHUNKS

    # A 10-1010 (launch 0); C all-gather 1010-1410 (launch 1000, 10 µs latency); B 1410-2210 waits for C
    k = Rank(0, 1)
    k.launch("gemm_A", 0.0, 7, 10.0, 1000.0)
    k.launch("ncclDevKernel_AllGather_RING_LL", 1000.0, 20, 1010.0, 400.0,
             **{"Collective name": "allgather", "In msg nelems": 1, "Out msg nelems": 8, "dtype": "Float",
                "Group size": 8, "Process Group Name": "0"})
    k.launch("gemm_B", 1005.0, 7, 1410.0, 800.0)
    res = replay([str(k.write(tmp_path / "rank-0.json"))], whatifs=["centauri"])
    s = res.whatifs[0]
    # Centauri's Algorithm 1: no independent compute beside C -> MAX_CHUNKS (8) chunks; latency 10 µs:
    # B starts at 1010 + 400/8 + 7*10 = 1130, ends 1930; window 10..1930
    assert MAX_CHUNKS == 8
    assert res.replay.step_time_s == pytest.approx(2200 * US)
    assert s.step_time_s == pytest.approx(1920 * US)
    assert "in 8 chunks" in s.note and "applied 1" in s.note


def test_cross_stream_from_cuda_sync_args(tmp_path):
    k = Rank(0, 1)
    k.launch("gemm_A", 0.0, 7, 10.0, 1000.0)
    rec = k.call("cudaEventRecord", 3.0)
    wait = k.call("cudaStreamWaitEvent", 4.0)
    k.kernel("Stream Wait Event", wait, 20, 10.0, 0.0, cat="cuda_sync", wait_on_stream=7,
             wait_on_cuda_event_record_corr_id=rec)
    k.launch("gemm_X", 5.0, 20, 1010.0, 100.0)
    job = load_job([str(k.write(tmp_path / "rank-0.json"))])
    g = job.graph.ranks[0]
    assert g.inferred["cross_stream_from_args"] == 1
    assert g.inferred["cross_stream_inferred_from_timing"] == 0


def test_chrome_trace_reads_back(tmp_path):
    from ccoverlap.replayer.report import write_chrome
    from ccoverlap.trace.analyze import analyze

    paths = [str(p) for p in two_rank_job(tmp_path, group_size=16)]
    res = replay(paths, steps="all", whatifs=["network-2x"], keep_times=True)
    for s in [res.replay] + res.whatifs:
        out = write_chrome(res, s, tmp_path / "out" / s.name)
        a = analyze([str(p) for p in out], steps="all")
        for m in a.metrics:
            mine = s.measured.overall[m.rank]
            assert m.step_time_s == pytest.approx(mine.step_time_s, abs=1e-9)
            assert m.exposed_comm_s == pytest.approx(mine.exposed_comm_s, abs=1e-9)
            for st, sm in a.step_metrics.items():
                assert sm[m.rank].step_time_s == pytest.approx(s.measured.steps[m.rank][st].step_time_s, abs=1e-9)


def test_bad_input_other_ranks_replayed(tmp_path):
    paths = two_rank_job(tmp_path)
    bad = tmp_path / "rank-2.json"
    bad.write_text('{"traceEvents": [')
    r = subprocess.run([sys.executable, "-m", "ccoverlap", "replay", str(tmp_path), "--steps", "all",
                        "--whatif", "none"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "rank-2.json" in r.stderr and "truncated" in r.stderr
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "x.json").write_text("not json")
    r = subprocess.run([sys.executable, "-m", "ccoverlap", "replay", str(only_bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "x.json" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "ccoverlap", "replay", str(paths[0]), "--whatif", "bogus"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "bogus" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ccoverlap", "replay", str(paths[0]), "--steps", "99"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no such profiler step" in r.stderr and "1, 2" in r.stderr


def test_cli_json(tmp_path):
    paths = two_rank_job(tmp_path)
    r = subprocess.run([sys.executable, "-m", "ccoverlap", "replay", *map(str, paths), "--steps", "all", "--json",
                        "--whatif", "no-comm", "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["whatifs"][0]["name"] == "no-comm"
    assert doc["whatifs"][0]["gain_s"] == pytest.approx(200e-6)     # (400 in step 1 + 0 in step 2) / 2
    assert (tmp_path / "o" / "no-comm" / "rank-1.json.gz").exists()




@pytest.mark.skipif(not SHARED.exists(), reason="../shared/traces not present")
@pytest.mark.parametrize("name", ["nccl_parser_config", "trace_filter", "ns_resolution_trace", "amd_trace"])
def test_real_traces_fidelity(name):
    res = replay([str(SHARED / name)], whatifs=["none"])
    assert res.fidelity
    for row in res.fidelity:
        assert abs(row["error_pct"]) <= 3.0


def _lagom_trace(d: Path, kernels: list[float], c_dur: float) -> Path:
    """Compute kernels back to back on stream 7 from 10 µs (then Z, 100 µs) and a 128 MiB
    all-gather C on stream 20 from 10 µs, beside the first kernel."""
    d.mkdir()
    k = Rank(0, 1)
    t = 10.0
    for i, dur in enumerate(kernels):
        k.launch(f"gemm_K{i}", 0.1 * i, 7, t, dur)
        t += dur
    k.launch("ncclDevKernel_AllGather_RING_LL", 0.5, 20, 10.0, c_dur,
             **{"Collective name": "allgather", "In msg nelems": 1 << 22, "Out msg nelems": 8 << 22,
                "dtype": "Float", "Group size": 8, "Process Group Name": "0"})
    k.launch("gemm_Z", 1.0, 7, t, 100.0)
    return k.write(d / "rank-0.json")


def test_lagom_applies_a_faster_configuration_and_keeps_the_given_one_otherwise(tmp_path):
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.replayer.decide import lagom_ratios

    h100 = get_cluster("dgx-h100")
    # K0 (500 µs) runs beside C (400 µs), K1 (500 µs) and Z after it: Lagom's group is C + 500 µs of compute
    rx, ry, rz = lagom_ratios("all_gather", 4.0 * (8 << 22), 8, 1, 500 * US, h100)
    assert rz < 1 and ry < 1
    res = replay([str(_lagom_trace(tmp_path / "a", [500.0, 500.0], 400.0))], whatifs=["lagom"], cluster="dgx-h100")
    s = res.whatifs[0]
    # K0 500 ry, K1 500, Z 100 after it; C ends at 400 rx, earlier
    assert 400 * rx < 500 * ry + 600
    assert s.step_time_s == pytest.approx((500 * ry + 600) * US)
    assert s.gain_s > 0 and "applied 1" in s.note
    # K (1000 µs) beside an 800 µs C: Lagom gives C fewer resources (its model: C stays hidden), but
    # C then ends at 800 rx > 1100 µs - slower in the replay, so the given configuration stays
    rx, ry, rz = lagom_ratios("all_gather", 4.0 * (8 << 22), 8, 1, 1000 * US, h100)
    assert rz < 1 and 800 * rx > 1100
    res = replay([str(_lagom_trace(tmp_path / "b", [1000.0], 800.0))], whatifs=["lagom"], cluster="dgx-h100")
    s = res.whatifs[0]
    assert s.gain_s == 0.0 and s.step_time_s == res.replay.step_time_s
    assert "kept the given configuration for 1" in s.note


def test_ops_without_launch_stay_in_their_step(tmp_path):
    from ccoverlap.replayer.report import write_chrome
    from ccoverlap.trace.analyze import analyze

    # no runtime events (like `ccoverlap simulate`'s traces): K 0-100, C (inter-node) 100-300,
    # B 300-400 waits for C (inferred); ProfilerStep#1 over 0-400
    k = Rank(0, 1)
    k.step(1, 0.0, 400.0)
    k.kernel("gemm_K", 1, 7, 0.0, 100.0)
    k.kernel("ncclDevKernel_AllReduce_RING_LL", 2, 20, 100.0, 200.0, **allreduce_args(16))
    k.kernel("gemm_B", 3, 7, 300.0, 100.0)
    res = replay([str(k.write(tmp_path / "rank-0.json"))], whatifs=["network-0.5x"], keep_times=True)
    s = res.whatifs[0]
    # C 100-500, B 500-600: the step grows past its annotation and keeps B
    assert s.step_time_s == pytest.approx(600 * US)
    a = analyze([str(p) for p in write_chrome(res, s, tmp_path / "out")])
    assert a.metrics[0].step_time_s == pytest.approx(600 * US, abs=1e-9)


def test_launch_queue_wait_follows_the_gpu(tmp_path):
    # C (inter-node all-reduce, stream 7) 0-1000; the next cudaLaunchKernel (at 5) blocks until
    # 1002 - the launch queue was full until C ended; K2 1000-1100 after C; the next launch at
    # 1012 puts K3 on an idle stream at 1022-1122
    k = Rank(0, 1)
    k.launch("ncclDevKernel_AllReduce_RING_LL", 0.0, 7, 0.0, 1000.0, **allreduce_args(16))
    c2 = k.call("cudaLaunchKernel", 5.0, 997.0)
    k.kernel("gemm_K2", c2, 7, 1000.0, 100.0)
    k.launch("gemm_K3", 1012.0, 9, 1022.0, 100.0)
    res = replay([str(k.write(tmp_path / "rank-0.json"))], whatifs=["network-2x"])
    assert res.job.graph.ranks[0].inferred["launch_queue_waits"] == 1
    assert res.replay.step_time_s == pytest.approx(1122 * US)
    # 2x network: C 0-500, the launch returns at 502, the next one at 512, K3 522-622
    assert res.whatifs[0].step_time_s == pytest.approx(622 * US)


def test_cyclic_matching_falls_back_to_measured(tmp_path):
    # rank 0 runs group A's all-reduce then group B's on one stream, rank 1 B then A: matching
    # by call order would make each wait for the other - replayed unmatched, with a warning
    for r, order in ((0, "AB"), (1, "BA")):
        k = Rank(r, 2)
        for i, g in enumerate(order):
            k.launch("ncclDevKernel_AllReduce_RING_LL", float(i), 20, 100.0 * i, 100.0,
                     **dict(allreduce_args(), **{"Process Group Name": g}))
        k.write(tmp_path / f"rank-{r}.json")
    res = replay([str(tmp_path)], whatifs=["no-comm"])
    assert any("cyclic" in p for p in res.job.problems)
    assert not res.job.graph.collectives
    assert res.replay.step_time_s == pytest.approx(200 * US)


def test_matching_skips_a_call_missing_on_one_rank(tmp_path):
    # rank 0 has two all-reduces (end 100 and 300); rank 1's trace lost the first: by call order
    # rank 1's only one would pair with rank 0's first; by aligned ends it pairs with the second
    k0 = Rank(0, 2)
    k0.launch("ncclDevKernel_AllReduce_RING_LL", 0.0, 20, 0.0, 100.0, **allreduce_args())
    k0.launch("ncclDevKernel_AllReduce_RING_LL", 1.0, 20, 150.0, 150.0, **allreduce_args())
    k0.write(tmp_path / "rank-0.json")
    k1 = Rank(1, 2)
    k1.launch("ncclDevKernel_AllReduce_RING_LL", 0.0, 20, 250.0, 50.0, **allreduce_args())
    k1.write(tmp_path / "rank-1.json")
    job = load_job([str(tmp_path)])
    assert len(job.graph.collectives) == 1
    c = job.graph.collectives[0]
    # transfer after the later member arrived (rank 1 at 250): 50 µs on both
    assert np.allclose(c.xfer, [50 * US, 50 * US])
    assert any("no partner" in p for p in job.problems)


def test_cli_text_piped_keeps_whole_tables(tmp_path):
    import os

    paths = two_rank_job(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    r = subprocess.run([sys.executable, "-m", "ccoverlap", "replay", *map(str, paths), "--steps", "all", "-q",
                        "--whatif", "no-comm,network-2x"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "error (structure)" in r.stdout and "exposed comm" in r.stdout
    assert any("no-comm" in line and "+13.2%" in line for line in r.stdout.splitlines())   # 200 of 1512.5 µs
    assert "Recommendation:" in r.stdout


def test_stream_sync_and_blocking_memcpy_follow_the_gpu(tmp_path):
    # stream sync: C (inter-node) 0-1000; cudaStreamSynchronize 5-1003 (no stream id: target
    # inferred from timing); next launch 1010 -> K 1020-1120
    k = Rank(0, 1)
    k.launch("ncclDevKernel_AllReduce_RING_LL", 0.0, 7, 0.0, 1000.0, **allreduce_args(16))
    k.call("cudaStreamSynchronize", 5.0, 998.0)
    k.launch("gemm_K", 1010.0, 9, 1020.0, 100.0)
    res = replay([str(k.write(tmp_path / "rank-0.json"))], whatifs=["network-2x"])
    assert res.job.graph.ranks[0].inferred["host_sync_blocking_calls"] == 1
    # 2x: C 0-500, the sync returns 503, launch 510, K 520-620
    assert res.whatifs[0].step_time_s == pytest.approx(620 * US)
    # blocking memcpy: its copy runs 1000-1010 after C on the same stream; the call returns at 1012
    d = tmp_path / "memcpy"
    d.mkdir()
    k = Rank(0, 1)
    k.launch("ncclDevKernel_AllReduce_RING_LL", 0.0, 7, 0.0, 1000.0, **allreduce_args(16))
    c = k.call("cudaMemcpyAsync", 5.0, 1007.0)
    k.kernel("Memcpy DtoH (Device -> Pageable)", c, 7, 1000.0, 10.0, cat="gpu_memcpy")
    k.launch("gemm_K", 1020.0, 9, 1030.0, 100.0)
    res = replay([str(k.write(d / "rank-0.json"))], whatifs=["network-2x"])
    assert res.job.graph.ranks[0].inferred["host_sync_blocking_calls"] == 1
    # 2x: C 0-500, copy 500-510, the call returns 512, launch 520, K 530-630
    assert res.whatifs[0].step_time_s == pytest.approx(630 * US)


def test_network_with_named_cluster_uses_cost_model_ratio(tmp_path):
    from ccoverlap.catalog.hardware import get_cluster

    paths = [str(p) for p in two_rank_job(tmp_path, group_size=16)]
    res = replay(paths, steps="all", whatifs=["network-2x"], cluster="a40-pcie")
    r = W.network_ratio("all_reduce", 4.0 * (1 << 20), 16, 2, 2.0, get_cluster("a40-pcie"))
    assert r is not None and 0.5 < r < 1.0
    # C ends at 1510 + 400 r on both ranks; then B 1000, sync +5, launch +10, D +10: step 1 = 2525 + 400 r
    assert _step1(res.whatifs[0], 0) == pytest.approx((2525 + 400 * r) * US)
    assert "cost model" in res.whatifs[0].note


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/traces not present")
@pytest.mark.parametrize("name", ["nccl_parser_config", "trace_filter"])
def test_real_trace_chrome_reads_back(tmp_path, name):
    from ccoverlap.replayer.report import write_chrome
    from ccoverlap.trace.analyze import analyze

    res = replay([str(SHARED / name)], whatifs=["no-comm"], keep_times=True)
    s = res.whatifs[0]
    a = analyze([str(p) for p in write_chrome(res, s, tmp_path / "out")])
    for m in a.metrics:
        assert m.step_time_s == pytest.approx(s.measured.overall[m.rank].step_time_s, abs=1e-9)
        assert m.exposed_comm_s == pytest.approx(s.measured.overall[m.rank].exposed_comm_s, abs=1e-9)
        for st, sm in a.step_metrics.items():
            assert sm[m.rank].step_time_s == pytest.approx(s.measured.steps[m.rank][st].step_time_s, abs=1e-9)


def test_cli_whatif_names_never_take_the_traces(tmp_path):
    paths = [str(p) for p in two_rank_job(tmp_path)]
    cli = [sys.executable, "-m", "ccoverlap", "replay", "--steps", "all", "-q", "--json"]
    r = subprocess.run(cli + ["--whatif", "none", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["whatifs"] == []
    for args in (["--whatif", "no-comm,network-2x"], ["--whatif", "no-comm", "--whatif", "network-2x"]):
        r = subprocess.run(cli + args + paths, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert sorted(w["name"] for w in json.loads(r.stdout)["whatifs"]) == ["network-2x", "no-comm"]
    # the old space-separated form: a what-if name where a trace belongs is named, in one line
    r = subprocess.run(cli + ["--whatif", "no-comm", "network-2x", *paths], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "'network-2x' is a what-if, not a trace" in r.stderr and "Traceback" not in r.stderr


def test_spans_nodes_from_ranks_size_and_world():
    # the group's ranks decide when the trace lists them: 8 ranks strided over 16 GPUs span two nodes
    assert W.spans_nodes(list(range(0, 16, 2)), 8, 16, 8) is True
    assert W.spans_nodes(list(range(8, 16)), 8, 16, 8) is False
    assert W.spans_nodes([0, 4], 2, 8, 4) is True
    # else the size: more GPUs than a node spans nodes; a job of one node never does
    assert W.spans_nodes(None, 16, 16, 8) is True
    assert W.spans_nodes(None, 8, 8, 8) is False
    # a group of at most one node's GPUs in a larger job, ranks not listed: the trace cannot tell
    assert W.spans_nodes(None, 8, 16, 8) is None


def _world_job(d: Path, world: int, group_ranks=None) -> Path:
    """One rank of a ``world``-rank job: K (1000 µs) then an all-reduce C of group size 8
    (1000-2000) that B (2000-2100) waits for."""
    d.mkdir()
    k = Rank(0, world)
    k.launch("gemm_K", 0.0, 7, 0.0, 1000.0)
    k.launch("ncclDevKernel_AllReduce_RING_LL", 1.0, 7, 1000.0, 1000.0, **allreduce_args(8))
    k.launch("gemm_B", 2.0, 7, 2000.0, 100.0)
    path = k.write(d / "rank-0.json")
    if group_ranks is not None:
        doc = json.loads(path.read_text())
        doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_desc": "dp", "pg_size": 8, "ranks": group_ranks}]
        path.write_text(json.dumps(doc))
    return path


def test_network_acts_on_every_inter_node_collective(tmp_path):
    # world size 8 on 8-GPU nodes: one node, nothing to change
    res = replay([str(_world_job(tmp_path / "w8", 8))], whatifs=["network-0.5x"], cluster="dgx-h100")
    assert res.whatifs[0].gain_s == 0 and "no collective spans nodes" in res.whatifs[0].note
    # world size 16, a group of 8 whose ranks the trace does not list: said, not guessed
    res = replay([str(_world_job(tmp_path / "w16", 16))], whatifs=["network-0.5x"])
    assert res.whatifs[0].gain_s == 0 and "assumed within one node" in res.whatifs[0].note
    # world size 16, the group's ranks strided over both nodes: inter-node, 1/F of its transfer time
    res = replay([str(_world_job(tmp_path / "strided", 16, list(range(0, 16, 2))))], whatifs=["network-0.5x"])
    s = res.whatifs[0]
    assert s.step_time_s == pytest.approx((2100 + 1000) * US) and "1 inter-node collective" in s.note


def _cpu_bound_job(d: Path) -> Path:
    """K (10-110), an all-reduce C (10-510) with nothing beside it after K, and the CPU busy
    until it launches K2 at 1000 (1010-1110): C is exposed but the GPU waits for the CPU."""
    k = Rank(0, 2)
    k.launch("gemm_K", 0.0, 7, 10.0, 100.0)
    k.launch("ncclDevKernel_AllReduce_RING_LL", 1.0, 20, 10.0, 500.0, **allreduce_args(2))
    k.launch("gemm_K2", 1000.0, 7, 1010.0, 100.0)
    return k.write(d / "rank-0.json")


def test_report_says_why_exposed_communication_costs_nothing(tmp_path):
    res = replay([str(_cpu_bound_job(tmp_path))], whatifs=["no-comm"])
    assert res.replay.exposed_comm_s == pytest.approx(400 * US)      # 110-510: no compute beside C
    assert res.whatifs[0].gain_s == 0.0
    assert "CPU-bound" in res.explanation and "host code" in res.explanation
    r = subprocess.run([sys.executable, "-m", "ccoverlap", "replay", str(tmp_path), "-q", "--whatif", "no-comm"],
                       capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "200"})
    assert r.returncode == 0 and "Why analyze and replay differ" in r.stdout
    assert "costs at most 0.00 ms" in r.stdout
    # where removing communication gains what analyze counts as exposed, nothing to explain
    res = replay([str(_contention_trace(tmp_path))], whatifs=["no-comm"])
    assert res.whatifs[0].gain_s == pytest.approx(res.replay.exposed_comm_s, rel=0.05)
    assert res.explanation == ""


def test_centauri_keeps_the_given_collective_when_partitioning_replays_slower(tmp_path):
    # C (all-reduce, 10-510) is exposed and B (stream 7) starts when it ends; the host then waits
    # for C (stream sync, returns 512) and launches K (stream 9, 520-620), which ends the step.
    # Centauri cuts C into chunks: B may start early, but every extra chunk costs a launch latency,
    # so C ends later, the sync returns later and K with it: slower, the given collective stays
    k = Rank(0, 2)
    k.launch("ncclDevKernel_AllReduce_RING_LL", 0.0, 20, 10.0, 500.0, **allreduce_args(2))
    k.launch("gemm_B", 1.0, 7, 510.0, 10.0)
    k.call("cudaStreamSynchronize", 2.0, 510.0)
    k.launch("gemm_K", 515.0, 9, 520.0, 100.0)
    res = replay([str(k.write(tmp_path / "rank-0.json"))], whatifs=["centauri"])
    s = res.whatifs[0]
    assert res.replay.step_time_s == pytest.approx(610 * US)
    assert s.gain_s == 0.0 and s.step_time_s == res.replay.step_time_s
    assert "kept the given configuration for 1" in s.note and "in 8 chunks" in s.note


def test_cli_out_with_a_step_range_too_long_to_list(tmp_path, capsys):
    """``--steps`` selecting more steps than are listed (kept as ranges) with ``--out``: the
    closing hint names the same ranges instead of failing to iterate them."""
    from ccoverlap.cli import main

    paths = [str(p) for p in two_rank_job(tmp_path)]
    code = main(["replay", *paths, "--steps", "0-20000", "--whatif", "network-2x", "--out", str(tmp_path / "w")])
    out = capsys.readouterr().out
    assert code == 0
    assert "--steps 0-20000 DIR" in out


def test_measure_without_metrics_gives_the_bounds_only(tmp_path):
    from ccoverlap.replayer.core import measure, step_time

    job = load_job([str(p) for p in two_rank_job(tmp_path)], steps="all")
    t = job.graph.run()
    starts, ends = gpu_times(job, t)
    full, bounds_only = measure(job, starts, ends), measure(job, starts, ends, metrics=False)
    assert bounds_only.overall == {} and all(per == {} for per in bounds_only.steps.values())
    assert set(full.overall) == set(bounds_only.bounds) == {0, 1}
    assert step_time(bounds_only) == step_time(full) > 0
