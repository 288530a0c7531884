"""Memory-bound (element-wise and reduction) ops of a transformer layer, as a framework runs them.

Every function returns one :class:`~ccoverlap.specs.MemorySpec` standing for one kernel, or
for a chain of ``kernels`` unfused kernels (each paying a launch, and with ``eager`` profiles a
host dispatch). Bytes count HBM reads + writes; a *pass* over a tensor of ``n`` elements in the
compute dtype ``d`` is ``n·d`` bytes; dropout masks are 1 byte per element (PyTorch's
``native_dropout`` bool mask). ``Tl`` = tokens outside the TP region on this rank (``T/t`` with
sequence parallelism), ``T`` = tokens inside it, ``h`` hidden, ``f`` the local MLP inner size.

=========================  ===============================  ===================================
op                         fused (one kernel)                unfused (kernels, passes)
=========================  ===============================  ===================================
norm fwd / bwd             2 / 4 passes of [Tl, h]           k_f / k_b kernels x 2 passes, or the
                                                             profile's norm_bytes per element
sublayer epilogue fwd      bias+dropout+residual add:        bias add 2, dropout 2 (+mask),
                           3 passes (+ mask)                 residual add 3
sublayer epilogue bwd      dropout bwd 2 (+mask), bias       same, one kernel each
                           grad 1 pass (only if present)
residual grad add (bwd)    3 passes (autograd sums the two   same
                           gradients of the residual fork)

The epilogue and the residual-gradient add are adjacent to a norm on the compute stream
and are counted inside the norm ops (:func:`norm_fwd`, :func:`norm_bwd`): one op each.
GELU (bias) fwd / bwd      2 / 3 (+1 bias grad) of [T, f]    bias add 2 + GELU 2 / 3 (+1)
SwiGLU fwd / bwd           3 / 5 of [T, f]                   SiLU 2 + mul 3 / 6 + 3
rotary (Q and K) fwd/bwd   inside the attention op           3 kernels each of Q, K: fp32 cast,
                                                             complex multiply, cast back
                                                             (20 bytes per element)
vocab-parallel cross-      read logits, fp32 softmax:        Megatron's / F.cross_entropy on
entropy fwd / bwd          (d + 8) / (d + 4) B per logit     .float() logits: cast, max, sub,
                                                             exp, sum, div = (d + 36) / (12 + d)
FP8 cast(+transpose)       read d, write FP8 and its FP8 transpose: (d + 2) bytes per element
=========================  ===============================  ===================================

Sources: Megatron-LM ``bias_dropout_add_fused_train``, ``bias_gelu``, ``MixedFusedLayerNorm``,
``_VocabParallelCrossEntropy``; TransformerEngine ``cast_transpose``; torchtitan
``apply_rotary_emb`` / ``FeedForward``; the per-profile choices are in the framework YAMLs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ccoverlap.specs import MemorySpec

if TYPE_CHECKING:
    from ccoverlap.parallel.context import LayerCtx

MASK_BYTES = 1  # bool dropout mask per element


def kernel_spec(ctx: LayerCtx, nbytes: float, kernels: int = 1, rowwise_bytes: float = 0.0) -> MemorySpec:
    """A memory-bound op of ``nbytes`` standing for ``kernels`` kernels (host-dispatched ones when
    the profile is eager), ``rowwise_bytes`` of them moved by a row-wise (fused norm) kernel over
    this rank's ``local_tokens`` rows."""
    k = max(1, int(kernels))
    return MemorySpec(bytes=float(nbytes), kernels=k, host_kernels=k if ctx.fw.eager else 0,
                      rowwise_bytes=float(rowwise_bytes), rows=int(ctx.local_tokens) if rowwise_bytes else 0)


def _norm(ctx: LayerCtx, direction: str) -> tuple[float, int]:
    """(bytes, kernels) of a LayerNorm / RMSNorm on this rank's [Tl, h]: fused forward reads x
    and writes y, fused backward reads x and dy, writes dx and the weight-grad partials."""
    n = ctx.local_tokens * ctx.h
    if ctx.fw.norm_fused:
        return (2 if direction == "fwd" else 4) * n * ctx.d, 1
    i = 0 if direction == "fwd" else 1
    k = ctx.fw.norm_kernels[i]
    if ctx.fw.norm_bytes is not None:  # a composite with an fp32 upcast (profile entry norm_bytes)
        return ctx.fw.norm_bytes[i] * n, k
    return 2 * k * n * ctx.d, k


def _epilogue(ctx: LayerCtx) -> tuple[float, int]:
    """(bytes, kernels) at the end of a sublayer on [Tl, h]: (bias add), (hidden dropout),
    residual add."""
    n, d, fw = ctx.local_tokens * ctx.h, ctx.d, ctx.fw
    bias, drop = ctx.model.bias, fw.hidden_dropout
    mask = MASK_BYTES * n if drop else 0.0
    if fw.bias_dropout_add_fused:
        return 3 * n * d + mask, 1
    return (3 + 2 * int(bias) + 2 * int(drop)) * n * d + mask, 1 + int(bias) + int(drop)


