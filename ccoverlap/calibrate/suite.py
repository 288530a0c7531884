"""The whole measurement run of ``ccoverlap calibrate``: every section of the plan in
:mod:`ccoverlap.calibrate.grids`, timed with :mod:`ccoverlap.calibrate.microbench`.

:func:`run_suite` returns the measurement records and notes (sections skipped and why).
CUDA only; torch is imported by the callers' ``Bench``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from ccoverlap.calibrate import grids
from ccoverlap.calibrate import microbench as mb
from ccoverlap.calibrate.kernels import ChannelCopy, KernelUnavailable, load_channel_copy
from ccoverlap.calibrate.sustained import sustained_section

if TYPE_CHECKING:  # torch is imported by the callers' Bench: the module loads without it
    import torch

MiB = 1 << 20


def _oom(bench: mb.Bench) -> type[BaseException]:
    return getattr(bench.torch.cuda, "OutOfMemoryError", RuntimeError)


def gemm_section(bench: mb.Bench, notes: list[str]) -> list[dict]:
    """Each GEMM of :func:`grids.gemm_sweep` alone (kind ``gemm``)."""
    out = []
    shapes = grids.gemm_sweep(bench.grid.quick)
    for i, (dtype, m, n, k) in enumerate(shapes):
        bench.log(f"gemm {i + 1}/{len(shapes)}: {dtype} {m}x{n}x{k}")
        try:
            r = bench.time_kernels(mb.make_gemm(bench, dtype, m, n, k))
        except _oom(bench):
            notes.append(f"gemm {dtype} {m}x{n}x{k}: out of memory, skipped")
            continue
        out.append({"kind": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, **r})
    bench.torch.cuda.empty_cache()
    return out


def split_section(bench: mb.Bench, notes: list[str]) -> list[dict]:
    """ficco Table I GEMMs (scaled) whole and split 8/64-way along M and K (kind ``gemm_split``,
    ficco §IV-C1, Fig. 7)."""
    out = []
    shapes = grids.ficco_shapes(bench.grid)
    for i, (name, m, n, k, scale) in enumerate(shapes):
        bench.log(f"decomposition {i + 1}/{len(shapes)}: {name} scaled x{scale:.3f} -> {m}x{n}x{k}")
        try:
            t = mb.gemm_tensors(bench, "bf16", m, n, k)
            whole = bench.time_kernels(mb.make_gemm(bench, "bf16", m, n, k, tensors=t))
            for dim in ("m", "k"):
                for ways in (8, 64):
                    r = bench.time_kernels(mb.make_split_gemm(bench, "bf16", m, n, k, dim, ways, tensors=t))
                    out.append({"kind": "gemm_split", "name": name, "dtype": "bf16", "m": m, "n": n, "k": k,
                                "scale": scale, "dim": dim, "ways": ways, "whole_s": whole["time_s"], **r})
            del t
        except _oom(bench):
            notes.append(f"decomposition {name} {m}x{n}x{k}: out of memory, skipped")
        bench.torch.cuda.empty_cache()
    return out


def _rotation(bench: mb.Bench, nbytes: int) -> int:
    """How many buffer pairs to cycle through so that back-to-back copies of ``nbytes`` touch
    at least 4x the L2 size (so each one streams from HBM, as the cost model assumes)."""
    props = bench.torch.cuda.get_device_properties(bench.dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 64 * MiB)
    return max(1, min(256, -(-4 * l2 // nbytes)))


def copy_section(bench: mb.Bench, kernel: ChannelCopy | None, notes: list[str]) -> list[dict]:
    """Copy bandwidth over sizes (kind ``copy``): SM-driven (elementwise kernel; the channel
    kernel with 4 blocks per SM when built) and copy-engine (d2d, pinned h2d / d2h; peer when
    there are two GPUs). Device-side copies cycle through enough buffers to miss in L2."""
    torch = bench.torch
    out = []
    sizes = (1, 16, 256) if bench.grid.quick else (1, 4, 16, 64, 256, 1024)
    sms = torch.cuda.get_device_properties(bench.dev).multi_processor_count
    for mib in sizes:
        nbytes = mib * MiB
        k = _rotation(bench, nbytes)
        bench.log(f"copy bandwidth: {mib} MiB ({k} buffer pair(s))")
        pairs = [(torch.ones(nbytes // 2, dtype=torch.bfloat16, device=bench.dev),
                  torch.empty(nbytes // 2, dtype=torch.bfloat16, device=bench.dev)) for _ in range(k)]
        turn = itertools.cycle(pairs)

        def elementwise() -> None:
            src, dst = next(turn)
            torch.mul(src, 1.0, out=dst)

        r = bench.time_kernels(elementwise)
        out.append({"kind": "copy", "engine": "sm", "method": "elementwise", "direction": "d2d", "bytes": nbytes,
                    "buffers": k, **r})
        if kernel is not None:
            stats = torch.zeros(4, dtype=torch.int64, device=bench.dev)
            nc, nt = 4 * sms, 512
            c = max(16, min(64 * 1024, nbytes // nc // 16 * 16))  # every block gets chunks

            def channel() -> None:
                src, dst = next(turn)
                kernel.launch(src, dst, nc=nc, nt=nt, chunk_bytes=c, total_bytes=nbytes, stats=stats)

            r = bench.time_kernels(channel)
            out.append({"kind": "copy", "engine": "sm", "method": "channel_kernel", "direction": "d2d",
                        "nc": nc, "nt": nt, "chunk_bytes": c, "bytes": nbytes, "buffers": k, **r})

        def memcpy() -> None:
            src, dst = next(turn)
            dst.copy_(src, non_blocking=True)  # same device, dtype, contiguous: cudaMemcpyAsync

        r = bench.time_kernels(memcpy)
        out.append({"kind": "copy", "engine": "ce", "method": "memcpy_async", "direction": "d2d", "bytes": nbytes,
                    "buffers": k, **r})
        del pairs, turn
        directions = (["h2d", "d2h"] if mib <= 256 else []) + (["p2p"] if torch.cuda.device_count() > 1 else [])
        for d in directions:
            r = bench.time_kernels(mb.make_ce_copy(bench, d, nbytes))
            out.append({"kind": "copy", "engine": "ce", "method": "memcpy_async", "direction": d,
                        "bytes": nbytes, **r})
        torch.cuda.empty_cache()
    return out


def _victims(bench: mb.Bench) -> list[tuple[dict, Callable[[], None]]]:
    """Victims of the contention runs: a large compute-bound GEMM, (full plan) a lower-intensity
    and a near-memory-bound GEMM, and a memory-bound elementwise op (``z = x + y``, 1.5 GiB)."""
    shapes = [(8192, 8192, 8192)] if bench.grid.quick else [(8192, 8192, 8192), (32768, 4096, 1024),
                                                            (65536, 512, 512)]
    out = [({"op": "gemm", "dtype": "bf16", "m": m, "n": n, "k": k}, mb.make_gemm(bench, "bf16", m, n, k))
           for m, n, k in shapes]
    fn, nbytes = mb.make_memory_op(bench, 1536 * MiB)
    out.append(({"op": "memory", "bytes": nbytes}, fn))
    return out


def contention_sections(bench: mb.Bench, kernel: ChannelCopy | None, notes: list[str]) -> list[dict]:
    """The channel copy alone over (NC, NT, C) (kind ``channel_copy``), then beside each victim
    (kind ``sm_contention``, lagom §3.2 Fig. 3), then copy-engine copies beside each victim
    (kind ``ce_contention``, ficco §IV-D Fig. 9): whole 256 MiB copies, then device-to-device
    copies issued as one memcpy per chunk of the plan's ``ce_chunks`` (field ``chunk_bytes``)."""
    torch = bench.torch
    out = []
    victims = _victims(bench)
    alone = {}
    for desc, fn in victims:
        alone[id(fn)] = bench.time_loop(fn)["time_s"]
    if kernel is not None:
        n_int32 = bench.grid.copy_buffer_bytes // 4  # each buffer copy_buffer_bytes, >> L2
        src = torch.empty(n_int32, dtype=torch.int32, device=bench.dev).fill_(7)
        dst = torch.empty_like(src)
        stats = torch.zeros(4, dtype=torch.int64, device=bench.dev)
        points = grids.contention_points(bench.grid)
        for i, (nc, nt, c) in enumerate(points):
            nbytes = grids.channel_copy_bytes(nc, c)
            bench.log(f"channel copy {i + 1}/{len(points)}: NC={nc} NT={nt} C={c // 1024} KiB")

            def copy(nc: int = nc, nt: int = nt, c: int = c, nbytes: int = nbytes) -> None:
                kernel.launch(src, dst, nc=nc, nt=nt, chunk_bytes=c, total_bytes=nbytes, stats=stats)

            r = bench.time_loop(copy)
            base = {"nc": nc, "nt": nt, "chunk_bytes": c}
            out.append({"kind": "channel_copy", **base, "bytes": nbytes, "backend": kernel.backend, **r})
            copy_alone = r["time_s"]
            for desc, fn in victims:
                v = bench.overlap(fn, alone[id(fn)], copy, copy_alone)
                cp = bench.overlap(copy, copy_alone, fn, alone[id(fn)])
                out.append({"kind": "sm_contention", "victim": desc, **base, "copy_bytes": nbytes,
                            "backend": kernel.backend, "victim_alone_s": alone[id(fn)], "victim_s": v["time_s"],
                            "copy_alone_s": copy_alone, "copy_s": cp["time_s"],
                            "covered_victim": v["covered"], "covered_copy": cp["covered"],
                            "victim_samples_s": v["samples_s"], "copy_samples_s": cp["samples_s"]})
        del src, dst
        torch.cuda.empty_cache()
    copies: list[tuple[str, int, int | None]] = [(d, 256 * MiB, None) for d in ("d2d", "h2d", "d2h")]
    copies += [("d2d", min(256 * MiB, 1024 * c), c) for c in bench.grid.ce_chunks]
    for d, nbytes, chunk in copies:
        bench.log(f"copy-engine contention: {d}" + (f" in {chunk // 1024} KiB memcpys" if chunk else ""))
        if not chunk:
            ce_copy = mb.make_ce_copy(bench, d, nbytes)
        else:
            try:
                ce_copy = mb.make_chunked_ce_copy(bench, nbytes, chunk)
            except RuntimeError as exc:  # a CUDA graph this driver cannot capture: say so, go on
                notes.append(f"chunked copy-engine copy of {chunk} B not measured: {str(exc).splitlines()[0]}")
                continue
        copy_alone = bench.time_loop(ce_copy)["time_s"]
        for desc, fn in victims:
            v = bench.overlap(fn, alone[id(fn)], ce_copy, copy_alone)
            cp = bench.overlap(ce_copy, copy_alone, fn, alone[id(fn)])
            out.append({"kind": "ce_contention", "victim": desc, "direction": d, "bytes": nbytes,
                        **({"chunk_bytes": chunk} if chunk else {}),
                        "victim_alone_s": alone[id(fn)], "victim_s": v["time_s"], "copy_alone_s": copy_alone,
                        "copy_s": cp["time_s"], "covered_victim": v["covered"], "covered_copy": cp["covered"],
                        "victim_samples_s": v["samples_s"], "copy_samples_s": cp["samples_s"]})
        del ce_copy
        torch.cuda.empty_cache()
    uncovered = sum(1 for r in out if not (r.get("covered_victim", True) and r.get("covered_copy", True)))
    if uncovered:
        notes.append(f"{uncovered} overlap run(s) where the covering side ended first; their unequal "
                     "side is left out of the fit")
    return out


