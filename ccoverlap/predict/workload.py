"""A workload = model + cluster + parallelism + batch + overlap knobs, from keywords, flags or a
config file.

Shared by ``plan``, ``simulate``, ``tune`` and the Python API (``ccoverlap.Workload``). A config
file (JSON, TOML or YAML) looks like::

    model: llama-3-8b            # a catalog name, a model file, or a mapping of ModelSpec fields
    cluster: a40-pcie            # a catalog cluster / GPU name, a cluster file or a mapping
    nodes: 2
    parallel: {dp: 16, data_parallel: fsdp}
    batch: {global_batch: 32, micro_batch: 1, seq_len: 4096}
    knobs: {fsdp_prefetch: 1, fsdp_limit_all_gathers: 2}
    calibration: calibrations/h100.json   # optional
    framework: megatron-core     # optional framework profile (name or file), docs/model.md

Every field is typed and bounded (:mod:`ccoverlap.config`): counts are integers in range (no
``true``, no ``2.5``, no ``"two"``), choices are one of their names, and a step that would have
more operations than the simulator builds (:func:`ccoverlap.parallel.config.check_step_size`)
is refused before anything is built. Flags and keywords override the file.
"""

from __future__ import annotations

import os
from dataclasses import InitVar, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from ccoverlap.catalog.frameworks import DEFAULT_FRAMEWORK, check_framework, get_framework
from ccoverlap.catalog.hardware import ClusterSpec, cluster_from_dict, get_cluster, load_cluster_file
from ccoverlap.config import (
    Count,
    check_keys,
    dataclass_from_mapping,
    field_names,
    plain_numbers,
    read_config_file,
    short,
    suggest,
    typed,
)
from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    from ccoverlap.catalog.models import ModelSpec

# ccoverlap.catalog.models and ccoverlap.parallel (about 50 and 40 ms to import) are imported in
# the functions that use them: `ccoverlap --help` imports this module for the workload flags.

# The built-in example: a compute-bound job where the overlap decision matters — Llama-3-8B
# on one DGX H100 (8 GPUs, NVSwitch), TP2 with sequence parallelism inside FSDP over 4 ranks,
# global batch 8 x 4096 tokens, micro-batch 1 (2 micro-batches per rank); small enough to plan
# in seconds. The Lagom paper's communication-bound A40 setting (lagom §4.1 cluster B,
# Table 2) is examples/llama3-8b-fsdp-a40.yaml.
DEFAULT_EXAMPLE = {
    "model": "llama-3-8b",
    "cluster": "dgx-h100",
    "nodes": 1,
    "parallel": {"tp": 2, "dp": 4, "data_parallel": "fsdp", "sequence_parallel": True},
    "batch": {"global_batch": 8, "micro_batch": 1, "seq_len": 4096},
    "knobs": {},
}

#: Keyword options of a workload besides the file's sections: the parallel layout's flags.
PARALLEL_OPTIONS = ("tp", "pp", "dp", "ep", "cp", "data_parallel", "sequence_parallel", "pp_schedule",
                    "virtual_stages", "recompute")
BATCH_OPTIONS = ("global_batch", "micro_batch", "seq_len")
#: ``--dtype`` names -> (dtype_bytes, fp8) of the parallel configuration.
DTYPES = {"bfloat16": (2, False), "float16": (2, False), "float32": (4, False), "fp8": (2, True)}


@dataclass(frozen=True, kw_only=True)
class WorkloadFile:
    """The top level of a workload config file (types only; the sections are checked by their
    own dataclasses)."""

    model: str | dict | None = None
    cluster: str | dict | None = None
    nodes: Count | None = None
    parallel: dict | None = None
    batch: dict | None = None
    knobs: dict | None = None
    calibration: str | None = None
    framework: str | None = None


