"""GPU paths of ``ccoverlap calibrate`` (skipped without CUDA): the channel-copy kernel really
launches NC blocks of NT threads moving C-byte chunks, timing and overlap runs behave, and the
quick plan runs end to end into a file the planner loads."""

import dataclasses
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from ccoverlap.calibrate import fileformat, grids  # noqa: E402
from ccoverlap.calibrate import microbench as mb  # noqa: E402
from ccoverlap.errors import ConfigError  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MiB = 1 << 20


@pytest.fixture(scope="module", params=["cuda", "triton"])
def kernel(request):
    from ccoverlap.calibrate.kernels import KernelUnavailable, load_channel_copy

    try:
        return load_channel_copy(prefer=request.param)
    except KernelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("nc,nt,chunk", [(1, 32, 16), (3, 128, 4096), (8, 256, 65536), (64, 512, MiB),
                                         (132, 1024, 16384)])
def test_launch_is_exactly_nc_blocks_of_nt_threads_in_c_byte_chunks(kernel, nc, nt, chunk):
    src = torch.randint(-2**31, 2**31 - 1, (16 * MiB,), dtype=torch.int32, device="cuda")  # 64 MiB
    dst = torch.zeros_like(src)
    stats = torch.zeros(4, dtype=torch.int64, device="cuda")
    total = min(3 * nc * chunk + chunk // 2, 64 * MiB - chunk)  # not a whole number of chunks
    kernel.launch(src, dst, nc=nc, nt=nt, chunk_bytes=chunk, total_bytes=total, stats=stats)
    torch.cuda.synchronize()
    chunks = math.ceil(total / chunk)
    assert stats.tolist() == [nc, nt, nc, chunks]
    moved = chunks * chunk // 4
    assert torch.equal(dst[:moved], src[:moved])
    assert not dst[moved:].any()


def test_wraps_around_the_buffer(kernel):
    src = torch.arange(1 << 18, dtype=torch.int32, device="cuda")  # 1 MiB
    dst = torch.zeros_like(src)
    stats = torch.zeros(4, dtype=torch.int64, device="cuda")
    kernel.launch(src, dst, nc=4, nt=128, chunk_bytes=65536, total_bytes=5 * MiB, stats=stats)
    torch.cuda.synchronize()
    assert torch.equal(src, dst) and stats.tolist()[3] == 80


def _bench():
    grid = dataclasses.replace(grids.make_grid(True), reps=3, warmup=1, min_window_s=0.002)
    return mb.Bench(mb.require_cuda(None), grid)


def test_time_loop_and_overlap(kernel):
    bench = _bench()
    gemm = mb.make_gemm(bench, "bf16", 4096, 4096, 4096)
    alone = bench.time_loop(gemm)
    assert alone["time_s"] > 0 and len(alone["samples_s"]) == 3
    src = torch.empty(64 * MiB, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)

    def copy():
        kernel.launch(src, dst, nc=16, nt=512, chunk_bytes=MiB, total_bytes=128 * MiB)

    copy_alone = bench.time_loop(copy)["time_s"]
    under = bench.overlap(gemm, alone["time_s"], copy, copy_alone)
    assert under["covered"]
    assert under["time_s"] > 0.9 * alone["time_s"]  # contention never speeds a GEMM up (noise aside)
    first = bench.overlap(gemm, alone["time_s"], copy, copy_alone, lead_s=2e-4)  # the copy holds its SMs first
    assert first["covered"] and first["time_s"] > 0.9 * alone["time_s"]


def test_split_gemm_computes_the_same_product():
    bench = _bench()
    t = mb.gemm_tensors(bench, "fp32", 512, 256, 1024)
    a, b, c = t
    want = a @ b
    for dim in ("m", "k"):
        c.zero_()
        mb.make_split_gemm(bench, "fp32", 512, 256, 1024, dim, 8, tensors=t)()
        torch.testing.assert_close(c, want, rtol=1e-4, atol=1e-3)


def test_device_info_and_bad_device():
    dev = mb.require_cuda("0")
    info = mb.device_info(dev)
    assert info["sms"] > 0 and info["name"] and info["torch"] == torch.__version__
    with pytest.raises(ConfigError, match="does not exist"):
        mb.require_cuda(f"cuda:{torch.cuda.device_count()}")
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        mb.require_cuda("cpu")


@pytest.mark.slow
def test_quick_calibration_end_to_end(tmp_path):
    out = tmp_path / "gpu.json"
    args = [sys.executable, "-m", "ccoverlap", "calibrate", "--quick", "--out", str(out)]
    name = torch.cuda.get_device_name()
    if mb.catalog_gpu(name) is None:
        args += ["--gpu", "H100-SXM"]
    res = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-2000:]
    data = fileformat.read(out)
    kinds = {r["kind"] for r in data["source"]["measurements"]}
    assert {"gemm", "gemm_split", "copy", "ce_contention"} <= kinds
    if data["source"]["settings"]["kernel_backend"]:
        assert {"channel_copy", "sm_contention"} <= kinds
    assert data["params"] and data["source"]["heldout"]
    from ccoverlap.cost.params import CostParams

    CostParams.load(out)


def test_chunked_copy_engine_copy_moves_every_chunk():
    dev = torch.device("cuda")
    bench = object.__new__(mb.Bench)
    bench.torch, bench.dev = torch, dev
    copy = mb.make_chunked_ce_copy(bench, 8 * MiB, 256 * 1024)
    src, dst = copy.buffers
    dst.zero_()
    copy()
    torch.cuda.synchronize()
    assert src.numel() * 4 == 8 * MiB and torch.equal(dst, src)
    with pytest.raises(ValueError, match="chunks"):
        mb.make_chunked_ce_copy(bench, 1024, 4096)