def _epilogue_bwd(ctx: LayerCtx) -> tuple[float, int]:
    """(bytes, kernels) of the epilogue's backward: dropout backward and the output bias's
    gradient (a reduction over tokens); (0, 0) when the sublayer has neither."""
    n, d, fw = ctx.local_tokens * ctx.h, ctx.d, ctx.fw
    bias, drop = ctx.model.bias, fw.hidden_dropout
    nbytes = (2 * n * d + MASK_BYTES * n if drop else 0.0) + (n * d if bias else 0.0)
    return nbytes, int(bias) + int(drop)


def norm_fwd(ctx: LayerCtx) -> MemorySpec:
    """Forward norm of a sublayer, with the previous sublayer's epilogue ((bias add), (dropout),
    residual add) in the same op: the two are adjacent kernels on the compute stream, so one op
    with their bytes and kernel count times them alike and keeps the graph small. (The first
    layer's norm thereby carries one epilogue the embedding does not have: one [Tl, h] add per
    step.)"""
    nb, nk = _norm(ctx, "fwd")
    eb, ek = _epilogue(ctx)
    return kernel_spec(ctx, nb + eb, nk + ek, nb if ctx.fw.norm_fused else 0.0)


def norm_bwd(ctx: LayerCtx) -> MemorySpec:
    """Backward norm of a sublayer, autograd's sum of the two gradients reaching the sublayer's
    input (3 passes), and the epilogue backward of the sublayer below it (next in backward
    order): adjacent kernels, one op (see :func:`norm_fwd`)."""
    nb, nk = _norm(ctx, "bwd")
    eb, ek = _epilogue_bwd(ctx)
    return kernel_spec(ctx, nb + 3 * ctx.local_tokens * ctx.h * ctx.d + eb, nk + 1 + ek,
                       nb if ctx.fw.norm_fused else 0.0)


def final_norm_bwd(ctx: LayerCtx) -> MemorySpec:
    """The final norm's backward and the epilogue backward of the last layer's MLP."""
    nb, nk = _norm(ctx, "bwd")
    eb, ek = _epilogue_bwd(ctx)
    return kernel_spec(ctx, nb + eb, nk + ek)


def act_fwd(ctx: LayerCtx, f: int, tokens: int | None = None) -> MemorySpec:
    """MLP activation on [T, f] (gated: gate and up read, one written)."""
    T = ctx.tokens if tokens is None else tokens
    n, d, fw = T * f, ctx.d, ctx.fw
    if ctx.model.gated_mlp:
        return kernel_spec(ctx, 3 * n * d) if fw.bias_act_fused else kernel_spec(ctx, 5 * n * d, 2)
    bias = ctx.model.bias
    if fw.bias_act_fused:
        return kernel_spec(ctx, 2 * n * d)
    return kernel_spec(ctx, (2 + 2 * int(bias)) * n * d, 1 + int(bias))


def act_bwd(ctx: LayerCtx, f: int, tokens: int | None = None) -> MemorySpec:
    """Backward of :func:`act_fwd` (plus the fc1 bias gradient when the model has biases)."""
    T = ctx.tokens if tokens is None else tokens
    n, d, fw = T * f, ctx.d, ctx.fw
    if ctx.model.gated_mlp:
        return kernel_spec(ctx, 5 * n * d) if fw.bias_act_fused else kernel_spec(ctx, 9 * n * d, 3)
    bias = int(ctx.model.bias)
    return kernel_spec(ctx, (3 + bias) * n * d, 1 + bias)


def rope(ctx: LayerCtx) -> MemorySpec | None:
    """Unfused rotary embedding of Q and K (one direction); None when fused or not rotary."""
    if ctx.model.position != "rope" or ctx.fw.rope_fused:
        return None
    n = ctx.tokens * (ctx.nq + ctx.nkv) * ctx.hd
    if ctx.fw.rope_bytes is not None:  # profile entry rope_bytes: [bytes per element, kernels]
        return kernel_spec(ctx, ctx.fw.rope_bytes[0] * n, ctx.fw.rope_bytes[1])
    return kernel_spec(ctx, 20.0 * n, 6)


def cross_entropy_fwd(ctx: LayerCtx, v: int) -> MemorySpec:
    """Vocab-parallel cross-entropy forward over this rank's [T, v] logits."""
    n, d = ctx.tokens * v, ctx.d
    if ctx.fw.cross_entropy_fused:
        return kernel_spec(ctx, n * (d + 8))
    return kernel_spec(ctx, n * (d + 36), 6)


def cross_entropy_bwd(ctx: LayerCtx, v: int) -> MemorySpec:
    """Cross-entropy backward: the softmax gradient written as the logits' gradient."""
    n, d = ctx.tokens * v, ctx.d
    if ctx.fw.cross_entropy_fused:
        return kernel_spec(ctx, n * (d + 4))
    return kernel_spec(ctx, n * (12 + d), 2)


def fp8_cast(ctx: LayerCtx, rows: int, cols: int) -> MemorySpec:
    """Cast a bf16 [rows, cols] tensor to FP8 with its FP8 transpose (TransformerEngine
    ``cast_transpose``; the transposed copy feeds the wgrad GEMM)."""
    return kernel_spec(ctx, rows * cols * (ctx.d + 2))