@dataclass(frozen=True, repr=False)
class Workload:
    """Everything a step simulation needs, validated.

    Made from keywords as the command line's flags (all optional; the built-in example fills
    the rest)::

        Workload(model="llama-3-8b", cluster="dgx-h100", tp=2, dp=4)
        Workload(model="llama-3-70b", cluster="dgx-h100", nodes=4, tp=8, pp=4, global_batch=64)
        Workload.from_file("examples/llama3-8b-fsdp-a40.yaml", nodes=2)

    ``model`` / ``cluster`` take a catalog name, a file or a mapping, ``parallel`` / ``batch``
    / ``knobs`` a mapping (or their dataclasses); ``tp``, ``pp``, ``dp``, ``ep``, ``cp``,
    ``data_parallel``, ``sequence_parallel``, ``pp_schedule``, ``virtual_stages``,
    ``recompute``, ``global_batch``, ``micro_batch``, ``seq_len``, ``nodes`` and ``dtype``
    override single fields. Any problem is one :class:`~ccoverlap.errors.ConfigError`.
    """

    model: Any = None
    cluster: Any = None
    parallel: Any = None
    batch: Any = None
    knobs: Any = None
    calibration: str | None = None
    source: str = "built-in example"
    framework: str = "megatron-core"  # a framework profile name or file (docs/model.md)
    nodes: InitVar[int | None] = None
    tp: InitVar[int | None] = None
    pp: InitVar[int | None] = None
    dp: InitVar[int | None] = None
    ep: InitVar[int | None] = None
    cp: InitVar[int | None] = None
    data_parallel: InitVar[str | None] = None
    sequence_parallel: InitVar[bool | None] = None
    pp_schedule: InitVar[str | None] = None
    virtual_stages: InitVar[int | None] = None
    recompute: InitVar[str | None] = None
    global_batch: InitVar[int | None] = None
    micro_batch: InitVar[int | None] = None
    seq_len: InitVar[int | None] = None
    dtype: InitVar[str | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Workload:
        """Check the keywords before the generated ``__init__`` sees them: an unknown one
        (``tpp=2``) is the ConfigError every other entry gives, not Python's TypeError."""
        check_options({k: v for k, v in kwargs.items() if k != "source"})
        return super().__new__(cls)

    def __post_init__(self, *values: object) -> None:
        options = {name: plain_numbers(v) for name, v in zip(INIT_OPTIONS, values) if v is not None}
        if not options and _is_built(self):
            return  # already validated (dataclasses.replace of a built workload)
        sections = {f: getattr(self, f) for f in ("model", "cluster", "parallel", "batch", "knobs", "calibration")}
        options.update({k: plain_numbers(_plain(v)) for k, v in sections.items() if v is not None})
        if self.framework != "megatron-core":
            options["framework"] = self.framework
        built = workload_from_options(None, options, source="python")
        for f in fields(self):
            object.__setattr__(self, f.name, getattr(built, f.name))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> Workload:
        """The workload of a config file (JSON / TOML / YAML, the schema above), with keyword
        ``options`` overriding it as flags do."""
        data = read_config_file(path)
        return workload_from_options(data, plain_numbers(_split_options(options)), source=str(path))

    def describe(self) -> str:
        """One line: model, cluster, layout, batch."""
        p = self.parallel
        dims = [f"{k.upper()}{getattr(p, k)}" for k in ("tp", "cp", "pp", "dp", "ep") if getattr(p, k) > 1] or ["1 GPU"]
        extra = [p.data_parallel.upper()] if p.dp > 1 else []
        if p.pp > 1:
            extra.append(p.pp_schedule)
        return (f"{self.model.name} on {self.cluster.nodes}x{self.cluster.gpus_per_node} {self.cluster.gpu.name} "
                f"({' x '.join(dims)}{', ' + ', '.join(extra) if extra else ''}; global batch "
                f"{self.batch.global_batch} x {self.batch.seq_len} tokens, micro-batch {self.batch.micro_batch})")

    def __repr__(self) -> str:
        return f"Workload({self.describe()})"

    def to_dict(self) -> dict:
        """Plain data: the config-file schema with every field filled (model and cluster by
        name), which :func:`workload_from_mapping` reads back for catalog models and clusters."""
        return {"model": self.model.name, "cluster": self.cluster.name, "nodes": self.cluster.nodes,
                "parallel": self.parallel.to_dict(), "batch": self.batch.to_dict(), "knobs": self.knobs.to_dict(),
                "calibration": self.calibration, "framework": self.framework, "source": self.source,
                "world_size": self.cluster.world_size, "description": self.describe()}


INIT_OPTIONS = ("nodes", *PARALLEL_OPTIONS, *BATCH_OPTIONS, "dtype")


def _is_built(w: Workload) -> bool:
    from ccoverlap.catalog.models import ModelSpec
    from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig

    return (isinstance(w.model, ModelSpec) and isinstance(w.cluster, ClusterSpec)
            and isinstance(w.parallel, ParallelConfig) and isinstance(w.batch, BatchConfig)
            and isinstance(w.knobs, OverlapKnobs))


def _plain(v: Any) -> Any:
    """A section given as its dataclass, as the mapping a file would give (catalog objects by
    themselves: a ModelSpec or ClusterSpec is used as it is)."""
    to_dict = getattr(v, "to_dict", None)
    from ccoverlap.catalog.models import ModelSpec

    if isinstance(v, (ModelSpec, ClusterSpec)) or to_dict is None:
        return v
    return to_dict()


def check_options(options: dict) -> dict:
    """``options`` once every name is a keyword of :class:`Workload`; ConfigError naming the
    first unknown one and the closest known name otherwise."""
    known = (*INIT_OPTIONS, "model", "cluster", "calibration", "framework", "parallel", "batch", "knobs")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"unknown workload option {short(unknown[0])}{suggest(unknown[0], known)}; "
                          f"expected some of {list(known)}")
    return options


