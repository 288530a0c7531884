"""Stock NCCL settings from an ``--emit`` directory, applied in a PyTorch job (docs/emit.md).

``ccoverlap plan --emit DIR`` (and ``tune --emit``) writes ``nccl.env`` (process-wide
``NCCL_*`` variables) and ``process_groups.json`` (min / max CTAs per process group). Here:

* :func:`apply_nccl_env` puts ``nccl.env`` into ``os.environ``; call it before the first NCCL
  process group is created (NCCL reads these once per process);
* :func:`process_group_options` gives ``ProcessGroupNCCL.Options`` with
  ``config.min_ctas`` / ``max_ctas`` (ncclConfig_t minCTAs / maxCTAs, NCCL >= 2.17) for one
  group, to pass as ``pg_options`` to ``init_process_group`` / ``new_group``;
  :func:`device_mesh_backend_override` the same per mesh dimension for
  ``init_device_mesh(..., backend_override=...)``.

Without NCCL (a CPU build, gloo) the options are None / empty, so one script runs on both.

:class:`TorchNCCLLayer` is the live profiler's layer on GPUs (:func:`live_profiler`): Lagom's
profiles measured with each configuration applied as these files apply it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import torch
import torch.distributed as dist

from ccoverlap.errors import ConfigError
from ccoverlap.nccl.apply import parse_nccl_env, pinned_options
from ccoverlap.runtime.profiler import LiveNCCLProfiler, ProfilerUnavailable
from ccoverlap.specs import AttentionSpec, CollectiveSpec, GemmSpec, MemorySpec

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from ccoverlap.nccl.groups import OverlapGroup
    from ccoverlap.sim.simulator import SupportsDuration

__all__ = ["load_nccl_env", "apply_nccl_env", "load_process_groups", "process_group_options",
           "device_mesh_backend_override", "options_from_config", "TorchNCCLLayer", "live_profiler"]


#: An ``--emit`` directory.
EmitDir = str | os.PathLike[str]


class _CTAs(Protocol):
    min_ctas: int
    max_ctas: int


class PGOptions(Protocol):
    """What :func:`options_from_config` sets: ``ProcessGroupNCCL.Options`` or a stand-in (tests)."""

    @property
    def config(self) -> _CTAs: ...


_Options = TypeVar("_Options", bound=PGOptions)
_T = TypeVar("_T")


def _dir(out_dir: EmitDir) -> Path:
    d = Path(out_dir)
    if not d.is_dir():
        raise ConfigError(f"{d}: no such --emit directory")
    return d


def load_nccl_env(out_dir: EmitDir) -> dict[str, str]:
    """``{NAME: value}`` of ``DIR/nccl.env`` (checked against the pinned NCCL variable list)."""
    p = _dir(out_dir) / "nccl.env"
    if not p.is_file():
        raise ConfigError(f"{p}: missing (write it with ccoverlap plan --emit)")
    return parse_nccl_env(p.read_text(encoding="utf-8"), str(p))


def apply_nccl_env(out_dir: EmitDir, *, override: bool = False) -> dict[str, str]:
    """Set ``DIR/nccl.env``'s variables in ``os.environ`` (a variable already set is kept
    unless ``override``); returns the ones set. NCCL reads them when it creates its first
    communicator in this process: call this before any NCCL process group exists."""
    done: dict[str, str] = {}
    for name, value in load_nccl_env(out_dir).items():
        if override or name not in os.environ:
            os.environ[name] = value
            done[name] = value
    return done


def load_process_groups(out_dir: EmitDir) -> dict[str, dict[str, Any]]:  # JSON objects
    """``{group: {ranks, ranks_per_node, min_ctas, max_ctas}}`` of ``DIR/process_groups.json``
    (empty when the directory has none: no group's channels change); ConfigError on bad values."""
    p = _dir(out_dir) / "process_groups.json"
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not JSON ({exc})") from None
    cap = pinned_options()["nccl"]["communicator"]["max_ctas"]
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of group name to options")
    for name, cfg in data.items():
        lo, hi = (_int(cfg.get(k)) if isinstance(cfg, dict) else None for k in ("min_ctas", "max_ctas"))
        if lo is None or hi is None or not 1 <= lo <= hi <= cap:
            raise ConfigError(f"{p}: group {name!r} needs integers 1 <= min_ctas <= max_ctas <= {cap}, got {cfg}")
    return data


def _int(v: object) -> int | None:
    """``v`` when it is an integer (not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def options_from_config(
    cfg: Mapping[str, Any], options_cls: Callable[..., _Options], *, is_high_priority_stream: bool = False
) -> _Options:
    """``options_cls(is_high_priority_stream)`` with ``config.min_ctas`` / ``max_ctas`` from
    ``cfg`` (one ``process_groups.json`` entry); ``options_cls`` is
    ``torch.distributed.ProcessGroupNCCL.Options`` (or a stand-in with the same attributes)."""
    opts = options_cls(is_high_priority_stream=is_high_priority_stream)
    opts.config.min_ctas = int(cfg["min_ctas"])
    opts.config.max_ctas = int(cfg["max_ctas"])
    return opts


def _nccl_options_cls() -> Callable[..., PGOptions] | None:
    if not dist.is_available() or not dist.is_nccl_available():
        return None
    return dist.ProcessGroupNCCL.Options


def process_group_options(
    out_dir: EmitDir, group: str, *, is_high_priority_stream: bool = False,
    options_cls: Callable[..., PGOptions] | None = None,
) -> PGOptions | None:
    """``ProcessGroupNCCL.Options`` for ``group`` (a name of ``process_groups.json``: ``dp``,
    ``tp``, ``ep``, ...) with its min / max CTAs, for ``pg_options=``; None when the group
    keeps NCCL's defaults or this PyTorch has no NCCL. ``options_cls`` replaces
    ``ProcessGroupNCCL.Options`` (tests)."""
    cfg = load_process_groups(out_dir).get(group)
    cls = options_cls or _nccl_options_cls()
    if cfg is None or cls is None:
        return None
    return options_from_config(cfg, cls, is_high_priority_stream=is_high_priority_stream)


def device_mesh_backend_override(
    out_dir: EmitDir, mesh_dim_names: Sequence[str], *, options_cls: Callable[..., PGOptions] | None = None
) -> dict[str, tuple[str, PGOptions]]:
    """``{dim name: ("nccl", options)}`` for the mesh dimensions whose group has options, for
    ``init_device_mesh(..., mesh_dim_names=..., backend_override=...)``; empty without NCCL."""
    out: dict[str, tuple[str, PGOptions]] = {}
    for name in mesh_dim_names:
        opts = process_group_options(out_dir, name, options_cls=options_cls)
        if opts is not None:
            out[name] = ("nccl", opts)
    return out


# ----------------------------------------------------------------------------- live profiling

class TorchNCCLLayer:
    """The live profiler's process-group layer on torch.distributed with NCCL and CUDA
    (:class:`~ccoverlap.runtime.profiler.CommLayer`). Use inside a job started with torchrun,
    after ``init_process_group("nccl")``, on every rank; ``workdir`` holds the tuner CSVs
    (one directory per rank, default a temporary one)."""

    def __init__(self, workdir: str | os.PathLike[str] | None = None) -> None:
        ok, why = self.available()
        if not ok:
            raise ProfilerUnavailable(f"live NCCL profiling is unavailable: {why}")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device())
        base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ccoverlap-tuner-"))
        self.workdir = base / f"rank{self.rank}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._csvs = 0

    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") when CUDA, NCCL and an initialised NCCL process group are present, else
        (False, why). Never raises."""
        if not torch.cuda.is_available():
            return False, "no CUDA device: the live NCCL profiler needs GPUs (use the simulated profiler)"
        if not dist.is_available() or not dist.is_nccl_available():
            return False, "torch.distributed has no NCCL backend"
        if not dist.is_initialized():
            return False, "torch.distributed is not initialised (launch with torchrun and init_process_group('nccl'))"
        if dist.get_backend() != "nccl":
            return False, f"the default process group uses {dist.get_backend()!r}, not NCCL"
        return True, ""

    def broadcast(self, obj: _T) -> _T:
        """Rank 0's ``obj`` on every rank."""
        box: list[_T] = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def nccl_env(self) -> dict[str, str]:
        """This process's ``NCCL_*`` environment (what its communicators run with)."""
        return {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}

    def communicator(
        self, blocks: Sequence[Sequence[int]], ctas: Mapping[str, Any], tuner_csv: str | None
    ) -> ProcessGroup | None:
        """This rank's group of a new set of ``blocks`` created with min / max CTAs ``ctas`` while NCCL
        reads ``tuner_csv`` (the tuner plugin's file, or None); every rank creates every block."""
        env: dict[str, str] = {}
        if tuner_csv is not None:
            self._csvs += 1
            path = self.workdir / f"call{self._csvs}.csv"
            path.write_text(tuner_csv, encoding="utf-8")
            env["NCCL_TUNER_CONFIG_FILE"] = str(path)
        opts = options_from_config(ctas, dist.ProcessGroupNCCL.Options) if ctas else None
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            mine: ProcessGroup | None = None
            for ranks in blocks:  # every rank creates every block, in the same order; eager init reads the CSV now
                pg = dist.new_group(ranks, backend="nccl", pg_options=opts, device_id=self.device)
                if self.rank in ranks:
                    mine = pg
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return mine

    def _compute_fn(self, spec: object) -> Callable[[], torch.Tensor]:
        if isinstance(spec, AttentionSpec):  # a GEMM of the same FLOPs
            side = max(16, int(round((spec.flops / 2) ** (1 / 3))))
            spec = GemmSpec(m=side, n=side, k=side)
        if isinstance(spec, GemmSpec):
            a = torch.randn(spec.batch, spec.m, spec.k, device=self.device, dtype=torch.bfloat16)
            b = torch.randn(spec.batch, spec.k, spec.n, device=self.device, dtype=torch.bfloat16)
            return lambda: torch.bmm(a, b)
        if isinstance(spec, MemorySpec):
            x = torch.empty(max(1, int(spec.bytes // 4)), device=self.device, dtype=torch.bfloat16)
            return lambda: x.mul_(1.0)
        raise ConfigError(f"the live profiler cannot run a {type(spec).__name__}")

    def _comm_fn(self, pg: ProcessGroup, spec: CollectiveSpec) -> Callable[[], object]:
        p = spec.group.size
        n = max(p, int(spec.bytes // 2) // p * p)  # bf16 elements, divisible by the group size
        buf = torch.empty(n, device=self.device, dtype=torch.bfloat16)
        part = torch.empty(n // p, device=self.device, dtype=torch.bfloat16)
        out = torch.empty_like(buf) if spec.collective == "all_to_all" else None
        fns = {"all_gather": lambda: dist.all_gather_into_tensor(buf, part, group=pg),
               "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, buf, group=pg),
               "all_to_all": lambda: dist.all_to_all_single(out, buf, group=pg),
               "all_reduce": lambda: dist.all_reduce(buf, group=pg),
               "broadcast": lambda: dist.broadcast(buf, src=dist.get_global_rank(pg, 0), group=pg),
               "reduce": lambda: dist.reduce(buf, dst=dist.get_global_rank(pg, 0), group=pg)}
        return fns[spec.collective]

    def run(
        self, computations: Sequence[object], collectives: Sequence[tuple[object, CollectiveSpec]], warmup: int,
        iters: int,
    ) -> list[tuple[list[float], float, float]]:
        """The computations on the main stream and the collectives on a side stream from one start; per timed
        run (after ``warmup``): (per-collective seconds, summed computation seconds, makespan seconds)."""
        comps = [self._compute_fn(s) for s in computations]
        comms = [self._comm_fn(cast("ProcessGroup", pg), spec) for pg, spec in collectives]  # made by communicator()
        side, main = torch.cuda.Stream(), torch.cuda.current_stream()
        samples: list[tuple[list[float], float, float]] = []
        for it in range(warmup + iters):
            dist.barrier()
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            start.record(main)
            side.wait_event(start)
            comp_ev, comm_ev = [], []
            for fn in comps:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(main); fn(); e1.record(main)
                comp_ev.append((e0, e1))
            with torch.cuda.stream(side):
                for cfn in comms:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record(side); cfn(); e1.record(side)
                    comm_ev.append((e0, e1))
            end = torch.cuda.Event(enable_timing=True)
            main.wait_stream(side)
            end.record(main)
            torch.cuda.synchronize()
            if it >= warmup:  # CUDA events measure milliseconds
                samples.append(([a.elapsed_time(b) * 1e-3 for a, b in comm_ev],
                                sum(a.elapsed_time(b) for a, b in comp_ev) * 1e-3, start.elapsed_time(end) * 1e-3))
        return samples

    def max_over_ranks(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum over every rank."""
        vec = torch.tensor(values, device=self.device, dtype=torch.float64)
        dist.all_reduce(vec, op=dist.ReduceOp.MAX)
        return [float(x) for x in vec.tolist()]


def live_profiler(
    group: OverlapGroup, *, cost: SupportsDuration | None = None, warmup: int = 3, iters: int = 10,
    strict: bool = True, workdir: str | os.PathLike[str] | None = None,
) -> LiveNCCLProfiler:
    """A :class:`~ccoverlap.runtime.profiler.LiveNCCLProfiler` for ``group`` on this job's GPUs
    (:class:`TorchNCCLLayer`); ProfilerUnavailable without CUDA and an NCCL process group."""
    return LiveNCCLProfiler(group, TorchNCCLLayer(workdir), cost=cost, warmup=warmup, iters=iters, strict=strict)
