"""``ccoverlap list models|clusters|gpus|frameworks|strategies``: the names the other commands
take, with what each one is (``--json``: one object)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ccoverlap.commands.options import Subparsers, add_json

WHAT = ("models", "clusters", "gpus", "frameworks", "strategies")
#: table headers of the JSON keys (words, so that they wrap in a narrow terminal)
HEADERS = {"parameters_b": "params (B)", "kv_heads": "kv heads", "gpu": "GPU", "gpus_per_node": "GPUs per node",
           "bf16_tflops": "bf16 TFLOP/s", "hbm_tb_s": "HBM TB/s", "memory_gb": "memory GB",
           "default_cluster": "default cluster"}


def register(sub: Subparsers) -> None:
    """Add the ``list`` parser."""
    p = sub.add_parser("list", help="the models, clusters, GPUs, framework profiles and strategies by name",
                       description=__doc__)
    p.add_argument("what", choices=WHAT, help="what to list")
    add_json(p)
    p.set_defaults(run=run)


def _models() -> list[dict[str, Any]]:
    from ccoverlap.catalog.models import MODELS

    return [{"name": m.name, "parameters_b": round(m.param_count().total / 1e9, 1), "layers": m.layers,
             "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "experts": m.experts} for m in MODELS.values()]


def _clusters() -> list[dict[str, Any]]:
    from ccoverlap.catalog.hardware import CLUSTERS

    return [{"name": k, "gpu": c.gpu.name, "gpus_per_node": c.gpus_per_node, "nodes": c.nodes,
             "intra": f"{c.intra.fabric} {c.intra.bandwidth_bytes_per_s / 1e9:g} GB/s",
             "inter": f"{c.inter.fabric} {c.inter.bandwidth_bytes_per_s / 1e9:g} GB/s"} for k, c in CLUSTERS.items()]


def _gpus() -> list[dict[str, Any]]:
    from ccoverlap.catalog.hardware import DEFAULT_CLUSTER_FOR_GPU, GPUS

    return [{"name": k, "vendor": g.vendor, "bf16_tflops": g.peak_flops.get("bf16", 0) / 1e12,
             "hbm_tb_s": g.hbm_bytes_per_s / 1e12, "memory_gb": g.memory_bytes / 1e9,
             "default_cluster": DEFAULT_CLUSTER_FOR_GPU.get(k, "-")} for k, g in GPUS.items()]


def _frameworks() -> list[dict[str, Any]]:
    from ccoverlap.catalog.frameworks import builtin_frameworks, get_framework

    return [{"name": n, "description": _clause(get_framework(n).description)} for n in builtin_frameworks()]


def _strategies() -> list[dict[str, Any]]:
    from ccoverlap.planning.strategies import default_registry

    return [{"name": s.name, "summary": _clause(s.summary)} for s in default_registry()]


def _clause(text: str) -> str:
    """The first clause of ``text``: up to a colon or semicolon followed by a space."""
    import re

    return re.split(r"[:;]\s", text, maxsplit=1)[0].strip()


def _cell(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v)


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON) of ``args.what``."""
    rows = {"models": _models, "clusters": _clusters, "gpus": _gpus, "frameworks": _frameworks,
            "strategies": _strategies}[args.what]()
    if args.json:
        json.dump({args.what: rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from ccoverlap.console import Col, make_console, print_table

    keys = list(rows[0])
    columns = [Col(HEADERS.get(k, k), "right" if isinstance(rows[0][k], (int, float)) else "left",
                   wrap=k in ("description", "summary")) for k in keys]
    print_table(make_console(highlight=False), columns, [[_cell(r[k]) for k in keys] for r in rows])
    return 0
