"""Multi-process cases of ccoverlap's ParallelStyles against torch's, run inside one process group per world size.

``run_all(rank, world)`` runs every case on every rank in a fixed order and returns
``{case: (status, detail, value)}``; ``test_runtime_tp.py`` spawns one group per world size
(2 and 4 gloo ranks) and turns each case into a test. Every model is built from the same
full weights (``load_full_state_dict``) once with torch's styles and once with ours (the
plan dict is the same, only the style classes differ), and most cases also against one
process holding the whole model. No case decides on a local result before a collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from spawned import run_cases
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import SequenceParallel, loss_parallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

from ccoverlap.runtime import ShapeMismatchError, all_gather_matmul, clear_tuning_cache
from ccoverlap.runtime.llama import Block, Llama, block_plan, model_plan, style_classes
from ccoverlap.runtime.shared_gather import gather_input
from ccoverlap.runtime.tp import full_state_dict, load_full_state_dict

REL_FP32 = 2e-5
STEPS = 5
B, S, DIM, HEADS, FFN = 2, 8, 16, 4, 32
_MESH = {}


def mesh_for(world: int):
    if world not in _MESH:
        _MESH[world] = init_device_mesh("cpu", (world,))
    return _MESH[world]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        raise AssertionError(f"shape {tuple(a.shape)} != {tuple(b.shape)}")
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def expect_close(a, b, what: str, tol: float = REL_FP32) -> float:
    e = rel_err(a, b)
    if not e <= tol:
        raise AssertionError(f"{what}: relative error {e:.3g} > {tol:g}")
    return e


def gen(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def shard_seq(t: torch.Tensor, rank: int, world: int, dim: int = 1) -> torch.Tensor:
    per = t.shape[dim] // world
    return t.narrow(dim, rank * per, per).contiguous()


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def parallel(module: nn.Module, plan: dict, world: int, full: dict) -> nn.Module:
    parallelize_module(module, mesh_for(world), plan)
    load_full_state_dict(module, full)
    return module


# ------------------------------------------------------------------------- block, 5 AdamW steps
def _train_block(mod: nn.Module, x: torch.Tensor, target: torch.Tensor, steps: int = STEPS, world: int = 1):
    """``steps`` AdamW steps of a squared-error loss on (a shard of) the sequence; losses summed over ranks."""
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        xin = x.detach().clone().requires_grad_()
        y = local(mod(xin))
        loss = ((y - target) ** 2).sum() / (B * S * DIM)
        loss.backward()
        opt.step()
        tot = loss.detach().clone()
        if world > 1:
            dist.all_reduce(tot)
        losses.append(tot)
    return torch.stack(losses), xin.grad, y.detach()


def _block_vs_torch(rank, world, dtype=torch.float32, wrap=None):
    torch.manual_seed(0)
    full = {k: v.to(dtype) for k, v in Block(DIM, HEADS, FFN).state_dict().items()}
    x, target = gen(1, B, S, DIM).to(dtype), gen(2, B, S, DIM).to(dtype)
    xs, ts = shard_seq(x, rank, world), shard_seq(target, rank, world)
    out = {}
    for styles in ("torch", "ccoverlap"):
        mod = parallel(Block(DIM, HEADS, FFN).to(dtype), block_plan(styles), world, full)
        if wrap is not None:
            mod = wrap(mod)
        losses, gx, y = _train_block(mod, xs, ts, world=world)
        out[styles] = (losses, gx, y, full_state_dict(mod))
    return out, x, target, full


def _block_fp32(rank, world):
    """fp32: ours equals torch's styles and one process, over 5 AdamW steps (losses, last output, input grad, weights)."""
    out, x, target, full = _block_vs_torch(rank, world)
    ref = Block(DIM, HEADS, FFN)
    ref.load_state_dict(full)
    ref_losses, ref_gx, ref_y = _train_block(ref, x, target)
    worst = 0.0
    for styles in ("torch", "ccoverlap"):
        losses, gx, y, sd = out[styles]
        worst = max(worst, expect_close(losses, ref_losses, f"{styles} losses vs one process", 1e-4))
    losses, gx, y, sd = out["ccoverlap"]
    t_losses, t_gx, t_y, t_sd = out["torch"]
    worst = max(worst, expect_close(losses, t_losses, "losses vs torch"), expect_close(y, t_y, "output vs torch"),
                expect_close(gx, t_gx, "input grad vs torch"), expect_close(gx, shard_seq(ref_gx, rank, world), "input grad vs one process", 1e-4))  # fmt: skip
    for k in t_sd:
        worst = max(worst, expect_close(sd[k], t_sd[k], f"{k} after {STEPS} steps vs torch"))
    return round(worst, 9)


