"""Start N local processes with an initialised process group, without torchrun.

Used by the tests and by ``ccoverlap bench`` when it is not launched by torchrun. Each
child sets ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``, ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``, initialises the default group (gloo on CPU, NCCL when every rank can have
its own GPU), runs ``fn(rank, world_size, *args)`` and writes its return value (or its
traceback) to a file. The parent joins with a deadline and kills what is left, so a hang
becomes an error instead of a stuck run.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

_T = TypeVar("_T")

__all__ = ["free_port", "spawn", "SpawnError", "default_backend"]


class SpawnError(RuntimeError):
    """A spawned rank failed, or the ranks did not finish before the deadline."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend(world_size: int) -> str:
    """``"nccl"`` when CUDA has at least ``world_size`` GPUs, else ``"gloo"``."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def _child(
    rank: int, world_size: int, port: int, backend: str, fn: Callable[..., object], args: tuple[object, ...],
    outdir: str, threads: int | None, pg_timeout_s: float,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    result: tuple[str, object]
    try:
        import torch
        import torch.distributed as dist

        if threads:
            torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout_s)
        )
        try:
            result = ("ok", fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        result = ("error", traceback.format_exc())
    with open(os.path.join(outdir, f"rank-{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)


def spawn(
    fn: Callable[..., _T],
    world_size: int,
    args: tuple[object, ...] = (),
    *,
    backend: str | None = None,
    timeout_s: float = 300.0,
    threads: int | None = None,
    pg_timeout_s: float = 120.0,
) -> list[_T]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes; return their results by rank.

    ``fn`` and its results must be picklable (``fn`` importable by module path). Raises
    :class:`SpawnError` with every failing rank's traceback, or naming the ranks still
    running after ``timeout_s`` seconds (they are killed).
    """
    import torch.multiprocessing as mp

    backend = backend or default_backend(world_size)
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ccoverlap-spawn-") as outdir:
        procs = [
            ctx.Process(
                target=_child,
                args=(r, world_size, port, backend, fn, args, outdir, threads, pg_timeout_s),
                daemon=False,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in stuck:
            procs[r].kill()
            procs[r].join(5)
        results: list[Any] = []  # what each rank's fn returned, unpickled
        errors: list[str] = []
        for r in range(world_size):
            path = os.path.join(outdir, f"rank-{r}.pkl")
            if not os.path.exists(path):
                errors.append(f"rank {r}: no result (exit code {procs[r].exitcode})")
                results.append(None)
                continue
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                errors.append(f"rank {r}:\n{value}")
                results.append(None)
            else:
                results.append(value)
        if stuck:
            raise SpawnError(f"ranks {stuck} still running after {timeout_s:.0f}s (killed)" + "".join(
                "\n" + e for e in errors))
        if errors:
            raise SpawnError("\n".join(errors))
        return results
