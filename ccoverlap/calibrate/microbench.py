"""GPU microbenchmarks for ``ccoverlap calibrate``: CUDA-event timing, medians, overlap runs.

Every measurement is a plain dict (a *record*) with a ``kind`` and its configuration, times
in seconds as medians over ``reps`` timed repetitions after ``warmup`` untimed ones; each
repetition times a loop of ``iters`` launches lasting at least ``min_window_s`` with CUDA
events, and reports seconds per launch. Kinds (see :mod:`ccoverlap.calibrate.fileformat`):

* ``gemm``          one GEMM alone (roofline with waves, lagom eq. 5; size-dependent efficiency)
* ``gemm_split``    a GEMM cut 8- or 64-way along M or K (accumulating), pieces run back to
                    back, vs. the whole (ficco §IV-C1, Fig. 7 decomposition loss)
* ``copy``          device copies: SM-driven (channel-copy kernel, elementwise kernel) and
                    copy-engine (``cudaMemcpyAsync`` d2d, pinned h2d / d2h, peer if 2 GPUs)
* ``channel_copy``  the NC/NT/C channel-copy kernel alone (its own throughput)
* ``sm_contention`` a victim (GEMM or memory-bound op) beside the channel-copy kernel on a
                    second stream, and the copy beside the victim (lagom §3.2, Fig. 3)
* ``ce_contention`` a victim beside copy-engine copies, and the copies beside the victim
                    (ficco §IV-D, Fig. 9)

Overlap runs: both streams wait behind a short sleep kernel (so the host enqueues all work
first and both sides start together); the *timed* side runs on one stream while the
*covering* side, long enough to outlast it, runs on the other. The timed side is measured
with events; the record says whether coverage held (``covered``). Each pair is run twice,
swapping roles, to get both slowdowns. Only runs on CUDA; import torch lazily.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ccoverlap.calibrate import grids
from ccoverlap.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where it is used: the module loads without it
    import torch


def require_cuda(device: str | None = None, *, offline_hint: str | None = None) -> torch.device:
    """The ``torch.device`` to calibrate, or :class:`ConfigError` (one line) when there is no
    usable CUDA GPU. ``device``: ``"cuda"``, ``"cuda:N"`` or ``"N"`` (default: current).
    ``offline_hint``: for a measuring script with modes that need no GPU, what to use instead
    (e.g. ``"--dry-run or --from-json"``); the message then names it."""
    try:
        import torch
    except ImportError:
        if offline_hint:
            raise ConfigError(f"measuring needs PyTorch with CUDA; without a GPU use {offline_hint}") from None
        raise ConfigError("calibrate needs PyTorch with CUDA (pip install torch); torch is not installed") from None
    if not torch.cuda.is_available():
        if offline_hint:
            raise ConfigError(f"no CUDA GPU available (torch {torch.__version__}); measuring needs one - "
                              f"without a GPU use {offline_hint}")
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"no CUDA GPU available (torch {torch.__version__}, {built}); "
                          "run `ccoverlap calibrate` on a machine with an NVIDIA GPU")
    spec = (device or "cuda").strip()
    if spec.isdigit():
        spec = f"cuda:{spec}"
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"--device: not a device: {device!r} (use cuda or cuda:N)") from None
    if dev.type != "cuda":
        raise ConfigError(f"--device: calibration needs a CUDA device, got {device!r}")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < torch.cuda.device_count():
        raise ConfigError(f"--device: {device!r} does not exist ({torch.cuda.device_count()} CUDA device(s))")
    return torch.device("cuda", index)


def _driver_version() -> str:
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:  # CUDA driver API version (e.g. 12040), when nvidia-smi is missing
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"CUDA driver API {v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        pass
    return "unknown"


def device_info(dev: torch.device) -> dict[str, Any]:
    """Name, SM count, memory, L2, compute capability of ``dev``, plus driver, torch and CUDA
    versions and the catalog GPU it matches (``ccoverlap.catalog.hardware``), for the file header."""
    import platform

    import torch

    p = torch.cuda.get_device_properties(dev)
    return {
        "name": p.name,
        "index": dev.index,
        "sms": int(p.multi_processor_count),
        "memory_bytes": int(p.total_memory),
        "l2_bytes": int(getattr(p, "L2_cache_size", 0) or 0),
        "compute_capability": f"{p.major}.{p.minor}",
        "catalog_gpu": catalog_gpu(p.name),
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "unknown",
        "python": platform.python_version(),
        "device_count": torch.cuda.device_count(),
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }


def catalog_gpu(device_name: str) -> str | None:
    """The :data:`ccoverlap.catalog.hardware.GPUS` entry a CUDA device name corresponds to, or None
    (``"NVIDIA H100 80GB HBM3"`` -> ``"H100-SXM"``; PCIe and NVL variants are not in the catalog)."""
    n = device_name.lower()
    if "h100" in n:
        return None if ("pcie" in n or "nvl" in n) else "H100-SXM"
    if "h200" in n:
        return "H200"
    if "a100" in n and "80" in n and "pcie" not in n:
        return "A100-80GB-SXM"
    if "a40" in n.split():
        return "A40"
    if "mi300x" in n:
        return "MI300X"
    return None


# ----------------------------------------------------------------------------- timing

class Bench:
    """Timing helpers bound to one device and run plan (:class:`~ccoverlap.calibrate.grids.Grid`)."""

    def __init__(self, dev: torch.device | str, grid: grids.Grid, *, log: Callable[[str], None] = lambda s: None) -> None:
        import torch

        self.torch = torch
        dev = torch.device(dev)
        self.dev = dev if dev.index is not None else torch.device(dev.type, torch.cuda.current_device())
        self.grid = grid
        self.log = log
        torch.cuda.set_device(self.dev)
        self.main = torch.cuda.Stream(self.dev)
        self.side = torch.cuda.Stream(self.dev)
        self._cycles_per_s = self._sleep_rate()

    def _sleep_rate(self) -> float:
        """GPU clock cycles per second as ``torch.cuda._sleep`` counts them (for the gate)."""
        torch = self.torch
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.main):
            torch.cuda._sleep(1000)
            a.record()
            torch.cuda._sleep(2_000_000)
            b.record()
        torch.cuda.synchronize()
        return 2_000_000 / max(a.elapsed_time(b) / 1e3, 1e-6)

    def time_loop(self, fn: Callable[[], None], *, iters: int | None = None) -> dict:
        """Median seconds per call of ``fn`` (enqueued on the main stream), with
        ``iters`` calls per timed repetition (default: enough for ``min_window_s``)."""
        if iters is None:
            iters = self.iters_for(fn)
        samples = []
        for r in range(self.grid.warmup + self.grid.reps):
            t = self.timed_calls(fn, iters)
            if r >= self.grid.warmup:
                samples.append(t / iters)
        return summary(samples, iters=iters)

    def timed_calls(self, fn: Callable[[], None], iters: int) -> float:
        """Seconds that ``iters`` back-to-back calls of ``fn`` take on the main stream, between
        two CUDA events (waits for the second)."""
        torch = self.torch
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.main):
            a.record()
            for _ in range(iters):
                fn()
            b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3

    def time_graph(self, fn: Callable[[], None], *, max_calls: int = 2000) -> dict:
        """Seconds per call of ``fn`` as the GPU runs it: ``n`` calls captured in one CUDA graph
        (``n`` = the eager calls that fill ``min_window_s``, at most ``max_calls``), replays
        timed with :meth:`time_loop` and divided by ``n``. Replaying a graph takes the host's
        launch cost out, which a Python loop of short kernels would measure instead of them.
        Raises what the capture raises."""
        torch = self.torch
        warm = torch.cuda.Stream(self.dev)
        warm.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(warm):  # warm-up off the capture stream (cuBLAS handles, workspaces)
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.dev).wait_stream(warm)
        torch.cuda.synchronize(self.dev)
        n = max(1, min(max_calls, self.iters_for(fn)))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(n):
                fn()
        r = self.time_loop(graph.replay, iters=1)
        del graph
        return {"time_s": r["time_s"] / n, "samples_s": [float(f"{x / n:.6g}") for x in r["samples_s"]],
                "iters": n, "timing": "graph"}

    def time_kernels(self, fn: Callable[[], None]) -> dict:
        """:meth:`time_graph`, or where the capture is refused an eager :meth:`time_loop` whose
        record says so (``timing``, ``note``). Out of memory is raised."""
        oom = getattr(self.torch.cuda, "OutOfMemoryError", RuntimeError)
        try:
            return self.time_graph(fn)
        except oom:
            raise
        except Exception as exc:  # capture refused: time it eagerly, keep the reason
            self.torch.cuda.synchronize(self.dev)
            return {**self.time_loop(fn), "timing": "eager",
                    "note": f"graph timing failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"}

    def iters_for(self, fn: Callable[[], None], window_s: float | None = None) -> int:
        """Calls of ``fn`` that take at least ``window_s`` (default ``min_window_s``)."""
        window = self.grid.min_window_s if window_s is None else window_s
        n, t = 1, 0.0
        for _ in range(12):
            t = self.timed_calls(fn, n)
            if t >= window:
                return n
            n = min(100_000, max(n * 2, int(math.ceil(n * window / max(t, 1e-7) * 1.2))))
        return n

    def overlap(self, timed: Callable[[], None], timed_s: float, cover: Callable[[], None],
                cover_s: float, *, lead_s: float = 0.0) -> dict:
        """Median seconds per call of ``timed`` on the main stream while ``cover`` runs on the
        side stream throughout. ``timed_s`` / ``cover_s``: their per-call times alone (to size
        the loops). ``lead_s``: the cover starts this long before the timed side (0: both are
        released together), so that its kernels hold their SMs first. Coverage is checked with
        events; if the cover ended first it is lengthened (from the observed durations, at
        least doubled; up to 3 times). Returns ``summary`` fields plus ``covered``."""
        torch = self.torch
        n_t = max(1, math.ceil(self.grid.min_window_s / max(timed_s, 1e-7)))
        n_c = max(1, math.ceil((2.5 * n_t * timed_s + lead_s) / max(cover_s, 1e-7)))
        gate_s = 1e-3
        for _attempt in range(4):
            samples, ok, need = [], True, n_c
            for r in range(self.grid.warmup + self.grid.reps):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                gate = torch.cuda.Event()
                host0 = time.perf_counter()
                with torch.cuda.stream(self.main):
                    torch.cuda._sleep(int(gate_s * self._cycles_per_s))
                    gate.record()
                self.side.wait_event(gate)
                with torch.cuda.stream(self.side):
                    ev[2].record()
                    for _ in range(n_c):
                        cover()
                    ev[3].record()
                with torch.cuda.stream(self.main):
                    if lead_s > 0:
                        torch.cuda._sleep(int(lead_s * self._cycles_per_s))
                    ev[0].record()
                    for _ in range(n_t):
                        timed()
                    ev[1].record()
                enqueue_s = time.perf_counter() - host0
                torch.cuda.synchronize()
                if enqueue_s > 0.5 * gate_s:  # host still enqueuing when the gate opened
                    gate_s = min(0.5, 3.0 * enqueue_s)
                t_end = ev[0].elapsed_time(ev[1])
                covered = ev[0].elapsed_time(ev[3]) >= t_end and ev[2].elapsed_time(ev[0]) >= -0.05
                if r >= self.grid.warmup:
                    samples.append(t_end / 1e3 / n_t)
                    ok = ok and covered
                cover_each = ev[2].elapsed_time(ev[3]) / n_c  # per call, slowed as it was
                need = max(need, math.ceil(1.5 * t_end / max(cover_each, 1e-6)))
            if ok:
                break
            n_c = max(2 * n_c, need)
        out = summary(samples, iters=n_t)
        out["covered"] = ok
        return out


def summary(samples: list[float], *, iters: int) -> dict:
    """``{"time_s": median, "samples_s": [...], "iters": iters}`` of per-call seconds."""
    return {"time_s": statistics.median(samples), "samples_s": [float(f"{s:.6g}") for s in samples],
            "iters": int(iters)}


# ----------------------------------------------------------------------------- workloads

def gemm_tensors(bench: Bench, dtype: str, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A, B, C) for ``C = A @ B``: M×K and K×N random operands of ``dtype``, M×N output."""
    torch = bench.torch
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    a = torch.randn(m, k, device=bench.dev, dtype=dt)
    b = torch.randn(k, n, device=bench.dev, dtype=dt)
    return a, b, torch.empty(m, n, device=bench.dev, dtype=dt)


