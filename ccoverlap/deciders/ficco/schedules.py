"""FiCCO on the cost model: the time of every overlap schedule of a GEMM with its collective.

FiCCO ("Design Space Exploration of DMA based Finer-Grain Compute Communication Overlap")
compares, for a data-dependent collective + GEMM, the serial execution, the shard-level
("ring", PyTorch async-TP) overlap of §II-B, and four finer-grain schedules (§V-B):
``uniform-fused-1d``, ``hetero-fused-1d``, ``hetero-unfused-1d`` and ``uniform-fused-2d``.
Two losses decide which one wins (§IV): the *decomposition loss* DIL (§IV-C: split GEMMs and
split transfers run less efficiently than whole ones) and the *contention loss* CIL (§IV-D:
a GEMM and a transfer running at once slow each other; copy-engine (DMA) transfers much
less than SM-driven ones).

Here each schedule is written as a small :class:`~ccoverlap.sim.graph.OpGraph` of one rank
(GEMM pieces, transfer pieces, the gather/scatter copies of §III-B, reductions) on its
streams, and played by the stream simulator under the project cost model. So:

* DIL is the cost model's GEMM and collective time on the split shapes
  (``dil_gemm_s = sum(pieces) - whole``, same for the transfers);
* CIL is the simulator's processor-sharing contention of the cost model
  (``cil_s = time - time with every op at its isolated speed``), which depends on the
  transport (``sm`` or ``dma``) as the cost model's contention does: SM-driven transfers
  hold compute units (lagom eq. 5), copy-engine traffic slows the GEMMs beside it through
  the memory subsystem (:mod:`ccoverlap.cost.copy_engine`), every transfer and copy takes
  HBM bandwidth;
* the topology enters through the cost model's collectives and peer-to-peer transfers: on a
  full mesh one peer is reached through one link only, so the shard-level ring's transfers
  crawl (FiCCO §III-C: up to 3.9x slower than serial on MI300X), on a switch through all.

Three collective patterns (``PATTERNS``): ``ag-gemm`` (all-gather, then GEMM: TP/SP
forward), ``gemm-rs`` (GEMM, then reduce-scatter: TP/SP forward of the row-parallel
linear) and ``a2a-gemm`` (all-to-all, then the expert GEMM: EP). For ``gemm-rs`` the
schedules are the mirrored dataflow (the local block is computed *last* in "hetero"), and
with DMA the reduction, which copy engines cannot do (§IV-B2), is a memory-bound kernel.

The static heuristic of §V-C lives in :mod:`ccoverlap.deciders.ficco.heuristic`;
:func:`heuristic_pick` calls it and :func:`accuracy` measures how often its pick is the
estimator's best (``ccoverlap ficco --accuracy``). Registering this module adds the
``ficco`` planner strategy (:func:`ficco_strategy`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from ccoverlap.catalog.hardware import CLUSTERS, DEFAULT_CLUSTER_FOR_GPU, ClusterSpec, LinkSpec, get_gpu
from ccoverlap.deciders.ficco.heuristic import FICCO_SCHEDULES, choose_schedule
from ccoverlap.errors import ConfigError
from ccoverlap.predict.evaluate import cost_model_for_cluster as impl
from ccoverlap.sim.graph import OpGraph
from ccoverlap.sim.simulator import simulate
from ccoverlap.sim.timeline import step_time_s
from ccoverlap.specs import CollectiveSpec, CopySpec, GemmSpec, GroupSpec, MemorySpec, P2PSpec

if TYPE_CHECKING:
    from ccoverlap.catalog.hardware import Fabric
    from ccoverlap.cost import CostModel
    from ccoverlap.sim.simulator import SupportsDuration
    from ccoverlap.specs import Collective, Spec, Transport

__all__ = [
    "SCHEDULES",
    "PATTERNS",
    "TOPOLOGIES",
    "ENGINES",
    "FiccoCase",
    "ScheduleEstimate",
    "machine",
    "schedule_graph",
    "estimate_schedule",
    "estimate_all",
    "best_schedule",
    "heuristic_pick",
    "ideal_time_s",
    "cost_model_for_cluster",
]

#: Every schedule the estimator times: serial, shard-level ring (§II-B), the four of §V-B.
SCHEDULES = ("serial", "ring", *FICCO_SCHEDULES)
#: Collective + GEMM pairs: all-gather before the GEMM, reduce-scatter after it, all-to-all before it.
PATTERNS = ("ag-gemm", "gemm-rs", "a2a-gemm")
#: ``switch``: NVSwitch-like fabric (any peer at full per-GPU bandwidth); ``full_mesh``:
#: direct links to every peer (MI300X Infinity Fabric, FiCCO §IV-B1).
TOPOLOGIES = ("switch", "full_mesh")
#: ``sm``: kernel-driven collectives (NCCL/RCCL); ``dma``: GPU copy engines (FiCCO §II-B, §IV-D).
ENGINES = ("sm", "dma")

_FABRIC: dict[str, Fabric] = {"switch": "nvswitch", "full_mesh": "full_mesh"}


# ----------------------------------------------------------------------------- the case


@dataclass(frozen=True, kw_only=True)
class FiccoCase:
    """One collective + GEMM on one machine.

    ``m, n, k``: the GEMM each rank runs, ``[m, k] x [k, n]`` (elements), with ``m`` the rows
    *after* the all-gather / all-to-all (before the reduce-scatter), i.e. the FiCCO Table I
    convention. ``world``: ranks in the group (one node). ``cluster``: the machine; its
    ``intra`` link's fabric is the topology. ``engine``: ``sm`` or ``dma``.
    """

    m: int
    n: int
    k: int
    world: int
    cluster: ClusterSpec
    pattern: str = "ag-gemm"
    engine: str = "dma"
    dtype_bytes: int = 2
    name: str = ""

    def __post_init__(self) -> None:
        for f in ("m", "n", "k", "world", "dtype_bytes"):
            v = getattr(self, f)
            if int(v) != v or v < 1:
                raise ConfigError(f"FiCCO case: {f} must be a positive integer, got {v!r}")
        if self.pattern not in PATTERNS:
            raise ConfigError(f"FiCCO case: pattern must be one of {PATTERNS}, got {self.pattern!r}")
        if self.engine not in ENGINES:
            raise ConfigError(f"FiCCO case: engine must be one of {ENGINES}, got {self.engine!r}")
        if self.m < self.world:  # every schedule cuts M into one shard per rank (§III-A)
            raise ConfigError(f"FiCCO case: m ({self.m} rows) must be at least world ({self.world}): "
                              f"each rank holds a shard of M rows")
        if self.world > self.cluster.gpus_per_node:
            raise ConfigError(f"FiCCO case: world {self.world} exceeds the {self.cluster.gpus_per_node} GPUs "
                              f"of one {self.cluster.name} node (FiCCO studies one node, §IV-B1)")

    @property
    def topology(self) -> str:
        """``"full_mesh"`` or ``"switch"`` (any other fabric), from the cluster's intra-node link."""
        return "full_mesh" if self.cluster.intra.fabric == "full_mesh" else "switch"

    @property
    def group(self) -> GroupSpec:
        """The one-node process group of the collective (``tp``, or ``ep`` for all-to-all)."""
        return GroupSpec(name="tp" if self.pattern != "a2a-gemm" else "ep", size=self.world, local_size=self.world)

    def describe(self) -> str:
        """One line naming pattern, GEMM shape, machine, topology and engine."""
        label = f"{self.name}: " if self.name else ""
        return (f"{label}{self.pattern} GEMM (M,N,K)=({self.m},{self.n},{self.k}) over {self.world} x "
                f"{self.cluster.gpu.name}, {self.topology}, {self.engine} communication")


