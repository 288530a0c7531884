"""A workload = model + cluster + parallelism + batch + overlap knobs, from flags or a config file.

Shared by ``plan``, ``simulate`` and ``tune``. A config file (JSON, TOML or YAML) looks like::

    model: llama-3-8b            # a catalog name, or a mapping of ModelSpec fields
    cluster: a40-pcie            # a catalog cluster / GPU name, or a mapping (see hardware.py)
    nodes: 2
    parallel: {dp: 16, data_parallel: fsdp}
    batch: {global_batch: 32, micro_batch: 1, seq_len: 4096}
    knobs: {fsdp_prefetch: 1, fsdp_limit_all_gathers: 2}
    calibration: calibrations/h100.json   # optional
    framework: megatron-core     # optional framework profile (name or file), docs/model.md

Flags given on the command line override the file.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

from ccoverlap.config import check_keys, dataclass_from_mapping, read_config_file
from ccoverlap.errors import ConfigError
from ccoverlap.catalog.hardware import ClusterSpec, cluster_from_dict, get_cluster, load_cluster_file

# The built-in example: a compute-bound job where the overlap decision matters —
# Llama-3-8B on one DGX H100 (8 GPUs, NVSwitch), TP2 with sequence parallelism inside FSDP over
# 4 ranks, global batch 8 x 4096 tokens, micro-batch 1 (2 micro-batches per rank); small enough
# to plan in seconds. The Lagom paper's communication-bound A40 setting (lagom §4.1 cluster B,
# Table 2), the previous built-in example, is examples/llama3-8b-fsdp-a40.yaml.
DEFAULT_EXAMPLE = {
    "model": "llama-3-8b",
    "cluster": "dgx-h100",
    "nodes": 1,
    "parallel": {"tp": 2, "dp": 4, "data_parallel": "fsdp", "sequence_parallel": True},
    "batch": {"global_batch": 8, "micro_batch": 1, "seq_len": 4096},
    "knobs": {},
}


@dataclass(frozen=True)
class Workload:
    """Everything a step simulation needs, validated."""

    model: Any
    cluster: ClusterSpec
    parallel: Any
    batch: Any
    knobs: Any
    calibration: str | None = None
    source: str = "built-in example"
    framework: str = "megatron-core"  # a framework profile name or file (docs/model.md)

    def describe(self) -> str:
        p = self.parallel
        dims = [f"{k.upper()}{getattr(p, k)}" for k in ("tp", "cp", "pp", "dp", "ep") if getattr(p, k, 1) > 1] or ["1 GPU"]
        extra = [p.data_parallel.upper()] if p.dp > 1 else []
        if p.pp > 1:
            extra.append(p.pp_schedule)
        return (f"{self.model.name} on {self.cluster.nodes}x{self.cluster.gpus_per_node} {self.cluster.gpu.name} "
                f"({' x '.join(dims)}{', ' + ', '.join(extra) if extra else ''}; global batch "
                f"{self.batch.global_batch} x {self.batch.seq_len} tokens, micro-batch {self.batch.micro_batch})")


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that describe a workload (all optional: defaults are the built-in example)."""
    g = parser.add_argument_group("workload (defaults: the built-in example)")
    g.add_argument("--config", help="JSON/TOML/YAML file describing the workload (flags override it)")
    g.add_argument("--model", help="model name (e.g. llama-3-70b) or a model file")
    g.add_argument("--cluster", help="cluster or GPU name (dgx-h100, a40-pcie, H100-SXM, ...) or a cluster file")
    g.add_argument("--nodes", type=int, help="number of nodes")
    for dim in ("tp", "pp", "dp", "ep", "cp"):
        g.add_argument(f"--{dim}", type=int, help=f"{dim.upper()} degree")
    g.add_argument("--data-parallel", choices=["ddp", "fsdp"], help="data-parallel flavour")
    g.add_argument("--sequence-parallel", action="store_true", default=None, help="TP with sequence parallelism")
    g.add_argument("--pp-schedule", choices=["gpipe", "1f1b", "interleaved", "dualpipe"])
    g.add_argument("--virtual-stages", type=int, help="virtual stages per rank (interleaved 1F1B)")
    g.add_argument("--recompute", choices=["none", "selective", "full"])
    g.add_argument("--global-batch", type=int, help="global batch (sequences)")
    g.add_argument("--micro-batch", type=int, help="micro-batch size (sequences)")
    g.add_argument("--seq-len", type=int, help="sequence length (tokens)")
    g.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="overlap knob as given, e.g. --knob fsdp_prefetch=2 --knob bucket_cap_mb=50")
    g.add_argument("--calibration", help="calibration file written by `ccoverlap calibrate`")
    g.add_argument("--framework", help="framework profile: megatron-core (default), megatron-lm-2021, torchtitan, "
                                       "torchtitan-compile, torchtitan-fused-rmsnorm, deepspeed, fms-fsdp, or a "
                                       "profile file (docs/model.md)")


def _parse_scalar(text: str) -> Any:
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


def _model(value: Any, where: str):
    from ccoverlap.catalog.models import get_model, model_from_dict

    if isinstance(value, dict):
        return model_from_dict(value)
    if isinstance(value, str) and value.lower().endswith((".json", ".toml", ".yaml", ".yml")):
        data = read_config_file(value)
        return model_from_dict(data.get("model", data) if isinstance(data.get("model"), dict) else data)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a model name or mapping")
    return get_model(value)


