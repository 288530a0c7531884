"""Single-process pieces of the runtime: piece sizes, fallback switches, policies, machine table,
and the one-rank path of every op (spawned, world size 1)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ccoverlap.runtime import checks, comm  # noqa: E402
from ccoverlap.runtime.machine import CPU_DEFAULT, GPU_TABLE, MachineSpec, machine_for  # noqa: E402
from ccoverlap.runtime.partition import chunk_sizes  # noqa: E402
from ccoverlap.runtime.schedules import _pieces, split_sizes  # noqa: E402


@pytest.mark.parametrize("total,parts", [(5, 2), (7, 4), (1, 4), (0, 3), (12, 4)])
def test_split_sizes_match_tensor_split(total, parts):
    expect = [len(t) for t in torch.tensor_split(torch.arange(total), parts)]
    assert split_sizes(total, parts) == expect
    pieces = _pieces(total, parts)
    assert sum(s for _, s in pieces) == total and all(s > 0 for _, s in pieces)
    assert [o for o, _ in pieces] == [sum(expect[:i]) for i, s in enumerate(expect) if s]


def test_chunk_sizes_fractions_follow_centauri_granularity():
    assert chunk_sizes(10, 3) == [4, 3, 3]
    assert chunk_sizes(8, [0.25, 0.75]) == [2, 6]  # Algorithm 1: [inter/world, 1 - inter/world]
    assert sum(chunk_sizes(7, [1, 1, 1])) == 7
    with pytest.raises(ValueError):
        chunk_sizes(4, [0, 0])
    with pytest.raises(ValueError):
        chunk_sizes(4, 0)


def test_force_fallbacks_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown names"):
        comm.force_fallbacks(["all_gather", "warp_drive"])


def test_shape_check_policy():
    old = checks.get_shape_check()
    try:
        assert checks.set_shape_check("never") == old
        assert checks.get_shape_check() == "never"
        with pytest.raises(ValueError):
            checks.set_shape_check("sometimes")
    finally:
        checks.set_shape_check(old)


def test_machine_table():
    assert machine_for(torch.device("cpu")) is CPU_DEFAULT
    h100 = GPU_TABLE["H100"]
    assert h100.peak_flops(torch.bfloat16) == pytest.approx(989.4e12)
    for spec in GPU_TABLE.values():
        assert spec.source
        assert spec.peak_flops_bf16 >= spec.peak_flops_tf32 >= spec.peak_flops_fp32
    with pytest.raises(ValueError):
        MachineSpec(name="x", peak_flops_bf16=0, peak_flops_tf32=1, peak_flops_fp32=1, mem_bw_bytes_per_s=1, source="")


def _one_rank(rank, world):
    from ccoverlap.runtime import ALL_SCHEDULES, all_gather_matmul, all_to_all_matmul, matmul_reduce_scatter
    from ccoverlap.runtime.tuning import resolve

    out = []
    x, w = torch.randn(5, 4), torch.randn(3, 4)
    for s in ALL_SCHEDULES:
        y1 = all_gather_matmul(x, w, schedule=s)
        y2 = matmul_reduce_scatter(x, w, schedule=s)
        out.append(bool(torch.allclose(y1, x @ w.t()) and torch.allclose(y2, x @ w.t())))
    e = torch.randn(2, 3, 4)
    y3 = all_to_all_matmul(x, e, [2, 3])
    out.append(bool(torch.allclose(y3, torch.cat([x[:2] @ e[0].t(), x[2:] @ e[1].t()]))))
    out.append(resolve("ag", x, w.t(), None, "auto").schedule)
    return out


@pytest.mark.timeout(120)
def test_every_op_on_one_rank():
    from ccoverlap.runtime.launch import spawn

    res = spawn(_one_rank, 1, timeout_s=100)[0]
    assert all(res[:-1]), res
    assert res[-1] == "serial"


def test_agreed_engine_falls_back_on_every_rank_unless_all_can_use_dma():
    from ccoverlap.runtime.ops import COMM_ENGINES, agreed_engine

    sm, dma = COMM_ENGINES.index("sm"), COMM_ENGINES.index("dma")
    assert agreed_engine([sm, sm], [0, 0])[0] == "sm"
    assert agreed_engine([dma, dma], [1, 1])[0] == "dma"
    engine, why = agreed_engine([dma, dma, dma], [1, 0, 1])
    assert engine == "sm" and "rank(s) [1]" in why


def test_tune_options_validate():
    import pytest

    from ccoverlap.runtime import get_tune_options, set_tune_options

    before = get_tune_options()
    with pytest.raises(ValueError):
        set_tune_options(min_reps=5, max_reps=2)
    assert get_tune_options() == before


def test_symmetric_buffer_pool_grows_one_buffer_per_key_instead_of_one_per_shape():
    from ccoverlap.runtime.cuda import BufferPool

    made = []

    def alloc(nbytes):
        made.append(nbytes)
        return bytearray(nbytes), f"handle{len(made)}"

    pool = BufferPool(alloc)
    key = ("group", 0)
    for nbytes in (100, 50, 100, 80):  # smaller or equal sizes reuse the buffer
        pool.get(key, nbytes)
    assert made == [100] and len(pool) == 1
    buf, hdl = pool.get(key, 300)  # a bigger shape grows it (one re-rendezvous)
    assert made == [100, 300] and len(buf) == 300 and hdl == "handle2" and len(pool) == 1
    pool.drop(key)
    pool.get(key, 10)
    assert made == [100, 300, 10]


def test_column_blocks_are_contiguous_and_cover_the_shard():
    import torch

    from ccoverlap.runtime.cuda import col_block_offsets

    m, k, p = 3, 7, 3
    shard = torch.arange(m * k, dtype=torch.float32).view(m, k)
    flat = torch.empty(m * k)
    for off, sz, start in col_block_offsets(m, k, p):  # how the transport writes the buffer
        flat[start : start + m * sz].view(m, sz).copy_(shard[:, off : off + sz])
    for off, sz, start in col_block_offsets(m, k, p):  # how a peer reads one block: one contiguous range
        block = flat[m * off : m * (off + sz)].view(m, sz)
        assert block.is_contiguous() and torch.equal(block, shard[:, off : off + sz])
    assert sum(sz for _, sz, _ in col_block_offsets(m, k, p)) == k


def test_dma_is_unavailable_on_cpu_with_a_reason():
    import torch

    from ccoverlap.runtime.cuda import dma_available

    ok, why = dma_available(torch.zeros(2, 2), None)
    assert not ok and "CUDA" in why


def test_check_fingerprint_is_stable_and_separates_descriptors():
    from ccoverlap.runtime.checks import _fingerprint

    row = [12345, 2, 5, 1, 2, 4, 8, -1, -1, -1, -1, -1, -1, 0, 3, 1]
    assert _fingerprint(row) == _fingerprint(list(row))
    assert -(2**63) <= _fingerprint(row) < 2**63
    for i in range(len(row)):  # any one field changed -> another fingerprint
        other = list(row)
        other[i] += 1
        assert _fingerprint(other) != _fingerprint(row)