def _split_options(options: dict) -> dict:
    return {k: v for k, v in check_options(options).items() if v is not None}


def parse_scalar(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _model(value: Any, where: str) -> ModelSpec:
    from ccoverlap.catalog.models import ModelSpec, get_model, model_from_dict

    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, dict):
        return model_from_dict(value, where=where)
    if isinstance(value, str) and value.lower().endswith((".json", ".toml", ".yaml", ".yml")):
        data = read_config_file(value)
        return model_from_dict(data.get("model", data) if isinstance(data.get("model"), dict) else data, where=value)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a model name or mapping, got {type(value).__name__}")
    return get_model(value)


def resolve_cluster(value: Any, nodes: int | None) -> ClusterSpec:
    """The cluster ``value`` names: a :class:`ClusterSpec`, a mapping of one, a cluster file
    (.json/.toml/.yaml) or a catalog cluster or GPU name; with ``nodes`` nodes when given."""
    if isinstance(value, ClusterSpec):
        c = value
    elif isinstance(value, dict):
        c = cluster_from_dict(value)
    elif isinstance(value, str) and value.lower().endswith((".json", ".toml", ".yaml", ".yml")):
        c = load_cluster_file(value)
    elif isinstance(value, str):
        return get_cluster(value, nodes=nodes)
    else:
        raise ConfigError(f"cluster: expected a cluster name, GPU name or mapping, got {type(value).__name__}")
    return c.with_nodes(nodes) if nodes is not None else c


def workload_from_mapping(data: dict, *, source: str = "config") -> Workload:
    """Validate a workload mapping (the config-file schema above) into a :class:`Workload`."""
    from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig, check_step_size, validate

    check_keys(data, [f.name for f in fields(WorkloadFile)], source, what="top-level key")
    top = typed(data, WorkloadFile, source)
    try:
        model = _model(top.model if top.model is not None else DEFAULT_EXAMPLE["model"], "model")
        cluster = resolve_cluster(top.cluster if top.cluster is not None else DEFAULT_EXAMPLE["cluster"], top.nodes)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    parallel = dataclass_from_mapping(ParallelConfig, top.parallel or {}, f"{source}: parallel")
    batch = dataclass_from_mapping(BatchConfig, top.batch or {}, f"{source}: batch")
    knobs = OverlapKnobs.from_dict(top.knobs or {}, where=f"{source}: knobs")  # nested comm_config too
    validate(model, parallel, batch, cluster)
    try:
        check_step_size(model.layers, parallel, batch, knobs)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    framework = top.framework or DEFAULT_FRAMEWORK
    try:
        check_framework(get_framework(framework), model, parallel)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return Workload(model=model, cluster=cluster, parallel=parallel, batch=batch, knobs=knobs,
                    calibration=top.calibration, source=source, framework=str(framework))


