"""Every multi-process runtime case, run inside one process group per world size.

``run_all(rank, world)`` runs all cases in a fixed order on every rank and returns
``{case: (status, detail, value)}``; the pytest side (test_distributed.py) starts one
spawn per world size and turns each case into a test. Every rank generates every rank's
inputs from fixed seeds, so each rank computes the single-process reference locally.

Cases never choose a path by local results before a collective, so a wrong answer on one rank
is reported instead of desynchronising the group.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from spawned import run_cases

from ccoverlap.runtime import (
    ALL_SCHEDULES,
    ShapeMismatchError,
    all_gather_matmul,
    all_to_all_matmul,
    comm,
    matmul_reduce_scatter,
    partition,
    set_shape_check,
    tuning_cache,
)
from ccoverlap.runtime.layers import ParallelTransformerBlock, TransformerBlock, allreduce_sequence_parallel_grads

RTOL, ATOL = 1e-4, 1e-5
_CASES: list[tuple[str, object]] = []


def case(name):
    def deco(fn):
        _CASES.append((name, fn))
        return fn

    return deco


def case_names(world: int) -> list[str]:
    """The case names ``run_all`` reports for ``world`` ranks (known before running)."""
    return [name for name, fn in _expand(world)]


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shape {tuple(a.shape)} != reference {tuple(b.shape)}")
    if not torch.allclose(a, b, rtol=RTOL, atol=ATOL):
        err = (a - b).abs().max().item()
        raise AssertionError(f"{what}: max abs error {err:.3g} exceeds rtol={RTOL}, atol={ATOL}")


def gen(seed: int, *shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


# --------------------------------------------------------------------------- comm layer
def _comm_case(fallbacks):
    def run(rank, world):
        with comm.force_fallbacks(fallbacks) if fallbacks else _null():
            x = [gen(10 + j, 3, 4) for j in range(world)]
            out = torch.empty(world * 3, 4)
            comm.all_gather_into(out, x[rank]).wait()
            close(out, torch.cat(x), "all_gather_into")
            full = [gen(20 + j, world * 2, 5) for j in range(world)]
            rs = torch.empty(2, 5)
            comm.reduce_scatter_into(rs, full[rank]).wait()
            close(rs, sum(full)[rank * 2 : rank * 2 + 2], "reduce_scatter_into")
            # uneven all-to-all: rank i sends (i + j) % 3 rows to rank j
            rows = lambda i, j: (i + j) % 3  # noqa: E731
            data = {i: gen(30 + i, sum(rows(i, j) for j in range(world)), 2) for i in range(world)}
            ins = [rows(rank, j) for j in range(world)]
            outs = [rows(i, rank) for i in range(world)]
            recv = torch.empty(sum(outs), 2)
            comm.all_to_all_single(recv, data[rank], outs, ins).wait()
            expect = []
            for i in range(world):
                off = sum(rows(i, j) for j in range(rank))
                expect.append(data[i][off : off + rows(i, rank)])
            close(recv, torch.cat(expect), "all_to_all_single (uneven)")
            # ring exchange
            buf = torch.empty(3, 4)
            comm.exchange([((rank + 1) % world, x[rank])], [((rank - 1) % world, buf)], tag=3).wait()
            close(buf, x[(rank - 1) % world], "exchange")

    return run


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ---------------------------------------------------------------------- centauri partition
def _partition_primitives(rank, world):
    t = [gen(40 + j, 5, 3) for j in range(world)]
    close(partition.all_reduce_as_rs_ag(t[rank]), sum(t), "all_reduce_as_rs_ag (5x3, padded)")
    close(partition.all_gather_as_broadcasts(t[rank]), torch.cat(t), "all_gather_as_broadcasts")
    x = [gen(50 + j, world * 3, 2) for j in range(world)]
    close(partition.reduce_scatter_as_reduces(x[rank]), sum(x)[rank * 3 : rank * 3 + 3], "reduce_scatter_as_reduces")


def _partition_workload(chunks):
    def run(rank, world):
        t = [gen(60 + j, 7, 3) for j in range(world)]
        pa = partition.partitioned_all_gather(t[rank], chunks=chunks)
        pa.wait(0)
        close(pa.wait_all(), torch.cat(t), f"partitioned_all_gather chunks={chunks}")
        x = [gen(70 + j, world * 7, 2) for j in range(world)]
        pr = partition.partitioned_reduce_scatter(x[rank], chunks=chunks)
        close(pr.wait_all(), sum(x)[rank * 7 : rank * 7 + 7], f"partitioned_reduce_scatter chunks={chunks}")
        close(partition.partitioned_all_reduce(t[rank], chunks=chunks).wait_all(), sum(t), "partitioned_all_reduce")

    return run


def _partition_mesh(inter, intra, order):
    def run(rank, world):
        mesh = partition.make_mesh_2d(inter, intra)
        t = [gen(80 + j, 3, 2) for j in range(world)]
        close(partition.hierarchical_all_gather(t[rank], mesh, order), torch.cat(t), "hierarchical_all_gather")
        x = [gen(90 + j, world * 3, 2) for j in range(world)]
        close(
            partition.hierarchical_reduce_scatter(x[rank], mesh, order),
            sum(x)[rank * 3 : rank * 3 + 3],
            "hierarchical_reduce_scatter",
        )
        u = [gen(100 + j, 5, 3) for j in range(world)]
        close(partition.hierarchical_all_reduce(u[rank], mesh, order), sum(u), "hierarchical_all_reduce")

    return run


# ------------------------------------------------------------------------------ AG + GEMM
def _ag_case(schedule, m, mid, k, n, uneven_n):
    """all_gather_matmul vs single-process reference, output and gradients."""

    def run(rank, world):
        ns = [n + (j if uneven_n else 0) for j in range(world)]
        xs = [gen(1000 + j, m, *mid, k).requires_grad_() for j in range(world)]
        ws = [gen(2000 + j, ns[j], k).requires_grad_() for j in range(world)]
        gs = [gen(3000 + j, world * m, *mid, ns[j]) for j in range(world)]
        full = torch.cat(xs)
        loss = sum(((full @ ws[j].t()) * gs[j]).sum() for j in range(world))
        loss.backward()
        x = xs[rank].detach().clone().requires_grad_()
        w = ws[rank].detach().clone().requires_grad_()
        y = all_gather_matmul(x, w, schedule=schedule)
        close(y, (full @ ws[rank].t()).detach(), f"forward ({schedule})")
        (y * gs[rank]).sum().backward()
        close(x.grad, xs[rank].grad, f"dx ({schedule})")
        close(w.grad, ws[rank].grad, f"dW ({schedule})")

    return run


# ------------------------------------------------------------------------------ GEMM + RS
def _rs_case(schedule, m, mid, k, n, uneven_k):
    def run(rank, world):
        ks = [k + (j if uneven_k else 0) for j in range(world)]
        xs = [gen(4000 + j, world * m, *mid, ks[j]).requires_grad_() for j in range(world)]
        ws = [gen(5000 + j, n, ks[j]).requires_grad_() for j in range(world)]
        gs = [gen(6000 + j, m, *mid, n) for j in range(world)]
        z = sum(xs[j] @ ws[j].t() for j in range(world))
        loss = sum((z[j * m : (j + 1) * m] * gs[j]).sum() for j in range(world))
        loss.backward()
        x = xs[rank].detach().clone().requires_grad_()
        w = ws[rank].detach().clone().requires_grad_()
        y = matmul_reduce_scatter(x, w, schedule=schedule)
        close(y, z[rank * m : (rank + 1) * m].detach(), f"forward ({schedule})")
        (y * gs[rank]).sum().backward()
        close(x.grad, xs[rank].grad, f"dx ({schedule})")
        close(w.grad, ws[rank].grad, f"dW ({schedule})")

    return run


def _tune_consistent(rank, world):
    """Every rank cached the same decision for every tuned key."""
    decided = sorted(
        (repr(k[:4]), d.schedule) for k, d in tuning_cache().items() if k[1] == "tune"
    )  # (kind, mode, shapes...)
    if not decided:
        raise AssertionError("no tune decision was cached")
    mine = [decided]
    allv = [None] * world
    dist.all_gather_object(allv, mine)
    if any(v != allv[0] for v in allv):
        raise AssertionError(f"ranks cached different tune decisions: {allv}")
    return len(decided)


# ------------------------------------------------------------------------------ all-to-all
def _a2a_case(schedule, experts, num_chunks):
    def run(rank, world):
        k, n = 6, 5
        g = torch.Generator().manual_seed(7000)
        splits = {i: torch.randint(0, 4, (world * experts,), generator=g).tolist() for i in range(world)}
        splits[0][0] = 0  # an empty slice
        xs = [gen(7100 + i, sum(splits[i]), k).requires_grad_() for i in range(world)]
        wfull = [gen(7200 + j, experts, n, k).requires_grad_() for j in range(world)]
        gs = [gen(7300 + i, sum(splits[i]), n) for i in range(world)]
        ys = []
        for i in range(world):
            owner = torch.repeat_interleave(torch.arange(world * experts), torch.tensor(splits[i]))
            rows = [xs[i][t] @ wfull[int(o) // experts][int(o) % experts].t() for t, o in enumerate(owner.tolist())]
            ys.append(torch.stack(rows) if rows else torch.zeros(0, n))
        sum((ys[i] * gs[i]).sum() for i in range(world)).backward()
        x = xs[rank].detach().clone().requires_grad_()
        w = wfull[rank].detach().clone().requires_grad_()
        y = all_to_all_matmul(x, w, splits[rank], schedule=schedule, num_chunks=num_chunks)
        close(y, ys[rank].detach(), f"forward ({schedule})")
        (y * gs[rank]).sum().backward()
        close(x.grad, xs[rank].grad, "dx")
        close(w.grad, wfull[rank].grad, "dW")

    return run


# --------------------------------------------------------------------------- error cases
def _expect_error(fn, *needles):
    try:
        fn()
    except ShapeMismatchError as exc:
        msg = str(exc)
        for s in needles:
            if s not in msg:
                raise AssertionError(f"message lacks {s!r}: {msg}") from None
        return msg
    raise AssertionError("no ShapeMismatchError raised")


def _err_ag_rows(rank, world):
    m = 4 + (1 if rank == world - 1 else 0)
    msg = _expect_error(
        lambda: all_gather_matmul(torch.randn(m, 8), torch.randn(6, 8), schedule="ring", check_shapes="always"),
        "all_gather_matmul", "x_shard shape", f"rank {world - 1}: (5, 8)",
    )  # fmt: skip
    _group_still_works(rank, world)
    return msg


def _err_ag_k(rank, world):
    k_w = 7 if rank == 1 else 8
    msg = _expect_error(
        lambda: all_gather_matmul(torch.randn(4, 8), torch.randn(6, k_w), schedule="serial", check_shapes="always"),
        "rank 1", "does not match weight.shape[1]=7",
    )  # fmt: skip
    _group_still_works(rank, world)
    return msg


def _err_rs_rows(rank, world):
    msg = _expect_error(
        lambda: matmul_reduce_scatter(torch.randn(world * 2 + 1, 4), torch.randn(3, 4), check_shapes="always"),
        "not divisible by the",
    )
    _group_still_works(rank, world)
    return msg


def _err_schedule_mismatch(rank, world):
    sched = "ring" if rank == 0 else "serial"
    msg = _expect_error(
        lambda: all_gather_matmul(torch.randn(4, 8), torch.randn(6, 8), schedule=sched, check_shapes="always"),
        "schedule=",
    )
    _group_still_works(rank, world)
    return msg


def _err_a2a_splits(rank, world):
    splits = [1] * world
    t = world + (1 if rank == 0 else 0)
    msg = _expect_error(
        lambda: all_to_all_matmul(torch.randn(t, 4), torch.randn(1, 3, 4), splits, check_shapes="always"),
        "rank 0", "splits sum to",
    )
    _group_still_works(rank, world)
    return msg


def _err_first_policy(rank, world):
    """Default policy 'first': the first call on a fresh group is checked."""
    old = set_shape_check("first")
    try:
        grp = dist.new_group(list(range(world)))
        m = 3 if rank == 0 else 2
        msg = _expect_error(lambda: all_gather_matmul(torch.randn(m, 4), torch.randn(2, 4), grp), "x_shard shape")
        y = all_gather_matmul(torch.ones(2, 4), torch.ones(2, 4), grp, schedule="serial")  # unchecked now, legal
        close(y, torch.full((2 * world, 2), 4.0), "legal call after the error")
        return msg
    finally:
        set_shape_check(old)


def _third_call(change):
    """Two legal calls, then on the third call rank 1 alone changes its schedule / shape / engine / op.

    Under the default policy every rank must raise the same message within seconds (not
    garbage, not an abort, not a hang), and the group must stay usable.
    """

    def run(rank, world):
        import time

        old = set_shape_check("always")  # the default policy
        set_shape_check(old)
        x = gen(8200 + rank, 4, 8)
        w = gen(8300, 6, 8)
        for _ in range(2):
            y = all_gather_matmul(x, w, schedule="hetero-fused-1d")
            close(y, torch.cat([gen(8200 + j, 4, 8) for j in range(world)]) @ w.t(), "legal call")
        odd = rank == 1
        sched, shape, engine = "hetero-fused-1d", (4, 8), "sm"
        if change == "schedule" and odd:
            sched = "ring"
        if change == "shape" and odd:
            shape = (5, 8)
        if change == "engine" and odd:
            engine = "dma"
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if change == "op" and odd:
                call = lambda: matmul_reduce_scatter(gen(1, 2 * world, 8), w)  # noqa: E731
            else:
                call = lambda: all_gather_matmul(gen(1, *shape), w, schedule=sched, comm_engine=engine)  # noqa: E731
            needle = {"schedule": "schedule='ring' but rank 0 has 'hetero-fused-1d'",
                      "shape": "rank 1: (5, 8)", "engine": "comm_engine='dma' but rank 0 has 'sm'",
                      "op": "ranks are calling different distributed ops"}[change]  # fmt: skip
            msg = _expect_error(call, needle)
        took = time.perf_counter() - t0
        if took > 20:
            raise AssertionError(f"the error took {took:.1f}s")
        _group_still_works(rank, world)
        y = all_gather_matmul(x, w, schedule="ring")  # and the ops still work
        close(y, torch.cat([gen(8200 + j, 4, 8) for j in range(world)]) @ w.t(), "call after the error")
        return msg

    return run


def _err_cache_cleared_on_one_rank(rank, world):
    from ccoverlap.runtime import clear_tuning_cache

    x, w = gen(8400 + rank, 4, 8), gen(8401, 6, 8)
    all_gather_matmul(x, w, schedule="auto")
    if rank == 1:
        clear_tuning_cache()
    msg = _expect_error(lambda: all_gather_matmul(x, w, schedule="auto"), "auto/tune decision for this shape")
    clear_tuning_cache()  # now even on every rank
    _group_still_works(rank, world)
    return msg


def _tune_a2a(rank, world):
    """tune for all_to_all_matmul: the same pick on every rank, the right answer, measurements kept."""
    from ccoverlap.runtime import set_tune_options, tuning_cache
    from ccoverlap.runtime.expert import a2a_candidates

    old = set_tune_options(warmup=0, min_reps=2, max_reps=3, budget_s=5.0)
    try:
        e, k, n = 1, 8, 5
        splits = [3] * world
        xs = [gen(8500 + i, 3 * world, k) for i in range(world)]
        ws = [gen(8600 + j, e, n, k) for j in range(world)]
        y = all_to_all_matmul(xs[rank], ws[rank], splits, schedule="tune")
        ref = torch.cat([xs[rank][3 * j : 3 * j + 3] @ ws[j][0].t() for j in range(world)])
        close(y, ref, "a2a tune forward")
        decs = [d for kk, d in tuning_cache().items() if kk[0] == "a2a"]
        if len(decs) != 1:
            raise AssertionError(f"expected one a2a decision, got {len(decs)}")
        d = decs[0]
        if d.schedule not in a2a_candidates(world) or len(d.timings_s) != len(a2a_candidates(world)):
            raise AssertionError(f"bad decision {d}")
        if not all(len(smp) >= 2 for _c, smp in d.samples_s):
            raise AssertionError(f"too few samples: {d.samples_s}")
        allv = [None] * world
        dist.all_gather_object(allv, (d.schedule, d.rounds))
        if any(v != allv[0] for v in allv):
            raise AssertionError(f"ranks disagree: {allv}")
        return d.schedule
    finally:
        set_tune_options(**old.__dict__)


def _tune_cache_file(rank, world):
    """Decisions go to the cache file on rank 0 and come back from it (no timing the second time)."""
    import os
    import tempfile

    from ccoverlap.runtime import clear_tuning_cache, set_tune_cache_file, set_tune_options, tuning_cache

    box = [tempfile.mkdtemp(prefix="ccov-tune-") if rank == 0 else ""]
    dist.broadcast_object_list(box, src=0)
    path = os.path.join(box[0], "tune.json")
    old_opt = set_tune_options(warmup=0, min_reps=1, max_reps=2, budget_s=5.0)
    old_file = set_tune_cache_file(path)
    try:
        x, w = gen(8700 + rank, 6, 8), gen(8701, 5, 8)
        ref = torch.cat([gen(8700 + j, 6, 8) for j in range(world)]) @ w.t()
        with torch.no_grad():
            close(all_gather_matmul(x, w, schedule="tune"), ref, "tune (timed)")
        first = [d for kk, d in tuning_cache().items() if kk[0] == "ag" and kk[1] == "tune"][0]
        if first.rounds < 1:
            raise AssertionError("the first decision was not timed")
        clear_tuning_cache()
        with torch.no_grad():
            close(all_gather_matmul(x, w, schedule="tune"), ref, "tune (from file)")
        second = [d for kk, d in tuning_cache().items() if kk[0] == "ag" and kk[1] == "tune"][0]
        if second.schedule != first.schedule or "cache file" not in second.reason:
            raise AssertionError(f"not served from the file: {second}")
        return second.schedule
    finally:
        set_tune_cache_file(old_file)
        set_tune_options(**old_opt.__dict__)
        clear_tuning_cache()


def _batch_first(rank, world):
    """dim=1: batch-first [b, s/P, h] in, [b, s, n] out (and back), values and grads."""
    b, s, k, n = 2, 3 * world, 8, 6
    xfull = gen(8800, b, s, k).requires_grad_()
    w = gen(8801, n, k).requires_grad_()
    per = s // world
    y_ref = xfull @ w.t()
    g = gen(8802, b, s, n)
    (y_ref * g).sum().backward()
    x = xfull.detach()[:, rank * per : (rank + 1) * per].clone().requires_grad_()
    wl = w.detach().clone().requires_grad_()
    y = all_gather_matmul(x, wl, schedule="hetero-unfused-1d", dim=1)
    close(y, y_ref.detach(), "batch-first all_gather_matmul")
    (y * g).sum().backward()
    # every rank's loss uses the whole y, so the summed objective is world x the reference
    close(x.grad, world * xfull.grad[:, rank * per : (rank + 1) * per], "batch-first dx")
    close(wl.grad, w.grad, "batch-first dW")
    # reduce-scatter along the sequence dim of a [b, s, k_r] input
    xs = [gen(8810 + j, b, s, k) for j in range(world)]
    z = matmul_reduce_scatter(xs[rank], w.detach(), schedule="ring", dim=1)
    close(z, (sum(xs) @ w.detach().t())[:, rank * per : (rank + 1) * per], "batch-first matmul_reduce_scatter")


def _llama_parallelize_module(rank, world):
    """examples/llama_tp.py: torch's TP plan vs the same plan with ccoverlap's styles, 10 SGD steps."""
    import os
    import sys

    ex = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
    if ex not in sys.path:
        sys.path.insert(0, ex)
    import llama_tp

    res = llama_tp.run_rank(rank, world, 10)
    ref = llama_tp.reference(10)
    close(torch.tensor(res["torch"]), torch.tensor(ref), "torch TP losses vs single process")
    close(torch.tensor(res["ccoverlap"]), torch.tensor(ref), "ccoverlap TP losses vs single process")
    close(torch.tensor(res["ccoverlap"]), torch.tensor(res["torch"]), "ccoverlap TP losses vs torch TP")
    if not res["state_dict_keys_equal"] or res["state_dict_roundtrip_max_err"] != 0.0:
        raise AssertionError(f"state_dict not interchangeable with torch TP: {res}")
    return [round(v, 5) for v in res["ccoverlap"]]


def _pairwise_p2p(rank, world):
    """The per-pair p2p batches used on NCCL (one Work per piece), forced on gloo: same answers."""
    with comm.force_pairwise_p2p():
        for sched in ("hetero-unfused-1d", "hetero-fused-1d", "ring"):
            x = [gen(8900 + j, 5, 6) for j in range(world)]
            w = gen(8950, 4, 6)
            y = all_gather_matmul(x[rank], w, schedule=sched)
            close(y, torch.cat(x) @ w.t(), f"pairwise p2p ({sched})")
            z = matmul_reduce_scatter(torch.cat(x)[: 4 * world], w, schedule=sched)
            close(z, (world * (torch.cat(x)[: 4 * world] @ w.t()))[rank * 4 : rank * 4 + 4], f"pairwise rs ({sched})")


def _group_still_works(rank, world):
    t = torch.ones(1)
    dist.all_reduce(t)
    if t.item() != world:
        raise AssertionError("process group unusable after the error")


def _dma_falls_back(rank, world):
    x = [gen(8000 + j, 4, 6) for j in range(world)]
    w = gen(8100 + rank, 3, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = all_gather_matmul(x[rank], w, schedule="ring", comm_engine="dma")
    close(y, torch.cat(x) @ w.t(), "dma fallback forward")


# ------------------------------------------------------------------- transformer training
def _train_case(schedule):
    def run(rank, world):
        s, b, h, heads, ffn, steps, lr = 12, 2, 16, 4, 32, 4, 0.05
        torch.manual_seed(1234)
        ref = TransformerBlock(h, heads, ffn)
        par = ParallelTransformerBlock.from_reference(ref, schedule=schedule)
        x = gen(9000, s, b, h)
        target = gen(9001, s, b, h)
        per = s // world
        xs, ts = x[rank * per : (rank + 1) * per], target[rank * per : (rank + 1) * per]
        opt_ref = torch.optim.SGD(ref.parameters(), lr=lr)
        opt_par = torch.optim.SGD(par.parameters(), lr=lr)
        ref_losses, par_losses = [], []
        for _ in range(steps):
            opt_ref.zero_grad()
            loss = ((ref(x) - target) ** 2).sum() / x.numel()
            loss.backward()
            opt_ref.step()
            ref_losses.append(loss.item())
            opt_par.zero_grad()
            local = ((par(xs) - ts) ** 2).sum() / x.numel()
            local.backward()
            allreduce_sequence_parallel_grads(par)
            opt_par.step()
            tot = local.detach().clone()
            dist.all_reduce(tot)
            par_losses.append(tot.item())
        close(torch.tensor(par_losses), torch.tensor(ref_losses), f"losses ({schedule})")
        if not ref_losses[-1] < ref_losses[0]:
            raise AssertionError(f"reference loss did not decrease: {ref_losses}")
        return par_losses

    return run


# ---------------------------------------------------------------------------- registry
def _expand(world: int):
    cases = [
        ("comm/native", _comm_case(None)),
        ("comm/fallback-all", _comm_case(["all_gather", "reduce_scatter", "all_to_all", "batch_p2p"])),
        ("comm/fallback-allreduce-slice", _comm_case(["reduce_scatter", "reduce_scatter_list"])),
        ("partition/primitives", _partition_primitives),
        ("partition/workload-3", _partition_workload(3)),
        ("partition/workload-fractions", _partition_workload([0.25, 0.75])),
    ]
    meshes = [(1, world), (world, 1)] + ([(2, world // 2)] if world >= 4 else [])
    for inter, intra in meshes:
        for order in ("intra_first", "inter_first"):
            cases.append((f"partition/mesh-{inter}x{intra}-{order}", _partition_mesh(inter, intra, order)))
    ag_shapes = [
        ("even", 8, (), 16, 8, False),
        ("uneven-rows", 5, (), 7, 6, False),
        ("rows-lt-ranks", 1, (), 5, 4, False),
        ("3d", 3, (2,), 6, 5, False),
        ("k-lt-ranks", 6, (), 3, 4, False),
        ("uneven-n-per-rank", 5, (), 6, 3, True),
    ]
    for sched in ALL_SCHEDULES:
        for label, m, mid, k, n, uneven in ag_shapes:
            if uneven and sched in ("auto", "tune"):
                continue  # auto/tune need equal weights on every rank (checked)
            cases.append((f"ag/{sched}/{label}", _ag_case(sched, m, mid, k, n, uneven)))
    rs_shapes = [
        ("even", 4, (), 16, 8, False),
        ("uneven-rows", 5, (), 7, 6, False),
        ("3d", 3, (2,), 6, 5, False),
        ("n-lt-ranks", 3, (), 6, 3, False),
        ("uneven-k-per-rank", 5, (), 6, 4, True),
    ]
    for sched in ALL_SCHEDULES:
        for label, m, mid, k, n, uneven in rs_shapes:
            if uneven and sched in ("auto", "tune"):
                continue
            cases.append((f"rs/{sched}/{label}", _rs_case(sched, m, mid, k, n, uneven)))
    cases.append(("tune/consistent", _tune_consistent))
    cases.append(("ag/dma-falls-back-on-cpu", _dma_falls_back))
    for sched, e, c in [("serial", 1, None), ("chunked", 1, None), ("chunked", 2, 3), ("auto", 2, None)]:
        cases.append((f"a2a/{sched}/E{e}-chunks{c}", _a2a_case(sched, e, c)))
    cases += [
        ("error/ag-rows-differ", _err_ag_rows),
        ("error/ag-k-mismatch-one-rank", _err_ag_k),
        ("error/rs-rows-not-divisible", _err_rs_rows),
        ("error/schedule-differs", _err_schedule_mismatch),
        ("error/a2a-splits", _err_a2a_splits),
        ("error/first-policy", _err_first_policy),
        ("error/third-call-schedule", _third_call("schedule")),
        ("error/third-call-shape", _third_call("shape")),
        ("error/third-call-engine", _third_call("engine")),
        ("error/third-call-op", _third_call("op")),
        ("error/tune-cache-cleared-on-one-rank", _err_cache_cleared_on_one_rank),
        ("tune/a2a", _tune_a2a),
        ("tune/cache-file", _tune_cache_file),
        ("ag/batch-first", _batch_first),
        ("comm/pairwise-p2p", _pairwise_p2p),
        ("train/llama-parallelize-module", _llama_parallelize_module),
    ]
    for sched in ("serial", "ring", "uniform-fused-1d", "hetero-fused-1d", "hetero-unfused-1d", "uniform-fused-2d", "auto"):
        cases.append((f"train/{sched}", _train_case(sched)))
    return cases


def run_all(rank: int, world: int) -> dict[str, tuple[str, str, object]]:
    """Run every case on this rank; ``{name: ("ok"|"fail", detail, value)}``."""
    from ccoverlap.runtime import set_tune_options

    set_tune_options(warmup=1, min_reps=2, max_reps=4, budget_s=2.0)  # tiny shapes: keep tests fast
    return run_cases(_expand(world), rank, world)
