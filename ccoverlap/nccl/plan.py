"""NCCL configurations decided per communication: the record Lagom and AutoCCL hand on.

A :class:`CommPlan` is an ordered tuple of :class:`CommRule` rows. Each row says: collectives
of type ``collective`` on the process group named ``group`` whose message size lies in
``[min_bytes, max_bytes)`` run with ``config``. The first matching row wins; a collective no
row matches keeps the configuration its step gave it (NCCL's defaults unless the knobs say
otherwise).

Fields of a row (all plain data; :meth:`CommPlan.to_dict` / :meth:`CommPlan.from_dict`):

* ``group``: the process group's name as the step builders name it (``dp``, ``tp``, ``ep``,
  ``edp``, ``cp``, ``pp``, ``dp_rep``, ...), with its ``group_size`` ranks of which
  ``local_size`` per node (so a row can name the communicator it belongs to);
* ``collective``: ``all_gather``, ``reduce_scatter``, ``all_reduce``, ``all_to_all``,
  ``broadcast`` or ``reduce``;
* ``min_bytes`` / ``max_bytes``: the message-size range, in nccl-tests' ``size`` convention
  (all-gather: the gathered output; reduce-scatter: the input; all-reduce: the buffer;
  all-to-all: the per-rank send buffer), half-open;
* ``config``: a :class:`~ccoverlap.specs.CommConfig` with every knob set: ``channels``
  (NC, thread blocks), ``threads`` (NT per block), ``chunk_bytes`` (C: NCCL's chunk, 2 MiB for
  Simple by default), ``protocol`` (``simple`` | ``ll`` | ``ll128``) and ``algorithm``
  (``ring`` | ``tree`` | ``pairwise`` | ...);
* ``source``: why the row is there (which tuner, on which overlap group).

This is the granularity NCCL's tuner-plugin interface sees (collective type, message size,
communicator), so the rows map one to one onto tuner-plugin CSV rows. Per-communicator
``ProcessGroupNCCL`` options (``config.min_ctas`` / ``max_ctas`` = NC) can carry a row's NC
when every row of a group agrees on it, and an environment file (``NCCL_*`` variables are
per process) only a configuration every row shares. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from ccoverlap.errors import ConfigError
from ccoverlap.sim.graph import OpGraph
from ccoverlap.specs import COLLECTIVES, CollectiveSpec, CommConfig

if TYPE_CHECKING:
    from ccoverlap.sim.simulator import SupportsDuration

__all__ = ["CommKey", "CommRule", "CommPlan", "comm_keys", "size_ranges"]


@dataclass(frozen=True, order=True)
class CommKey:
    """One communication as a tuner tells them apart: process-group name, collective type and
    message size in bytes (nccl-tests' ``size``), plus the group's shape."""

    group: str
    collective: str
    nbytes: float
    group_size: int = 1
    local_size: int = 1

    @classmethod
    def of(cls, spec: CollectiveSpec) -> CommKey:
        """The key of a collective spec."""
        return cls(spec.group.name, spec.collective, float(spec.bytes), spec.group.size, spec.group.local_size)

    def describe(self) -> str:
        """``all_gather 150.1 MiB on dp(8)``."""
        return f"{self.collective} {self.nbytes / 2**20:.1f} MiB on {self.group}({self.group_size})"


@dataclass(frozen=True)
class CommRule:
    """One row of a :class:`CommPlan` (fields: the module docstring)."""

    group: str
    collective: str
    min_bytes: float
    max_bytes: float
    config: CommConfig
    group_size: int = 0
    local_size: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ConfigError(f"plan row for {self.group!r}: unknown collective {self.collective!r}; "
                              f"expected one of {', '.join(COLLECTIVES)}")
        if not (0 <= self.min_bytes < self.max_bytes):
            raise ConfigError(f"plan row {self.collective} on {self.group!r}: need 0 <= min_bytes < max_bytes, "
                              f"got [{self.min_bytes}, {self.max_bytes})")
        if not isinstance(self.config, CommConfig):
            raise ConfigError(f"plan row {self.collective} on {self.group!r}: config must be a CommConfig")

    def matches(self, spec: CollectiveSpec) -> bool:
        """Whether ``spec`` falls under this row."""
        return (spec.group.name == self.group and spec.collective == self.collective
                and self.min_bytes <= spec.bytes < self.max_bytes)


def size_ranges(sizes: Iterable[float]) -> dict[float, tuple[float, float]]:
    """Half-open message-size ranges, one per distinct size, that do not overlap: bounded by
    the geometric midpoints between neighbouring sizes, and by half / twice the smallest /
    largest size at the ends (so a rule covers its own size and the sizes nearer it than
    any other tuned size, and no more)."""
    s = sorted({float(x) for x in sizes if x > 0})
    out: dict[float, tuple[float, float]] = {}
    for i, v in enumerate(s):
        lo = math.sqrt(s[i - 1] * v) if i else v / 2.0
        hi = math.sqrt(v * s[i + 1]) if i + 1 < len(s) else v * 2.0
        out[v] = (lo, hi)
    return out


@dataclass(frozen=True)
class CommPlan:
    """Configurations per process group, collective type and message-size range (the rows;
    see the module docstring). Immutable: :meth:`with_config` returns a new plan."""

    rules: tuple[CommRule, ...] = ()

    @classmethod
    def from_configs(cls, configs: dict[CommKey, CommConfig], *, universe: Iterable[CommKey] = (),
                     sources: dict[CommKey, str] | None = None) -> CommPlan:
        """One row per key of ``configs``, its size range from :func:`size_ranges` over the
        sizes of the same group and collective among ``configs`` and ``universe`` (every
        communication of the step), so a row never covers another communication's size."""
        sizes: dict[tuple[str, str], set[float]] = {}
        for k in [*configs, *universe]:
            sizes.setdefault((k.group, k.collective), set()).add(k.nbytes)
        rules = []
        for k in sorted(configs):
            if k.nbytes <= 0:
                continue
            lo, hi = size_ranges(sizes[(k.group, k.collective)])[k.nbytes]
            rules.append(CommRule(k.group, k.collective, lo, hi, configs[k], k.group_size, k.local_size,
                                  (sources or {}).get(k, "")))
        return cls(tuple(rules))

    def lookup(self, spec: CollectiveSpec) -> CommConfig | None:
        """The configuration of the first row matching ``spec``, or None."""
        for r in self.rules:
            if r.matches(spec):
                return r.config
        return None

    def configs(self) -> dict[CommKey, CommConfig]:
        """``{key: config}`` with the key at each row's geometric centre (for reports)."""
        return {CommKey(r.group, r.collective, math.sqrt(max(r.min_bytes, 1.0) * r.max_bytes), r.group_size,
                        r.local_size): r.config for r in self.rules}

    def apply(self, graph: OpGraph) -> OpGraph:
        """A copy of ``graph`` (same op ids, order and dependencies) in which every collective a
        row matches runs with that row's configuration (its transport kept)."""
        out = OpGraph()
        out.meta = dict(graph.meta)
        memo: dict[int, Any] = {}
        ops = []
        for op in graph.ops:
            spec = op.spec
            if isinstance(spec, CollectiveSpec):
                new = memo.get(id(spec))
                if new is None:
                    cfg = self.lookup(spec)
                    new = spec if cfg is None else replace(spec, config=cfg)
                    memo[id(spec)] = new
                if new is not spec:
                    op = op._replace(spec=new)
            ops.append(op)
        out.ops = ops
        return out

    def describe(self, limit: int = 6) -> str:
        """The rows, ``; ``-separated (``dp all_gather 106-212 MiB: NC=2 NT=512 C=684 KiB simple ring``)."""
        lines = []
        for r in self.rules[:limit]:
            lines.append(f"{r.group} {r.collective} {r.min_bytes / 2**20:.3g}-{r.max_bytes / 2**20:.3g} MiB: "
                         f"{format_config(r.config)}")
        if len(self.rules) > limit:
            lines.append(f"... {len(self.rules) - limit} more")
        return "; ".join(lines)

    def to_dict(self) -> dict:
        """``{"rules": [{group, collective, min_bytes, max_bytes, group_size, local_size,
        source, config: {channels, threads, chunk_bytes, protocol, algorithm}}, ...]}``."""
        return {"rules": [{**{k: v for k, v in asdict(r).items() if k != "config"}, "config": asdict(r.config)}
                          for r in self.rules]}

    @classmethod
    def from_dict(cls, data: dict, where: str = "comm plan") -> CommPlan:
        """The inverse of :meth:`to_dict`; ConfigError naming ``where`` on malformed input."""
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            raise ConfigError(f"{where}: expected a mapping with a list 'rules'")
        rules = []
        for i, row in enumerate(data["rules"]):
            if not isinstance(row, dict) or not isinstance(row.get("config"), dict):
                raise ConfigError(f"{where}.rules[{i}]: expected a mapping with a 'config' mapping")
            try:
                cfg = CommConfig(**row["config"])
                rest = {k: v for k, v in row.items() if k != "config"}
                rules.append(CommRule(config=cfg, **rest))
            except TypeError as exc:
                raise ConfigError(f"{where}.rules[{i}]: {exc}") from None
        return cls(tuple(rules))


def comm_keys(graph: OpGraph, cost: SupportsDuration | None = None) -> dict[CommKey, float]:
    """The distinct communications of ``graph`` (SM-driven collectives with bytes), each with
    how many times it occurs, or with its total stand-alone time in seconds when ``cost``
    (a cost model, or anything with its ``duration_s``) is given: the weight a tuner ranks them by."""
    out: dict[CommKey, float] = {}
    seen: dict[int, tuple[CommKey, float]] = {}
    for op in graph.ops:
        spec = op.spec
        if not isinstance(spec, CollectiveSpec) or spec.bytes <= 0 or spec.transport != "sm":
            continue
        got = seen.get(id(spec))
        if got is None:
            got = (CommKey.of(spec), float(cost.duration_s(spec, ())) if cost is not None else 1.0)
            seen[id(spec)] = got
        out[got[0]] = out.get(got[0], 0.0) + got[1]
    return out


def format_config(c: CommConfig) -> str:
    """``NC=2 NT=512 C=684 KiB simple ring``."""
    chunk = c.chunk_bytes or 0
    size = f"{chunk / 2**20:g} MiB" if chunk >= 2**20 and chunk % 2**18 == 0 else f"{chunk / 1024:g} KiB"
    alg = "" if c.algorithm in (None, "auto") else f" {c.algorithm}"
    return f"NC={c.channels} NT={c.threads} C={size} {c.protocol}{alg}"

