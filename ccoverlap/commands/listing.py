"""``ccoverlap list models|clusters|gpus|frameworks|strategies``: the names the other commands
take, with what each one is (``--json``: one object)."""

from __future__ import annotations

import argparse
import json
import sys

from ccoverlap.commands.options import add_json

WHAT = ("models", "clusters", "gpus", "frameworks", "strategies")


def register(sub) -> None:
    """Add the ``list`` parser."""
    p = sub.add_parser("list", help="the models, clusters, GPUs, framework profiles and strategies by name",
                       description=__doc__)
    p.add_argument("what", choices=WHAT, help="what to list")
    add_json(p)
    p.set_defaults(run=run)


def _models() -> list[dict]:
    from ccoverlap.catalog.models import MODELS

    return [{"name": m.name, "parameters_b": round(m.param_count().total / 1e9, 1), "layers": m.layers,
             "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "experts": m.experts} for m in MODELS.values()]


def _clusters() -> list[dict]:
    from ccoverlap.catalog.hardware import CLUSTERS

    return [{"name": k, "gpu": c.gpu.name, "gpus_per_node": c.gpus_per_node, "nodes": c.nodes,
             "intra": f"{c.intra.fabric} {c.intra.bandwidth_bytes_per_s / 1e9:g} GB/s",
             "inter": f"{c.inter.fabric} {c.inter.bandwidth_bytes_per_s / 1e9:g} GB/s"} for k, c in CLUSTERS.items()]


def _gpus() -> list[dict]:
    from ccoverlap.catalog.hardware import DEFAULT_CLUSTER_FOR_GPU, GPUS

    return [{"name": k, "vendor": g.vendor, "bf16_tflops": g.peak_flops.get("bf16", 0) / 1e12,
             "hbm_tb_s": g.hbm_bytes_per_s / 1e12, "memory_gb": g.memory_bytes / 1e9,
             "default_cluster": DEFAULT_CLUSTER_FOR_GPU.get(k, "-")} for k, g in GPUS.items()]


def _frameworks() -> list[dict]:
    from ccoverlap.catalog.frameworks import builtin_frameworks, get_framework

    return [{"name": n, "description": _clause(get_framework(n).description)} for n in builtin_frameworks()]


def _strategies() -> list[dict]:
    from ccoverlap.planning.strategies import default_registry

    return [{"name": s.name, "summary": _clause(s.summary)} for s in default_registry()]


def _clause(text: str, width: int = 70) -> str:
    """The first clause of ``text`` (to a colon or semicolon), at most ``width`` characters."""
    import re

    head = re.split(r"[:;]", text, maxsplit=1)[0].strip()
    return head if len(head) <= width else head[: width - 3].rstrip() + "..."


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON) of ``args.what``."""
    rows = {"models": _models, "clusters": _clusters, "gpus": _gpus, "frameworks": _frameworks,
            "strategies": _strategies}[args.what]()
    if args.json:
        json.dump({args.what: rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from ccoverlap.results import format_rows

    print(format_rows(rows, list(rows[0]), limit=len(rows)))
    return 0