def workload_from_options(data: dict | None, options: dict, *, source: str) -> Workload:
    """The workload of config mapping ``data`` (None: the built-in example) with single-field
    ``options`` (the flags: ``nodes``, ``tp`` ... ``seq_len``, ``dtype``, ``model``,
    ``cluster``, ``knobs``, ``calibration``, ``framework``) applied over it."""
    from_file = data is not None
    if data is None:
        data = DEFAULT_EXAMPLE
    for section in ("parallel", "batch", "knobs"):
        if options.get(section) is not None and not isinstance(options[section], dict):
            raise ConfigError(f"{source}: {section!r} must be a mapping, got {type(options[section]).__name__}")
    for section in ("parallel", "batch", "knobs"):
        if section in data and data[section] is not None and not isinstance(data[section], dict):
            raise ConfigError(f"{source}: {section!r} must be a mapping, got {type(data[section]).__name__}")
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for key in ("model", "cluster", "calibration", "framework"):
        if options.get(key) is not None:
            data[key] = options[key]
    if options.get("cluster") is not None and options.get("nodes") is None and not from_file:
        data.pop("nodes", None)  # a named cluster's own node count, not the example's
    if options.get("nodes") is not None:
        data["nodes"] = options["nodes"]
    par = dict(options["parallel"] if options.get("parallel") is not None else data.get("parallel") or {})
    layout = {k: options[k] for k in PARALLEL_OPTIONS if options.get(k) is not None}
    if not from_file and (set(layout) & {"tp", "pp", "dp", "ep", "cp", "data_parallel"}) \
            and "parallel" not in options:
        par = {}  # a layout given by flags replaces the built-in example's, not inherits its FSDP
    par.update(layout)
    if options.get("dtype") is not None:
        if options["dtype"] not in DTYPES:
            raise ConfigError(f"dtype: expected one of {list(DTYPES)}, got {short(options['dtype'])}")
        par["dtype_bytes"], fp8 = DTYPES[options["dtype"]]
        if fp8:
            par["fp8"] = True
    data["parallel"] = par
    data["batch"] = {**(data.get("batch") or {}), **(options.get("batch") or {}),
                     **{k: options[k] for k in BATCH_OPTIONS if options.get(k) is not None}}
    if options.get("knobs"):
        data["knobs"] = {**(data.get("knobs") or {}), **options["knobs"]}
    _fill_world_size(data)
    try:
        return workload_from_mapping(data, source=source)
    except ConfigError as exc:
        given = sorted(k for k, v in options.items() if v is not None)
        if not from_file or not given or not str(exc).startswith(f"{source}: "):
            raise
        # a flag's value must not be blamed on the file: "c.yaml: nodes ... got 0" for --nodes 0
        raise ConfigError(f"{source} + options {', '.join(given)}: {str(exc)[len(source) + 2:]}") from None


def _fill_world_size(data: dict) -> None:
    """If DP is not given, make it fill the cluster (:meth:`ParallelConfig.data_parallel_for`)."""
    par = data["parallel"]
    if "dp" in par:
        return
    from ccoverlap.parallel.config import ParallelConfig

    try:
        cluster = resolve_cluster(data.get("cluster", DEFAULT_EXAMPLE["cluster"]), data.get("nodes"))
        tp, pp, cp = (par.get(k, 1) for k in ("tp", "pp", "cp"))
    except ConfigError:
        return  # validation names the bad value
    if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 2**20 for v in (tp, pp, cp)):
        return  # validation of the parallel section names the bad value
    dp = ParallelConfig.data_parallel_for(cluster.world_size, tp=tp, pp=pp, cp=cp)
    if dp is not None:
        par["dp"] = dp


def require_workload(w: Any, who: str) -> Workload:
    """``w`` when it is a :class:`Workload`; ConfigError naming ``who`` and what came instead
    otherwise (the entry check of every function that takes a workload)."""
    if not isinstance(w, Workload):
        raise ConfigError(f"{who} needs a Workload (ccoverlap.Workload(...) or workload_from_mapping), "
                          f"got {short(w)}")
    return w


def with_knobs(w: Workload, **changes: Any) -> Workload:
    """The same workload with some overlap knobs changed (ConfigError naming an unknown knob
    or a bad value)."""
    from ccoverlap.parallel.config import OverlapKnobs

    require_workload(w, "with_knobs")
    check_keys(changes, field_names(OverlapKnobs), "with_knobs", what="knob")
    return replace(w, knobs=replace(w.knobs, **changes))
