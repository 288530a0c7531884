"""Lagom's profile interface on real GPUs: each configuration applied to stock NCCL the way
``--emit`` writes it (per-communicator min / max CTAs, a tuner-plugin row; threads and chunk are
per process), through a process-group layer (lagom §3.4, Fig. 6 steps c-e).

On GPUs the layer is :class:`ccoverlap.runtime.nccl.TorchNCCLLayer`
(:func:`ccoverlap.runtime.nccl.live_profiler` builds one); the logic here needs no torch and is
tested on CPU with a stand-in layer. The simulated profiler it stands beside is
:class:`ccoverlap.deciders.lagom.profiler.SimulatedProfiler`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from ccoverlap.errors import CCOverlapError, ConfigError
from ccoverlap.nccl.apply import call_settings, pinned_options, process_values, tuner_csv_text
from ccoverlap.nccl.groups import ComputeSpec, OverlapGroup
from ccoverlap.nccl.plan import CommKey
from ccoverlap.nccl.profile import ProfileResult, computation_spec
from ccoverlap.sim.simulator import SupportsDuration
from ccoverlap.specs import CollectiveSpec, CommConfig

_T = TypeVar("_T")

__all__ = ["LiveNCCLProfiler", "ProfilerUnavailable", "CommLayer", "rank_blocks"]


#: the algorithms the example tuner plugin knows (ccoverlap/data/emit/options.yaml)
TUNER_ALGORITHMS = tuple(pinned_options()["nccl"]["tuner_csv"]["algorithms"])


class ProfilerUnavailable(CCOverlapError):
    """The live profiler cannot run here (no CUDA, no NCCL process group, ...)."""


class CommLayer(Protocol):
    """What :class:`LiveNCCLProfiler` needs from the process-group layer: on GPUs,
    :class:`ccoverlap.runtime.nccl.TorchNCCLLayer` (torch.distributed, NCCL, CUDA events)."""

    rank: int
    world: int

    def broadcast(self, obj: _T) -> _T:
        """Rank 0's ``obj`` on every rank."""
        ...

    def nccl_env(self) -> dict[str, str]:
        """This process's ``NCCL_*`` environment (what its communicators run with)."""
        ...

    def communicator(self, blocks: list[list[int]], ctas: dict, tuner_csv: str | None) -> object:
        """A new communicator over this rank's block of ``blocks`` (every rank creates every
        block, in order), created now with ``ProcessGroupNCCL.Options`` min / max CTAs ``ctas``
        while ``tuner_csv`` (the example tuner plugin's file text, or None) is the file NCCL
        reads for it. Returns a handle :meth:`run` takes."""
        ...

    def run(self, computations: list, collectives: list[tuple[object, CollectiveSpec]], warmup: int,
            iters: int) -> list[tuple[list[float], float, float]]:
        """The computations (specs) on one stream and the collectives (handle, spec) in order on
        another, both from one start; ``warmup`` untimed runs, then one sample per timed run:
        ``(per-collective seconds, summed computation seconds, makespan seconds)``."""
        ...

    def max_over_ranks(self, values: list[float]) -> list[float]:
        """Element-wise maximum over every rank."""
        ...


def rank_blocks(world: int, size: int) -> list[list[int]]:
    """The contiguous blocks of ``size`` ranks a collective's group runs on (the job is laid out
    so); ConfigError when ``size`` does not divide ``world``."""
    if size < 1 or world % size:
        raise ConfigError(f"a collective group of {size} ranks does not divide the world of {world}")
    return [list(range(s, s + size)) for s in range(0, world, size)]