def run_suite(dev: torch.device | str, grid: grids.Grid, *, log: Callable[[str], None], kernel_prefer: str = "auto",
              sections: tuple[str, ...] = grids.SECTIONS,
              checkpoint: Callable[[list[dict], list[str], dict], None] | None = None,
              ) -> tuple[list[dict], list[str], dict]:
    """Run the measurement plan on ``dev``. Returns (records, notes, settings), settings
    saying which channel-copy backend ran (or why none could be built). ``sustained`` (the
    clock a long GEMM loop settles at, :mod:`ccoverlap.calibrate.sustained`) runs last, so
    the heat it leaves does not reach the other sections. ``checkpoint(records, notes,
    settings)`` is called after each section, so a run cut short keeps what it measured."""

    bench = mb.Bench(dev, grid, log=log)
    notes: list[str] = []
    settings: dict = {"kernel_backend": None}
    kernel = None
    if "copy" in sections or "contention" in sections:
        log("building the NC/NT/C channel-copy kernel (load_inline, else Triton) ...")
        try:
            kernel = load_channel_copy(prefer=kernel_prefer)
            settings["kernel_backend"] = kernel.backend
        except KernelUnavailable as exc:
            msg = f"SM-driven contention not measured: {exc}"
            notes.append(msg)
            settings["kernel_error"] = str(exc)
            log(msg)
    records: list[dict] = []
    runs = {"gemm": lambda: gemm_section(bench, notes), "split": lambda: split_section(bench, notes),
            "copy": lambda: copy_section(bench, kernel, notes),
            "contention": lambda: contention_sections(bench, kernel, notes),
            "sustained": lambda: sustained_section(bench, notes)}
    for name in grids.SECTIONS:
        if name in sections:
            records += runs[name]()
            if checkpoint is not None:
                checkpoint(records, notes, settings)
    return records, notes, settings
