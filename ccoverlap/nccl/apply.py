"""How stock NCCL applies a configuration per communication, and what it cannot.

A decision (Lagom, AutoCCL, a user's knobs) wants one :class:`~ccoverlap.specs.CommConfig`
per communication (:class:`~ccoverlap.nccl.plan.CommKey`: process group, collective type, message
size). Stock NCCL takes settings at three places, each with its reach:

* **process-wide environment variables** (read once per process): ``NCCL_NTHREADS`` (threads
  per block of Simple and LL), ``NCCL_LL128_NTHREADS``, ``NCCL_BUFFSIZE`` (the Simple
  protocol's buffer; a ring collective's chunk is half of it), ``NCCL_PROTO``, ``NCCL_ALGO``;
  one value for every communicator;
* **per communicator**: ``ncclConfig_t`` ``minCTAs`` / ``maxCTAs`` (NCCL >= 2.17), which
  PyTorch passes as ``ProcessGroupNCCL.Options().config.min_ctas`` / ``max_ctas``: bounds on
  the channels of every kernel of that process group;
* **per call**, through a tuner plugin: NCCL's example plugin reads a CSV
  (``NCCL_TUNER_CONFIG_FILE``) of ``collective_type, min_bytes, max_bytes, algorithm,
  protocol, channels, nNodes, nRanks[, numPipeOps, regBuff]`` rows and, for the first row
  matching a call, prefers that algorithm and protocol and sets its channel count. Rows
  tell communicators apart only by their node and rank counts, and there is no column for
  threads or chunk size.

:func:`stock_nccl_settings` turns wanted configurations into those settings and computes what
stock NCCL then runs for each communication (``applied``), listing every knob it could not
set (``dropped``). Rules: threads and chunk size go into the environment when the decision
changed them; where communications want different values, the value carrying the most
communication time is written and the others are dropped. Algorithm, protocol and channels
go into the tuner CSV when the decision changed any of them, one row per communication with
an explicit channel count: the example plugin starts every call at one channel and keeps it
for a row with ``channels = -1`` or a call no row matches (``pluginGetCollInfo``), so a
partial file would leave the other collectives on one channel. Groups whose channels
changed get min / max CTAs spanning their rows. All-to-all runs on NCCL's send/receive path,
which the tuner does not see: only its group's CTA bounds reach it.

The names, file formats and limits come from ``ccoverlap/data/emit/options.yaml`` (each with
the NCCL file and commit it was read at). No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ccoverlap.errors import ConfigError
from ccoverlap.nccl.plan import CommKey, size_ranges
from ccoverlap.specs import CommConfig

if TYPE_CHECKING:
    from ccoverlap.specs import CommProtocol

__all__ = ["pinned_options", "TunerRow", "tuner_csv_text", "parse_tuner_csv", "match_row", "nccl_env_text",
           "parse_nccl_env", "GroupOptions", "Dropped", "NcclSettings", "stock_nccl_settings", "buffsize_for_chunk",
           "TUNER_COLLECTIVES", "call_settings", "process_values"]

_OPTIONS = Path(__file__).resolve().parent.parent / "data" / "emit" / "options.yaml"


@lru_cache(maxsize=1)
def pinned_options() -> dict:
    """The pinned option names and their sources (``ccoverlap/data/emit/options.yaml``)."""
    import yaml

    with open(_OPTIONS, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _csv_spec() -> dict:
    return pinned_options()["nccl"]["tuner_csv"]


#: ccoverlap collective -> the example plugin's ``collective_type``
TUNER_COLLECTIVES: dict[str, str] = {"broadcast": "broadcast", "reduce": "reduce", "all_gather": "allgather",
                                     "reduce_scatter": "reducescatter", "all_reduce": "allreduce"}
#: NCCL_PROTO / NCCL_ALGO spellings
_PROTO_ENV = {"simple": "Simple", "ll": "LL", "ll128": "LL128"}
_ALGO_ENV = {"ring": "Ring", "tree": "Tree"}
#: getNthreads bounds (src/graph/tuning.cc): multiples of 32, Simple/LL 64..512, LL128 160..640
_THREAD_BOUNDS = {"NCCL_NTHREADS": (64, 512), "NCCL_LL128_NTHREADS": (160, 640)}
#: collectives whose Simple ring chunk is NCCL_BUFFSIZE / 2 (chunkSteps = NCCL_STEPS / 2)
_RING_CHUNKED = ("all_gather", "reduce_scatter", "all_reduce")


def buffsize_for_chunk(chunk_bytes: int) -> int:
    """``NCCL_BUFFSIZE`` giving a Simple ring collective the chunk ``chunk_bytes``: the chunk is
    buffSize / NCCL_STEPS x chunkSteps = buffSize / 8 x 4 (src/enqueue.cc calcCollChunking)."""
    return 2 * int(chunk_bytes)


def process_values(env: Mapping[str, str]) -> dict[str, int]:
    """Threads per block and the Simple ring chunk this process's NCCL runs every call with,
    from its ``NCCL_*`` environment (``env``): ``{"threads": NCCL_NTHREADS or 512,
    "ll128_threads": NCCL_LL128_NTHREADS or 640, "chunk_bytes": NCCL_BUFFSIZE / 2 or 2 MiB}``
    (defaults: src/graph/tuning.cc NCCL_SIMPLE_MAX_NTHREADS / NCCL_LL128_MAX_NTHREADS,
    src/init.cc DEFAULT_BUFFSIZE)."""
    def num(name: str, default: int) -> int:
        try:
            return int(env.get(name, default))
        except ValueError:
            raise ConfigError(f"{name}={env.get(name)!r} is not an integer") from None

    return {"threads": num("NCCL_NTHREADS", 512), "ll128_threads": num("NCCL_LL128_NTHREADS", 640),
            "chunk_bytes": num("NCCL_BUFFSIZE", 4 * 2**20) // 2}


# ----------------------------------------------------------------------------- tuner CSV

@dataclass(frozen=True)
class TunerRow:
    """One row of the example tuner plugin's CSV (bytes inclusive at both ends, as the plugin
    matches them); ``comment`` is written on its own ``#`` line above the row."""

    collective_type: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    n_nodes: int = -1
    n_ranks: int = -1
    num_pipe_ops: int = -1
    reg_buff: int = -1
    comment: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        spec = _csv_spec()
        where = f"tuner row {self.collective_type},{self.min_bytes},{self.max_bytes}"
        if self.collective_type not in spec["collective_types"].values():
            raise ConfigError(f"{where}: collective_type must be one of {sorted(spec['collective_types'].values())}")
        if self.algorithm not in spec["algorithms"]:
            raise ConfigError(f"{where}: algorithm must be one of {spec['algorithms']}, got {self.algorithm!r}")
        if self.protocol not in spec["protocols"]:
            raise ConfigError(f"{where}: protocol must be one of {spec['protocols']}, got {self.protocol!r}")
        # the plugin reads both bounds as size_t (strtoull): SIZE_MAX, not 2**32 - 1 (options.yaml)
        if not 0 <= self.min_bytes <= self.max_bytes <= spec["max_bytes"]:
            raise ConfigError(f"{where}: need 0 <= min_bytes <= max_bytes <= {spec['max_bytes']}")
        if self.channels != -1 and not 1 <= self.channels <= pinned_options()["nccl"]["communicator"]["max_ctas"]:
            raise ConfigError(f"{where}: channels must be -1 or 1..64, got {self.channels}")
        for name in ("n_nodes", "n_ranks", "num_pipe_ops"):
            v = getattr(self, name)
            if v != -1 and v < 1:
                raise ConfigError(f"{where}: {name} must be -1 or >= 1, got {v}")
        if self.reg_buff not in (-1, 0, 1):
            raise ConfigError(f"{where}: regBuff must be -1, 0 or 1, got {self.reg_buff}")

    def line(self) -> str:
        """The CSV line (10 fields, no spaces)."""
        return ",".join(str(v) for v in (self.collective_type, self.min_bytes, self.max_bytes, self.algorithm,
                                          self.protocol, self.channels, self.n_nodes, self.n_ranks,
                                          self.num_pipe_ops, self.reg_buff))

    def matches(self, collective_type: str, nbytes: int, n_nodes: int, n_ranks: int) -> bool:
        """The plugin's test (``pluginGetCollInfo``; numPipeOps and regBuff taken as matching)."""
        return (self.collective_type == collective_type and self.min_bytes <= nbytes <= self.max_bytes
                and self.n_nodes in (-1, n_nodes) and self.n_ranks in (-1, n_ranks))


