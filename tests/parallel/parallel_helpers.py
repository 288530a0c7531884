"""Shared helpers for the parallel-builder tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ccoverlap.catalog.hardware import CLUSTERS
from ccoverlap.sim.timeline import merge_intervals
from ccoverlap.specs import AttentionSpec, CollectiveSpec, GemmSpec, MemorySpec, P2PSpec


class ToyCost:
    """duration = flops / flops_per_s for GEMMs and attention, bytes / mem_bw for memory-bound
    ops, bytes / comm_bw for collectives and transfers; concurrency is ignored. Any of the
    rates may be ``inf`` to make that kind free."""

    def __init__(self, flops_per_s=1e14, mem_bw=1e12, comm_bw=1e11):
        self.flops_per_s, self.mem_bw, self.comm_bw = flops_per_s, mem_bw, comm_bw

    def duration_s(self, spec, concurrent):
        if isinstance(spec, (CollectiveSpec, P2PSpec)):
            return spec.bytes / self.comm_bw
        if isinstance(spec, (GemmSpec, AttentionSpec)):
            return spec.flops / self.flops_per_s
        if isinstance(spec, MemorySpec):
            return spec.bytes / self.mem_bw
        return 0.0


def cluster(gpus: int, gpus_per_node: int = 8):
    """A DGX-H100-like cluster of ``gpus`` GPUs (``gpus_per_node`` per node, at most ``gpus``)."""
    g = min(gpus, gpus_per_node)
    return replace(CLUSTERS["dgx-h100"], gpus_per_node=g, nodes=gpus // g)


def compute_busy_s(tl, rank: int) -> float:
    """Length of the union of compute intervals of ``rank``."""
    t = tl.for_rank(rank)
    m = t.kind == "compute"
    s, e = merge_intervals(t.start_s[m], t.end_s[m])
    return float(np.sum(e - s))




def validate_error_of_tp_run(tmp_path, capsys, *, parallel: dict, knobs: dict, framework: str) -> tuple[int, str]:
    """Exit code and stderr of ``ccoverlap validate`` on a runs file of two copies of one
    Llama-3-8B run on one DGX H100 node with ``parallel``, ``knobs`` and ``framework``."""
    import copy

    import yaml

    from ccoverlap.cli import main

    run = {"name": "tp-run", "source": "test", "assumptions": [], "model": "Llama-3-8B", "cluster": "dgx-h100",
           "nodes": 1, "parallel": parallel, "batch": {"global_batch": 1, "micro_batch": 1, "seq_len": 4096},
           "knobs": knobs, "framework": framework, "measured": {"tokens_per_s_per_gpu": 1000}, "subset": "fit"}
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump({"runs": [run, dict(copy.deepcopy(run), name="tp-run-2")]}))
    code = main(["validate", str(p), "--quiet"])
    return code, capsys.readouterr().err.strip()
