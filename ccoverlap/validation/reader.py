"""Read and check a runs file: measured training runs that ``ccoverlap validate`` compares with
the model's predictions.

A runs file is YAML, JSON or TOML with a top-level ``runs:`` list (docs/validation.md has the
full format); each run names its ``source``, every ``assumptions`` made where the source is
silent, the ``model``, ``cluster`` (+ ``nodes``), ``parallel`` layout, ``batch``, ``knobs``,
``framework`` profile, what was ``measured`` (and by which FLOP rule) and the declared
``subset`` (``fit`` / ``held-out``) used by ``--fit-on``.

The reader checks the file's structure itself, independently of what this build of the
simulator supports: known keys and types, a known model and cluster, a layout whose degrees
multiply to the GPU count and divide the model, a measurement in the units its key names. Any
problem raises one :class:`~ccoverlap.errors.ConfigError` line naming the file, the run and the
field. Whether the simulator can build a run (e.g. context parallelism) is the predictor's
business (:mod:`ccoverlap.validation.predict`), reported per run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ccoverlap.catalog.hardware import (
    GPUSpec,
    LinkSpec,
    cluster_from_dict,
    get_cluster,
    get_gpu,
    load_cluster_file,
    read_config_file,
)
from ccoverlap.config import short, suggest, typed
from ccoverlap.errors import ConfigError
from ccoverlap.validation.measure import (
    FLOP_RULES,
    MEASURE_KINDS,
    Measurement,
    implied_step_time_s,
    model_tflops_per_gpu,
)

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import ClusterSpec
    from ccoverlap.catalog.models import ModelSpec

# ccoverlap.catalog.models and ccoverlap.parallel (about 50 and 40 ms to import) are imported in
# the functions that use them: `ccoverlap --help` imports this module (validate's flags).

TOP_KEYS = {"runs", "description", "sources", "version", "notes"}
RUN_KEYS = {"name", "source", "assumptions", "model", "cluster", "nodes", "parallel", "batch", "knobs",
            "framework", "measured", "subset", "group", "flops_model"}
REQUIRED_RUN_KEYS = ("name", "source", "model", "cluster", "parallel", "batch", "measured")
SUBSETS = ("fit", "held-out")
MEASURED_KEYS = set(MEASURE_KINDS) | {"flop_rule", "peak_tflops", "note", "memory_gib"}
# Cluster mapping with a catalog base: {base: dgx-h100, name: ..., nodes: N, gpus_per_node: G,
# gpu: {GPUSpec changes} or a catalog GPU name, intra: {LinkSpec changes}, inter: {LinkSpec changes}};
# without 'base', {gpu: NAME, nodes: N, ...} starts from that catalog GPU's default cluster.
CLUSTER_BASE_KEYS = {"base", "name", "gpu", "intra", "inter", "gpus_per_node", "nodes"}

# Parallel-layout fields agreed for context parallelism, HSDP and FP8 (docs/validation.md,
# "Runs file"); the runs file may use them whether or not this build's ParallelConfig has them.
EXTRA_PARALLEL = {"cp": (int, 1), "cp_impl": (str, "ring"), "dp_replicate": (int, 1), "fp8": (bool, False)}
CP_IMPLS = ("ring", "allgather")
#: Largest count (a degree, a batch, a sequence length, nodes) a runs file may give.
MAX_COUNT = 2**30
# Framework profiles agreed for this project (ccoverlap/data/frameworks/NAME.yaml when present).
KNOWN_FRAMEWORKS = ("megatron-lm-2021", "megatron-core", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class RunSpec:
    """One measured run, checked. ``model`` is a ModelSpec, ``cluster`` a ClusterSpec;
    ``parallel`` / ``batch`` / ``knobs`` stay mappings (the predictor turns them into the
    simulator's configs); ``measurement`` is the published number with its rule."""

    name: str
    index: int
    source: str
    assumptions: tuple
    model: Any
    cluster: Any
    parallel: dict
    batch: dict
    knobs: dict
    framework: str | None
    measurement: Measurement
    subset: str | None = None
    group: str = ""
    flops_model: Any = None  # ModelSpec the source's FLOP count refers to, if not ``model``

    @property
    def gpus(self) -> int:
        return self.cluster.world_size

    def degree(self, name: str) -> int:
        """Parallel degree ``name`` (tp, cp, pp, dp, ep, dp_replicate), 1 when not given."""
        return int(self.parallel.get(name, 1))

    @property
    def layout(self) -> str:
        """``TPxCPxPPxDP`` as a short string."""
        return "x".join(str(self.degree(d)) for d in ("tp", "cp", "pp", "dp"))

    @property
    def gpu_name(self) -> str:
        return self.cluster.gpu.name

    @property
    def measured_step_time_s(self) -> float:
        """The iteration time the published number implies (:mod:`ccoverlap.validation.measure`)."""
        return implied_step_time_s(self.measurement, model=self.flops_model or self.model,
                                   batch=self.batch, gpus=self.gpus)


@dataclass
class RunsFile:
    """A checked runs file: its path, the runs that passed the checks (in file order) and,
    when read with ``keep_going``, one line per run that did not (``problems``)."""

    path: str
    runs: list[RunSpec] = field(default_factory=list)
    sources: dict = field(default_factory=dict)
    description: str = ""
    problems: list[str] = field(default_factory=list)


class _Where:
    """Builds the one-line error prefix 'FILE: run NAME (#i): field F: ...'."""

    def __init__(self, path: str, index: int, name: str | None) -> None:
        self.path, self.index, self.name = path, index, name

    def err(self, fld: str, msg: str) -> ConfigError:
        who = f"run {short(self.name)} (#{self.index + 1})" if self.name else f"run #{self.index + 1}"
        return ConfigError(f"{self.path}: {who}: field {short(fld)}: {msg}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _strip_error(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _model(value: Any, where: _Where, fld: str, base_dir: Path) -> ModelSpec:
    from ccoverlap.catalog.models import get_model, model_from_dict

    try:
        if isinstance(value, dict):
            return model_from_dict(value, where=fld)
        if isinstance(value, str) and value.lower().endswith((".json", ".toml", ".yaml", ".yml")):
            p = Path(value)
            data = read_config_file(p if p.is_absolute() else base_dir / p)
            return model_from_dict(data["model"] if isinstance(data.get("model"), dict) else data, where=fld)
        if isinstance(value, str):
            return get_model(value)
    except ConfigError as exc:
        raise where.err(fld, _strip_error(exc)) from None
    raise where.err(fld, f"expected a model name, a model file or a mapping, got {type(value).__name__}")


def _cluster(value: Any, nodes: Any, where: _Where, base_dir: Path) -> ClusterSpec:

    if nodes is not None and (not _is_int(nodes) or not 1 <= nodes <= 2**20):
        raise where.err("nodes", f"must be an integer from 1 to {2**20}, got {short(nodes)}")
    try:
        if isinstance(value, str) and value.lower().endswith((".json", ".toml", ".yaml", ".yml")):
            p = Path(value)
            c = load_cluster_file(p if p.is_absolute() else base_dir / p)
        elif isinstance(value, str):
            c = get_cluster(value)
        elif isinstance(value, dict) and ("base" in value or (
                isinstance(value.get("gpu"), str) and not ("intra" in value and "inter" in value))):
            unknown = sorted(set(value) - CLUSTER_BASE_KEYS)
            if unknown:
                raise where.err(f"cluster.{unknown[0]}", f"unknown field; a cluster given by 'base' (or by a "
                                f"catalog 'gpu' and its default cluster) takes {sorted(CLUSTER_BASE_KEYS)}")
            c = get_cluster(str(value.get("base", value.get("gpu"))))
            if "nodes" in value:
                if nodes is not None and nodes != value["nodes"]:
                    raise where.err("cluster.nodes", f"{value['nodes']} disagrees with the run's nodes: {nodes}")
                nodes = value["nodes"]
                if not _is_int(nodes) or not 1 <= nodes <= 2**20:
                    raise where.err("cluster.nodes", f"must be a positive integer, got {short(nodes)}")
            changes: dict = {"name": str(value.get("name", c.name))}
            if "gpus_per_node" in value:
                changes["gpus_per_node"] = value["gpus_per_node"]
            if isinstance(value.get("gpu"), str):
                c = replace(c, gpu=get_gpu(value["gpu"]))
            for key, cls, cur in (("gpu", GPUSpec, c.gpu), ("intra", LinkSpec, c.intra), ("inter", LinkSpec, c.inter)):
                if key not in value or (key == "gpu" and isinstance(value[key], str)):
                    continue
                ov = value[key]
                if not isinstance(ov, dict):
                    raise where.err(f"cluster.{key}", f"expected a mapping of {cls.__name__} fields to change")
                names = {f.name for f in fields(cls)}
                bad = sorted(set(ov) - names)
                if bad:
                    raise where.err(f"cluster.{key}.{bad[0]}", f"unknown field; expected some of {sorted(names)}")
                try:
                    changes[key] = replace(cur, **ov)
                except (TypeError, ValueError) as exc:
                    raise where.err(f"cluster.{key}", _strip_error(exc)) from None
            c = replace(c, **changes)
        elif isinstance(value, dict):
            data = dict(value)
            data.setdefault("nodes", nodes if nodes is not None else 1)
            c = cluster_from_dict(data, where="cluster")
        else:
            raise where.err("cluster", f"expected a cluster name, a cluster file or a mapping, got {type(value).__name__}")
    except ConfigError as exc:
        if str(exc).startswith(where.path):
            raise
        raise where.err("cluster", _strip_error(exc)) from None
    if nodes is not None:
        c = c.with_nodes(nodes)
    return c


def _check_section(section: Any, fld: str, where: _Where, kinds: dict[str, tuple]) -> dict:
    """A mapping whose keys are in ``kinds`` (name -> (type, default)), values of that type."""
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise where.err(fld, f"expected a mapping, got {type(section).__name__}")
    for k, v in section.items():
        if k not in kinds:
            raise where.err(f"{fld}.{k}", f"unknown field; expected some of {sorted(kinds)}")
        typ = kinds[k][0]
        ok = (_is_int(v) if typ is int else isinstance(v, bool) if typ is bool else
              _is_num(v) if typ is float else isinstance(v, typ))
        if not ok:
            raise where.err(f"{fld}.{k}", f"expected {typ.__name__}, got {short(v)}")
        if typ is int and not 0 <= v <= MAX_COUNT:
            raise where.err(f"{fld}.{k}", f"must be between 0 and {MAX_COUNT}, got {short(v)}")
    return dict(section)


def _dataclass_kinds(cls: type) -> dict[str, tuple[type, Any]]:
    out = {}
    for f in fields(cls):
        default = f.default
        typ = type(default) if default is not None and not callable(default) else object
        if typ is float:
            typ = float
        out[f.name] = (typ, default)
    return out


def _check_layout(run: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, where: _Where) -> None:
    """Degrees multiply to the GPU count and fit the model and batch (whatever this build can simulate)."""
    from ccoverlap.parallel.config import BatchConfig, ParallelConfig, check_step_size, config_problems

    par, batch = run["parallel"], run["batch"]
    tp, cp, pp, dp = (int(par.get(k, 1)) for k in ("tp", "cp", "pp", "dp"))
    for k in ("tp", "cp", "pp", "dp", "ep", "dp_replicate", "virtual_stages"):
        if k in par and par[k] < 1:
            raise where.err(f"parallel.{k}", f"must be >= 1, got {par[k]}")
    if tp * cp * pp * dp != cluster.world_size:
        raise where.err("parallel", f"tp x cp x pp x dp = {tp} x {cp} x {pp} x {dp} = {tp * cp * pp * dp} must equal "
                        f"the cluster's {cluster.world_size} GPUs ({cluster.nodes} nodes x {cluster.gpus_per_node})")
    rep = int(par.get("dp_replicate", 1))
    if dp % rep:
        raise where.err("parallel.dp_replicate", f"must divide dp={dp}, got {rep}")
    if rep > 1 and par.get("data_parallel", "ddp") != "fsdp":
        raise where.err("parallel.dp_replicate", "HSDP (dp_replicate > 1) needs data_parallel: fsdp")
    if par.get("cp_impl", "ring") not in CP_IMPLS:
        raise where.err("parallel.cp_impl", f"must be one of {CP_IMPLS}, got {short(par['cp_impl'])}")
    try:
        b = typed(batch, BatchConfig, "batch")
    except ConfigError as exc:
        raise where.err("batch", _strip_error(exc).removeprefix("batch: ")) from None
    if cp > 1 and b.seq_len % (2 * cp):
        raise where.err("parallel.cp", f"seq_len {b.seq_len} must be divisible by 2 x cp = {2 * cp} "
                        f"(load-balanced causal context parallelism)")
    own = {f.name for f in fields(ParallelConfig)}  # this build's fields (cp etc. once they exist)
    base = {k: v for k, v in par.items() if k in own}
    try:
        p = typed(base, ParallelConfig, "parallel")
    except ConfigError as exc:
        raise where.err("parallel", _strip_error(exc).removeprefix("parallel: ")) from None
    problems = config_problems(p, model, None, None)
    if problems:
        raise where.err("parallel", problems[0])
    problems = b.problems(p)
    if problems:
        raise where.err("batch", problems[0])
    try:
        check_step_size(model.layers, p, b)
    except ConfigError as exc:
        raise where.err("batch", _strip_error(exc)) from None


def _measurement(m: Any, where: _Where) -> Measurement:
    if not isinstance(m, dict):
        raise where.err("measured", f"expected a mapping with one of {list(MEASURE_KINDS)}, got {type(m).__name__}")
    for k in m:
        if k not in MEASURED_KEYS:
            raise where.err(f"measured.{k}", f"unknown field; expected one of {list(MEASURE_KINDS)} "
                            f"plus flop_rule, peak_tflops, note, memory_gib")
    kinds = [k for k in MEASURE_KINDS if k in m]
    if not kinds:
        raise where.err("measured", f"missing measurement: give one of {list(MEASURE_KINDS)}")
    if len(kinds) > 1:
        raise where.err("measured", f"give exactly one measurement, got {kinds}")
    kind = kinds[0]
    value = m[kind]
    if not _is_num(value):
        unit = MEASURE_KINDS[kind]
        raise where.err(f"measured.{kind}", f"expected a number in {unit} (the unit the key names), got {short(value)}")
    if value <= 0:
        raise where.err(f"measured.{kind}", f"must be positive, got {value}")
    rule = m.get("flop_rule")
    if kind in ("tflops_per_gpu", "mfu"):
        if rule is None:
            raise where.err("measured.flop_rule", f"{kind} needs the FLOP rule the source used: one of {list(FLOP_RULES)}")
        if rule not in FLOP_RULES:
            raise where.err("measured.flop_rule", f"unknown FLOP rule {short(rule)}; expected one of {list(FLOP_RULES)}")
    elif rule is not None and rule not in FLOP_RULES:
        raise where.err("measured.flop_rule", f"unknown FLOP rule {short(rule)}; expected one of {list(FLOP_RULES)}")
    peak = m.get("peak_tflops")
    if kind == "mfu":
        if value > 1:
            raise where.err("measured.mfu", f"is a fraction in (0, 1]; got {value} (a percentage? write {value / 100:g})")
        if peak is None:
            raise where.err("measured.peak_tflops", "mfu needs the peak (TFLOP/s per GPU) the source divided by")
    if peak is not None and (not _is_num(peak) or peak <= 0):
        raise where.err("measured.peak_tflops", f"expected a positive number of TFLOP/s, got {short(peak)}")
    mem = m.get("memory_gib")
    if mem is not None and (not _is_num(mem) or mem <= 0):
        raise where.err("measured.memory_gib", f"expected a positive number of GiB, got {short(mem)}")
    note = m.get("note", "")
    if not isinstance(note, str):
        raise where.err("measured.note", "expected text")
    return Measurement(kind=kind, value=float(value), flop_rule=rule, peak_tflops=None if peak is None else float(peak),
                       memory_gib=None if mem is None else float(mem), note=note)


def _check_units(spec: RunSpec, where: _Where) -> None:
    """The implied achieved model TFLOP/s per GPU must lie between 1% of the GPU's dense
    bf16 peak and twice it (the FP8 dense peak); outside, the number is in the wrong unit."""
    kind = spec.measurement.kind
    try:
        t = spec.measured_step_time_s
    except ConfigError as exc:
        raise where.err(f"measured.{kind}", _strip_error(exc)) from None
    if not (t > 0 and math.isfinite(t)):
        raise where.err(f"measured.{kind}", f"implies a step time of {t} s")
    achieved = model_tflops_per_gpu(spec.flops_model or spec.model, spec.batch, spec.gpus, t)
    peak = spec.cluster.gpu.peak_flops["bf16"] / 1e12
    unit = MEASURE_KINDS[kind]
    if achieved > 2.0 * peak:
        raise where.err(f"measured.{kind}", f"{spec.measurement.value:g} {unit} implies {achieved:.0f} model TFLOP/s "
                        f"per GPU, above the {spec.gpu_name} peak ({peak:.0f} bf16, {2 * peak:.0f} fp8): wrong units?")
    if achieved < 0.01 * peak:
        raise where.err(f"measured.{kind}", f"{spec.measurement.value:g} {unit} implies {achieved:.2f} model TFLOP/s "
                        f"per GPU, under 1% of the {spec.gpu_name} peak ({peak:.0f}): wrong units?")


def known_frameworks() -> tuple[str, ...]:
    """Framework profile names: the files in ccoverlap/data/frameworks/ when this build has
    them, else the names agreed for the project."""
    d = Path(__file__).resolve().parents[1] / "data" / "frameworks"
    names = sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []
    return tuple(sorted(set(names) | set(KNOWN_FRAMEWORKS)))


def read_run(raw: Any, index: int, path: str, base_dir: Path) -> RunSpec:
    """Check one run mapping; ConfigError naming run and field on the first problem."""
    from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig

    name = raw.get("name") if isinstance(raw, dict) else None
    where = _Where(path, index, name if isinstance(name, str) else None)
    if not isinstance(raw, dict):
        raise where.err("runs", f"each run must be a mapping, got {type(raw).__name__}")
    for k in raw:
        if k not in RUN_KEYS:
            raise where.err(k, f"unknown field; expected some of {sorted(RUN_KEYS)}")
    for k in REQUIRED_RUN_KEYS:
        if k not in raw:
            raise where.err(k, "missing" + (" measurement" if k == "measured" else ""))
    if not isinstance(name, str) or not name.strip():
        raise where.err("name", "expected a non-empty string")
    source = raw["source"]
    if not isinstance(source, str) or not source.strip():
        raise where.err("source", "expected a non-empty citation")
    assumptions = raw.get("assumptions", [])
    if not isinstance(assumptions, list) or not all(isinstance(a, str) for a in assumptions):
        raise where.err("assumptions", "expected a list of sentences")
    subset = raw.get("subset")
    if subset is not None and subset not in SUBSETS:
        raise where.err("subset", f"must be one of {SUBSETS}, got {short(subset)}")
    group = raw.get("group", "")
    if not isinstance(group, str):
        raise where.err("group", "expected text")
    framework = raw.get("framework")
    if framework is not None:
        if not isinstance(framework, str):
            raise where.err("framework", "expected a profile name or a profile file")
        if not framework.lower().endswith((".yaml", ".yml", ".json", ".toml")) and framework not in known_frameworks():
            raise where.err("framework", f"unknown framework profile {short(framework)}; known: {list(known_frameworks())}")

    model = _model(raw["model"], where, "model", base_dir)
    flops_model = _model(raw["flops_model"], where, "flops_model", base_dir) if raw.get("flops_model") is not None \
        else None
    cluster = _cluster(raw["cluster"], raw.get("nodes"), where, base_dir)

    par_kinds = _dataclass_kinds(ParallelConfig)
    par_kinds.update({k: v for k, v in EXTRA_PARALLEL.items() if k not in par_kinds})
    parallel = _check_section(raw["parallel"], "parallel", where, par_kinds)
    batch_kinds = {f.name: (int, None) for f in fields(BatchConfig)}
    batch = _check_section(raw["batch"], "batch", where, batch_kinds)
    if "global_batch" not in batch:
        raise where.err("batch.global_batch", "missing")
    knobs = raw.get("knobs") or {}
    try:
        OverlapKnobs.from_dict(knobs, where="knobs")
    except ConfigError as exc:
        raise where.err("knobs", _strip_error(exc).removeprefix("knobs: ")) from None
    _check_layout({"parallel": parallel, "batch": batch}, model, cluster, where)
    spec = RunSpec(name=name, index=index, source=source.strip(), assumptions=tuple(assumptions), model=model,
                   cluster=cluster, parallel=parallel, batch=batch, knobs=dict(knobs), framework=framework,
                   measurement=_measurement(raw["measured"], where), subset=subset, group=group,
                   flops_model=flops_model)
    _check_units(spec, where)
    return spec


PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "runs" / "published.yaml"


def runs_path(arg: str | Path) -> Path:
    """The runs file ``arg`` names: ``published`` is the set shipped with ccoverlap
    (:data:`PUBLISHED`), anything else a path."""
    if not isinstance(arg, (str, os.PathLike)):
        raise ConfigError(f"expected the path of a runs file or 'published', got {short(arg)}")
    if str(arg) == "published":
        return PUBLISHED
    p = Path(arg)
    if not p.suffix and not p.exists():  # 'publshed', a typo: not "unknown config format ''"
        raise ConfigError(f"{short(str(arg))}: no such runs file{suggest(str(arg), ['published'])} "
                          f"(a .yaml, .json or .toml file, or 'published' for the shipped set)")
    return p


def load_runs(path: str | Path, *, keep_going: bool = False) -> RunsFile:
    """Read and check the runs file at ``path`` (YAML / JSON / TOML; ``published``: the
    shipped set). A problem with the file itself raises one ConfigError naming it. A problem
    with a run raises one ConfigError naming the file, the run and the field, or, with
    ``keep_going``, becomes a line of ``problems`` and the other runs are still read."""

    p = runs_path(path)
    data = read_config_file(p)
    unknown = sorted((k for k in data if k not in TOP_KEYS), key=str)
    if unknown:
        raise ConfigError(f"{p}: unknown top-level field {short(unknown[0])}; expected some of {sorted(TOP_KEYS)}")
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ConfigError(f"{p}: field 'runs': expected a non-empty list of runs")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{p}: field 'description': expected text, got {type(description).__name__}")
    sources = data.get("sources") or {}
    if not isinstance(sources, dict):
        raise ConfigError(f"{p}: field 'sources': expected a mapping, got {type(sources).__name__}")
    out = RunsFile(path=str(p), sources=sources, description=description)
    seen: dict[str, int] = {}
    for i, raw in enumerate(runs):
        try:
            spec = read_run(raw, i, str(p), p.parent)
            if spec.name in seen:
                raise _Where(str(p), i, spec.name).err("name", f"duplicate of run #{seen[spec.name] + 1}")
        except ConfigError as exc:
            if not keep_going:
                raise
            out.problems.append(str(exc))
            continue
        seen[spec.name] = i
        out.runs.append(spec)
    return out
