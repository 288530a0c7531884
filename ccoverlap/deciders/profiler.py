"""The profile interface Lagom searches with: ``ProfileTime(s)`` of lagom Algorithm 2, line 6.

``profile(configs)`` runs an overlap group once with ``configs[j]`` for collective ``j`` and
returns the per-collective communication times ``x_j^{s_j}``, the computation time
``Y = sum_i y_i`` and the makespan ``Z`` (lagom eq. 1), all measured *during* the overlap,
so contention (eqs. 4-6) is in every number. Two implementations:

* :class:`SimulatedProfiler` - the group as an :class:`~ccoverlap.sim.graph.OpGraph` played by
  the stream simulator under a cost model (processor-sharing contention). Deterministic.
* :class:`LiveNCCLProfiler` - the group run on GPUs with NCCL, timed with CUDA events. It is
  written for a multi-GPU job launched with torchrun but has **not been run** (this project's
  development machines have no GPU); :meth:`LiveNCCLProfiler.available` says whether it can
  run here. See its docstring for what it applies and what NCCL allows live.

No torch at module level.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ccoverlap.errors import CCOverlapError, ConfigError
from ccoverlap.sim.graph import AttentionSpec, CollectiveSpec, CommConfig, GemmSpec, MemorySpec

from .overlap_group import OverlapGroup, equivalent_spec

__all__ = ["ProfileResult", "Profiler", "SimulatedProfiler", "LiveNCCLProfiler", "ProfilerUnavailable"]


@dataclass(frozen=True)
class ProfileResult:
    """One profiled run of an overlap group (seconds).

    ``comm_times_s[j]`` = ``x_j^{s_j}``, collective j's time while overlapped; ``compute_time_s``
    = ``Y`` = sum of the computations' times while overlapped; ``makespan_s`` = ``Z``, first
    start to last end (lagom eq. 1: ``Z = max(X, Y)`` when both streams start together and
    never wait on each other).
    """

    comm_times_s: tuple[float, ...]
    compute_time_s: float
    makespan_s: float
    comm_span_s: float | None = None

    @property
    def comm_time_s(self) -> float:
        """``X = sum_j x_j`` (lagom eq. 1), seconds."""
        return float(sum(self.comm_times_s))

    @property
    def comm_busy_s(self) -> float:
        """How long communication runs, first start to last end (seconds): ``X`` when the
        collectives share one stream (lagom §3.1), less when a framework issues them on
        several streams that run at the same time (FSDP's all-gather and reduce-scatter
        streams). What ``X < Y`` compares in Lagom's stopping conditions (§3.4)."""
        return self.comm_time_s if self.comm_span_s is None else float(self.comm_span_s)


class Profiler(Protocol):
    """Anything that can run the group under a list of configurations and time it."""

    group: OverlapGroup

    def profile(self, configs: Sequence[CommConfig]) -> ProfileResult:
        """Run the group with ``configs[j]`` for collective j; see :class:`ProfileResult`."""
        ...


class SimulatedProfiler:
    """``profile`` by simulation: the group's OpGraph under ``cost`` (lagom eqs. 1, 4-6 as
    the cost model implements them). ``calls`` counts profiles run (cache hits included: a
    live profiler would re-run them too), ``simulations`` the simulations actually done.

    Duration-only computations are modelled by :func:`equivalent_spec`, computed once.
    """

    def __init__(self, group: OverlapGroup, cost) -> None:
        self.group = group
        self.cost = cost
        self.calls = 0
        self.simulations = 0
        self._cache: dict[tuple, ProfileResult] = {}
        self._specs = [c.spec if c.spec is not None else equivalent_spec(c.duration_s, cost, bound=c.bound)
                       for c in group.computations]

    def profile(self, configs: Sequence[CommConfig]) -> ProfileResult:
        """Simulate the group with ``configs``; returns x_j, Y and Z in seconds (lagom eq. 1)."""
        from ccoverlap.sim.engine import simulate

        self.calls += 1
        key = tuple(configs)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        g = self.group.graph(configs, computation_specs=self._specs)
        tl = simulate(g, self.cost)
        self.simulations += 1
        dur = tl.end_s - tl.start_s
        n_comp = len(self.group.computations)
        comm = tuple(float(d) for d in dur[n_comp:])
        y = float(dur[:n_comp].sum())
        z = float(tl.end_s.max() - tl.start_s.min())
        span = float(tl.end_s[n_comp:].max() - tl.start_s[n_comp:].min())
        res = ProfileResult(comm_times_s=comm, compute_time_s=y, makespan_s=z, comm_span_s=span)
        self._cache[key] = res
        return res


