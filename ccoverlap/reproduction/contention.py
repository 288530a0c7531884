"""Public contention figures against the cost model: ``ccoverlap reproduce --paper contention``.

Each row of the corpus kind ``contention`` (``ccoverlap/data/corpus/contention/``, one table
per source) is one measured slowdown: a kernel's time beside another / its time alone (or
beside a reference configuration, ``channels_ref``). ``side`` says whose time: ``compute``
(the GEMM / attention slowed by communication), ``comm`` (the communication slowed by the
GEMM) or ``share`` (the share of a copy-engine copy's time spent outside the transfer; the
model's ``dma_copy_outside_fraction`` x ``dma_copy_latency_s`` over its copy time). ``role``: ``judge`` rows are compared with the model (match: the modelled time ratio
within 30% of the measured one), ``fit`` rows are shown but not counted (a parameter was
fitted on them), ``info`` rows whose setting the source does not state are listed with the
reason, never modelled.

The model is :class:`~ccoverlap.cost.model.CostModel` with the GPU's default parameters, one
set per GPU type. Communication is an NCCL / RCCL collective (``transport`` sm), a copy-engine
one (dma), or the project's channel-copy stand-in (standin), whose thread blocks co-reside
with the GEMM's instead of holding SMs: it is modelled with its measured stand-alone time,
no SMs taken, its HBM traffic (read + write of each byte) and its chunks in L2. On the
communication side, an SM-driven kernel launched with a GEMM first waits for the GEMM's
last wave (:func:`~ccoverlap.cost.contention.dispatch_delay_s`), then runs slowed by the
GEMM's memory traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ccoverlap.catalog.hardware import get_cluster
from ccoverlap.corpus.tables import Table, load_kind
from ccoverlap.cost import contention as ct
from ccoverlap.cost.model import CostModel
from ccoverlap.errors import ConfigError
from ccoverlap.specs import Collective, CollectiveSpec, CommConfig, GemmSpec, GroupSpec, P2PSpec

TOLERANCE = 0.30
KIND = "contention"


@dataclass(frozen=True)
class FigureRow:
    """One public figure: its table (source), row id, role, side, measured and modelled ratio."""

    table: str
    source: str
    id: str
    role: str
    side: str
    gpu: str
    measured: float
    modelled: float | None

    @property
    def error(self) -> float | None:
        """``modelled / measured - 1`` (None when not modelled)."""
        return None if self.modelled is None else self.modelled / self.measured - 1.0

    @property
    def verdict(self) -> str:
        if self.role == "info":
            return "not stated"
        if self.role == "fit":
            return "fit"
        assert self.error is not None
        return "match" if abs(self.error) <= TOLERANCE else "miss"


def _collective(row: dict[str, Any], channels: int) -> CollectiveSpec:
    group = GroupSpec(name="dp", size=int(row["group_size"]), local_size=int(row["local_size"]))
    cfg = CommConfig(channels=channels or None, chunk_bytes=int(row["chunk_bytes"]) or None,
                     threads=int(row.get("threads", 0)) or None)
    # the table names the collective; CollectiveSpec checks it is one it knows
    return CollectiveSpec(collective=cast(Collective, str(row["comm"])), bytes=int(row["comm_bytes"]), group=group, config=cfg,
                          transport="dma" if row["transport"] == "dma" else "sm")


def _model(row: dict[str, Any]) -> CostModel:
    nodes = max(1, int(row["group_size"]) // int(row["local_size"]))
    return CostModel(get_cluster(str(row["cluster"]), nodes=nodes))


def _standin_ratio(row: dict[str, Any], model: CostModel) -> float:
    """The channel-copy stand-in beside a GEMM: no SMs taken, its measured rate's HBM traffic."""
    gpu, p = model.gpu, model.params
    gemm = GemmSpec(m=int(row["m"]), n=int(row["n"]), k=int(row["k"]))
    copy_s = float(row["comm_alone_s"])
    copy_hbm = 2.0 * float(row["comm_bytes"]) / copy_s
    footprint = int(row["channels"]) * min(float(row["chunk_bytes"]), float(row["comm_bytes"])) * p.l2_inflight_chunks
    if row["side"] == "compute":  # the copy gets SMs at the GEMM's last wave: it sees that wave only
        alone = model.alone_s(gemm)
        beside = ct.compute_time_under_s(gemm, gpu, p, sms_taken=0.0, hbm_taken=copy_hbm,
                                         l2_fraction=footprint / gpu.l2_bytes, sharers=1)
        delay = ct.dispatch_delay_s(gemm, gpu, p)
        last = (alone - delay) * beside / alone
        return (delay + last) / alone
    gemm_hbm = model.profile(gemm).hbm_bytes_per_s
    beside = ct.comm_time_under_s(copy_s, copy_hbm, gemm_hbm, 1, gpu, p, dma=False)
    return (ct.dispatch_delay_s(gemm, gpu, p) + beside) / copy_s


def modelled_ratio(row: dict[str, Any]) -> float:
    """The model's time ratio for one judged or fit row (see the module docstring)."""
    model = _model(row)
    if row["side"] == "share":  # a copy-engine peer copy: share of its time outside the transfer
        copy = P2PSpec(bytes=int(row["comm_bytes"]), inter_node=False, transport="dma")
        p = model.params
        return p.dma_copy_outside_fraction * p.dma_copy_latency_s / model.alone_s(copy)
    if row["transport"] == "standin":
        return _standin_ratio(row, model)
    if row["victim"] != "gemm":
        raise ConfigError(f"contention row {row['id']}: only GEMM victims are modelled, got {row['victim']!r}")
    gemm = GemmSpec(m=int(row["m"]), n=int(row["n"]), k=int(row["k"]))
    coll = _collective(row, int(row["channels"]))
    if row["side"] == "compute":
        ref = int(row["channels_ref"])
        base = model.alone_s(gemm) if ref < 0 else model.duration_s(gemm, [_collective(row, ref)])
        return model.duration_s(gemm, [coll]) / base
    delay = ct.dispatch_delay_s(gemm, model.gpu, model.params) if coll.transport == "sm" else 0.0
    return (delay + model.duration_s(coll, [gemm])) / model.alone_s(coll)


def figure_rows(tables: list[Table] | None = None) -> list[FigureRow]:
    """Every row of the contention corpus with the model's ratio where the setting is stated."""
    out = []
    for t in tables if tables is not None else load_kind(KIND):
        for row in t.rows:
            role = str(row["role"])
            if role not in ("judge", "fit", "info"):
                raise ConfigError(f"contention table {t.name}, row {row['id']}: role must be judge, fit or info")
            modelled = None if role == "info" else modelled_ratio(row)
            out.append(FigureRow(table=t.name, source=t.source.cite(), id=str(row["id"]), role=role,
                                 side=str(row["side"]), gpu=t.gpu, measured=float(row["measured"]),
                                 modelled=modelled))
    return out


def summary(rows: list[FigureRow]) -> dict[str, Any]:
    """Judged rows, matches, and per table (judged, matches)."""
    judged = [r for r in rows if r.role == "judge"]
    per: dict[str, list[int]] = {}
    for r in judged:
        c = per.setdefault(r.table, [0, 0])
        c[0] += 1
        c[1] += r.verdict == "match"
    return {"judged": len(judged), "matches": sum(r.verdict == "match" for r in judged),
            "tables": {k: {"judged": v[0], "matches": v[1]} for k, v in per.items()}}