def machine(gpu: str, topology: str | None = None, world: int = 8) -> ClusterSpec:
    """A one-node machine of ``world`` catalog GPUs named ``gpu`` on a ``topology``.

    ``topology`` ``"switch"`` or ``"full_mesh"`` keeps the per-GPU bandwidth and latency of
    the GPU's catalog node (:data:`ccoverlap.catalog.hardware.CLUSTERS`) and changes only the fabric,
    so that the two topologies differ in how peers are reached, not in bytes/s. ``None``: the
    catalog node as it is (e.g. MI300X -> full mesh, H100 -> NVSwitch). Raises ConfigError on
    an unknown GPU or topology.
    """
    g = get_gpu(gpu)
    base = CLUSTERS[DEFAULT_CLUSTER_FOR_GPU[g.name]]
    if world < 1:
        raise ConfigError(f"world must be >= 1, got {world}")
    intra = base.intra
    if topology is not None:
        if topology not in TOPOLOGIES:
            raise ConfigError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
        if intra.fabric in ("pcie",) and topology == "full_mesh":
            raise ConfigError(f"{g.name} nodes are PCIe-connected; a full mesh of them is not a real machine")
        if intra.fabric != "pcie":
            intra = LinkSpec(fabric=_FABRIC[topology], bandwidth_bytes_per_s=intra.bandwidth_bytes_per_s,
                             latency_s=intra.latency_s, source=intra.source)
    return replace(base, name=f"{g.name.lower()}-{topology or intra.fabric}-x{world}", nodes=1,
                   gpus_per_node=max(world, 1), intra=intra)