class ProfilerUnavailable(CCOverlapError):
    """The live profiler cannot run here (no CUDA, no NCCL process group, ...)."""


class LiveNCCLProfiler:
    """``profile`` on real GPUs: the group's kernels on two CUDA streams, NCCL configured per
    collective, timed with CUDA events (lagom §3.4, Fig. 6 steps c-e). **Untested**: no GPU
    was available where it was written; treat it as an implementation outline.

    Use inside a job started with torchrun, after ``torch.distributed.init_process_group("nccl")``,
    on every rank with the same group. Per profile:

    1. rank 0's configurations are broadcast so every rank applies the same choice (Fig. 6
       step c); a rank that disagrees would deadlock NCCL.
    2. each distinct configuration gets its own NCCL communicator, created once and cached:
       ``ProcessGroupNCCL.Options().config.min_ctas = max_ctas = NC`` pins the channel count
       per communicator (ncclConfig_t minCTAs/maxCTAs, NCCL >= 2.17); ``NCCL_NTHREADS`` (NT),
       ``NCCL_BUFFSIZE`` (= C x NCCL_STEPS, 8 steps per buffer for the Simple protocol),
       ``NCCL_PROTO`` and ``NCCL_ALGO`` are set in the environment before the communicator
       is created (eager init via ``device_id`` so it is created now, not lazily).
       Caveat: NCCL caches most ``NCCL_*`` parameters the first time it reads them
       (``NCCL_PARAM`` in src/include/param.h), so NT, C, protocol and algorithm set this way
       may only take effect in a fresh process; NC through ncclConfig is per communicator and
       does work live. Lagom/AutoCCL patch NCCL to change all of them per call; with stock
       NCCL, pass ``resource_knobs=("channels",)`` to tune NC alone, or run one process per
       (NT, C) candidate.
    3. the computations run on the current stream and the collectives, in order, on a side
       stream, both after a common start event; ``warmup`` untimed runs then ``iters`` timed
       runs; each kernel is bracketed by CUDA events; times are the median over iterations,
       then the maximum over ranks (all-reduce MAX), as the slowest rank sets the step.

    Computations must have GEMM / memory specs or durations (a duration runs a GEMM of the
    equivalent size, needing ``cost`` to size it); attention specs run as GEMMs of the same
    FLOPs.
    """

    def __init__(self, group: OverlapGroup, *, cost=None, warmup: int = 3, iters: int = 10,
                 resource_knobs: Sequence[str] = ("channels", "threads", "chunk_bytes"),
                 dtype: str = "bfloat16") -> None:
        self.group = group
        self.cost = cost
        self.warmup = warmup
        self.iters = iters
        self.resource_knobs = tuple(resource_knobs)
        self.dtype = dtype
        self.calls = 0
        self._pgs: dict[tuple, object] = {}
        self._buffers = None

    # -- availability ------------------------------------------------------------------
    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") if CUDA, NCCL and an initialised NCCL process group are present, else
        (False, why). Never raises, never imports torch at module import time."""
        try:
            import torch
            import torch.distributed as dist
        except Exception as exc:  # pragma: no cover - depends on the install
            return False, f"torch is not importable ({exc})"
        if not torch.cuda.is_available():
            return False, "no CUDA device: the live NCCL profiler needs GPUs (use the simulated profiler)"
        if not dist.is_available() or not dist.is_nccl_available():
            return False, "torch.distributed has no NCCL backend"
        if not dist.is_initialized():
            return False, "torch.distributed is not initialised (launch with torchrun and init_process_group('nccl'))"
        if dist.get_backend() != "nccl":
            return False, f"the default process group uses {dist.get_backend()!r}, not NCCL"
        return True, ""

    def _require(self) -> None:
        ok, why = self.available()
        if not ok:
            raise ProfilerUnavailable(f"live NCCL profiling is unavailable: {why}")

    # -- configuration -----------------------------------------------------------------
    def _broadcast_configs(self, configs: Sequence[CommConfig]) -> list[CommConfig]:
        """Rank 0's configurations on every rank (lagom Fig. 6 step c)."""
        import torch.distributed as dist

        obj = [list(configs)]
        dist.broadcast_object_list(obj, src=0)
        return obj[0]

    def _process_group(self, spec: CollectiveSpec, cfg: CommConfig):
        """An NCCL process group over this collective's ranks configured with ``cfg`` (cached)."""
        import torch
        import torch.distributed as dist

        key = (spec.group, cfg)
        pg = self._pgs.get(key)
        if pg is not None:
            return pg
        env = {}
        if "threads" in self.resource_knobs and cfg.threads is not None:
            env["NCCL_NTHREADS"] = str(cfg.threads)
        if "chunk_bytes" in self.resource_knobs and cfg.chunk_bytes is not None:
            env["NCCL_BUFFSIZE"] = str(int(cfg.chunk_bytes) * 8)  # NCCL_STEPS = 8 chunks per buffer
        if cfg.protocol is not None:
            env["NCCL_PROTO"] = {"simple": "Simple", "ll": "LL", "ll128": "LL128"}[cfg.protocol]
        if cfg.algorithm not in (None, "auto"):
            env["NCCL_ALGO"] = cfg.algorithm.capitalize() if cfg.algorithm != "nvls" else "NVLS"
        opts = dist.ProcessGroupNCCL.Options()
        if "channels" in self.resource_knobs and cfg.channels is not None:
            opts.config.min_ctas = int(cfg.channels)
            opts.config.max_ctas = int(cfg.channels)
        # the collective's ranks: contiguous blocks of group.size (the caller lays the job out so)
        world, me = dist.get_world_size(), dist.get_rank()
        size = spec.group.size
        if world % size:
            raise ConfigError(f"collective group of {size} ranks does not divide the world of {world}")
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            mine = None
            for start in range(0, world, size):  # every rank creates every subgroup, in the same order
                ranks = list(range(start, start + size))
                pg = dist.new_group(ranks, backend="nccl", pg_options=opts,
                                    device_id=torch.device("cuda", torch.cuda.current_device()))
                if me in ranks:
                    mine = pg
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self._pgs[key] = mine
        return mine

    # -- running -----------------------------------------------------------------------
    def _compute_fns(self):
        import torch

        dt = getattr(torch, self.dtype)
        dev = torch.device("cuda", torch.cuda.current_device())
        fns = []
        for comp in self.group.computations:
            spec = comp.spec
            if spec is None:
                if self.cost is None:
                    raise ConfigError(f"computation {comp.name!r} is a duration; give the live profiler a cost "
                                      f"model to size an equivalent GEMM")
                spec = equivalent_spec(comp.duration_s, self.cost, bound=comp.bound)
            if isinstance(spec, AttentionSpec):
                side = max(16, int(round((spec.flops / 2) ** (1 / 3))))
                spec = GemmSpec(m=side, n=side, k=side)
            if isinstance(spec, GemmSpec):
                a = torch.randn(spec.batch, spec.m, spec.k, device=dev, dtype=dt)
                b = torch.randn(spec.batch, spec.k, spec.n, device=dev, dtype=dt)
                fns.append(lambda a=a, b=b: torch.bmm(a, b))
            elif isinstance(spec, MemorySpec):
                n = max(1, int(spec.bytes // 2 // 2))  # read + write, 2-byte elements
                x = torch.empty(n, device=dev, dtype=dt)
                fns.append(lambda x=x: x.mul_(1.0))
        return fns

    def _comm_fns(self, configs: Sequence[CommConfig]):
        import torch
        import torch.distributed as dist

        dev = torch.device("cuda", torch.cuda.current_device())
        fns = []
        for coll, cfg in zip(self.group.collectives, configs):
            spec = coll.spec
            pg = self._process_group(spec, cfg)
            p = spec.group.size
            n = max(p, int(spec.bytes // 2) // p * p)  # bf16 elements, divisible by the group size
            if spec.collective == "all_gather":
                out = torch.empty(n, device=dev, dtype=torch.bfloat16)
                inp = torch.empty(n // p, device=dev, dtype=torch.bfloat16)
                fns.append(lambda o=out, i=inp, g=pg: dist.all_gather_into_tensor(o, i, group=g))
            elif spec.collective == "reduce_scatter":
                inp = torch.empty(n, device=dev, dtype=torch.bfloat16)
                out = torch.empty(n // p, device=dev, dtype=torch.bfloat16)
                fns.append(lambda o=out, i=inp, g=pg: dist.reduce_scatter_tensor(o, i, group=g))
            elif spec.collective == "all_to_all":
                inp = torch.empty(n, device=dev, dtype=torch.bfloat16)
                out = torch.empty_like(inp)
                fns.append(lambda o=out, i=inp, g=pg: dist.all_to_all_single(o, i, group=g))
            elif spec.collective in ("all_reduce", "broadcast", "reduce"):
                buf = torch.empty(n, device=dev, dtype=torch.bfloat16)
                op = {"all_reduce": lambda b=buf, g=pg: dist.all_reduce(b, group=g),
                      "broadcast": lambda b=buf, g=pg: dist.broadcast(b, src=dist.get_global_rank(g, 0), group=g),
                      "reduce": lambda b=buf, g=pg: dist.reduce(b, dst=dist.get_global_rank(g, 0), group=g)}
                fns.append(op[spec.collective])
        return fns

    def profile(self, configs: Sequence[CommConfig]) -> ProfileResult:
        """Run the group live with ``configs`` (rank 0's, broadcast) and time it with CUDA
        events; x_j, Y, Z in seconds as in :class:`ProfileResult` (lagom eq. 1, Alg. 2 line 6)."""
        self._require()
        import torch
        import torch.distributed as dist

        self.calls += 1
        configs = self._broadcast_configs(configs)
        comps = self._compute_fns()
        comms = self._comm_fns(configs)
        side = torch.cuda.Stream()
        main = torch.cuda.current_stream()
        samples = []
        for it in range(self.warmup + self.iters):
            dist.barrier()
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            start.record(main)
            side.wait_event(start)
            comp_ev = []
            for fn in comps:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(main); fn(); e1.record(main)
                comp_ev.append((e0, e1))
            comm_ev = []
            with torch.cuda.stream(side):
                for fn in comms:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record(side); fn(); e1.record(side)
                    comm_ev.append((e0, e1))
            end = torch.cuda.Event(enable_timing=True)
            main.wait_stream(side)
            end.record(main)
            torch.cuda.synchronize()
            if it >= self.warmup:
                samples.append(([a.elapsed_time(b) for a, b in comm_ev],
                                sum(a.elapsed_time(b) for a, b in comp_ev),
                                start.elapsed_time(end)))

        def median(xs):
            xs = sorted(xs)
            return xs[len(xs) // 2]

        comm = [median([s[0][j] for s in samples]) for j in range(len(comms))]
        vec = torch.tensor(comm + [median([s[1] for s in samples]), median([s[2] for s in samples])],
                           device="cuda", dtype=torch.float64)
        dist.all_reduce(vec, op=dist.ReduceOp.MAX)
        v = [float(x) * 1e-3 for x in vec.tolist()]  # ms -> s
        return ProfileResult(comm_times_s=tuple(v[:-2]), compute_time_s=v[-2], makespan_s=v[-1])
