"""Multi-process cases of the overlapped ops on batch-first inputs (sharded along dim 1 or 2).

``run_all(rank, world)`` runs every case on every rank in a fixed order and returns
``{case: (status, detail, value)}``; ``test_runtime_layout.py`` spawns one gloo group per
world size (2 and 4) and turns each case into a test.

* ``value/...``: :func:`all_gather_matmul` and :func:`matmul_reduce_scatter` with ``dim=1``
  or ``dim=2`` against a single-process float64 reference (outputs and both gradients) and
  against the same op on the same data laid out along dim 0 (``dim=0``), for every
  schedule, in float32 and bfloat16.
* ``copies/...``: ``torch.profiler`` counts every ``aten::copy_`` of a forward + backward on a
  shape whose one side is much wider than the other; no copy may be as large as one rank's
  block of the wide side (the layout copies these paths no longer make), and all copies
  together must stay below it; the same for two column-parallel projections on one shared
  gather (:mod:`ccoverlap.runtime.shared_gather`), whose outputs are assembled in place.

Every rank builds every rank's inputs from fixed seeds, so each computes the reference
locally; no case decides on a local result before a collective.
"""

from __future__ import annotations

import math

import torch
from spawned import run_cases
from torch.profiler import ProfilerActivity, profile

from ccoverlap.runtime import ALL_SCHEDULES, all_gather_matmul, matmul_reduce_scatter

#: Relative error (max abs error / max abs reference) allowed against the float64 reference.
REF_TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
#: Allowed between the batch-first path and the dim-0 path on the same data: the same math in fp32.
SAME_TOL = {torch.float32: 1e-6, torch.bfloat16: 2e-2}


def gen(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def rel_err(a: torch.Tensor, b: torch.Tensor, what: str) -> float:
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}")
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def expect(a: torch.Tensor, b: torch.Tensor, tol: float, what: str) -> float:
    e = rel_err(a, b, what)
    if not e <= tol:
        raise AssertionError(f"{what}: relative error {e:.3g} > {tol:g}")
    return e


def _shard_shape(dim: int, m: int, k: int) -> tuple[int, ...]:
    """A shard with ``m`` rows along ``dim``: ``[3, m, k]`` (dim 1) or ``[2, 3, m, k]`` (dim 2)."""
    return (3, m, k) if dim == 1 else (2, 3, m, k)


def _run(op, x, w, g, schedule, dim):
    """Forward + backward of ``op``; ``(y, dx, dW)``."""
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    y = op(x, w, schedule=schedule, dim=dim)
    (y * g).sum().backward()
    return y.detach(), x.grad, w.grad


def _rows_per_rank(dim: int) -> int:
    """8 rows per rank along dim 1 (more than the widths: the weight gradient is summed per batch entry when
    batched GEMMs read strided blocks), 2 along dim 2 (fewer: the narrower operand is re-laid)."""
    return 8 if dim == 1 else 2


def _ag_value(schedule: str, dtype, dim: int):
    """all_gather_matmul along ``dim`` = the float64 reference = the dim-0 path on the same data."""

    def run(rank, world):
        m, k, n = _rows_per_rank(dim), 5, 7
        xs = [gen(100 + j, *_shard_shape(dim, m, k)) for j in range(world)]
        ws = [gen(200 + j, n, k) for j in range(world)]
        full = torch.cat(xs, dim)
        gs = [gen(300 + j, *full.shape[:-1], n) for j in range(world)]
        x64 = [x.double().requires_grad_() for x in xs]
        w64 = [w.double().requires_grad_() for w in ws]
        sum(((torch.cat(x64, dim) @ w64[j].t()) * gs[j].double()).sum() for j in range(world)).backward()
        ref = (full.double() @ ws[rank].double().t(), x64[rank].grad, w64[rank].grad)
        x, w, g = xs[rank].to(dtype), ws[rank].to(dtype), gs[rank].to(dtype)
        got = _run(all_gather_matmul, x, w, g, schedule, dim)
        # dim 0: the same rows with the sharded dim moved to the front
        y0, dx0, dw0 = _run(all_gather_matmul, x.movedim(dim, 0).contiguous(), w, g.movedim(dim, 0).contiguous(),
                            schedule, 0)  # fmt: skip
        alt = (y0.movedim(0, dim), dx0.movedim(0, dim), dw0)
        return _compare(got, ref, alt, dtype, schedule)

    return run


def _rs_value(schedule: str, dtype, dim: int):
    """matmul_reduce_scatter along ``dim`` = the float64 reference = the dim-0 path on the same data."""

    def run(rank, world):
        m, k, n = _rows_per_rank(dim), 6, 5
        shard = _shard_shape(dim, m, k)
        full_shape = (*shard[:dim], world * m, k)
        xs = [gen(400 + j, *full_shape) for j in range(world)]
        ws = [gen(500 + j, n, k) for j in range(world)]
        gs = [gen(600 + j, *shard[:-1], n) for j in range(world)]
        x64 = [x.double().requires_grad_() for x in xs]
        w64 = [w.double().requires_grad_() for w in ws]
        z = sum(x64[j] @ w64[j].t() for j in range(world))
        sum((z.narrow(dim, j * m, m) * gs[j].double()).sum() for j in range(world)).backward()
        ref = (z.narrow(dim, rank * m, m).detach(), x64[rank].grad, w64[rank].grad)
        x, w, g = xs[rank].to(dtype), ws[rank].to(dtype), gs[rank].to(dtype)
        got = _run(matmul_reduce_scatter, x, w, g, schedule, dim)
        y0, dx0, dw0 = _run(matmul_reduce_scatter, x.movedim(dim, 0).contiguous(), w,
                            g.movedim(dim, 0).contiguous(), schedule, 0)  # fmt: skip
        alt = (y0.movedim(0, dim), dx0.movedim(0, dim), dw0)
        return _compare(got, ref, alt, dtype, schedule)

    return run


