"""The NC/NT/C "channel copy" kernel: an NCCL-channel-shaped copy for contention microbenchmarks.

lagom §3.2 (Fig. 3) finds that an NCCL collective slows a concurrent GEMM mainly through
two knobs: the number of channels NC (one thread block each, so NC SMs are taken from the
GEMM, eq. 5) and the chunk size C each channel moves per step (more bytes in flight, so a
larger share V(NC, C) of the memory bandwidth, eq. 6); the threads per block NT matter
little. To measure that on one GPU, without a second GPU or NCCL, this kernel reproduces
the *resource shape* of a channel set:

* the grid is exactly ``NC`` thread blocks of exactly ``NT`` threads (``<<<NC, NT>>>``);
* block ``b`` copies chunks ``b, b + NC, b + 2 NC, ...`` of ``C`` bytes each from a source
  to a destination buffer (wrapping around the buffers, which are larger than L2 so the
  traffic reaches HBM), with 16-byte vector loads/stores, all NT threads on one chunk;
* a block finishes a chunk (``__syncthreads`` + ``__threadfence``) before starting the next,
  like an NCCL step that publishes a chunk before the next one.

Two backends, tried in order: CUDA C++ compiled with
``torch.utils.cpp_extension.load_inline`` (needs nvcc and ninja), then Triton (grid of NC
programs with ``num_warps = NT / 32``, so NT must be a power of two ≥ 32). Both write
launch statistics to a small int64 tensor so a test can check what really ran:
``[grid size, threads per block, blocks that ran, chunks copied]`` (Triton reports threads
per block from its launch configuration).

Nothing here runs without CUDA; :func:`load_channel_copy` raises
:class:`KernelUnavailable` with the reason of each backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the module loads without it
    import torch

VEC_BYTES = 16  # one int4 per thread per step: the width NCCL's simple protocol uses

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

// One thread block = one channel. Block b copies chunks b, b+NC, b+2NC, ... of
// chunk_vecs int4 (16-byte) words; chunk c lives at (c mod n_buf_chunks) * chunk_vecs.
__global__ void ccov_channel_copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst,
                                         long long n_buf_chunks, long long chunk_vecs,
                                         long long total_chunks, long long* stats) {
  long long done = 0;
  for (long long c = blockIdx.x; c < total_chunks; c += gridDim.x) {
    const long long base = (c % n_buf_chunks) * chunk_vecs;
    for (long long i = threadIdx.x; i < chunk_vecs; i += blockDim.x) {
      dst[base + i] = src[base + i];
    }
    __threadfence();   // publish the chunk ...
    __syncthreads();   // ... and finish it before the next one, like one NCCL step
    ++done;
  }
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) {
      stats[0] = gridDim.x;
      stats[1] = blockDim.x;
    }
    atomicAdd(reinterpret_cast<unsigned long long*>(stats + 2), 1ULL);
    atomicAdd(reinterpret_cast<unsigned long long*>(stats + 3), (unsigned long long)done);
  }
}

void ccov_channel_copy(torch::Tensor src, torch::Tensor dst, int64_t nc, int64_t nt,
                       int64_t chunk_bytes, int64_t total_bytes, torch::Tensor stats) {
  TORCH_CHECK(src.is_cuda() && dst.is_cuda() && stats.is_cuda(), "tensors must be on the GPU");
  TORCH_CHECK(src.is_contiguous() && dst.is_contiguous(), "buffers must be contiguous");
  TORCH_CHECK(stats.scalar_type() == torch::kInt64 && stats.numel() >= 4, "stats: int64[4]");
  TORCH_CHECK(nc >= 1 && nc <= 65535, "NC must be in [1, 65535]");
  TORCH_CHECK(nt >= 32 && nt <= 1024 && nt % 32 == 0, "NT must be a multiple of 32 in [32, 1024]");
  TORCH_CHECK(chunk_bytes >= 16 && chunk_bytes % 16 == 0, "C must be a positive multiple of 16 bytes");
  const int64_t buf_bytes = std::min(src.nbytes(), dst.nbytes());
  const int64_t n_buf_chunks = buf_bytes / chunk_bytes;
  TORCH_CHECK(n_buf_chunks >= 1, "buffers are smaller than one chunk");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(src.data_ptr()) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(dst.data_ptr()) % 16 == 0, "buffers must be 16-byte aligned");
  const int64_t total_chunks = (total_bytes + chunk_bytes - 1) / chunk_bytes;
  auto stream = at::cuda::getCurrentCUDAStream();
  ccov_channel_copy_kernel<<<(unsigned)nc, (unsigned)nt, 0, stream>>>(
      reinterpret_cast<const int4*>(src.data_ptr()), reinterpret_cast<int4*>(dst.data_ptr()),
      (long long)n_buf_chunks, (long long)(chunk_bytes / 16), (long long)total_chunks,
      reinterpret_cast<long long*>(stats.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

CPP_DECL = (
    "void ccov_channel_copy(torch::Tensor src, torch::Tensor dst, int64_t nc, int64_t nt, "
    "int64_t chunk_bytes, int64_t total_bytes, torch::Tensor stats);"
)


class KernelUnavailable(RuntimeError):
    """Neither backend of the channel-copy kernel could be built; the message says why, per backend."""


@dataclass
class ChannelCopy:
    """A built channel-copy kernel. ``launch`` enqueues one copy on the current CUDA stream."""

    backend: str  # "cuda" (load_inline) or "triton"
    _launch: Callable[..., None]

    def launch(self, src: torch.Tensor, dst: torch.Tensor, *, nc: int, nt: int, chunk_bytes: int, total_bytes: int,
               stats: torch.Tensor | None = None) -> None:
        """Copy ``total_bytes`` (rounded up to whole chunks) from ``src`` to ``dst`` with exactly
        ``nc`` blocks of ``nt`` threads, each block moving ``chunk_bytes`` (C, bytes) per step.
        ``stats`` (int64[4] on the GPU, zeroed by the caller) receives the launch statistics."""
        check_launch(nc=nc, nt=nt, chunk_bytes=chunk_bytes, total_bytes=total_bytes, backend=self.backend)
        if stats is None:
            import torch

            stats = torch.zeros(4, dtype=torch.int64, device=src.device)
        self._launch(src, dst, nc, nt, chunk_bytes, total_bytes, stats)


def check_launch(*, nc: int, nt: int, chunk_bytes: int, total_bytes: int, backend: str = "cuda") -> None:
    """Raise ValueError unless (NC, NT, C) is launchable: NC ≥ 1 blocks, NT a multiple of 32 in
    [32, 1024] (a power of two for Triton, whose blocks are ``num_warps`` warps), C a multiple
    of 16 bytes (the vector width), ``total_bytes`` > 0."""
    if nc < 1 or nc > 65535:
        raise ValueError(f"NC must be in [1, 65535], got {nc}")
    if nt < 32 or nt > 1024 or nt % 32:
        raise ValueError(f"NT must be a multiple of 32 in [32, 1024], got {nt}")
    if backend == "triton" and (nt & (nt - 1)):
        raise ValueError(f"NT must be a power of two for the Triton kernel, got {nt}")
    if chunk_bytes < VEC_BYTES or chunk_bytes % VEC_BYTES:
        raise ValueError(f"C must be a positive multiple of {VEC_BYTES} bytes, got {chunk_bytes}")
    if total_bytes <= 0:
        raise ValueError(f"total bytes must be positive, got {total_bytes}")


def _build_cuda(verbose: bool) -> ChannelCopy:
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        raise RuntimeError("CUDA_HOME not found (no nvcc)")
    mod = cpp_extension.load_inline(
        name="ccoverlap_channel_copy_v1",
        cpp_sources=CPP_DECL,
        cuda_sources=CUDA_SRC,
        functions=["ccov_channel_copy"],
        extra_cuda_cflags=["-O3"],
        verbose=verbose,
    )

    def launch(src: torch.Tensor, dst: torch.Tensor, nc: int, nt: int, chunk_bytes: int, total_bytes: int,
               stats: torch.Tensor) -> None:
        mod.ccov_channel_copy(src, dst, int(nc), int(nt), int(chunk_bytes), int(total_bytes), stats)

    return ChannelCopy(backend="cuda", _launch=launch)


def _build_triton() -> ChannelCopy:
    import triton  # type: ignore[import-not-found, unused-ignore]  # optional: on GPU machines only
    import triton.language as tl  # type: ignore[import-not-found, unused-ignore]

    # Triton compiles from the kernel's annotations (tl.constexpr): its parameters stay bare
    @triton.jit
    def _channel_copy(src, dst, stats, n_buf_chunks, chunk_elems, total_chunks, nt_threads,  # type: ignore[no-untyped-def, unused-ignore]
                      TILE: tl.constexpr):
        # int32 elements; one program = one channel of num_warps * 32 threads.
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, TILE)
        done = pid * 0  # an int32 tensor, so the loop may carry it
        for c in range(pid, total_chunks, nprog):
            base = (c % n_buf_chunks) * chunk_elems
            for off in range(0, chunk_elems, TILE):
                mask = off + offs < chunk_elems
                v = tl.load(src + base + off + offs, mask=mask)
                tl.store(dst + base + off + offs, v, mask=mask)
            tl.debug_barrier()  # finish the chunk before the next one
            done += 1
        if pid == 0:
            tl.store(stats + 0, nprog)  # stored values are cast to int64
            tl.store(stats + 1, nt_threads)
        tl.atomic_add(stats + 2, 1)
        tl.atomic_add(stats + 3, done.to(tl.int64))

    def launch(src: torch.Tensor, dst: torch.Tensor, nc: int, nt: int, chunk_bytes: int, total_bytes: int,
               stats: torch.Tensor) -> None:
        import torch

        s32 = src.view(torch.int32)
        d32 = dst.view(torch.int32)
        buf_bytes = min(src.numel() * src.element_size(), dst.numel() * dst.element_size())
        n_buf_chunks = buf_bytes // chunk_bytes
        if n_buf_chunks < 1:
            raise ValueError("buffers are smaller than one chunk")
        total_chunks = -(-total_bytes // chunk_bytes)
        chunk_elems = chunk_bytes // 4
        tile = min(nt * 4, triton.next_power_of_2(chunk_elems))  # 16 bytes per thread per step
        _channel_copy[(nc,)](s32, d32, stats, n_buf_chunks, chunk_elems, total_chunks, nt,
                             TILE=tile, num_warps=nt // 32)

    return ChannelCopy(backend="triton", _launch=launch)


def load_channel_copy(*, prefer: str = "auto", verbose: bool = False) -> ChannelCopy:
    """Build the channel-copy kernel: CUDA via ``load_inline`` first, then Triton
    (``prefer="cuda"`` or ``"triton"`` tries only that one). Raises :class:`KernelUnavailable`
    naming why each backend failed (e.g. no nvcc, no Triton)."""
    import torch

    if not torch.cuda.is_available():
        raise KernelUnavailable("no CUDA device")
    order = {"auto": ("cuda", "triton"), "cuda": ("cuda",), "triton": ("triton",)}.get(prefer)
    if order is None:
        raise ValueError(f"prefer must be auto, cuda or triton, got {prefer!r}")
    reasons = []
    for backend in order:
        try:
            kernel = _build_cuda(verbose) if backend == "cuda" else _build_triton()
            _smoke_test(kernel)
            return kernel
        except Exception as exc:  # a missing compiler, header or package: try the next one
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            reasons.append(f"{backend}: {type(exc).__name__}: {first[:200]}")
    raise KernelUnavailable("channel-copy kernel unavailable (" + "; ".join(reasons) + ")")


def _smoke_test(kernel: ChannelCopy) -> None:
    """Copy 1 MiB with NC=3, NT=128, C=4 KiB and check the bytes and the launch statistics."""
    import torch

    src = torch.randint(0, 2**31 - 1, (1 << 18,), dtype=torch.int32, device="cuda")
    dst = torch.zeros_like(src)
    stats = torch.zeros(4, dtype=torch.int64, device="cuda")
    kernel.launch(src, dst, nc=3, nt=128, chunk_bytes=4096, total_bytes=src.numel() * 4, stats=stats)
    torch.cuda.synchronize()
    if not torch.equal(src, dst):
        raise RuntimeError("smoke test: copied bytes differ")
    got = stats.tolist()
    if got != [3, 128, 3, (1 << 20) // 4096]:
        raise RuntimeError(f"smoke test: launch statistics {got}, expected [3, 128, 3, 256]")
