"""The communication model against the collective corpus (``ccoverlap validate collectives``).

Each table of kind ``collective`` (:mod:`ccoverlap.corpus.tables`) holds measured times of
one collective library on one kind of node, a row per measurement::

    cluster,collective,gpus,nodes,nbytes,time_s[,busbw_gbs][,algorithm][,issuer]

``cluster`` is a catalog cluster (``ccoverlap list clusters``), ``collective`` one of the
cost model's collectives or ``send_recv`` (a point-to-point transfer between 2 GPUs),
``gpus`` the ranks, ``nodes`` the nodes they span (an equal share a node), ``nbytes`` the
message size as nccl-tests' ``size`` and ``time_s`` the measured seconds; an optional
``algorithm`` column names the algorithm the run forced (``NCCL_ALGO``: ``ring``, ``tree`` or
``nvls``; empty or absent: NCCL's own choice); an optional ``issuer`` column names the program
whose loop issued the calls where it matters to the floor (:data:`ISSUERS`). Every row is
predicted with :func:`ccoverlap.cost.comm.collective_time_s` / :func:`~ccoverlap.cost.comm.p2p_time_s`
at NCCL's default knobs and the cluster GPU's default parameters; the error is
``predicted / measured - 1``.

Rows fall in size classes: one node below 16 MiB (latency-bound: target median
|error| <= 15%), one node at 16 MiB and above (bandwidth-bound: <= 10%) and ``multi-node``
(target: mean signed error within ±10%). :func:`fit_params` fits named physical parameters
on the tables' declared ``fit`` half (least squares of log time ratios).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ccoverlap.catalog.hardware import ClusterSpec, get_cluster
from ccoverlap.config import short
from ccoverlap.corpus.tables import Table, load_kind, load_table
from ccoverlap.cost.comm import ALGORITHMS, back_to_back_time_s, collective_time_s, p2p_time_s
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.errors import ConfigError
from ccoverlap.specs import COLLECTIVES, CollectiveSpec, CommConfig, GroupSpec, P2PSpec

KIND = "collective"
MiB = 1 << 20
LARGE_BYTES = 16 * MiB
CLASSES = ("< 16 MiB", ">= 16 MiB", "multi-node")
#: class -> (statistic, limit): median |error| for one node, mean signed error across nodes
TARGETS = {"< 16 MiB": ("median_abs", 0.15), ">= 16 MiB": ("median_abs", 0.10), "multi-node": ("mean_signed", 0.10)}
REQUIRED = ("cluster", "collective", "gpus", "nodes", "nbytes", "time_s")
P2P = "send_recv"


@dataclass(frozen=True)
class Case:
    """One measured row, checked: where it ran, what it moved, how long it took (seconds)."""

    table: str
    cluster: ClusterSpec
    collective: str
    gpus: int
    nodes: int
    nbytes: float
    measured_s: float
    algorithm: str = "auto"
    issuer: str = ""

    @property
    def size_class(self) -> str:
        """``"multi-node"``, ``">= 16 MiB"`` or ``"< 16 MiB"``."""
        if self.nodes > 1:
            return "multi-node"
        return ">= 16 MiB" if self.nbytes >= LARGE_BYTES else "< 16 MiB"


def _int(row: dict[str, Any], col: str, where: str) -> int:
    v = row[col]
    if not isinstance(v, float) or not math.isfinite(v) or v != int(v) or v < 1:
        raise ConfigError(f"{where}: {col} must be a positive whole number, got {short(v)}")
    return int(v)


def _positive(row: dict[str, Any], col: str, where: str) -> float:
    v = row[col]
    if not isinstance(v, float) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{where}: {col} must be a positive number, got {short(v)}")
    return v


def table_cases(table: Table, split: str = "held-out") -> list[Case]:
    """The checked rows of one half of ``table`` (``"fit"``, ``"held-out"`` or ``"all"``);
    ConfigError naming the table and row on a missing column, an unknown cluster or
    collective, or a shape the cluster cannot hold."""
    missing = [c for c in REQUIRED if c not in table.rows[0]]
    if missing:
        raise ConfigError(f"collective table {table.name}: missing column(s) {', '.join(missing)} "
                          f"(needs {', '.join(REQUIRED)})")
    index = {id(r): i for i, r in enumerate(table.rows, start=2)}
    out = []
    for row in table.half(split):
        where = f"collective table {table.name}, row {index[id(row)]}"
        coll = str(row["collective"])
        if coll != P2P and coll not in COLLECTIVES:
            raise ConfigError(f"{where}: unknown collective {short(coll)}; expected one of {COLLECTIVES + (P2P,)}")
        cluster = get_cluster(str(row["cluster"]))
        gpus, nodes = _int(row, "gpus", where), _int(row, "nodes", where)
        if gpus % nodes or gpus // nodes > cluster.gpus_per_node:
            raise ConfigError(f"{where}: {gpus} GPUs on {nodes} node(s) do not fit {cluster.name} "
                              f"({cluster.gpus_per_node} GPUs a node)")
        if coll == P2P and gpus != 2:
            raise ConfigError(f"{where}: send_recv rows are between 2 GPUs, got {gpus}")
        out.append(Case(table.name, cluster.with_nodes(max(cluster.nodes, nodes)), coll, gpus, nodes,
                        _positive(row, "nbytes", where), _positive(row, "time_s", where),
                        _algorithm(row, coll, where), _issuer(row, where)))
    return out


def _cell(row: dict[str, Any], column: str) -> str:
    """An optional column's cell, lower case (``""`` where the column is absent or the cell empty)."""
    return str(row.get(column, "") or "").strip().lower()


