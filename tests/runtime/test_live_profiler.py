"""The live NCCL profiler's logic on CPU, through a stand-in process-group layer: configurations
broadcast from rank 0, applied to stock NCCL as ``--emit`` writes them (min / max CTAs per
communicator, a tuner-plugin row per call), one communicator per distinct configuration,
threads and chunk held to the process's values, medians then the maximum over ranks. The
real layer runs on GPUs only (skipped here without CUDA)."""

from __future__ import annotations

import pytest

from ccoverlap.catalog.hardware import get_cluster
from ccoverlap.deciders.lagom.space import TuningSpace
from ccoverlap.deciders.lagom.tune import lagom_tune
from ccoverlap.errors import ConfigError
from ccoverlap.nccl.apply import match_row, parse_tuner_csv
from ccoverlap.nccl.groups import Computation, OverlapCollective, OverlapGroup
from ccoverlap.nccl.plan import CommKey
from ccoverlap.runtime.profiler import LiveNCCLProfiler, ProfilerUnavailable, rank_blocks
from ccoverlap.specs import CollectiveSpec, CommConfig, GemmSpec, GroupSpec

MiB = 1 << 20
DP = GroupSpec(name="dp", size=4, local_size=4)
TP = GroupSpec(name="tp", size=2, local_size=2)


def group() -> OverlapGroup:
    comps = (Computation(name="gemm", spec=GemmSpec(m=4096, n=4096, k=4096)),)
    colls = (OverlapCollective(name="ag", spec=CollectiveSpec(collective="all_gather", bytes=64 * MiB, group=DP)),
             OverlapCollective(name="rs", spec=CollectiveSpec(collective="reduce_scatter", bytes=32 * MiB, group=TP)))
    return OverlapGroup(name="g", computations=comps, collectives=colls, cluster=get_cluster("dgx-h100", nodes=1))


class FakeLayer:
    """Rank ``rank`` of ``world``; rank 0's configurations are ``rank0`` (what broadcast returns);
    a collective's time is bytes / (channels x 1 GB/s) so the applied channels show in the times;
    other ranks are 10% slower (the maximum over ranks picks them)."""

    def __init__(self, rank=1, world=4, env=None, rank0=None, noise=(1.0, 3.0, 1.0, 1.0, 2.0)):
        self.rank, self.world = rank, world
        self.env = dict(env or {})
        self.rank0 = rank0
        self.noise = noise
        self.made: list[tuple] = []
        self.runs: list[list] = []

    def broadcast(self, obj):
        configs, env = obj  # (configurations, NCCL environment) of this rank
        return (self.rank0 if self.rank0 is not None else configs), env

    def nccl_env(self):
        return dict(self.env)

    def communicator(self, blocks, ctas, tuner_csv):
        self.made.append((blocks, dict(ctas), tuner_csv))
        return len(self.made) - 1

    def run(self, computations, collectives, warmup, iters):
        self.runs.append([(h, spec) for h, spec in collectives])
        samples = []
        for it in range(iters):
            f = self.noise[it % len(self.noise)]
            comm = []
            for h, spec in collectives:
                ctas = self.made[h][1]
                comm.append(f * spec.bytes / (ctas.get("max_ctas", 16) * 1e9))
            samples.append((comm, f * 1e-3, f * (1e-3 + sum(comm))))
        return samples

    def max_over_ranks(self, values):
        return [v * 1.1 for v in values]


def cfg(nc, proto="simple", alg="ring", nt=None, chunk=None):
    return CommConfig(channels=nc, threads=nt, chunk_bytes=chunk, protocol=proto, algorithm=alg)


def test_configurations_go_to_communicators_as_the_emitted_settings_apply_them():
    layer = FakeLayer(env={"NCCL_TUNER_PLUGIN": "/opt/libnccl-tuner-example.so"})
    prof = LiveNCCLProfiler(group(), layer, iters=5, warmup=2)
    res = prof.profile([cfg(8), cfg(4, "ll128")])
    assert [m[0] for m in layer.made] == [rank_blocks(4, 4), rank_blocks(4, 2)]
    assert [m[1] for m in layer.made] == [{"min_ctas": 8, "max_ctas": 8}, {"min_ctas": 4, "max_ctas": 4}]
    for (_, ctas, csv), coll in zip(layer.made, group().collectives):
        rows = parse_tuner_csv(csv)  # the pinned format, one row for exactly this call
        assert len(rows) == 1
        row = match_row(rows, CommKey.of(coll.spec))
        assert row.channels == ctas["max_ctas"] and row.n_ranks == coll.spec.group.size
    assert rows[0].protocol == "ll128"
    # times: the median over the timed runs (noise 1, 3, 1, 1, 2 -> 1), then the maximum over ranks
    assert res.comm_times_s == pytest.approx((64 * MiB / 8e9 * 1.1, 32 * MiB / 4e9 * 1.1))
    assert res.compute_time_s == pytest.approx(1e-3 * 1.1)