def _block_bf16(rank, world):
    """bf16: ours is as close to an fp32 one-process reference as torch's styles are."""
    out, x, target, full32 = _block_vs_torch(rank, world, torch.bfloat16)
    ref = Block(DIM, HEADS, FFN)
    ref.load_state_dict({k: v.float() for k, v in full32.items()})
    ref_losses, ref_gx, ref_y = _train_block(ref, x.float(), target.float())
    errs = {}
    for styles in ("torch", "ccoverlap"):
        losses, gx, y, sd = out[styles]
        errs[styles] = max(rel_err(losses, ref_losses), rel_err(y, shard_seq(ref_y, rank, world)),
                           rel_err(gx, shard_seq(ref_gx, rank, world)))  # fmt: skip
    if not errs["ccoverlap"] <= 1.5 * errs["torch"] + 2e-3:
        raise AssertionError(f"bf16 error vs fp32: ours {errs['ccoverlap']:.3g}, torch's {errs['torch']:.3g}")
    return {k: round(v, 4) for k, v in errs.items()}


def _block_autocast(rank, world):
    """fp32 weights under CPU autocast (bf16): ours follows torch's casts; as close to fp32 as torch's styles."""

    class Autocast(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.inner(x).float()

    out, x, target, full = _block_vs_torch(rank, world, wrap=Autocast)
    ref = Block(DIM, HEADS, FFN)
    ref.load_state_dict(full)
    ref_losses, ref_gx, ref_y = _train_block(ref, x, target)
    errs = {s: max(rel_err(out[s][0], ref_losses), rel_err(out[s][2], shard_seq(ref_y, rank, world)),
                   rel_err(out[s][1], shard_seq(ref_gx, rank, world))) for s in out}  # fmt: skip
    if not errs["ccoverlap"] <= 1.5 * errs["torch"] + 2e-3:
        raise AssertionError(f"autocast error vs fp32: ours {errs['ccoverlap']:.3g}, torch's {errs['torch']:.3g}")
    return {k: round(v, 4) for k, v in errs.items()}


def _block_checkpointed(rank, world):
    """Activation checkpointing around the block (non-reentrant, as torchtitan): equal to torch's."""
    from torch.utils.checkpoint import checkpoint

    class Ckpt(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    out, *_ = _block_vs_torch(rank, world, wrap=Ckpt)
    return max(expect_close(out["ccoverlap"][i], out["torch"][i], f"checkpointed item {i}") for i in range(3))


# ------------------------------------------------------------------- modules that observe their input
class Gated(nn.Module):
    """A router-style module: reads its (replicated) input with ``to_local()`` besides the projections.

    ``grad_placements=None`` is ``to_local()``'s default (torch treats the gradient of the
    local tensor as replicated); ``(Partial(),)`` declares it partial, which is what this
    module's gate gradient is (summed over the feature shards of ``wq``), so only then does
    the parallel model train as one process does. The router is frozen (a trainable one
    would need its own gradient all-reduce).
    """

    def __init__(self, dim: int, grad_placements=None) -> None:
        super().__init__()
        self.grad_placements = grad_placements
        self.wq = nn.Linear(dim, dim, bias=True)
        self.wv = nn.Linear(dim, dim, bias=False)  # its output is not used: no backward reaches it
        self.wo = nn.Linear(dim, dim, bias=True)
        self.router = nn.Linear(dim, 1).requires_grad_(False)

    def forward(self, x):
        full = x.to_local(grad_placements=self.grad_placements) if isinstance(x, DTensor) else x  # whole sequence
        gate = torch.sigmoid(self.router(full))  # [b, s, 1]
        _unused = self.wv(x)
        return self.wo(self.wq(x) * gate)


def _gated_plan(styles: str, use_local_output: bool) -> dict:
    colwise, rowwise, prepare = style_classes(styles)
    return {
        "norm": SequenceParallel(),
        "mix": prepare(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=use_local_output),
        "mix.wq": colwise(), "mix.wv": colwise(), "mix.wo": rowwise(output_layouts=Shard(1)),
    }  # fmt: skip


class GatedBlock(nn.Module):
    def __init__(self, dim: int, grad_placements=None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mix = Gated(dim, grad_placements)

    def forward(self, x):
        return x + self.mix(self.norm(x))


def _gated_case(use_local_output: bool, grad_placements=None):
    """Ours equals torch's styles on a module that reads its input itself; with a partial gradient
    declaration also one process."""

    def run(rank, world):
        torch.manual_seed(3)
        full = GatedBlock(DIM).state_dict()
        x, target = gen(5, B, S, DIM), gen(6, B, S, DIM)
        res = {}
        for styles in ("torch", "ccoverlap"):
            mod = parallel(GatedBlock(DIM, grad_placements), _gated_plan(styles, use_local_output), world, full)
            res[styles] = _train_block(mod, shard_seq(x, rank, world), shard_seq(target, rank, world), world=world)
            res[styles] += (full_state_dict(mod),)
        (lo, gx, y, sd), (tl, tgx, ty, tsd) = res["ccoverlap"], res["torch"]
        worst = max(expect_close(lo, tl, "losses vs torch"), expect_close(y, ty, "output vs torch"),
                    expect_close(gx, tgx, "input grad vs torch"))  # fmt: skip
        for k in tsd:
            worst = max(worst, expect_close(sd[k], tsd[k], f"{k} vs torch"))
        if grad_placements is not None:
            ref = GatedBlock(DIM)
            ref.load_state_dict(full)
            ref_losses, ref_gx, ref_y = _train_block(ref, x, target)
            worst = max(worst, expect_close(lo, ref_losses, "losses vs one process", 1e-4),
                        expect_close(y, shard_seq(ref_y, rank, world), "output vs one process", 1e-4))  # fmt: skip
        return round(worst, 9)

    return run


# ------------------------------------------------------------------- model with loss parallelism
def _train_model(mod, tokens, steps=STEPS, parallel_loss=True):
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-2)
    losses = []
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    for _ in range(steps):
        opt.zero_grad()
        if parallel_loss:
            with loss_parallel():
                pred = mod(inp)
                loss = F.cross_entropy(pred.flatten(0, 1), tgt.flatten(0, 1))
                loss.backward()
        else:
            pred = mod(inp)
            loss = F.cross_entropy(pred.flatten(0, 1), tgt.flatten(0, 1))
            loss.backward()
        opt.step()
        losses.append(local(loss.full_tensor() if isinstance(loss, DTensor) else loss).detach().clone())
    return torch.stack(losses)


def _model_loss_parallel(rank, world):
    """Embedding -> 2 blocks -> head with loss parallelism, 5 AdamW steps: equal to torch's and one process."""
    vocab = 32
    torch.manual_seed(4)
    full = Llama(vocab, DIM, HEADS, FFN, 2).state_dict()
    tokens = torch.randint(0, vocab, (B, S + 1), generator=torch.Generator().manual_seed(7))
    ref = Llama(vocab, DIM, HEADS, FFN, 2)
    ref.load_state_dict(full)
    ref_losses = _train_model(ref, tokens, parallel_loss=False)
    res = {}
    for styles in ("torch", "ccoverlap"):
        mod = Llama(vocab, DIM, HEADS, FFN, 2)
        mod = parallel(mod, model_plan(mod, styles, loss_parallel=True), world, full)
        res[styles] = (_train_model(mod, tokens), full_state_dict(mod))
    (lo, sd), (tl, tsd) = res["ccoverlap"], res["torch"]
    worst = max(expect_close(lo, tl, "losses vs torch"), expect_close(lo, ref_losses, "losses vs one process", 1e-4))
    for k in tsd:
        worst = max(worst, expect_close(sd[k], tsd[k], f"{k} vs torch"))
    return [round(float(v), 6) for v in lo]


# ------------------------------------------------------------------------ collectives per block
_AG = ("_c10d_functional.all_gather_into_tensor", "c10d._allgather_base_", "c10d.allgather_into_tensor_coalesced_")
_RS = ("_c10d_functional.reduce_scatter_tensor", "c10d._reduce_scatter_base_", "c10d.reduce_scatter_tensor_coalesced_")


class CountCollectives(TorchDispatchMode):
    """Counts all-gathers and reduce-scatters whose input is at least ``min_numel`` elements (activations)."""

    def __init__(self, min_numel: int) -> None:
        super().__init__()
        self.min_numel, self.ag, self.rs = min_numel, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith(_AG) or name.startswith(_RS):
            t = args[1] if name.startswith("c10d._") else args[0]  # c10d base ops: (output, input, ...)
            if isinstance(t, torch.Tensor) and t.numel() >= self.min_numel:
                if name.startswith(_AG):
                    self.ag += 1
                else:
                    self.rs += 1
        return func(*args, **(kwargs or {}))


def _collective_counts(rank, world):
    """Per block, forward and forward + backward: ours moves as many activation all-gathers / reduce-scatters as torch."""
    torch.manual_seed(0)
    full = Block(DIM, HEADS, FFN).state_dict()
    xs = shard_seq(gen(1, B, S, DIM), rank, world)
    counts = {}
    for styles, kw in (("torch", {}), ("ccoverlap", {"schedule": "serial"})):
        mod = parallel(Block(DIM, HEADS, FFN), block_plan(styles, **kw), world, full)
        x = xs.clone().requires_grad_()
        local(mod(x)).sum().backward()  # warm-up
        shard_numel = xs.numel() // 2  # smaller than any activation shard here, larger than the checks' 8 bytes
        with CountCollectives(shard_numel) as fwd:
            y = local(mod(x))
        with CountCollectives(shard_numel) as bwd:
            y.sum().backward()
        counts[styles] = {"forward": (fwd.ag, fwd.rs), "backward": (bwd.ag, bwd.rs)}
    if counts["ccoverlap"] != counts["torch"] or counts["torch"]["forward"] != (2, 2):
        raise AssertionError(f"activation collectives (all-gathers, reduce-scatters) differ: {counts}")
    return counts["ccoverlap"]


# --------------------------------------------------------------------------------- error rules
def _expect_error(fn, *needles) -> str:
    try:
        fn()
    except ShapeMismatchError as exc:
        msg = str(exc)
        missing = [n for n in needles if n not in msg]
        if missing:
            raise AssertionError(f"message lacks {missing}: {msg}") from None
        return msg
    raise AssertionError("no ShapeMismatchError raised")


def _group_still_works(world):
    t = torch.ones(1)
    dist.all_reduce(t)
    if t.item() != world:
        raise AssertionError("process group unusable after the error")


DTYPE_PAIRS = [
    (torch.complex64, torch.complex128), (torch.float8_e4m3fn, torch.float8_e5m2),
    (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz), (torch.bool, torch.uint8), (torch.uint16, torch.int16),
    (torch.uint32, torch.int32), (torch.bfloat16, torch.float16), (torch.float32, torch.float64),
]  # fmt: skip


def _dtype_mismatch(rank, world):
    """A dtype that differs on one rank - any dtype - raises the same error on every rank (gather and op)."""
    msgs = []
    mesh = mesh_for(world)
    for a, b in DTYPE_PAIRS:
        dt = b if rank == world - 1 else a
        x = torch.zeros(2, 3, 4).to(dt)
        msgs.append(_expect_error(lambda: gather_input(x, mesh, 1), "dtype", str(a).replace("torch.", ""),
                                  str(b).replace("torch.", "")))  # fmt: skip
        if not a.is_floating_point or a.itemsize < 2:
            continue
        msgs.append(_expect_error(lambda: all_gather_matmul(torch.zeros(2, 4, dtype=dt), torch.zeros(3, 4, dtype=dt)),
                                  "dtype"))  # fmt: skip
    _group_still_works(world)
    return msgs


def _shape_before_cache(rank, world):
    """auto, a shape changed on one rank after a cached decision: the message names the shape, not the cache."""
    x, w = gen(10 + rank, 4, 8), gen(11, 6, 8)
    all_gather_matmul(x, w, schedule="auto")
    odd = gen(12, 5, 8) if rank == 1 else x
    msg = _expect_error(lambda: all_gather_matmul(odd, w, schedule="auto"), "x_shard shape", "rank 1: (5, 8)")
    if "clear_tuning_cache" in msg:
        raise AssertionError(f"the cache rule was reported instead of the shape: {msg}")
    clear_tuning_cache()
    _group_still_works(world)
    return msg


def _odd_sequence_model(rank, world):
    """A sequence length the ranks cannot split evenly: the same clear error on every rank (no crash, no hang)."""
    torch.manual_seed(4)
    mod = Llama(32, DIM, HEADS, FFN, 1)
    parallelize_module(mod, mesh_for(world), model_plan(mod, "ccoverlap"))
    tokens = torch.randint(0, 32, (B, world * 2 + 1), generator=torch.Generator().manual_seed(8))
    msg = _expect_error(lambda: mod(tokens), "sequence all-gather", "sequence shard shape")
    _group_still_works(world)
    return msg


def _odd_sequence_block(rank, world):
    """Block input shards of different lengths: every rank raises the same message."""
    torch.manual_seed(0)
    mod = parallel(Block(DIM, HEADS, FFN), block_plan("ccoverlap"), world, Block(DIM, HEADS, FFN).state_dict())
    x = gen(1, B, 3 if rank == 0 else 2, DIM)
    msg = _expect_error(lambda: mod(x), "sequence shard shape", "rank 0: (2, 3, 16)")
    _group_still_works(world)
    return msg


# ------------------------------------------------------------------------------------- registry
CASES = [
    ("train/block-fp32-adamw", _block_fp32),
    ("train/block-bf16-vs-fp32", _block_bf16),
    ("train/block-checkpointed", _block_checkpointed),
    ("train/block-autocast-bf16", _block_autocast),
    ("train/to-local-router", _gated_case(False)),
    ("train/to-local-partial-grad-router", _gated_case(False, (Partial(),))),
    ("train/use-local-output", _gated_case(True)),
    ("train/model-loss-parallel-adamw", _model_loss_parallel),
    ("count/collectives-per-block", _collective_counts),
    ("error/dtype-mismatch-any-dtype", _dtype_mismatch),
    ("error/shape-named-before-cache", _shape_before_cache),
    ("error/odd-sequence-block", _odd_sequence_block),
    ("error/odd-sequence-model", _odd_sequence_model),
]


def run_all(rank: int, world: int) -> dict[str, tuple[str, str, object]]:
    """Run every case of ``CASES`` on this rank; ``{name: ("ok"|"fail", detail, value)}``."""
    return run_cases(CASES, rank, world)
