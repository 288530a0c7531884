"""Rank-block views and the GEMMs that read and write them in place (ccoverlap.runtime.blocks), one process."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerActivity, profile  # noqa: E402

from ccoverlap.runtime.blocks import (  # noqa: E402
    gemm_operand,
    mm_blocks,
    mm_into,
    rank_blocks,
    strided_bmm,
    weight_grad,
)

P = 3


def _natural(shape_full, dim, dtype=torch.float32, seed=0):
    t = torch.randn(*shape_full, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return t, rank_blocks(t, dim, P)


def _copied_elements(fn) -> int:
    """Elements ``fn`` copies (``aten::copy_``), less the no-op self-copy an in-place ``baddbmm_`` records."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return sum(math.prod(e.input_shapes[0]) for e in prof.events() if e.name == "aten::copy_" and e.input_shapes
               and not (e.cpu_parent is not None and e.cpu_parent.name == "aten::baddbmm_"))  # fmt: skip


@pytest.mark.parametrize("shape,dim", [((6, 5), 0), ((6, 4, 5), 0), ((2, 6, 5), 1), ((2, 3, 6, 2, 5), 2)])
def test_rank_blocks_are_views_of_each_ranks_rows(shape, dim):
    t, t4 = _natural(shape, dim)
    assert t4.data_ptr() == t.data_ptr()
    m = shape[dim] // P
    b, r = math.prod(shape[:dim]), m * math.prod(shape[dim + 1 : -1])
    assert t4.shape == (P, b, r, shape[-1])
    for j in range(P):
        assert torch.equal(t4[j].reshape(-1, shape[-1]), t.narrow(dim, j * m, m).reshape(-1, shape[-1]))
    assert t4.is_contiguous() == (b == 1)


def _layouts(b, r, c, dtype, seed):
    """The same [P, B, R, c] values rank-major (contiguous) and natural (a transposed view)."""
    rm = torch.randn(P, b, r, c, generator=torch.Generator().manual_seed(seed)).to(dtype)
    nat = rm.transpose(0, 1).contiguous().transpose(0, 1)
    return {"rank-major": rm, "natural": nat}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("src", ["rank-major", "natural"])
@pytest.mark.parametrize("dst", ["rank-major", "natural"])
def test_mm_blocks_any_layouts(dtype, accumulate, src, dst):
    b, r, k, n = 4, 5, 3, 7
    a4 = _layouts(b, r, k, dtype, 1)[src]
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(2)).to(dtype)
    out4 = _layouts(b, r, n, dtype, 3)[dst]
    before = out4.clone()
    ptr = out4.data_ptr()
    mm_blocks(a4, w.t(), out4, accumulate=accumulate)
    ref = a4.double() @ w.double().t() + (before.double() if accumulate else 0)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-6
    assert out4.data_ptr() == ptr
    assert float((out4.double() - ref).abs().max() / ref.abs().max()) <= tol


@pytest.mark.parametrize("accumulate", [False, True])
def test_mm_into_strided_float32_moves_nothing(accumulate):
    """float32 on CPU: one batched GEMM reads or writes strided blocks with no copy (the point of the module)."""
    assert strided_bmm(torch.empty(0)) and not strided_bmm(torch.empty(0, dtype=torch.bfloat16))
    b, r, k, n = 4, 16, 8, 32
    a4 = _layouts(b, r, k, torch.float32, 1)["natural"]
    out4 = _layouts(b, r, n, torch.float32, 3)["natural"]
    w = torch.randn(n, k)
    for j in range(P):
        a_c, out_c = a4[j].contiguous(), torch.zeros(b, r, n)
        before = out4[j].clone()
        assert _copied_elements(lambda: mm_into(a_c, w.t(), out4[j], accumulate)) == 0  # strided output
        assert _copied_elements(lambda: mm_into(a4[j], w.t(), out_c, accumulate)) == 0  # strided input
        ref = a_c @ w.t()
        assert torch.allclose(out4[j], ref + before if accumulate else ref, atol=1e-5)
        assert torch.allclose(out_c, ref, atol=1e-5)


@pytest.mark.parametrize("dy_layout", ["rank-major", "natural"])
@pytest.mark.parametrize("x_layout", ["rank-major", "natural"])
@pytest.mark.parametrize("n,k", [(3, 9), (9, 3)])
@pytest.mark.parametrize("r", [5, 12])
def test_weight_grad_any_layouts(dy_layout, x_layout, n, k, r):
    b = 4
    dy4 = _layouts(b, r, n, torch.float64, 1)[dy_layout]
    x4 = _layouts(b, r, k, torch.float64, 2)[x_layout]
    ref = dy4.reshape(-1, n).t() @ x4.reshape(-1, k)
    got = weight_grad(dy4, x4)
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    copied = _copied_elements(lambda: weight_grad(dy4, x4))
    if dy_layout == x_layout or max(n, k) < r:  # one GEMM, or per batch entry and summed
        assert copied == 0
    else:  # the narrower of the two is re-laid, never the wider
        assert copied == P * b * r * min(n, k)


def test_weight_grad_bfloat16_re_lays_the_narrower():
    """CPU bfloat16: batched GEMMs would copy strided blocks themselves, so the narrower operand is re-laid."""
    b, r, n, k = 4, 12, 3, 9
    dy4 = _layouts(b, r, n, torch.bfloat16, 1)["rank-major"]
    x4 = _layouts(b, r, k, torch.bfloat16, 2)["natural"]
    ref = dy4.double().reshape(-1, n).t() @ x4.double().reshape(-1, k)
    got = weight_grad(dy4, x4)
    assert float((got.double() - ref).abs().max() / ref.abs().max()) <= 2e-2
    assert _copied_elements(lambda: weight_grad(dy4, x4)) == P * b * r * n


def test_gemm_operand_keeps_strided_blocks_only_where_bmm_reads_them():
    nat32 = _layouts(4, 5, 3, torch.float32, 1)["natural"]
    assert gemm_operand(nat32) is nat32
    nat16 = _layouts(4, 5, 3, torch.bfloat16, 1)["natural"]
    rm = gemm_operand(nat16)
    assert rm.is_contiguous() and torch.equal(rm, nat16)
