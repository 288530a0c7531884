"""How the parallel groups sit on the cluster's nodes (which decides intra- vs inter-node links).

Rank order, innermost first, as Megatron-LM orders ranks (``order="tp-cp-ep-dp-pp"``):
TP (consecutive ranks, inside a node when tp <= gpus_per_node), then CP (context parallel),
then EP (carved out of DP, so EP peers are DP neighbours), then the rest of DP, then PP
outermost::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)),   dp_rank = ep_rank + ep * edp_rank

Gradients are reduced over the ``dp × cp`` ranks that hold the same parameters (group ``dp``,
stride tp; Megatron-LM's ``data_parallel_group_with_context_parallel``). With HSDP
(``dp_replicate = r > 1``) the group ``dp`` is one *shard* group of ``dp·cp / r`` consecutive
members (FSDP all-gathers / reduce-scatters there) and ``dp_rep`` joins the ``r`` replicas
(stride tp × shard size; gradients all-reduced there), torchtitan's
``(dp_replicate, dp_shard, cp, tp)`` mesh order with the replicas outermost.

A group of ``size`` ranks spaced ``stride`` apart has ``gpus_per_node // stride`` members per
node when ``stride < gpus_per_node`` (capped at ``size`` and rounded down to a divisor of
``size``, since GroupSpec needs whole nodes), else one member per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from ccoverlap.parallel.config import ParallelConfig
from ccoverlap.specs import GroupSpec


def local_size(size: int, stride: int, gpus_per_node: int) -> int:
    """Members per node of a group of ``size`` ranks spaced ``stride`` apart."""
    if size <= 1:
        return 1
    if stride >= gpus_per_node:
        return 1
    per_node = min(size, max(1, gpus_per_node // stride))
    return gcd(size, per_node)


@dataclass(frozen=True)
class Layout:
    """The process groups of a configuration on a cluster (GroupSpecs named tp, dp, ep, edp, pp,
    embd (first+last pipeline stage, tied embeddings), world, mp (tp x pp), cp (context
    parallel), dp_rep (HSDP replicas))."""

    tp: GroupSpec
    dp: GroupSpec
    ep: GroupSpec
    edp: GroupSpec
    pp: GroupSpec
    embd: GroupSpec
    world: GroupSpec
    mp: GroupSpec
    pp_inter_node: bool
    cp: GroupSpec = GroupSpec(name="cp", size=1, local_size=1)
    dp_rep: GroupSpec = GroupSpec(name="dp_rep", size=1, local_size=1)
    cp_inter_node: bool = False

    @classmethod
    def build(cls, p: ParallelConfig, gpus_per_node: int) -> Layout:
        """Groups of ``p`` laid out on nodes of ``gpus_per_node`` GPUs (see module docstring)."""
        g = gpus_per_node

        def grp(name: str, size: int, stride: int) -> GroupSpec:
            return GroupSpec(name=name, size=size, local_size=local_size(size, stride, g))

        world = p.world_size
        cp = p.cp
        pp_stride = p.tp * cp * p.dp
        shard = p.dp_cp // p.dp_replicate
        return cls(
            tp=grp("tp", p.tp, 1),
            dp=grp("dp", shard, p.tp),
            ep=grp("ep", p.ep, p.tp * cp),
            edp=grp("edp", p.expert_dp, p.tp * (p.ep if cp == 1 else 1)),
            pp=grp("pp", p.pp, pp_stride),
            embd=GroupSpec(name="embd", size=2, local_size=2 if (p.pp - 1) * pp_stride < g else 1),
            world=GroupSpec(name="world", size=world, local_size=gcd(world, min(world, g))),
            # model-parallel ranks (one TP group per stage): the TP part shares a node, and so do
            # the stages that land on the same node (stride tp*dp)
            mp=GroupSpec(name="mp", size=p.tp * p.pp,
                         local_size=local_size(p.tp, 1, g) * local_size(p.pp, pp_stride, g)),
            pp_inter_node=pp_stride >= g,
            cp=grp("cp", cp, p.tp),
            dp_rep=grp("dp_rep", p.dp_replicate, p.tp * shard),
            # a ring neighbour sits on another node once the CP group spans nodes
            cp_inter_node=local_size(cp, p.tp, g) < cp,
        )