def tuner_csv_text(rows: list[TunerRow], header: str = "") -> str:
    """The CSV file: ``#`` comment lines (the column names among them: the plugin has no header
    row and would parse one as a configuration), then each row under its comment. Every line
    stays under the plugin's 256-character read buffer."""
    spec = _csv_spec()
    limit = spec["max_line_chars"]
    lines = [f"# {c}"[:limit] for c in header.splitlines() if c.strip()]
    lines.append("# " + ",".join(spec["columns"]))
    for r in rows:
        if r.comment:
            lines.append(f"# {r.comment}"[:limit])
        lines.append(r.line())
    return "\n".join(lines) + "\n"


def parse_tuner_csv(text: str, where: str = "tuner CSV") -> list[TunerRow]:
    """The rows of a tuner CSV as the example plugin reads them (comments and empty lines
    skipped; 8 to 10 fields), validated against the pinned format; ConfigError naming the line."""
    spec = _csv_spec()
    rows = []
    for n, raw in enumerate(text.splitlines(), 1):
        if len(raw) > spec["max_line_chars"]:
            raise ConfigError(f"{where}:{n}: line longer than {spec['max_line_chars']} characters "
                              f"(the plugin would split it)")
        if not raw or raw.startswith("#"):
            continue
        fields = [f.strip() for f in raw.split(",")]
        if not 8 <= len(fields) <= 10:
            raise ConfigError(f"{where}:{n}: expected 8 to 10 comma-separated fields, got {len(fields)}")
        try:
            # channels, n_nodes, n_ranks, then num_pipe_ops and reg_buff (-1, the defaults, when left out)
            nums = [int(f) for f in fields[5:]] + [-1] * (10 - len(fields))
            rows.append(TunerRow(fields[0], int(fields[1]), int(fields[2]), fields[3], fields[4],
                                 nums[0], nums[1], nums[2], nums[3], nums[4]))
        except ValueError as exc:
            raise ConfigError(f"{where}:{n}: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{where}:{n}: {exc}") from None
    return rows


