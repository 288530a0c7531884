"""The cost model the simulator calls: ``CostModel(cluster, params).duration_s(spec, concurrent)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ccoverlap.catalog.hardware import ClusterSpec
from ccoverlap.cost import comm as _comm
from ccoverlap.cost import contention as _ct
from ccoverlap.cost import copy_engine as _ce
from ccoverlap.cost.compute import attention_time_s, gemm_profile, memory_time_s
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.errors import ConfigError
from ccoverlap.specs import AttentionSpec, CollectiveSpec, CommConfig, CopySpec, GemmSpec, MemorySpec, P2PSpec, Spec


class CostModel:
    """Seconds per op on one GPU of ``cluster``, alone or beside other ops (lagom eqs. 4–6).

    ``params`` defaults to :func:`default_params` of the cluster's GPU. Stand-alone profiles
    are cached per spec; :meth:`duration_s` is a pure function of ``(spec, concurrent)``.
    """

    def __init__(self, cluster: ClusterSpec, params: CostParams | None = None) -> None:
        if not isinstance(cluster, ClusterSpec):
            raise ConfigError(f"CostModel needs a ClusterSpec, got {type(cluster).__name__}")
        if params is not None and not isinstance(params, CostParams):
            raise ConfigError(f"CostModel: params must be a CostParams or None, got {type(params).__name__}")
        self.cluster = cluster
        self.gpu = cluster.gpu
        self.params = params if params is not None else default_params(cluster.gpu)
        self._profiles: dict[Spec, _ct.Profile] = {}
        self._configs: dict[Spec, CommConfig] = {}
        self._durations: dict[tuple, float] = {}

    _MAX_CACHED = 500_000  # (spec, concurrent) entries kept before the cache is reset

    # ------------------------------------------------------------------ stand-alone
    def profile(self, spec: Spec) -> _ct.Profile:
        """The op alone: time, HBM demand, SMs held, L2 share, link levels (cached)."""
        prof = self._profiles.get(spec)
        if prof is None:
            prof = self._profile(spec)
            self._profiles[spec] = prof
        return prof

    def _profile(self, spec: Spec) -> _ct.Profile:
        p, gpu, cl = self.params, self.gpu, self.cluster
        if isinstance(spec, GemmSpec):
            t, d = gemm_profile(spec, gpu, p)
            return _ct.Profile(t, d / t if t > 0 else 0.0)
        if isinstance(spec, (AttentionSpec, MemorySpec)):
            t = attention_time_s(spec, gpu, p) if isinstance(spec, AttentionSpec) else memory_time_s(spec, gpu, p)
            return _ct.Profile(t, spec.bytes / t if t > 0 else 0.0)
        if isinstance(spec, (CollectiveSpec, P2PSpec)):
            cp = _comm.collective_profile(spec, cl, p) if isinstance(spec, CollectiveSpec) else \
                _comm.p2p_profile(spec, cl, p)
            resolved = replace(spec, config=replace(cp.config, algorithm=spec.config.algorithm))
            self._configs[spec] = cp.config
            rate = cp.wire_bytes / cp.time_s if cp.time_s > 0 else 0.0
            return _ct.Profile(cp.time_s, rate * _ct.hbm_bytes_per_wire_byte(spec, p),
                               _ct.comm_sms(resolved, cl, p), _ct.l2_footprint_fraction(resolved, cl, p),
                               cp.levels)
        if isinstance(spec, CopySpec):
            t = _comm.copy_time_s(spec, cl, p)
            moved = spec.bytes * (2.0 if spec.direction == "d2d" else 1.0)
            level = "copy_host" if spec.direction in ("h2d", "d2h") else "copy_d2d"
            return _ct.Profile(t, moved / t if t > 0 else 0.0, 0.0, _ct.l2_footprint_fraction(spec, cl, p),
                               frozenset({level}))
        raise ConfigError(f"the cost model has no rule for {type(spec).__name__}")

    def alone_s(self, spec: Spec) -> float:
        """Seconds ``spec`` takes on an idle GPU."""
        return self.profile(spec).time_s

    def comm_config(self, spec: CollectiveSpec | P2PSpec) -> CommConfig:
        """The knobs a communication op runs with once defaults and auto choices are resolved."""
        self.profile(spec)
        return self._configs[spec]

    def comm_sms(self, spec: Spec) -> float:
        """SMs ``spec`` holds while it runs (NC for SM-driven communication, else 0)."""
        return self.profile(spec).sms

    # ------------------------------------------------------------------ under contention
    def duration_s(self, spec: Spec, concurrent: Sequence[Spec] = ()) -> float:
        """Seconds ``spec`` would take if the ``concurrent`` ops (others on the same GPU) ran
        beside it throughout (lagom eqs. 4–6, ficco §IV-D; see :mod:`.contention`, and
        :mod:`.copy_engine` for GEMMs beside copy-engine traffic)."""
        if not concurrent:
            return self.profile(spec).time_s
        key = (spec, tuple(concurrent))
        d = self._durations.get(key)
        if d is None:
            d = self._duration(spec, key[1])
            if len(self._durations) >= self._MAX_CACHED:
                self._durations.clear()
            self._durations[key] = d
        return d

    def _duration(self, spec: Spec, concurrent: tuple) -> float:
        own = self.profile(spec)
        others = [self.profile(c) for c in concurrent]
        p = self.params
        if isinstance(spec, _ct.COMPUTE_SPECS):
            sms = hbm = l2 = 0.0
            sharers = 1
            for c, prof in zip(concurrent, others):
                if isinstance(c, _ct.COMPUTE_SPECS):
                    sharers += 1
                else:
                    sms += prof.sms
                    hbm += prof.hbm_bytes_per_s
                    l2 += prof.l2_fraction
            if sharers == 1 and sms == 0.0 and hbm == 0.0 and l2 == 0.0:
                return own.time_s
            t = _ct.compute_time_under_s(spec, self.gpu, p, sms_taken=sms, hbm_taken=hbm,
                                         l2_fraction=l2, sharers=sharers)
            share = _ce.copy_engine_hbm_share(concurrent, [prof.hbm_bytes_per_s for prof in others], self.gpu, p)
            return t * _ce.gemm_slowdown_beside_copy_engines(spec, share, p)
        other_hbm = sum(prof.hbm_bytes_per_s for prof in others)
        sharers = 1 + sum(1 for prof in others if prof.levels & own.levels)
        return _ct.comm_time_under_s(own.time_s, own.hbm_bytes_per_s, other_hbm, sharers, self.gpu, p,
                                     dma=_ct.is_dma(spec))