#: what an ``algorithm`` cell may name (NCCL_ALGO values the cost model has)
FORCED_ALGORITHMS = ("ring", "tree", "nvls")


def _algorithm(row: dict[str, Any], coll: str, where: str) -> str:
    """The row's forced algorithm (``"auto"`` where the column is absent or empty)."""
    value = _cell(row, "algorithm")
    if not value:
        return "auto"
    if value not in FORCED_ALGORITHMS or value not in ALGORITHMS:
        raise ConfigError(f"{where}: algorithm must be one of {FORCED_ALGORITHMS} or empty, got {short(value)}")
    if coll == P2P:
        raise ConfigError(f"{where}: a send_recv row has no algorithm to force, got {short(value)}")
    return value


#: what an ``issuer`` cell may name: ``nccl-tests``, a C loop calling NCCL directly. Its host cost
#: a call (NCCL's enqueue and one kernel launch) is not the eager-PyTorch issue time a catalog
#: cluster's ``host_issue_s`` (and a GPU's ``comm_host_issue_s``) is fitted as, and it stays
#: below the GPU's time of the collective: an nccl-tests loop of 8-byte all-reduces on one
#: 8 x H100 node takes 13.0 us a call (dgxc_benchmarking_h100_1x8_all_reduce), against the
#: 37 us floor of eager PyTorch's loops on the same kind of node. Such rows are predicted at
#: the collective's own time. Empty or absent: the row is held to the floor.
ISSUERS = ("nccl-tests",)


def _issuer(row: dict[str, Any], where: str) -> str:
    """The row's issuer (``""`` where the column is absent or empty)."""
    value = _cell(row, "issuer")
    if value and value not in ISSUERS:
        raise ConfigError(f"{where}: issuer must be one of {ISSUERS} or empty, got {short(value)}")
    return value