def _compare(got, ref, alt, dtype, schedule) -> list[float]:
    """Each of (output, dx, dW) against the float64 reference and the dim-0 path; the errors."""
    errs = []
    for name, a, r, b in zip(("output", "dx", "dW"), got, ref, alt):
        errs.append(expect(a, r, REF_TOL[dtype], f"{schedule} {dtype} {name} vs float64 reference"))
        errs.append(expect(a, b, SAME_TOL[dtype], f"{schedule} {dtype} {name} vs the dim-0 path"))
    return [round(e, 9) for e in errs]


# ------------------------------------------------------------------------------ copy counting
def _copies(fn) -> list[int]:
    """The element count of every ``aten::copy_`` ``fn`` makes on this rank (every thread)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [math.prod(e.input_shapes[0]) for e in prof.events() if e.name == "aten::copy_" and e.input_shapes]


def _no_wide_copy(op: str, schedule: str):
    """Forward + backward on a batch-first shard: no copy of one rank's block of the wide side.

    ``ag`` (the lm-head shape): output 48x wider than the input, so a copy of one block of
    the output (or of ``dy``) would be the largest copy; ``rs`` (the wo/w2 shape): input
    48x wider than the output, so a copy of one block of ``x`` (or of ``dx``) would be.
    """

    def run(rank, world):
        b, m, narrow, wide = 4, 8, 2, 96
        if op == "ag":
            x, w = gen(700 + rank, b, m, narrow), gen(800 + rank, wide, narrow)
            fn = all_gather_matmul
        else:
            x, w = gen(700 + rank, b, world * m, wide), gen(800 + rank, narrow, wide)
            fn = matmul_reduce_scatter
        block = b * m * wide  # one rank's block of the wide side

        def step(xr, wr):
            y = fn(xr, wr, schedule=schedule, dim=1)
            y.backward(torch.ones_like(y))

        step(x.clone().requires_grad_(), w.clone().requires_grad_())  # warm-up: first-call work stays out
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        sizes = _copies(lambda: step(xr, wr))
        if max(sizes, default=0) >= block or sum(sizes) >= block:
            raise AssertionError(f"{op} {schedule}: copies of {sorted(sizes, reverse=True)[:6]} elements "
                                 f"(largest {max(sizes)}, total {sum(sizes)}); one block of the wide side is {block}")  # fmt: skip
        return max(sizes, default=0)

    return run


def _no_wide_copy_shared_gather(rank, world):
    """Two column-parallel projections on one shared gather (our PrepareModuleInput + ColwiseParallel), outputs 48x
    wider than the input: forward + backward copies no block of an output."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from ccoverlap.runtime.tp import ColwiseParallel, PrepareModuleInput

    class TwoProjections(nn.Module):
        def __init__(self, hidden: int, n: int) -> None:
            super().__init__()
            self.wa, self.wb = nn.Linear(hidden, n, bias=False), nn.Linear(hidden, n, bias=False)

        def forward(self, x):
            return self.wa(x) * self.wb(x)

    b, m, hidden, n_local = 4, 8, 2, 96
    torch.manual_seed(0)
    mod = TwoProjections(hidden, n_local * world)
    plan = {"": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "wa": ColwiseParallel(schedule="serial"), "wb": ColwiseParallel(schedule="serial")}  # fmt: skip
    parallelize_module(mod, init_device_mesh("cpu", (world,)), plan)
    x = gen(900 + rank, b, m, hidden)
    block = b * m * n_local  # one rank's rows of one projection's output

    def step(xr):
        y = mod(xr)
        y.backward(torch.ones_like(y))

    step(x.clone().requires_grad_())
    xr = x.clone().requires_grad_()
    sizes = _copies(lambda: step(xr))
    if max(sizes, default=0) >= block:
        raise AssertionError(f"shared gather: copies of {sorted(sizes, reverse=True)[:6]} elements; one block of an "
                             f"output is {block}")  # fmt: skip
    return max(sizes, default=0)


# ------------------------------------------------------------------------------------ registry
def _cases():
    cases = []
    scheds = [s for s in ALL_SCHEDULES if s not in ("auto", "tune")]
    for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for sched in scheds:
            cases.append((f"value/ag/{sched}/dim1-{tag}", _ag_value(sched, dtype, 1)))
            cases.append((f"value/rs/{sched}/dim1-{tag}", _rs_value(sched, dtype, 1)))
    for sched in ("serial", "ring"):
        cases.append((f"value/ag/{sched}/dim2-fp32", _ag_value(sched, torch.float32, 2)))
        cases.append((f"value/rs/{sched}/dim2-fp32", _rs_value(sched, torch.float32, 2)))
    for op in ("ag", "rs"):
        for sched in ("serial", "ring"):
            cases.append((f"copies/{op}/{sched}", _no_wide_copy(op, sched)))
    cases.append(("copies/shared-gather", _no_wide_copy_shared_gather))
    return cases


CASES = _cases()


def run_all(rank: int, world: int) -> dict[str, tuple[str, str, object]]:
    """Run every case of ``CASES`` on this rank; ``{name: ("ok"|"fail", detail, value)}``."""
    return run_cases(CASES, rank, world)
