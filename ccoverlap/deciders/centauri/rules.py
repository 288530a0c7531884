"""Centauri's decision rules as pure functions (Chen et al., ASPLOS '24), no graphs involved.

* :func:`operation_level` — Algorithm 1 (§3.2.1): how finely to partition a collective
  (chunk count) and, for a group spanning nodes, which sub-group goes first.
* :func:`allgather_pieces` — the group partition of §3.1.2 for an all-gather: the
  sub-collectives (inter-node / intra-node sub-groups) each granularity of Algorithm 1 needs.
* :func:`layer_level` — eq. 1 (§3.2.2): backward priority T1 (activation gradients first)
  or T2 (weight gradients first).
* :func:`model_level` — eq. 2 (§3.2.3): how many micro-batches to launch together in forward
  (L1) and backward (L2) to hide the data-parallel all-gather / reduce-scatter, under memory.
* :func:`speedup_bound` — §5.4: overlap cannot speed a step up by more than
  ``min(1/α, 1/(1−α))``, α the communication share of the serial time.

Times are seconds, memory bytes. :mod:`ccoverlap.deciders.centauri.decide` feeds these from the cost
model and checks each choice in the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ccoverlap.errors import ConfigError
from ccoverlap.specs import CollectiveSpec, GroupSpec

__all__ = [
    "MAX_CHUNKS",
    "OperationPlan",
    "operation_level",
    "sub_groups",
    "allgather_pieces",
    "LayerCosts",
    "layer_level",
    "model_level",
    "speedup_bound",
]

#: Algorithm 1's MAX_CHUNKS: the paper sets a cap "to prevent excessive partitioning" without
#: a number; 8 is our assumption (beyond it the per-chunk launch and latency terms dominate
#: for the message sizes of the examples).
MAX_CHUNKS = 8


@dataclass(frozen=True)
class OperationPlan:
    """Algorithm 1's output: ``granularity`` (fractions of the workload, summing to 1, in
    issue order), ``order`` (``"none"``, ``"even"``, ``"inter-first"``, ``"intra-first"``,
    ``"intra-first-fine"``) and the reason, with the numbers."""

    num_chunks: int
    granularity: tuple[float, ...]
    order: str
    reason: str


def operation_level(*, comp_cost: float, comm_cost: float, cost_inter: float, cost_intra: float,
                    inter_size: int, intra_size: int, in_cost: float, group_partitioned: bool,
                    max_chunks: int = MAX_CHUNKS) -> OperationPlan:
    """Centauri Algorithm 1 (§3.2.1), line by line.

    ``comp_cost``: the dependent computation (s); ``comm_cost``: the collective (s);
    ``cost_inter``/``cost_intra``: its inter-/intra-node sub-collectives (s); ``inter_size``
    nodes x ``intra_size`` ranks per node = world; ``in_cost``: independent computation
    that can hide it (s). Lines 2-7: if the independent work cannot hide the collective, cut
    it evenly into ``min(ceil(comm/in), MAX_CHUNKS)`` chunks (the paper writes comm/in; the
    ceiling makes it a count). Lines 9-22 (group partitioned): inter-node first if the
    independent work hides the inter-node part, granularity ``[inter/world, 1-inter/world]``;
    else intra-node first, ``[intra/world, 1-intra/world]`` when ``comp_cost/inter_size >
    intra_size x cost_inter`` (line 15, as printed), otherwise the finer three-way
    ``[intra/world, (inter-1)/world, 1-(inter+intra-1)/world]``. Lines 24-26: no partition.
    """
    for name, v in (("comp_cost", comp_cost), ("comm_cost", comm_cost), ("cost_inter", cost_inter),
                    ("cost_intra", cost_intra), ("in_cost", in_cost)):
        if not v >= 0:
            raise ConfigError(f"operation_level: {name} must be >= 0 seconds, got {v}")
    if inter_size < 1 or intra_size < 1 or max_chunks < 1:
        raise ConfigError("operation_level: sizes and max_chunks must be >= 1")
    world = inter_size * intra_size
    if not in_cost < comm_cost:  # lines 24-26
        return OperationPlan(1, (1.0,), "none",
                             f"independent compute {in_cost * 1e3:.3g} ms hides the collective "
                             f"({comm_cost * 1e3:.3g} ms): no partition (Alg. 1 line 25)")
    num = max_chunks
    if in_cost > 0:  # lines 4-6
        num = max(1, min(math.ceil(comm_cost / in_cost - 1e-12), max_chunks))
    gran = tuple([1.0 / num] * num)  # line 7
    plan = OperationPlan(num, gran, "even" if num > 1 else "none",
                         f"collective {comm_cost * 1e3:.3g} ms > independent compute {in_cost * 1e3:.3g} ms: "
                         f"{num} even chunks (Alg. 1 lines 3-7)")
    if not group_partitioned or inter_size < 2 or intra_size < 2:
        return plan
    if in_cost > cost_inter:  # lines 10-12
        f = inter_size / world
        return OperationPlan(2, (f, 1.0 - f), "inter-first",
                             f"independent compute {in_cost * 1e3:.3g} ms hides the inter-node part "
                             f"({cost_inter * 1e3:.3g} ms): inter-node all-gather first (Alg. 1 line 12)")
    f = intra_size / world
    if comp_cost / inter_size > intra_size * cost_inter:  # line 15
        return OperationPlan(2, (f, 1.0 - f), "intra-first",
                             "intra-node all-gather first; compute on its output hides the inter-node part "
                             "(Alg. 1 line 16)")
    g2 = (inter_size - 1) / world
    return OperationPlan(3, (f, g2, 1.0 - f - g2), "intra-first-fine",
                         f"intra-node all-gather first; inter-node part ({cost_inter * 1e3:.3g} ms) too long "
                         f"to hide, finer partition (Alg. 1 line 19)")


def sub_groups(group: GroupSpec) -> tuple[GroupSpec, GroupSpec]:
    """The hierarchical group partition of §3.1.2 on a [nodes, local] mesh: the inter-node
    sub-group (one rank per node) and the intra-node sub-group (one node's ranks) of a rank.
    Only balanced sub-groups (each on one kind of link) are kept, as the paper prunes the rest."""
    return (GroupSpec(name=f"{group.name}_inter", size=group.nodes, local_size=1),
            GroupSpec(name=f"{group.name}_intra", size=group.local_size, local_size=group.local_size))


def allgather_pieces(spec: CollectiveSpec, plan: OperationPlan) -> list[tuple[CollectiveSpec, float]]:
    """The all-gather ``spec`` partitioned as ``plan`` says: ``[(sub-collective, fraction of the
    gathered data usable once it completes)]`` in issue order (fractions sum to 1; a
    sub-collective that unlocks nothing new has fraction 0). ``bytes`` follow nccl-tests'
    all-gather size (the output buffer). Group orders (``D`` bytes over ``n = N x l`` ranks):

    * inter-first: all-gather ``D·N/n`` over the N nodes, then ``D`` within the node;
    * intra-first: ``D·l/n`` within the node, then this rank's shard over the nodes (``D·N/n``),
      then the other nodes' shards within the node (``D·(N−1)/N``); the middle step unlocks
      ``(N−1)/n`` of the data only in the fine variant (Alg. 1 line 19).
    """
    if spec.collective != "all_gather":
        raise ConfigError(f"allgather_pieces: expected an all_gather, got {spec.collective}")
    d = float(spec.bytes)
    g = spec.group
    if plan.order in ("none", "even"):
        k = plan.num_chunks
        return [(CollectiveSpec(collective="all_gather", bytes=d / k, group=g, config=spec.config,
                                transport=spec.transport), 1.0 / k) for _ in range(k)]
    inter, intra = sub_groups(g)
    n, N, lo = g.size, g.nodes, g.local_size

    def ag(nbytes: float, grp: GroupSpec) -> CollectiveSpec:
        """An all-gather of ``nbytes`` (output size) on sub-group ``grp``, same config/transport."""
        return CollectiveSpec(collective="all_gather", bytes=nbytes, group=grp, config=spec.config,
                              transport=spec.transport)

    if plan.order == "inter-first":
        return [(ag(d * N / n, inter), N / n), (ag(d, intra), 1.0 - N / n)]
    if plan.order == "intra-first":
        return [(ag(d * lo / n, intra), lo / n), (ag(d * N / n, inter), 0.0),
                (ag(d * (N - 1) / N, intra), 1.0 - lo / n)]
    if plan.order == "intra-first-fine":
        return [(ag(d * lo / n, intra), lo / n), (ag(d * N / n, inter), (N - 1) / n),
                (ag(d * (N - 1) / N, intra), 1.0 - (lo + N - 1) / n)]
    raise ConfigError(f"allgather_pieces: unknown order {plan.order!r}")


@dataclass(frozen=True)
class LayerCosts:
    """The terms of eq. 1 for one backward layer (seconds): ``w_ag`` weight pre-fetch
    all-gather (FSDP), ``g_act`` activation-gradient compute, ``act_ag`` TP/SP activation
    all-gather, ``g_w`` weight-gradient compute, ``act_rs`` TP/SP reduce-scatter of the
    activation gradient, ``g_w_rs`` FSDP gradient reduce-scatter, ``others`` the rest."""

    w_ag: float = 0.0
    g_act: float = 0.0
    act_ag: float = 0.0
    g_w: float = 0.0
    act_rs: float = 0.0
    g_w_rs: float = 0.0
    others: float = 0.0


def layer_level(c: LayerCosts) -> tuple[str, float, float]:
    """Centauri eq. 1 (§3.2.2): ``(choice, T1, T2)`` with

    ``T1 = W_AG + max(G_act, act_AG) + max(G_w, act_RS) + max(G_w_RS, others)`` (activation
    gradients first) and ``T2 = act_AG + max(G_w, W_AG) + max(G_act, G_w_RS) + act_RS +
    others`` (weight gradients first); the choice is the smaller ("T2" only if strictly smaller).
    """
    t1 = c.w_ag + max(c.g_act, c.act_ag) + max(c.g_w, c.act_rs) + max(c.g_w_rs, c.others)
    t2 = c.act_ag + max(c.g_w, c.w_ag) + max(c.g_act, c.g_w_rs) + c.act_rs + c.others
    return ("T2" if t2 < t1 else "T1"), t1, t2


def model_level(*, c_ag: float, c_rs: float, c_fw: float, c_bw: float, act_bytes: float,
                free_bytes: float, microbatches: int) -> tuple[int, int, float]:
    """Centauri eq. 2 (§3.2.3): ``(L1, L2, T)`` minimising
    ``T = max(C_AG − L1·C_fw, 0) + max(C_RS − L2·C_bw, 0)`` subject to ``L1·m ≤ M``,
    ``L2·m ≤ M`` and ``L1 + L2 ≤ mb`` (``m`` = ``act_bytes`` per micro-batch, ``M`` =
    ``free_bytes``), over integers ``L1, L2 ≥ 1``; ties go to the fewest micro-batches
    launched together (least memory). With one micro-batch both are 1. Raises ConfigError if
    even one micro-batch does not fit."""
    if microbatches < 1:
        raise ConfigError("model_level: microbatches must be >= 1")
    if act_bytes > free_bytes:
        raise ConfigError("model_level: one micro-batch's activations do not fit in the free memory")
    cap = microbatches if act_bytes <= 0 else max(1, min(microbatches, int(free_bytes // act_bytes)))
    best: tuple | None = None
    for l1 in range(1, cap + 1):
        for l2 in range(1, cap + 1):
            if microbatches > 1 and l1 + l2 > microbatches:
                continue
            t = max(c_ag - l1 * c_fw, 0.0) + max(c_rs - l2 * c_bw, 0.0)
            key = (t, l1 + l2, l2)
            if best is None or key < best[0]:
                best = (key, l1, l2, t)
    assert best is not None
    return best[1], best[2], best[3]


def speedup_bound(alpha: float) -> float:
    """Centauri §5.4: the most overlap can speed up a serial execution whose communication
    share is ``alpha`` (communication / (communication + computation)):
    ``min(1/α, 1/(1−α))`` (infinite at α = 0 or 1 is capped to 1: nothing to overlap)."""
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"alpha must be in [0, 1], got {alpha}")
    if alpha in (0.0, 1.0):
        return 1.0
    return min(1.0 / alpha, 1.0 / (1.0 - alpha))