def match_row(rows: list[TunerRow], key: CommKey) -> TunerRow | None:
    """The first row the example plugin would apply to a call of ``key``, or None."""
    ct = TUNER_COLLECTIVES.get(key.collective)
    if ct is None:
        return None
    nodes = max(1, key.group_size // max(1, key.local_size))
    for r in rows:
        if r.matches(ct, int(round(key.nbytes)), nodes, key.group_size):
            return r
    return None


# ----------------------------------------------------------------------------- environment file

def nccl_env_text(env: Mapping[str, str], comments: Mapping[str, str] | None = None, header: str = "") -> str:
    """``NAME=value`` lines (shell-sourceable), each under a ``#`` line saying why; names
    must be in the pinned list."""
    known = pinned_options()["nccl"]["env"]
    lines = [f"# {c}" for c in header.splitlines() if c.strip()]
    for name, value in env.items():
        if name not in known:
            raise ConfigError(f"{name} is not an NCCL variable ccoverlap knows (ccoverlap/data/emit/options.yaml)")
        if comments and comments.get(name):
            lines.append(f"# {comments[name]}")
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def parse_nccl_env(text: str, where: str = "nccl.env") -> dict[str, str]:
    """``{NAME: value}`` of an environment file (comments skipped); ConfigError for a line
    that is not ``NAME=value`` or a name outside the pinned NCCL list."""
    known = pinned_options()["nccl"]["env"]
    out = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name:
            raise ConfigError(f"{where}:{n}: expected NAME=value, got {line!r}")
        if name not in known:
            raise ConfigError(f"{where}:{n}: {name} is not a pinned NCCL variable")
        out[name] = value
    return out


def call_settings(key: CommKey, config: CommConfig) -> tuple[TunerRow | None, dict]:
    """The settings that give one communicator's calls of ``key`` the configuration ``config``
    (resolved: channels, protocol, algorithm set), as :func:`stock_nccl_settings` writes them:
    a tuner row covering exactly this size (None for a collective the plugin does not see, or
    an algorithm it does not have) and ``{"min_ctas": NC, "max_ctas": NC}`` for the
    communicator. Threads and chunk are per process and not here."""
    cap = pinned_options()["nccl"]["communicator"]["max_ctas"]
    nc = min(_channels(config), cap)
    ctas = {"min_ctas": nc, "max_ctas": nc}
    ct = TUNER_COLLECTIVES.get(key.collective)
    if ct is None or config.algorithm not in _csv_spec()["algorithms"]:
        return None, ctas
    size = int(round(key.nbytes))
    nodes = max(1, key.group_size // max(1, key.local_size))
    assert config.protocol is not None  # resolved, as documented
    return TunerRow(ct, size, size, config.algorithm, config.protocol, nc, nodes, key.group_size,
                    comment=f"{key.group} {key.collective} {size} bytes"), ctas


# ----------------------------------------------------------------------------- the projection

@dataclass(frozen=True)
class GroupOptions:
    """``ProcessGroupNCCL.Options().config`` for one process group: ``min_ctas`` / ``max_ctas``
    (ncclConfig_t minCTAs / maxCTAs) and the group's shape."""

    group: str
    ranks: int
    ranks_per_node: int
    min_ctas: int
    max_ctas: int

    def to_dict(self) -> dict:
        """Plain data (the ``process_groups.json`` entry)."""
        return {"ranks": self.ranks, "ranks_per_node": self.ranks_per_node, "min_ctas": self.min_ctas,
                "max_ctas": self.max_ctas}


@dataclass(frozen=True)
class Dropped:
    """A knob of one communication that the settings do not give it: ``wanted`` (the decision),
    ``applied`` (what stock NCCL runs with the settings) and why."""

    key: CommKey
    knob: str
    wanted: object
    applied: object
    why: str

    def describe(self) -> str:
        """``dp all_gather 150.1 MiB: threads 256 -> 512 (NCCL_NTHREADS is per process ...)``."""
        return f"{self.key.group} {self.key.collective} {self.key.nbytes / 2**20:.1f} MiB: {self.knob} " \
               f"{self.wanted} -> {self.applied} ({self.why})"


@dataclass
class NcclSettings:
    """What :func:`stock_nccl_settings` decided: environment, tuner rows, per-group options,
    the configuration each communication then runs with, and the knobs dropped."""

    env: dict[str, str] = field(default_factory=dict)
    env_why: dict[str, str] = field(default_factory=dict)
    tuner_rows: list[TunerRow] = field(default_factory=list)
    groups: dict[str, GroupOptions] = field(default_factory=dict)
    applied: dict[CommKey, CommConfig] = field(default_factory=dict)
    dropped: list[Dropped] = field(default_factory=list)

    @property
    def needs_tuner(self) -> bool:
        """Whether the CSV (and so the example tuner plugin) is part of the settings."""
        return bool(self.tuner_rows)


Resolver = Callable[[CommKey, CommConfig], CommConfig]
Configs = Mapping[CommKey, CommConfig]
Weights = Mapping[CommKey, float]


def _channels(c: CommConfig) -> int:
    """NC of a resolved configuration (every knob set, as the settings below take them)."""
    assert c.channels is not None
    return int(c.channels)


def stock_nccl_settings(wanted: Mapping[CommKey, CommConfig], given: Mapping[CommKey, CommConfig],
                        weights: Mapping[CommKey, float], resolve: Resolver) -> NcclSettings:
    """Settings stock NCCL takes for the configurations ``wanted`` per communication (every
    knob resolved), starting from ``given`` (what runs without settings, resolved), and what
    each communication then runs with (rules: the module docstring). ``weights``: seconds of
    communication per key (which value wins where communications disagree); ``resolve(key,
    config)``: the configuration with its unset knobs and ``algorithm="auto"`` resolved (the
    cost model's choice, as NCCL's own tuner would)."""
    keys = sorted(wanted)
    missing = [k for k in keys if k not in given]
    if missing:
        raise ConfigError(f"no as-given configuration for {missing[0].describe()}")
    out = NcclSettings(applied={k: wanted[k] for k in keys})
    _per_call(out, keys, wanted, given, weights, resolve)
    _process_wide(out, keys, wanted, given, weights)
    return out


def _per_call(out: NcclSettings, keys: list[CommKey], wanted: Configs, given: Configs, weights: Weights,
              resolve: Resolver) -> None:
    """Algorithm, protocol and channels: the tuner CSV and the groups' CTA bounds."""
    tunable = [k for k in keys if k.collective in TUNER_COLLECTIVES]
    if any((wanted[k].algorithm, wanted[k].protocol, wanted[k].channels)
           != (given[k].algorithm, given[k].protocol, given[k].channels) for k in tunable):
        _tuner(out, tunable, wanted, weights, resolve)
    _group_bounds(out, keys, wanted, given)


def _tuner(out: NcclSettings, tunable: list[CommKey], wanted: Configs, weights: Weights, resolve: Resolver) -> None:
    """The tuner CSV over every collective the plugin sees, and what each then runs with."""
    max_ctas = pinned_options()["nccl"]["communicator"]["max_ctas"]
    csv_algs = set(_csv_spec()["algorithms"])
    want: dict[CommKey, CommConfig] = {}
    for k in tunable:
        c = wanted[k]
        if c.algorithm not in csv_algs:
            fallback = resolve(k, replace(c, algorithm="auto"))
            out.dropped.append(Dropped(k, "algorithm", c.algorithm, fallback.algorithm,
                                       "the tuner plugin's algorithms are NCCL's own (ring, tree, ...)"))
            c = replace(c, algorithm=fallback.algorithm)
        if c.channels > max_ctas:
            out.dropped.append(Dropped(k, "channels", c.channels, max_ctas, "NCCL has at most 64 channels"))
            c = replace(c, channels=max_ctas)
        want[k] = c
    out.tuner_rows = _tuner_rows(want, weights)
    for k in tunable:
        row = match_row(out.tuner_rows, k)
        assert row is not None  # the rows cover every tunable key (_tuner_rows)
        # a row's protocol is one of NCCL's (TunerRow checks it against the plugin's list)
        got = replace(want[k], algorithm=row.algorithm, protocol=cast("CommProtocol", row.protocol),
                      channels=row.channels)
        for knob in ("algorithm", "protocol", "channels"):
            if getattr(got, knob) != getattr(want[k], knob):
                out.dropped.append(Dropped(k, knob, getattr(want[k], knob), getattr(got, knob),
                                           "another group of the same size and node count has a call of this "
                                           "size; the tuner's rows cannot tell communicators apart by name"))
        out.applied[k] = got


def _tuner_rows(want: Configs, weights: Weights) -> list[TunerRow]:
    """One row per (collective, nodes, ranks, size), ranges between neighbouring sizes; where
    two groups of the same shape have a call of the same size, the heavier one's row;
    neighbouring rows with the same values merged."""
    buckets: dict[tuple, dict[float, CommKey]] = {}
    for k in sorted(want, key=lambda k: -weights.get(k, 0.0)):
        b = buckets.setdefault((k.collective, max(1, k.group_size // max(1, k.local_size)), k.group_size), {})
        b.setdefault(k.nbytes, k)  # the heavier key of this shape and size wins the row
    rows: list[TunerRow] = []
    for (coll, nodes, ranks), by_size in sorted(buckets.items()):
        ranges = size_ranges(by_size)
        for size in sorted(by_size):
            k = by_size[size]
            lo, hi = ranges[size]
            c = want[k]
            assert c.protocol is not None  # the wanted configurations are resolved
            row = TunerRow(TUNER_COLLECTIVES[coll], math.ceil(lo), max(math.ceil(lo), math.ceil(hi) - 1),
                           c.algorithm, c.protocol, _channels(c), nodes, ranks,
                           comment=f"{k.group} {k.collective} {int(round(k.nbytes))} bytes, {k.group_size} ranks")
            prev = rows[-1] if rows else None
            if prev is not None and (prev.collective_type, prev.algorithm, prev.protocol, prev.channels,
                                     prev.n_nodes, prev.n_ranks) == (row.collective_type, row.algorithm,
                                                                     row.protocol, row.channels, nodes, ranks) \
                    and prev.max_bytes + 1 >= row.min_bytes:
                rows[-1] = replace(prev, max_bytes=row.max_bytes, comment=f"{prev.comment}; {row.comment}")
            else:
                rows.append(row)
    return rows


def _group_bounds(out: NcclSettings, keys: list[CommKey], wanted: Configs, given: Configs) -> None:
    """min / max CTAs of every group whose channels changed; all-to-all (not tuned by the
    plugin) gets the bound nearest what it wanted."""
    by_group: dict[str, list[CommKey]] = {}
    for k in keys:
        by_group.setdefault(k.group, []).append(k)
    for name, ks in sorted(by_group.items()):
        if all(wanted[k].channels == given[k].channels for k in ks):
            continue
        cap = pinned_options()["nccl"]["communicator"]["max_ctas"]
        chans = [_channels(out.applied[k]) for k in ks if k.collective in TUNER_COLLECTIVES] + \
                [min(_channels(wanted[k]), cap) for k in ks if k.collective not in TUNER_COLLECTIVES]
        lo, hi = min(chans), max(chans)
        out.groups[name] = GroupOptions(name, ks[0].group_size, ks[0].local_size, lo, hi)
        for k in ks:
            if k.collective in TUNER_COLLECTIVES:
                continue
            got = min(max(given[k].channels, lo), hi)
            if lo == hi:
                got = lo
            a = out.applied[k]
            if a.channels != got:
                out.dropped.append(Dropped(k, "channels", wanted[k].channels, got,
                                           "all-to-all runs on NCCL's send/receive path; only the group's "
                                           "min/max CTAs reach it"))
            if (a.algorithm, a.protocol) != (given[k].algorithm, given[k].protocol):
                out.dropped.append(Dropped(k, "protocol/algorithm", f"{a.protocol}/{a.algorithm}",
                                           f"{given[k].protocol}/{given[k].algorithm}",
                                           "the tuner plugin is not asked about send/receive"))
            out.applied[k] = replace(a, channels=got, protocol=given[k].protocol, algorithm=given[k].algorithm)


def _process_wide(out: NcclSettings, keys: list[CommKey], wanted: Configs, given: Configs, weights: Weights) -> None:
    """Threads and the Simple ring chunk: environment variables, one value per process."""
    families = {"NCCL_NTHREADS": ("simple", "ll"), "NCCL_LL128_NTHREADS": ("ll128",)}
    for var, protos in families.items():
        ks = [k for k in keys if out.applied[k].protocol in protos]
        _one_value(out, var, ks, "threads", wanted, given, weights, lambda v: str(v),
                   f"{var} is per process: one thread count for every {'/'.join(protos)} call")
    ring = [k for k in keys if k.collective in _RING_CHUNKED and out.applied[k].protocol == "simple"
            and out.applied[k].algorithm == "ring"]
    _one_value(out, "NCCL_BUFFSIZE", ring, "chunk_bytes", wanted, given, weights,
               lambda v: str(buffsize_for_chunk(v)),
               "NCCL_BUFFSIZE is per process: one Simple ring chunk (half the buffer) for every call")
    for k in keys:  # chunks NCCL_BUFFSIZE does not set (LL, LL128, tree, all-to-all, ...)
        if k in ring or wanted[k].chunk_bytes == given[k].chunk_bytes:
            continue
        out.dropped.append(Dropped(k, "chunk_bytes", wanted[k].chunk_bytes, given[k].chunk_bytes,
                                   "NCCL derives this call's chunk itself; only the Simple ring chunk follows "
                                   "NCCL_BUFFSIZE"))
        out.applied[k] = replace(out.applied[k], chunk_bytes=given[k].chunk_bytes)
    tunable = [k for k in keys if k.collective in TUNER_COLLECTIVES]
    for var, knob, spell in (("NCCL_PROTO", "protocol", _PROTO_ENV), ("NCCL_ALGO", "algorithm", _ALGO_ENV)):
        vals = {getattr(out.applied[k], knob) for k in tunable}
        if len(vals) == 1 and any(getattr(wanted[k], knob) != getattr(given[k], knob) for k in tunable):
            v = vals.pop()
            if v in spell:
                out.env[var] = spell[v]
                out.env_why[var] = f"every collective of the step runs {knob} {v}"


def _one_value(out: NcclSettings, var: str, ks: list[CommKey], knob: str, wanted: Configs, given: Configs,
               weights: Weights, fmt: Callable[[int], str], why: str) -> None:
    """Set ``var`` when the decision changed ``knob`` on any of ``ks``: the value with the most
    communication time; every key then runs with it."""
    if not ks or all(getattr(wanted[k], knob) == getattr(given[k], knob) for k in ks):
        return
    score: dict[int, float] = {}  # per value of the knob (threads or chunk bytes)
    for k in ks:
        v = getattr(wanted[k], knob)
        score[v] = score.get(v, 0.0) + weights.get(k, 0.0)
    best = max(score, key=lambda v: (score[v], v))
    if var in _THREAD_BOUNDS:
        lo, hi = _THREAD_BOUNDS[var]
        if not lo <= best <= hi or best % 32:
            for k in ks:
                out.dropped.append(Dropped(k, knob, getattr(wanted[k], knob), getattr(given[k], knob),
                                           f"{var} accepts multiples of 32 from {lo} to {hi}"))
                out.applied[k] = replace(out.applied[k], **{knob: getattr(given[k], knob)})
            return
    out.env[var] = fmt(best)
    agree = len(score) == 1
    out.env_why[var] = (f"every {knob} the step's calls want" if agree else
                        f"the {knob} carrying the most communication time ({len(score)} values wanted)")
    change: dict[str, Any] = {knob: best}
    for k in ks:
        if getattr(wanted[k], knob) != best:
            out.dropped.append(Dropped(k, knob, getattr(wanted[k], knob), best, why))
        out.applied[k] = replace(out.applied[k], **change)