def _cluster(value: Any, nodes: int | None) -> ClusterSpec:
    if isinstance(value, dict):
        c = cluster_from_dict(value)
    elif isinstance(value, str) and value.lower().endswith((".json", ".toml", ".yaml", ".yml")):
        c = load_cluster_file(value)
    elif isinstance(value, str):
        return get_cluster(value, nodes=nodes)
    else:
        raise ConfigError("cluster: expected a cluster name, GPU name or mapping")
    if nodes is not None:
        if nodes < 1:
            raise ConfigError(f"nodes must be >= 1, got {nodes}")
        c = c.with_nodes(nodes)
    return c


def workload_from_mapping(data: dict, *, source: str = "config") -> Workload:
    """Validate a workload mapping (the config-file schema above) into a :class:`Workload`."""
    from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig, validate

    allowed = {"model", "cluster", "nodes", "parallel", "batch", "knobs", "calibration", "framework"}
    check_keys(data, allowed, source, what="top-level key")
    model = _model(data.get("model", DEFAULT_EXAMPLE["model"]), f"{source}: model")
    cluster = _cluster(data.get("cluster", DEFAULT_EXAMPLE["cluster"]), data.get("nodes"))
    parallel = dataclass_from_mapping(ParallelConfig, data.get("parallel") or {}, f"{source}: parallel")
    batch = dataclass_from_mapping(BatchConfig, data.get("batch") or {}, f"{source}: batch")
    knobs = OverlapKnobs.from_dict(data.get("knobs") or {}, where=f"{source}: knobs")  # nested comm_config too
    validate(model, parallel, batch, cluster)
    from ccoverlap.catalog.frameworks import DEFAULT_FRAMEWORK, check_framework, get_framework

    framework = data.get("framework") or DEFAULT_FRAMEWORK
    try:
        check_framework(get_framework(framework), model, parallel)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return Workload(model=model, cluster=cluster, parallel=parallel, batch=batch, knobs=knobs,
                    calibration=data.get("calibration"), source=source, framework=str(framework))


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload described by the command line (config file first, then flags)."""
    if args.config:
        data = read_config_file(args.config)
        source = args.config
        for section in ("parallel", "batch", "knobs"):
            if section in data and not isinstance(data[section], dict):
                raise ConfigError(f"{source}: {section!r} must be a mapping, got {type(data[section]).__name__}")
    else:
        data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in DEFAULT_EXAMPLE.items()}
        source = "built-in example"
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    flags_given = False
    if args.model:
        data["model"] = args.model
        flags_given = True
    if args.cluster:
        data["cluster"] = args.cluster
        data.pop("nodes", None) if args.nodes is None and not args.config else None
        flags_given = True
    if args.nodes is not None:
        data["nodes"] = args.nodes
        flags_given = True
    par = dict(data.get("parallel") or {})
    if not args.config and any(getattr(args, d) is not None for d in ("tp", "pp", "dp", "ep", "cp", "data_parallel")):
        par = {}  # a layout given by flags replaces the built-in example's, not inherits its FSDP
    for dim in ("tp", "pp", "dp", "ep", "cp"):
        v = getattr(args, dim)
        if v is not None:
            par[dim] = v
    for flag, key in (("data_parallel", "data_parallel"), ("sequence_parallel", "sequence_parallel"),
                      ("pp_schedule", "pp_schedule"), ("virtual_stages", "virtual_stages"),
                      ("recompute", "recompute")):
        v = getattr(args, flag)
        if v is not None:
            par[key] = v
    if par != (data.get("parallel") or {}):
        flags_given = True
    data["parallel"] = par
    batch = dict(data.get("batch") or {})
    for flag, key in (("global_batch", "global_batch"), ("micro_batch", "micro_batch"), ("seq_len", "seq_len")):
        v = getattr(args, flag)
        if v is not None:
            batch[key] = v
            flags_given = True
    data["batch"] = batch
    knobs = dict(data.get("knobs") or {})
    for item in args.knob:
        if "=" not in item:
            raise ConfigError(f"--knob {item!r}: expected NAME=VALUE")
        name, value = item.split("=", 1)
        knobs[name.strip()] = _parse_scalar(value.strip())
        flags_given = True
    data["knobs"] = knobs
    if args.calibration:
        data["calibration"] = args.calibration
    if getattr(args, "framework", None):
        data["framework"] = args.framework
        flags_given = True
    if flags_given and source == "built-in example":
        source = "command line"
    _fill_world_size(data)
    return workload_from_mapping(data, source=source)


def _fill_world_size(data: dict) -> None:
    """If DP is not given, make it fill the cluster (:meth:`ParallelConfig.data_parallel_for`)."""
    par = data["parallel"]
    if "dp" in par:
        return
    from ccoverlap.parallel.config import ParallelConfig

    cluster = _cluster(data.get("cluster", DEFAULT_EXAMPLE["cluster"]), data.get("nodes"))
    try:
        tp, pp, cp = (int(par.get(k, 1)) for k in ("tp", "pp", "cp"))
    except (TypeError, ValueError):
        return  # validation of the parallel section names the bad value
    dp = ParallelConfig.data_parallel_for(cluster.world_size, tp=tp, pp=pp, cp=cp)
    if dp is not None:
        par["dp"] = dp


def with_knobs(w: Workload, **changes: Any) -> Workload:
    """The same workload with some overlap knobs changed."""
    return replace(w, knobs=replace(w.knobs, **changes))