class LiveNCCLProfiler:
    """``profile`` on real GPUs through a process-group layer (lagom §3.4, Fig. 6 steps c-e),
    applying each configuration the way ``--emit`` writes it for stock NCCL
    (:func:`~ccoverlap.nccl.apply.call_settings`):

    1. rank 0's configurations (and its ``NCCL_*`` environment, which the decisions below read)
       are broadcast, so every rank applies the same choice and raises the same errors (Fig. 6
       step c; ranks that disagree would deadlock NCCL);
    2. each distinct (group, NC, protocol, algorithm) gets its own communicator, created once
       and cached: ``ProcessGroupNCCL.Options().config.min_ctas = max_ctas = NC`` and, when
       this process loaded NCCL's example tuner plugin (``NCCL_TUNER_PLUGIN``), a one-row
       tuner CSV for the call (the plugin reads its file once per communicator, so a new
       communicator takes a new row);
    3. threads per block (NT) and the chunk size (C) are per process in stock NCCL
       (``NCCL_NTHREADS``, ``NCCL_BUFFSIZE``, read once): a configuration asking for other
       values than the process runs raises ConfigError, or with ``strict=False`` is run with
       the process's values (as the emitted settings would run it); so are protocol and
       algorithm without the tuner plugin;
    4. the layer times ``warmup`` untimed and ``iters`` timed runs; each time is the median
       over the timed runs, then the maximum over ranks (the slowest rank sets the step).

    ``cost`` sizes computations given as durations (:func:`equivalent_spec`). ``ignored``
    lists, per profile, the knobs that ran at the process's values (``strict=False``).
    """

    def __init__(self, group: OverlapGroup, layer: CommLayer, *, cost: SupportsDuration | None = None,
                 warmup: int = 3, iters: int = 10, strict: bool = True) -> None:
        if warmup < 0 or iters < 1:
            raise ConfigError(f"live profiler: need warmup >= 0 and iters >= 1, got {warmup}, {iters}")
        self.group = group
        self.layer = layer
        self.cost = cost
        self.warmup = warmup
        self.iters = iters
        self.strict = strict
        self.calls = 0
        self.ignored: list[list[str]] = []
        self._comms: dict[tuple, object] = {}
        self._specs: list[ComputeSpec] | None = None

    def _computations(self) -> list[ComputeSpec]:
        if self._specs is None:
            specs = []
            for c in self.group.computations:
                if c.spec is not None:
                    specs.append(c.spec)
                elif self.cost is None:
                    raise ConfigError(f"computation {c.name!r} is a duration; give the live profiler a cost model "
                                      f"to size an equivalent kernel")
                else:
                    specs.append(computation_spec(c, self.cost))
            self._specs = specs
        return self._specs

    def _applied(self, spec: CollectiveSpec, cfg: CommConfig, proc: dict, tuner: bool, notes: list[str]) -> CommConfig:
        """``cfg`` as stock NCCL runs it in this process; ConfigError (strict) for what it cannot."""
        threads = proc["ll128_threads"] if cfg.protocol == "ll128" else proc["threads"]
        chunk = proc["chunk_bytes"] if (cfg.protocol in (None, "simple") and cfg.algorithm in ("auto", "ring")) \
            else cfg.chunk_bytes
        off = []
        if cfg.threads is not None and cfg.threads != threads:
            off.append(f"threads {cfg.threads} (this process runs {threads}: NCCL_NTHREADS is per process)")
        if cfg.chunk_bytes is not None and cfg.chunk_bytes != chunk:
            off.append(f"chunk {cfg.chunk_bytes} B (this process runs {chunk} B: NCCL_BUFFSIZE is per process)")
        if cfg.algorithm not in ("auto", "pairwise", *TUNER_ALGORITHMS):
            off.append(f"algorithm {cfg.algorithm} (not an NCCL algorithm)")
        elif not tuner and (cfg.protocol is not None or cfg.algorithm not in ("auto", "pairwise")):
            off.append("protocol/algorithm per call (needs NCCL's example tuner plugin: NCCL_TUNER_PLUGIN)")
        if off and self.strict:
            raise ConfigError(f"{spec.collective} on {spec.group.name}: stock NCCL cannot run " + "; ".join(off)
                              + " live; tune NC only, or pass strict=False to run them with the process's values")
        notes += [f"{spec.collective} on {spec.group.name}: {o}" for o in off]
        kw = {"threads": threads, "chunk_bytes": chunk}
        if not tuner or cfg.algorithm not in ("auto", "pairwise", *TUNER_ALGORITHMS):
            kw.update(protocol=None, algorithm="auto")
        return replace(cfg, **kw)

    def _communicator(self, spec: CollectiveSpec, cfg: CommConfig, tuner: bool) -> object:
        key = CommKey.of(spec)
        row, ctas = call_settings(key, replace(cfg, channels=cfg.channels if cfg.channels is not None else 64,
                                               protocol=cfg.protocol or "simple",
                                               algorithm=cfg.algorithm if cfg.algorithm != "auto" else "ring"))
        if cfg.channels is None:
            ctas = {}
        csv = tuner_csv_text([row]) if (tuner and row is not None and cfg.protocol is not None
                                        and cfg.algorithm != "auto") else None
        k = (spec.group, tuple(sorted(ctas.items())), csv)
        handle = self._comms.get(k)
        if handle is None:
            handle = self.layer.communicator(rank_blocks(self.layer.world, spec.group.size), ctas, csv)
            self._comms[k] = handle
        return handle

    def profile(self, configs: Sequence[CommConfig]) -> ProfileResult:
        """Run the group live with ``configs`` (rank 0's) and time it; x_j, Y, Z in seconds as
        in :class:`ProfileResult` (lagom eq. 1, Alg. 2 line 6)."""
        self.calls += 1
        # rank 0's configurations and NCCL environment: every rank decides (and fails) alike
        configs, env = self.layer.broadcast((list(configs), self.layer.nccl_env()))
        if len(configs) != self.group.n_collectives:
            raise ConfigError(f"live profiler: {len(configs)} configurations for {self.group.n_collectives} collectives")
        proc = process_values(env)
        tuner = bool(env.get("NCCL_TUNER_PLUGIN"))
        notes: list[str] = []
        comms = []
        for coll, cfg in zip(self.group.collectives, configs):
            applied = self._applied(coll.spec, cfg, proc, tuner, notes)
            comms.append((self._communicator(coll.spec, applied, tuner), coll.spec))
        self.ignored.append(notes)
        samples = self.layer.run(self._computations(), comms, self.warmup, self.iters)
        if len(samples) != self.iters:
            raise ConfigError(f"live profiler: the layer returned {len(samples)} samples for {self.iters} timed runs")
        n = len(comms)
        vec = [statistics.median(s[0][j] for s in samples) for j in range(n)]
        vec += [statistics.median(s[1] for s in samples), statistics.median(s[2] for s in samples)]
        v = self.layer.max_over_ranks(vec)
        return ProfileResult(comm_times_s=tuple(v[:n]), compute_time_s=v[n], makespan_s=v[n + 1])