# ----------------------------------------------------------------------------- schedule graphs


def _split(total: int, parts: int) -> list[int]:
    """Sizes of ``total`` cut into ``parts`` near-equal non-empty pieces (first ones larger)."""
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class _Builder:
    """Adds the ops of one schedule to an OpGraph, with the specs of the case."""

    def __init__(self, case: FiccoCase) -> None:
        self.c = case
        self.g = OpGraph()
        self.g.meta.update({"ficco_case": case.describe()})
        self.b = case.dtype_bytes

    # specs ------------------------------------------------------------------------------
    def gemm(self, rows: int, n: int | None = None, k: int | None = None) -> GemmSpec:
        """GEMM ``[rows, k] x [k, n]`` (defaults: the case's n and k)."""
        return GemmSpec(m=max(1, rows), n=max(1, n or self.c.n), k=max(1, k or self.c.k), dtype_bytes=self.b)

    @property
    def transport(self) -> Transport:
        """The case's engine, one of :data:`ENGINES` (checked by :class:`FiccoCase`)."""
        return cast("Transport", self.c.engine)

    def coll(self, kind: Collective, nbytes: float) -> CollectiveSpec:
        """A collective of ``nbytes`` (nccl-tests size) on the case's group and engine."""
        return CollectiveSpec(collective=kind, bytes=float(nbytes), group=self.c.group, transport=self.transport)

    def p2p(self, nbytes: float) -> P2PSpec:
        """A transfer of ``nbytes`` to one peer. On a full mesh the cost model gives it one of the
        ``world - 1`` links (FiCCO §III-C), on a switch the GPU's whole bandwidth."""
        return P2PSpec(bytes=float(nbytes), inter_node=False, transport=self.transport)

    def copy(self, nbytes: float) -> CopySpec | MemorySpec:
        """A gather/scatter copy of ``nbytes`` (FiCCO §III-B, §V-B). With DMA communication it is
        a copy-engine copy, as FiCCO runs it ("FiCCO schedules are implemented in PyTorch by
        invoking standard GEMM libraries and DMA transfers", §VI-A): no compute units, only
        memory bandwidth. With SM communication it is a copy kernel reading and writing
        ``nbytes``."""
        if self.c.engine == "dma":
            return CopySpec(bytes=float(nbytes), direction="d2d")
        return MemorySpec(bytes=2.0 * float(nbytes))

    # ops ---------------------------------------------------------------------------------
    def add(self, name: str, spec: Spec, stream: str, deps: Iterable[int | None] = (), phase: str = "") -> int:
        """Append an op to the schedule graph; returns its id."""
        return self.g.add(name, spec, stream=stream, deps=list(deps), phase=phase)


def _comm_kind(case: FiccoCase) -> Collective:
    kinds: dict[str, Collective] = {"ag-gemm": "all_gather", "a2a-gemm": "all_to_all", "gemm-rs": "reduce_scatter"}
    return kinds[case.pattern]