def predict_s(case: Case, params: CostParams | None = None) -> float:
    """The cost model's seconds a call for ``case`` as the tables measure it, a loop of calls:
    a collective no faster than the host issues it (:func:`ccoverlap.cost.comm.back_to_back_time_s`;
    a row issued by a C loop, :data:`ISSUERS`, at its own time), a send/recv as its sender
    sees it (``params`` default: the cluster GPU's)."""
    p = params if params is not None else default_params(case.cluster.gpu)
    if case.collective == P2P:  # the sender's time: it runs ahead of its receiver's issue
        return p2p_time_s(P2PSpec(bytes=case.nbytes, inter_node=case.nodes > 1), case.cluster, p)
    group = GroupSpec(name="corpus", size=case.gpus, local_size=case.gpus // case.nodes)
    spec = CollectiveSpec(collective=case.collective, bytes=case.nbytes, group=group,  # type: ignore[arg-type]
                          config=CommConfig(algorithm=case.algorithm))
    alone = collective_time_s(spec, case.cluster, p)
    return alone if case.issuer in ISSUERS else back_to_back_time_s(alone, p, case.cluster)


@dataclass(frozen=True)
class Group:
    """Errors of one (table, collective, size class): ``n`` rows, median |error|, mean signed
    error, and whether the class target (:data:`TARGETS`) is met."""

    table: str
    cluster: str
    gpu: str
    collective: str
    size_class: str
    n: int
    median_abs: float
    mean_signed: float

    @property
    def target(self) -> float:
        return TARGETS[self.size_class][1]

    @property
    def ok(self) -> bool:
        stat, limit = TARGETS[self.size_class]
        return abs(getattr(self, stat)) <= limit

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (errors as fractions)."""
        return {"table": self.table, "cluster": self.cluster, "gpu": self.gpu, "collective": self.collective,
                "size_class": self.size_class, "rows": self.n, "median_abs_error": self.median_abs,
                "mean_signed_error": self.mean_signed, "target_statistic": TARGETS[self.size_class][0],
                "target": self.target, "ok": self.ok}


ParamsFor = Callable[[Case], CostParams]


def errors(cases: list[Case], params_for: ParamsFor | None = None) -> list[float]:
    """``predicted / measured - 1`` of each case."""
    pf = params_for or (lambda c: default_params(c.cluster.gpu))
    return [predict_s(c, pf(c)) / c.measured_s - 1.0 for c in cases]


def summarize(cases: list[Case], errs: list[float]) -> list[Group]:
    """One :class:`Group` per (table, collective, size class), in table order."""
    keyed: dict[tuple[str, str, str], list[tuple[Case, float]]] = {}
    for c, e in zip(cases, errs):
        keyed.setdefault((c.table, c.collective, c.size_class), []).append((c, e))
    out = []
    for (table, coll, cls), items in keyed.items():
        es = [e for _, e in items]
        c0 = items[0][0]
        out.append(Group(table, c0.cluster.name, c0.cluster.gpu.name, coll, cls, len(es),
                         statistics.median(abs(e) for e in es), statistics.fmean(es)))
    order = {k: i for i, k in enumerate(CLASSES)}
    return sorted(out, key=lambda g: (g.table, g.collective, order[g.size_class]))


def validate_corpus(split: str = "held-out", *, root: Path | None = None, names: list[str] | None = None,
                    params_for: ParamsFor | None = None) -> list[Group]:
    """Errors of the model on ``split`` of every collective table (or those in ``names``)."""
    tables = [load_table(KIND, n, root=root) for n in names] if names else load_kind(KIND, root=root)
    if not tables:
        raise ConfigError("no collective corpus tables found")
    cases = [c for t in tables for c in table_cases(t, split)]
    if not cases:
        raise ConfigError(f"the {split} half of the collective tables has no rows")
    return summarize(cases, errors(cases, params_for))


# ----------------------------------------------------------------------------- fitting

#: parameter -> (lower, upper) bounds for the fit (physical ranges)
FIT_BOUNDS = {"comm_base_latency_s": (0.0, 100e-6), "comm_host_issue_s": (0.0, 200e-6),
              "link_efficiency_nvlink": (0.3, 1.0), "chunk_pipeline_depth": (0.0, 40.0),
              "link_efficiency_pcie": (0.2, 1.0), "link_efficiency_network": (0.2, 1.0),
              "link_efficiency_ethernet": (0.2, 1.0), "link_efficiency_efa": (0.2, 1.0),
              "nvls_latency_s": (0.0, 200e-6), "pcie_socket_crossing_fraction": (0.05, 1.0), "channel_bytes_per_s": (5e9, 100e9),
              "net_channel_bytes_per_s": (2e9, 100e9),
              "host_issue_s": (0.0, 200e-6), "inter_latency_s": (0.0, 500e-6),
              "proto_ll_latency_factor": (0.05, 1.0)}

#: fitted names that are properties of a catalog cluster, not of a GPU's CostParams: the host
#: issue time of its nodes (``ClusterSpec.host_issue_s``) and the one-hop latency of the fabric
#: between its nodes (``ClusterSpec.inter.latency_s``)
CLUSTER_FIELDS = ("host_issue_s", "inter_latency_s")


def with_cluster_value(cluster: ClusterSpec, name: str, value: float) -> ClusterSpec:
    """``cluster`` with one of :data:`CLUSTER_FIELDS` set to ``value``."""
    if name == "host_issue_s":
        return replace(cluster, host_issue_s=value)
    if name == "inter_latency_s":
        return replace(cluster, inter=replace(cluster.inter, latency_s=value))
    raise ConfigError(f"{name!r} is not a cluster field; expected one of {CLUSTER_FIELDS}")


def cluster_value(cluster: ClusterSpec, name: str) -> float:
    """The value of one of :data:`CLUSTER_FIELDS` in ``cluster``."""
    if name == "host_issue_s":
        return cluster.host_issue_s
    if name == "inter_latency_s":
        return cluster.inter.latency_s
    raise ConfigError(f"{name!r} is not a cluster field; expected one of {CLUSTER_FIELDS}")


#: GPU -> the parameters its tables decide (benchmarks/fit_collectives.py fits these, over the
#: GPU's tables with each cluster's own host issue time set aside: the GPU's
#: comm_host_issue_s is what a cluster without one gets). NVLink
#: efficiency on H100 / A100 and the network's are large-message figures (nccl-tests#212,
#: #290; DGX A100 ~230 of 300 GB/s): the H100 / A100 tables stop at 64 MiB, where NCCL's rings
#: are still ramping up, so they do not refit them. H100's NVLS latency is fitted on vidur's
#: DGX H100 rows and on an nccl-tests run forced to NVLS at every size (Azure ND H100 v5); its
#: LL step (proto_ll_latency_factor) on the small all-reduces of the dgxc nccl-tests sweep, LL
#: rings issued by a C loop, the only H100 rows where the LL step shows.
#: A40: its table reaches 4 GiB, and a bridged pair's NVLink rate is fitted there.
FIT = {
    "H100-SXM": ["comm_host_issue_s", "link_efficiency_pcie", "net_channel_bytes_per_s", "nvls_latency_s",
                 "proto_ll_latency_factor"],
    "A100-80GB-SXM": ["comm_host_issue_s", "link_efficiency_pcie"],
    "A40": ["comm_host_issue_s", "link_efficiency_nvlink", "link_efficiency_pcie", "pcie_socket_crossing_fraction"],
}

#: catalog cluster -> what its own tables decide once its GPU's parameters are fitted (FIT):
#: the host issue time of nodes whose tables were timed in eager PyTorch (vidur; the A40
#: table replays a CUDA graph and keeps the GPU's value), and for a3-mega the latency and
#: efficiency of GPUDirect-TCPXO between its nodes (its only Ethernet fabric); for aws-p5 /
#: aws-p4d the step latency of AWS EFA between their nodes and their GPU's EFA efficiency (one
#: EFA cluster per GPU); for azure-nd-a100-v4 the floor of an nccl-tests loop on its node.
FIT_CLUSTER = {
    "dgx-h100": ["host_issue_s"],
    "h100-nvl-nvlink-pairs": ["host_issue_s"],
    "dgx-a100": ["host_issue_s"],
    "a100-pcie-nvlink-pairs": ["host_issue_s"],
    "a3-mega": ["inter_latency_s", "link_efficiency_ethernet"],
    "aws-p5": ["inter_latency_s", "link_efficiency_efa"],
    "aws-p4d": ["inter_latency_s", "link_efficiency_efa"],
    "azure-nd-a100-v4": ["host_issue_s"],
}


#: tables left out of their GPU's fit (FIT), and why: none of the parameters fitted per GPU is
#: what they measure, and their rows would pull those of their GPU's other tables. They are
#: fitted on their own cluster's values (FIT_CLUSTER).
NOT_FITTED = {
    "nccl_tests_a3mega_h100_2x8_all_reduce": "GPUDirect-TCPXO between the nodes: its hop latency and efficiency "
                                             "are the cluster's (FIT_CLUSTER), not the H100's",
    "nccl_tests_aws_p5_h100_2x8_all_reduce": "AWS EFA between the nodes: its hop latency and the H100's EFA "
                                             "efficiency are fitted on the cluster's rows (FIT_CLUSTER)",
    "nccl_tests_aws_p4d_a100_2x8_all_reduce": "AWS EFA between the nodes: its hop latency and the A100's EFA "
                                              "efficiency are fitted on the cluster's rows (FIT_CLUSTER)",
    "azure_nd_a100_v4_1x8_all_reduce": "a check of the A100 one-node fit on nccl-tests (8 KiB to 8 GiB): judged, "
                                       "not fitted; only its node's host issue time is (FIT_CLUSTER)",
    "nccl_tests_h100_nvswitch_1x8_all_reduce": "a check of NVLS at 128 MiB-4 GiB, whose efficiency is a cited "
                                               "large-message figure: judged, not fitted",
    "nccl_tests_cluster_h100_1x8_collectives": "a check of the one-node H100 model on all-reduce, all-gather, "
                                               "reduce-scatter and all-to-all at 32 MiB-16 GiB: judged, not fitted",
    "nccl_tests_cluster_h100_10x8_collectives": "a check of the model across 10 H100 nodes (1-8 GPUs a node) "
                                                "on an unnamed 400 Gb/s-a-GPU network: judged, not fitted",
}


def fit_params(cases: list[Case], names: list[str], base: CostParams) -> dict[str, float]:
    """Values of ``names`` (keys of :data:`FIT_BOUNDS`) minimising the squared log time ratio
    over ``cases`` (all of one GPU: one value per GPU type; a name of :data:`CLUSTER_FIELDS`
    is set in every case's cluster, so fit those on one cluster's cases), starting from
    ``base`` and the cases' clusters. The loss is robust (soft L1 beyond 10%): a few rows far
    off (a launch-bound small size) do not pull the fit away from the rest, as the targets are
    medians."""
    from scipy.optimize import least_squares

    unknown = [n for n in names if n not in FIT_BOUNDS]
    if unknown or not names:
        raise ConfigError(f"cannot fit {unknown or names}; fittable: {', '.join(FIT_BOUNDS)}")
    if not cases:
        raise ConfigError("no rows to fit on")
    scale = [FIT_BOUNDS[n][1] for n in names]
    lo = [FIT_BOUNDS[n][0] / s for n, s in zip(names, scale)]
    hi = [FIT_BOUNDS[n][1] / s for n, s in zip(names, scale)]
    start = [cluster_value(cases[0].cluster, n) if n in CLUSTER_FIELDS else getattr(base, n) for n in names]
    x0 = [min(max(v / s, lo_ + 1e-6), hi_ - 1e-6) for v, s, lo_, hi_ in zip(start, scale, lo, hi)]

    def resid(x: Any) -> list[float]:
        values = {n: float(v) * s for n, v, s in zip(names, x, scale)}
        p = base.with_overrides(**{n: v for n, v in values.items() if n not in CLUSTER_FIELDS})
        out = []
        for c in cases:
            cl = c.cluster
            for n in CLUSTER_FIELDS:
                if n in values:
                    cl = with_cluster_value(cl, n, values[n])
            out.append(math.log(predict_s(replace(c, cluster=cl), p) / c.measured_s))
        return out

    # the model has flat stretches (max, algorithm choice): start also from the middle of the
    # bounds and keep the better end point
    mid = [(a + b) / 2 for a, b in zip(lo, hi)]
    best = min((least_squares(resid, x, bounds=(lo, hi), diff_step=1e-3, xtol=1e-6, ftol=1e-6, loss="soft_l1",
                              f_scale=0.1) for x in (x0, mid)), key=lambda r: r.cost)
    return {n: float(v) * s for n, v, s in zip(names, best.x, scale)}


# ----------------------------------------------------------------------------- report

def report(groups: list[Group], split: str) -> dict[str, Any]:
    """The JSON object ``ccoverlap validate collectives --json`` prints: the split, the
    targets, one entry per group and the count of groups meeting their target."""
    return {"split": split, "targets": {k: {"statistic": s, "limit": v} for k, (s, v) in TARGETS.items()},
            "groups": [g.to_dict() for g in groups], "met": sum(g.ok for g in groups), "total": len(groups)}


def report_lines(groups: list[Group], split: str) -> list[str]:
    """Plain-text report, narrow enough for a terminal: a heading per table (its cluster and
    GPU), a line per (collective, size class)."""
    which = "all rows" if split == "all" else f"{split} half"
    lines = [f"collective corpus, {which}: error = predicted / measured - 1",
             "targets: median |error| <= 15% below 16 MiB, <= 10% at >= 16 MiB; "
             "multi-node mean signed error within +-10%", ""]
    table = None
    for g in groups:
        if g.table != table:
            table = g.table
            lines.append(f"{g.table}  ({g.cluster}, {g.gpu})")
        lines.append(f"  {g.collective:<10} {g.size_class:<10} {g.n:>3} rows  median |err| {g.median_abs:6.1%}  "
                     f"mean {g.mean_signed:+7.1%}  {'ok' if g.ok else 'MISS'}")
    lines += ["", f"{sum(g.ok for g in groups)} of {len(groups)} groups meet their target"]
    return lines