def test_rank_zeros_choice_is_what_every_rank_runs_and_communicators_are_reused():
    mine, rank0 = [cfg(2), cfg(2)], [cfg(16), cfg(16)]
    layer = FakeLayer(env={"NCCL_TUNER_PLUGIN": "x"}, rank0=rank0)
    prof = LiveNCCLProfiler(group(), layer, iters=1)
    prof.profile(mine)
    prof.profile(mine)
    assert [m[1]["max_ctas"] for m in layer.made] == [16, 16]  # two groups, made once each
    assert prof.calls == 2 and len(layer.runs) == 2


def test_threads_and_chunk_are_the_processs_and_strict_says_so():
    env = {"NCCL_TUNER_PLUGIN": "x", "NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": str(2 * MiB)}
    prof = LiveNCCLProfiler(group(), FakeLayer(env=env), iters=1)
    prof.profile([cfg(8, nt=256, chunk=MiB), cfg(8, nt=256, chunk=MiB)])  # what this process runs: fine
    with pytest.raises(ConfigError, match="threads 128 \\(this process runs 256: NCCL_NTHREADS is per process\\)"):
        prof.profile([cfg(8, nt=128), cfg(8)])
    with pytest.raises(ConfigError, match="chunk 524288 B \\(this process runs 1048576 B"):
        prof.profile([cfg(8, chunk=512 * 1024), cfg(8)])
    lenient = LiveNCCLProfiler(group(), FakeLayer(env=env), iters=1, strict=False)
    lenient.profile([cfg(8, nt=128), cfg(8)])
    assert any("threads 128" in n for n in lenient.ignored[-1])


def test_without_the_tuner_plugin_only_the_channels_apply():
    layer = FakeLayer(env={})
    with pytest.raises(ConfigError, match="needs NCCL's example tuner plugin"):
        LiveNCCLProfiler(group(), layer, iters=1).profile([cfg(8), cfg(8)])
    prof = LiveNCCLProfiler(group(), layer, iters=1, strict=False)
    prof.profile([cfg(8), cfg(4)])
    assert [(m[1], m[2]) for m in layer.made] == [({"min_ctas": 8, "max_ctas": 8}, None),
                                                  ({"min_ctas": 4, "max_ctas": 4}, None)]


def test_an_algorithm_nccl_does_not_have_is_refused():
    with pytest.raises(ConfigError, match="algorithm hierarchical"):
        LiveNCCLProfiler(group(), FakeLayer(env={"NCCL_TUNER_PLUGIN": "x"}), iters=1).profile(
            [cfg(8, alg="hierarchical"), cfg(8)])


@pytest.mark.parametrize("world,size", [(6, 4), (4, 0)])
def test_groups_that_do_not_tile_the_world_fail_with_one_message(world, size):
    with pytest.raises(ConfigError, match="does not divide the world"):
        rank_blocks(world, size)


def test_lagom_tunes_channels_through_the_live_path():
    # NT and C pinned to the process's values (the stock-NCCL way); Lagom varies NC, protocol, algorithm
    env = {"NCCL_TUNER_PLUGIN": "x"}
    prof = LiveNCCLProfiler(group(), FakeLayer(env=env, noise=(1.0,)), iters=1, strict=False)
    res = lagom_tune(group(), prof, space=TuningSpace(nc_min=2, nc_max=32))
    assert len(res.configs) == 2 and res.profiles == prof.calls > 1
    assert all(c.channels is not None for c in res.configs)


def test_the_gpu_layer_is_clearly_unavailable_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present; test_live_profiler_on_one_gpu covers it")
    from ccoverlap.runtime.nccl import TorchNCCLLayer, live_profiler

    ok, why = TorchNCCLLayer.available()
    assert not ok and "CUDA" in why
    with pytest.raises(ProfilerUnavailable, match="unavailable: no CUDA device"):
        live_profiler(group())


@pytest.mark.gpu
def test_live_profiler_on_one_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from ccoverlap.runtime.launch import spawn

    res = spawn(_one_gpu_profile, 1, (str(tmp_path),), backend="nccl", timeout_s=240)
    comm, compute, makespan = res[0]
    assert all(t > 0 for t in comm) and compute > 0 and makespan >= max(compute, max(comm)) * 0.5


def _one_gpu_profile(rank, world, workdir):
    import torch

    from ccoverlap.runtime.nccl import live_profiler

    torch.cuda.set_device(rank)
    g1 = GroupSpec(name="dp", size=1, local_size=1)
    comps = (Computation(name="gemm", spec=GemmSpec(m=2048, n=2048, k=2048)),)
    colls = (OverlapCollective(name="ag", spec=CollectiveSpec(collective="all_reduce", bytes=16 * MiB, group=g1)),)
    g = OverlapGroup(name="one", computations=comps, collectives=colls, cluster=get_cluster("dgx-h100", nodes=1))
    r = live_profiler(g, iters=3, warmup=1, strict=False, workdir=workdir).profile([CommConfig(channels=4)])
    return list(r.comm_times_s), r.compute_time_s, r.makespan_s
