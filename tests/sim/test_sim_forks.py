"""Quiet-rank spans through forks, against the op-by-op reference of test_sim_reference.

A fork is a backward layer's shape: a data-gradient GEMM whose end starts both its all-reduce
(on ``tp_comm``) and the weight-gradient GEMM (next on ``compute``), the following layer waiting
for both. The fast simulator times such a pair inside a span; here other ranks' transfers land
on the rank at random moments (before, inside and after the forks, while both fork ops run or
only the slower one), so every way of replaying a span with forks into running state is met."""

from __future__ import annotations

import random

import pytest
from test_sim_reference import assert_equals_reference

from ccoverlap.sim.graph import OpGraph
from ccoverlap.specs import CollectiveSpec, GemmSpec, GroupSpec, MemorySpec

TP = GroupSpec(name="tp", size=8, local_size=8)


def fork_graph(seed: int) -> OpGraph:
    """Ranks playing chains of forks; transfers from other ranks arrive on a side stream and
    a later op of the chain (or nothing) waits for them."""
    rnd = random.Random(seed)
    g = OpGraph()
    ranks = rnd.randint(2, 3)
    dgrad = [GemmSpec(m=256 * rnd.randint(1, 6), n=512, k=512) for _ in range(2)]
    wgrad = [GemmSpec(m=256 * rnd.randint(1, 6), n=512, k=512) for _ in range(2)]
    ar = [CollectiveSpec(collective="all_reduce", bytes=float(rnd.randint(1, 40) * 1e5), group=TP)
          for _ in range(2)]
    norm = MemorySpec(bytes=float(rnd.randint(1, 8) * 1e6))
    prev = {r: None for r in range(ranks)}
    sends: list = []
    for _ in range(rnd.randint(10, 40)):
        r = rnd.randrange(ranks)
        k = rnd.randrange(2)
        d = g.add("dgrad", dgrad[k], rank=r, deps=[prev[r]])
        a = g.add("dgrad_ar", ar[k], rank=r, stream="tp_comm", deps=[d])
        w = g.add("wgrad", wgrad[k], rank=r, deps=[d] if rnd.random() < 0.5 else [])
        nxt_deps = [a, w]
        if sends and rnd.random() < 0.4:  # a transfer from another rank lands here
            src = rnd.choice(sends)
            if g.ops[src].rank != r:
                recv = g.add("recv", ar[0], rank=r, stream="pp_recv", deps=[src])
                if rnd.random() < 0.5:
                    nxt_deps.append(recv)
        prev[r] = g.add("norm", norm, rank=r, deps=nxt_deps)
        if rnd.random() < 0.5:
            sends.append(g.add("send", ar[1], rank=r, stream="pp_send", deps=[rnd.choice([d, a, w])]))
    return g


@pytest.mark.parametrize("seed", range(80))
def test_forks_in_spans_equal_the_reference(seed):
    assert_equals_reference(fork_graph(seed))