def schedule_graph(case: FiccoCase, schedule: str) -> OpGraph:
    """The op graph of one rank running ``schedule`` for ``case`` (FiCCO §II-B, §V-B).

    Streams: ``compute`` (GEMMs, reductions), ``comm`` (transfers), ``gather`` and
    ``scatter`` (the copy kernels the fused schedules need, which FiCCO runs concurrently,
    §V-B: uniform-fused-1d "can execute communication, gather, compute, and scatter at the
    same time"). Sizes: 1-D pieces are ``1/world`` of a shard's rows (one level deeper than
    the shard, §III-A); 2-D pieces are ``1/world`` of the columns (K for the input side, N
    for the reduce-scatter side). Raises ConfigError on an unknown schedule.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown FiCCO schedule {schedule!r}; expected one of {SCHEDULES}")
    if case.world == 1:
        bld = _Builder(case)
        bld.add("gemm", bld.gemm(case.m), "compute")
        return bld.g
    if case.pattern == "gemm-rs":
        return _rs_graph(case, schedule)
    return _input_side_graph(case, schedule)


def _input_side_graph(case: FiccoCase, schedule: str) -> OpGraph:
    """All-gather (or all-to-all) feeding a GEMM: the data arrives, then it is multiplied.

    Where the pieces land (FiCCO §IV-B1, §V-B): the peers write their pieces straight into
    the buffer the step's GEMM reads (symmetric memory, "to eliminate intermediate buffer
    copies"), so only the uniform schedules gather ("to ensure uniformity in GEMM sizes, all
    uniform schedules incur gather"): they copy the *local* piece (1-D) or the local column
    block (2-D) beside the received ones. That copy needs no transfer, so it runs ahead on
    the gather stream, and the step's GEMM waits for both its transfer and its gather. The
    first step of a uniform schedule still waits for its transfer, which is what the hetero
    schedules hide under the local shard's GEMM (§V-A).
    """
    bld = _Builder(case)
    w, m, n, k, b = case.world, case.m, case.n, case.k, case.dtype_bytes
    kind = _comm_kind(case)
    shards = _split(m, w)  # rows each rank contributes (its shard)
    if schedule == "serial":
        cm = bld.add(kind, bld.coll(kind, m * k * b), "comm")
        bld.add("gemm", bld.gemm(m), "compute", [cm])
    elif schedule == "ring":
        # shard-level: compute the local shard while the next whole shard comes from one peer
        bld.add("gemm.local", bld.gemm(shards[0]), "compute")
        for i in range(1, w):
            cm = bld.add(f"p2p.{i}", bld.p2p(shards[i] * k * b), "comm")
            bld.add(f"gemm.{i}", bld.gemm(shards[i]), "compute", [cm])
    elif schedule == "uniform-fused-2d":
        cols = _split(k, w)
        for t, kc in enumerate(cols):
            cm = bld.add(f"{kind}.{t}", bld.coll(kind, m * kc * b), "comm")
            # the peers write their [M/W, K/W] blocks into the step's [M, K/W] buffer; the gather
            # copies the local block (a strided slice of the local shard) beside them
            ga = bld.add(f"gather.{t}", bld.copy(shards[0] * kc * b), "gather")
            # C += A_t B_t: every piece after the first is an accumulating GEMM that reads C (§IV-C1)
            bld.add(f"gemm.{t}", replace(bld.gemm(m, n, kc), accumulate=t > 0), "compute", [cm, ga])
    else:
        pieces = [_split(s, w) for s in shards]  # pieces[src][t]: rows of piece t of shard src
        hetero = schedule.startswith("hetero")
        if hetero:
            bld.add("gemm.local", bld.gemm(shards[0]), "compute")
        for t in range(w):
            rows_all = sum(p[t] for p in pieces if t < len(p))
            remote = [p[t] for p in pieces[1:] if t < len(p)]
            if rows_all == 0:
                continue
            cm = bld.add(f"{kind}.{t}", bld.coll(kind, rows_all * k * b), "comm")
            if schedule == "uniform-fused-1d":
                # remote pieces land in the step's buffer; the gather copies the local piece in
                ga = bld.add(f"gather.{t}", bld.copy(pieces[0][t] * k * b), "gather")
                gm = bld.add(f"gemm.{t}", bld.gemm(rows_all), "compute", [cm, ga])
                bld.add(f"scatter.{t}", bld.copy(rows_all * n * b), "scatter", [gm])
            elif schedule == "hetero-fused-1d":
                if sum(remote):
                    gm = bld.add(f"gemm.{t}", bld.gemm(sum(remote)), "compute", [cm])
                    bld.add(f"scatter.{t}", bld.copy(sum(remote) * n * b), "scatter", [gm])
            else:  # hetero-unfused-1d: one GEMM per received piece, written in place
                for src, rows in enumerate(remote, start=1):
                    if rows:
                        bld.add(f"gemm.{t}.{src}", bld.gemm(rows), "compute", [cm])
    return bld.g


def _rs_graph(case: FiccoCase, schedule: str) -> OpGraph:
    """GEMM producing partial sums, reduce-scattered over rows (mirror of the input side).

    With DMA the transfer is an all-to-all of the partial blocks by copy engines and the sum
    is a memory-bound kernel on the compute stream (copy engines cannot add, FiCCO §IV-B2).
    """
    bld = _Builder(case)
    w, m, n, k, b = case.world, case.m, case.n, case.k, case.dtype_bytes
    dma = case.engine == "dma"
    blocks = _split(m, w)  # output rows owned by each rank after the reduce-scatter

    def reduce_piece(name: str, rows_all: int, cols: int, *, deps: Sequence[int | None],
                     tail: bool = False) -> int:
        """Transfer + (for DMA) reduction of one piece whose W contributions total ``rows_all`` rows."""
        nbytes = rows_all * cols * b
        if not dma:
            return bld.add(f"reduce_scatter.{name}", bld.coll("reduce_scatter", nbytes), "comm", deps)
        cm = bld.add(f"all_to_all.{name}", bld.coll("all_to_all", nbytes), "comm", deps)
        own = rows_all / w
        return bld.add(f"reduce.{name}", MemorySpec(bytes=(own * w + own) * cols * b), "compute", [cm])

    if schedule == "serial":
        gm = bld.add("gemm", bld.gemm(m), "compute")
        reduce_piece("all", m, n, deps=[gm])
    elif schedule == "ring":
        # partial block for peer r+i computed and sent while the next one is computed; the
        # partial arriving from the other side is added to this rank's own block
        # (the add of a received partial is issued after the next GEMM, so that the compute
        # stream never waits on a transfer it could compute under)
        add = MemorySpec(bytes=3.0 * blocks[0] * n * b)  # read own + received, write own
        prev = None
        for i in range(1, w):
            gm = bld.add(f"gemm.{i}", bld.gemm(blocks[i]), "compute")
            if prev is not None:
                bld.add(f"add.{i - 1}", add, "compute", [prev])
            prev = bld.add(f"p2p.{i}", bld.p2p(blocks[i] * n * b), "comm", [gm])
        bld.add("gemm.local", bld.gemm(blocks[0]), "compute")
        bld.add(f"add.{w - 1}", add, "compute", [prev])
    elif schedule == "uniform-fused-2d":
        for t, nc in enumerate(_split(n, w)):
            gm = bld.add(f"gemm.{t}", bld.gemm(m, nc, k), "compute")
            cp = bld.add(f"contig.{t}", bld.copy(m * nc * b), "scatter", [gm])  # column block -> contiguous
            reduce_piece(str(t), m, nc, deps=[cp])
    else:
        pieces = [_split(s, w) for s in blocks]  # pieces[dst][t]
        hetero = schedule.startswith("hetero")
        for t in range(w):
            rows_all = sum(p[t] for p in pieces if t < len(p))
            remote = [p[t] for p in pieces[1:] if t < len(p)]
            if rows_all == 0:
                continue
            if schedule == "uniform-fused-1d":
                ga = bld.add(f"gather.{t}", bld.copy(rows_all * k * b), "gather")
                gm = bld.add(f"gemm.{t}", bld.gemm(rows_all), "compute", [ga])
                sc = bld.add(f"scatter.{t}", bld.copy(rows_all * n * b), "scatter", [gm])
                reduce_piece(str(t), rows_all, n, deps=[sc])
            elif schedule == "hetero-fused-1d":
                if not sum(remote):
                    continue
                ga = bld.add(f"gather.{t}", bld.copy(sum(remote) * k * b), "gather")
                gm = bld.add(f"gemm.{t}", bld.gemm(sum(remote)), "compute", [ga])
                reduce_piece(str(t), rows_all, n, deps=[gm])
            else:
                last = None
                for dst, rows in enumerate(remote, start=1):
                    if rows:
                        last = bld.add(f"gemm.{t}.{dst}", bld.gemm(rows), "compute")
                if last is not None:
                    reduce_piece(str(t), rows_all, n, deps=[last])
        if hetero:  # the local block needs no transfer: computed last, under the last transfer
            bld.add("gemm.local", bld.gemm(blocks[0]), "compute")
    return bld.g


# ----------------------------------------------------------------------------- estimates


class _Isolated:
    """The same cost model with contention switched off (every op at its isolated speed)."""

    def __init__(self, cost: SupportsDuration) -> None:
        self.cost = cost

    def duration_s(self, spec: Spec, concurrent: Sequence[Spec]) -> float:
        """Seconds of ``spec`` alone, whatever runs beside it."""
        return self.cost.duration_s(spec, ())


@dataclass(frozen=True, kw_only=True)
class ScheduleEstimate:
    """Predicted time of one schedule and where it goes (seconds).

    ``gemm_s``/``comm_s``/``copy_s``: isolated durations summed over the schedule's GEMM,
    transfer and copy/reduction ops; ``dil_gemm_s``/``dil_comm_s``: decomposition loss, the
    split pieces' isolated time minus the whole op's (FiCCO §IV-C; negative when splitting
    helps, e.g. smaller waves); ``cil_s``: contention loss, simulated time minus the time of
    the same schedule with every op at its isolated speed (FiCCO §IV-D); ``speedup``:
    serial time / this time.
    """

    schedule: str
    time_s: float
    gemm_s: float
    comm_s: float
    copy_s: float
    dil_gemm_s: float
    dil_comm_s: float
    cil_s: float
    speedup: float = 1.0
    ops: int = 0

    def to_dict(self) -> dict:
        """The estimate as a JSON-ready mapping (seconds)."""
        return {k: getattr(self, k) for k in ("schedule", "time_s", "speedup", "gemm_s", "comm_s", "copy_s",
                                              "dil_gemm_s", "dil_comm_s", "cil_s", "ops")}


def _isolated_by_kind(graph: OpGraph, cost: SupportsDuration) -> tuple[float, float, float]:
    """Summed isolated times of a schedule graph's GEMMs, transfers (collectives and
    point-to-point) and everything else (copies, reductions), in seconds."""
    gemm = comm = other = 0.0
    for op in graph.ops:
        assert op.spec is not None  # every op of a schedule graph has a spec
        d = float(cost.duration_s(op.spec, ()))
        if isinstance(op.spec, GemmSpec):
            gemm += d
        elif isinstance(op.spec, (CollectiveSpec, P2PSpec)):
            comm += d
        else:
            other += d
    return gemm, comm, other


def _whole_times(case: FiccoCase, cost: SupportsDuration) -> tuple[float, float]:
    """Isolated time of the unsplit GEMM and of the unsplit collective (seconds)."""
    gemm, comm, _ = _isolated_by_kind(schedule_graph(case, "serial"), cost)
    return gemm, comm


def ideal_time_s(case: FiccoCase, cost: SupportsDuration) -> float:
    """Ideal overlapped time of ``case`` (FiCCO Fig. 6, §VI-B), seconds: the whole collective
    ``C`` and the whole GEMM ``G`` cut into ``world`` pieces that take exactly ``1/world`` of
    the whole ("decomposition scales linearly with no slowdowns from decomposition or
    contention") and run as a pipeline in which piece ``i`` of the GEMM waits for piece ``i`` of
    the transfer: ``max(C, G) + min(C, G) / world``."""
    g, c = _whole_times(case, cost)
    return max(g, c) + min(g, c) / max(case.world, 1)


def estimate_schedule(case: FiccoCase, schedule: str, cost: SupportsDuration, *,
                      whole: tuple[float, float] | None = None,
                      serial_s: float | None = None) -> ScheduleEstimate:
    """Predicted time of ``schedule`` for ``case`` under ``cost`` (FiCCO §IV, §V-B).

    Simulates :func:`schedule_graph` twice: with the cost model's contention (the answer)
    and with every op isolated (to separate CIL). DIL is measured against the whole GEMM
    and whole collective of the serial schedule. Times in seconds.
    """
    graph = schedule_graph(case, schedule)
    t = step_time_s(simulate(graph, cost))
    t_iso = step_time_s(simulate(graph, _Isolated(cost)))
    gemm, comm, copy = _isolated_by_kind(graph, cost)
    g_whole, c_whole = whole if whole is not None else _whole_times(case, cost)
    if schedule == "serial":
        serial_s = t
    return ScheduleEstimate(
        schedule=schedule, time_s=t, gemm_s=gemm, comm_s=comm, copy_s=copy,
        dil_gemm_s=gemm - g_whole, dil_comm_s=comm - c_whole, cil_s=t - t_iso,
        speedup=(serial_s / t) if (serial_s and t > 0) else 1.0, ops=len(graph.ops),
    )


def estimate_all(case: FiccoCase, cost: SupportsDuration, schedules: Sequence[str] = SCHEDULES
                 ) -> list[ScheduleEstimate]:
    """:func:`estimate_schedule` for every schedule (serial first), speedups against serial."""
    whole = _whole_times(case, cost)
    serial = estimate_schedule(case, "serial", cost, whole=whole)
    out = [serial]
    for s in schedules:
        if s != "serial":
            out.append(estimate_schedule(case, s, cost, whole=whole, serial_s=serial.time_s))
    return out if "serial" in schedules else out[1:]


def best_schedule(estimates: Sequence[ScheduleEstimate], among: Iterable[str] | None = None) -> ScheduleEstimate:
    """The fastest estimate (restricted to the schedule names in ``among`` if given)."""
    pool = [e for e in estimates if among is None or e.schedule in set(among)]
    if not pool:
        raise ConfigError("no estimate among the requested schedules")
    return min(pool, key=lambda e: (e.time_s, SCHEDULES.index(e.schedule)))


def heuristic_pick(case: FiccoCase, **tuning: float) -> tuple[str, str]:
    """The §V-C static heuristic's schedule for ``case``, and its reason.

    Calls :func:`ccoverlap.deciders.ficco.heuristic.choose_schedule` with the GPU's dense
    peak FLOP/s for the dtype and its HBM bandwidth. For ``gemm-rs`` the 2-D schedule splits
    the output columns N (not K), so the shape test of §V-C compares M with N: the GEMM is
    passed as ``(m, k, n)`` (the combined OTB x MT metric is symmetric in the three sizes).
    ``tuning``: the heuristic's constants (``reference_time_s``, ``hetero_unfused_factor``,
    ``sm_uniform_band_scale``) when retuned (see :func:`fit_heuristic`).
    """
    gpu = case.cluster.gpu
    m, n, k = (case.m, case.k, case.n) if case.pattern == "gemm-rs" else (case.m, case.n, case.k)
    return choose_schedule(m, n, k, case.world, case.dtype_bytes, peak_flops=gpu.flops_for(case.dtype_bytes),
                           mem_bw_bytes_per_s=gpu.hbm_bytes_per_s, comm_engine=case.engine, **tuning)


def cost_model_for_cluster(cluster: ClusterSpec) -> CostModel:
    """The project cost model of ``cluster`` with the GPU's default parameters
    (:func:`ccoverlap.predict.evaluate.cost_model_for_cluster`)."""

    return impl(cluster)