def make_gemm(bench: Bench, dtype: str, m: int, n: int, k: int, *,
              tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> Callable[[], None]:
    """A closure launching ``C = A @ B`` (M×K by K×N, ``dtype``) into a preallocated C."""
    torch = bench.torch
    a, b, c = tensors if tensors is not None else gemm_tensors(bench, dtype, m, n, k)
    return lambda: torch.matmul(a, b, out=c)


def make_split_gemm(bench: Bench, dtype: str, m: int, n: int, k: int, dim: str, ways: int, *,
                    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> Callable[[], None]:
    """A closure running the ``ways`` pieces of the GEMM back to back (ficco §IV-C1): by rows
    (``dim="m"``, each piece writes its rows of C) or by the inner dimension (``dim="k"``,
    piece 0 writes C, later pieces accumulate ``C += A[:, ks] @ B[ks, :]``)."""
    torch = bench.torch
    a, b, c = tensors if tensors is not None else gemm_tensors(bench, dtype, m, n, k)
    size = m if dim == "m" else k
    bounds = [(i * size) // ways for i in range(ways + 1)]
    pieces = [(bounds[i], bounds[i + 1]) for i in range(ways)]
    if dim == "m":
        views = [(a[lo:hi], c[lo:hi]) for lo, hi in pieces]

        def run() -> None:
            for av, cv in views:
                torch.matmul(av, b, out=cv)
    else:
        views = [(a[:, lo:hi], b[lo:hi]) for lo, hi in pieces]

        def run() -> None:
            torch.matmul(views[0][0], views[0][1], out=c)
            for av, bv in views[1:]:
                c.addmm_(av, bv)
    return run


def make_memory_op(bench: Bench, nbytes: int) -> tuple[Callable[[], None], int]:
    """A memory-bound victim: ``z = x + y`` on bf16 tensors; returns (closure, HBM bytes moved)."""
    torch = bench.torch
    n = max(1, nbytes // 6)
    x = torch.randn(n, device=bench.dev, dtype=torch.bfloat16)
    y = torch.randn(n, device=bench.dev, dtype=torch.bfloat16)
    z = torch.empty_like(x)
    return (lambda: torch.add(x, y, out=z)), 6 * n


def make_ce_copy(bench: Bench, direction: str, nbytes: int) -> Callable[[], None]:
    """A copy-engine copy of ``nbytes``: ``d2d`` (same device), ``h2d`` / ``d2h`` with pinned
    host memory, or ``p2p`` to the next GPU; ``Tensor.copy_(non_blocking=True)`` between
    contiguous same-dtype buffers, which PyTorch issues as ``cudaMemcpyAsync``."""
    torch = bench.torch
    n = nbytes // 4
    if direction == "d2d":
        src = torch.empty(n, dtype=torch.int32, device=bench.dev)
        dst = torch.empty_like(src)
    elif direction == "h2d":
        src = torch.empty(n, dtype=torch.int32, pin_memory=True)
        dst = torch.empty(n, dtype=torch.int32, device=bench.dev)
    elif direction == "d2h":
        src = torch.empty(n, dtype=torch.int32, device=bench.dev)
        dst = torch.empty(n, dtype=torch.int32, pin_memory=True)
    elif direction == "p2p":
        peer = (bench.dev.index + 1) % torch.cuda.device_count()
        src = torch.empty(n, dtype=torch.int32, device=bench.dev)
        dst = torch.empty(n, dtype=torch.int32, device=torch.device("cuda", peer))
    else:
        raise ValueError(f"unknown copy direction {direction!r}")
    src.fill_(1) if src.is_cuda else src.zero_()
    return lambda: dst.copy_(src, non_blocking=True)


def make_chunked_ce_copy(bench: Bench, nbytes: int, chunk_bytes: int) -> Callable[[], None]:
    """``nbytes`` copied device to device as ``nbytes / chunk_bytes`` back-to-back
    ``cudaMemcpyAsync`` calls of ``chunk_bytes`` each (a DMA transport's steps, ficco §IV-D),
    captured in a CUDA graph so that the host's launch cost does not pace them; one call
    replays the graph on the current stream."""
    torch = bench.torch
    n, per = nbytes // chunk_bytes, chunk_bytes // 4
    if n < 1 or per < 1 or chunk_bytes % 4:
        raise ValueError(f"chunked copy needs 4-byte-aligned chunks no larger than the copy, "
                         f"got {chunk_bytes} of {nbytes}")
    src = torch.ones(n * per, dtype=torch.int32, device=bench.dev)
    dst = torch.empty_like(src)
    side = torch.cuda.Stream(bench.dev)
    side.wait_stream(torch.cuda.current_stream(bench.dev))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for i in range(n):
            dst[i * per:(i + 1) * per].copy_(src[i * per:(i + 1) * per], non_blocking=True)
    torch.cuda.synchronize(bench.dev)

    def replay() -> None:
        graph.replay()

    # the graph reads and writes these: alive as long as it is (a function attribute, which
    # the checker does not model)
    replay.buffers = (src, dst)  # type: ignore[attr-defined]
    return replay
