"""The fused mixture-of-experts expert computation.

Expert weights use the stacked layout: ``w13`` [E, 2 * I, D] holds [gate | up] rows (interleaved
gate/up rows, GPT-OSS's checkpoint layout, with ``interleaved=True``), ``w2`` [E, D, I]. Routing
(:mod:`atom_kernels.routing`) gives the fp32 weights and int32 expert ids, both [num_tokens, top_k].

FP8 experts (W8A8) keep ``w13``/``w2`` in float8_e4m3fn with fp32 scales, per B x B block of each
expert's weight (DeepSeek-V3 and Qwen3-FP8 checkpoints, B = ``block_size``, 128 there) or per output
row (``block_size`` 0). The activations of both GEMMs are quantized on the fly: per token and per
group of B channels, or per token (:mod:`atom_kernels.quant`).

MXFP4 experts (``weight_format="mxfp4"``, gpt-oss) keep ``w13``/``w2`` packed, two e2m1 values per
uint8 along K, with a uint8 e8m0 scale per 32 values (:mod:`atom_kernels.mxfp4`). The GEMMs
dequantize the weights as they read them and compute in x's dtype. gpt-oss's are weight-only; AMD
Quark's W4A4 checkpoints (``input_format="mxfp4"``) also round both GEMMs' inputs to MXFP4 and back
first (:func:`atom_kernels.mxfp4.mxfp4_quant_dequant`), as a host emulates FP4 activations where no
FP4 matrix unit runs them.
"""

from __future__ import annotations

import math
import weakref

import torch
import triton
import triton.language as tl

from atom_kernels.activation import (
    ACT_CLAMPED_SWIGLU,
    ACT_GELU,
    ACT_GELU_TANH,
    ACT_SILU,
    apply_gated_activation,
    clamped_swiglu_torch,
    gelu_and_mul_torch,
    launch_gated_activation,
    silu_and_mul,
    silu_and_mul_torch,
)
from atom_kernels.moe_align import moe_align_block_size_triton, warm_up_moe_align
from atom_kernels.moe_gemv import run_fused_moe_mxfp4_gemv
from atom_kernels.moe_reduce import reduce_gated_partials, sum_expert_rows
from atom_kernels.mxfp4 import (
    MXFP4_BLOCK,
    REGISTER_DECODE_CODES,
    REGISTER_DECODE_RESCALE,
    dequantize_mxfp4,
    e2m1_pairs_to_bf16,
    e2m1_to_float,
    e8m0_to_decode_factor,
    e8m0_to_float,
    mxfp4_quant_dequant_torch,
    mxfp4_quant_dequant_triton,
)
from atom_kernels.quant import FP8_DTYPE, per_group_quant_fp8, per_group_quant_fp8_row_major, per_token_quant_fp8
from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous, dot_precision, interpreting
from atom_kernels.tuned import all_tuned_configs, tuned_config


@define_op
def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    interleaved: bool = False,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block_size: int = 0,
    weight_format: str = "auto",
    input_format: str = "auto",
) -> torch.Tensor:
    """``sum_k topk_weights[:, k] * down_e(act(gate_up_e(x)))`` over each token's experts
    ``e = topk_ids[:, k]``. ``activation``: ``"silu"``, ``"gelu"``, ``"gelu_tanh"`` or
    ``"clamped_swiglu"`` (GPT-OSS, with ``swiglu_alpha`` and ``swiglu_limit``); optional per-expert
    biases ``w13_bias`` [E, 2 * I] and ``w2_bias`` [E, D].

    FP8 weights: float8_e4m3fn ``w13`` and ``w2`` with fp32 ``w13_scale`` and ``w2_scale``, with
    ``block_size`` B > 0 one per B x B block ([E, ceil(2I / B), ceil(D / B)] and
    [E, ceil(D / B), ceil(I / B)]), with ``block_size`` 0 one per row ([E, 2I] and [E, D], or with a
    trailing 1). The inputs of both GEMMs are quantized to fp8 per token and group of B channels (per
    token with ``block_size`` 0); biases are added after dequantization; the output has x's dtype.

    ``weight_format``: ``"auto"`` (the weights' dtype tells: x's, or float8_e4m3fn with scales) or
    ``"mxfp4"``: uint8 ``w13`` [E, 2I, D / 2] and ``w2`` [E, D, I / 2], two e2m1 values per byte,
    with uint8 e8m0 ``w13_scale`` [E, 2I, D / 32] and ``w2_scale`` [E, D, I / 32], one per 32
    values along K (:mod:`atom_kernels.mxfp4`); D and I multiples of 32, ``block_size`` 0. The
    weights are dequantized to x's dtype.

    ``input_format``: ``"auto"`` (FP8 weights: fp8 inputs, as above; else x's dtype) or, with MXFP4
    weights, ``"mxfp4"``: both GEMMs' inputs (x, and the activation's output in x's dtype) rounded to
    MXFP4 and back per 32 values (:func:`atom_kernels.mxfp4.mxfp4_quant_dequant`)."""


ACTIVATIONS = {
    "silu": ACT_SILU,
    "gelu": ACT_GELU,
    "gelu_tanh": ACT_GELU_TANH,
    "clamped_swiglu": ACT_CLAMPED_SWIGLU,
}


def _expert_activation(
    h: torch.Tensor, activation: str, alpha: float, limit: float, interleaved: bool
) -> torch.Tensor:
    if activation == "clamped_swiglu":
        return clamped_swiglu_torch(h, alpha, limit, interleaved)
    if interleaved:
        h = torch.cat([h[..., 0::2], h[..., 1::2]], dim=-1)
    if activation == "silu":
        return silu_and_mul_torch(h)
    if activation in ("gelu", "gelu_tanh"):
        return gelu_and_mul_torch(h, "tanh" if activation == "gelu_tanh" else "none")
    raise ValueError(f"fused_moe: unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}")


def _check_fused_moe_args(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    block_size: int,
    weight_format: str,
    input_format: str = "auto",
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Check :func:`fused_moe`'s tensors; return the weight scales as [E, rows, K blocks] (per-row
    FP8 scales as [E, rows, 1]), or (None, None) for unquantized weights."""
    if weight_format not in ("auto", "mxfp4"):
        raise ValueError(f"fused_moe: weight_format {weight_format!r} is not 'auto' or 'mxfp4'")
    if input_format not in ("auto", "mxfp4"):
        raise ValueError(f"fused_moe: input_format {input_format!r} is not 'auto' or 'mxfp4'")
    if input_format == "mxfp4" and weight_format != "mxfp4":
        raise ValueError("fused_moe: input_format='mxfp4' needs weight_format='mxfp4'")
    mxfp4 = weight_format == "mxfp4"
    if not mxfp4 and torch.uint8 in (w13.dtype, w2.dtype):
        raise ValueError("fused_moe: uint8 weights are MXFP4 only with weight_format='mxfp4'")
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    packing = 2 if mxfp4 else 1  # values per stored element along K
    if (w13.shape != (num_experts, 2 * inter, hidden // packing)
            or w2.shape != (num_experts, hidden, inter // packing)):
        raise ValueError(
            f"fused_moe: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}"
            + (" (MXFP4: two values per byte along K)" if mxfp4 else "")
        )
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != num_tokens:
        raise ValueError(
            f"fused_moe: topk_ids {tuple(topk_ids.shape)}, topk_weights {tuple(topk_weights.shape)}"
        )
    if mxfp4:
        return _check_mxfp4_args(w13, w2, w13_scale, w2_scale, block_size, hidden, inter)
    if w13_scale is None and w2_scale is None and FP8_DTYPE not in (w13.dtype, w2.dtype):
        if block_size:
            raise ValueError(f"fused_moe: block_size {block_size} without w13_scale and w2_scale")
        if w13.dtype != x.dtype or w2.dtype != x.dtype:
            raise ValueError(f"fused_moe: weights {w13.dtype}/{w2.dtype} must match x {x.dtype}")
        return None, None
    # fp8 tl.dot takes K steps of at least 32, and a K step must lie inside one scale block.
    if block_size < 0 or block_size % 32:
        raise ValueError(f"fused_moe: block_size {block_size} must be 0 or a multiple of 32")
    scales = []
    for name, w, scale in (("w13", w13, w13_scale), ("w2", w2, w2_scale)):
        if w.dtype != FP8_DTYPE:
            raise ValueError(f"fused_moe: {name} is {w.dtype}; with scales it must be {FP8_DTYPE}")
        if scale is None:
            raise ValueError(f"fused_moe: {name} is {FP8_DTYPE} and needs {name}_scale")
        rows, cols = w.shape[1:]
        if block_size:
            shapes = [(num_experts, -(-rows // block_size), -(-cols // block_size))]
        else:
            shapes = [(num_experts, rows), (num_experts, rows, 1)]
        if tuple(scale.shape) not in shapes or scale.dtype != torch.float32:
            raise ValueError(
                f"fused_moe: {name}_scale is {scale.dtype} {tuple(scale.shape)}, expected float32 "
                + " or ".join(map(str, shapes))
                + (f" for block_size {block_size}" if block_size else " (one scale per row)")
            )
        scales.append(scale if block_size else scale.reshape(num_experts, rows, 1))
    return scales[0], scales[1]


def _check_mxfp4_args(
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    block_size: int,
    hidden: int,
    inter: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    if block_size:
        raise ValueError(f"fused_moe: block_size {block_size} is FP8's; MXFP4 blocks are always "
                         f"{MXFP4_BLOCK} values")
    if hidden % MXFP4_BLOCK or inter % MXFP4_BLOCK:
        raise ValueError(f"fused_moe: MXFP4 needs D {hidden} and I {inter} to be multiples of "
                         f"{MXFP4_BLOCK}")
    for name, w, scale, k in (("w13", w13, w13_scale, hidden), ("w2", w2, w2_scale, inter)):
        if w.dtype != torch.uint8:
            raise ValueError(f"fused_moe: {name} is {w.dtype}; MXFP4 weights are torch.uint8")
        expected = (*w.shape[:2], k // MXFP4_BLOCK)
        if scale is None:
            raise ValueError(f"fused_moe: MXFP4 {name} needs {name}_scale")
        if tuple(scale.shape) != expected or scale.dtype != torch.uint8:
            raise ValueError(f"fused_moe: {name}_scale is {scale.dtype} {tuple(scale.shape)}, "
                             f"expected uint8 {expected} (MXFP4)")
    return w13_scale, w2_scale


def quantize_activations(
    a: torch.Tensor, block_size: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 ``(q, scale)`` of a W8A8 GEMM's input [M, K], by ``backend``'s quant op: per token and
    group of ``block_size`` channels (scale [M, ceil(K / block_size)]; a last, partial group on its
    own), or per token (scale [M, 1]) with ``block_size`` 0. Triton's per-group scales are stored
    row-major, as the fused MoE's GEMMs read them best (atom_kernels.quant.per_group_quant_fp8_row_major)."""
    if block_size == 0:
        return per_token_quant_fp8.impl(backend)(a)
    width = a.shape[-1]
    if width % block_size:
        # Zeros leave the partial group's amax as it is.
        a = torch.nn.functional.pad(a, (0, -width % block_size))
    quant = per_group_quant_fp8_row_major if backend == "triton" else per_group_quant_fp8.impl(backend)
    q, scale = quant(a, block_size)
    return q[:, :width], scale


def _dequantize(
    q: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int
) -> torch.Tensor:
    """fp32 ``q`` times its scales, one per ``block_rows`` x ``block_cols`` block of q's 2 dims."""
    scale = scale.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return q.float() * scale[: q.shape[0], : q.shape[1]]


def _expert_linear(
    a: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    expert: int,
    block_size: int,
    mxfp4: bool,
) -> torch.Tensor:
    """``a @ w[expert].T``; for MXFP4 weights in a's dtype on the dequantized weight; for FP8
    weights (a ``scale``) in fp32, as the W8A8 GEMM computes it: ``a`` quantized to fp8 like the
    Triton path's activations, then both dequantized."""
    if mxfp4:
        return a @ dequantize_mxfp4(w[expert], scale[expert], a.dtype).t()
    if scale is None:
        return a @ w[expert].t()
    width = a.shape[1]
    q, a_scale = quantize_activations(a, block_size, "torch")
    a = _dequantize(q, a_scale, 1, block_size or width)
    return a @ _dequantize(w[expert], scale[expert], block_size or 1, block_size or width).t()


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


@fused_moe.register("torch")
def fused_moe_torch(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    interleaved: bool = False,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block_size: int = 0,
    weight_format: str = "auto",
    input_format: str = "auto",
) -> torch.Tensor:
    w13_scale, w2_scale = _check_fused_moe_args(
        x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block_size, weight_format,
        input_format
    )
    mxfp4 = weight_format == "mxfp4"
    round_inputs = mxfp4_quant_dequant_torch if input_format == "mxfp4" else _unchanged
    x = round_inputs(x)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_weights = topk_weights.reshape(-1)
    for expert in flat_ids.unique().tolist():
        rows = (flat_ids == expert).nonzero().squeeze(1)
        tokens = token_of[rows]
        gate_up = _expert_linear(x[tokens], w13, w13_scale, expert, block_size, mxfp4)
        if w13_bias is not None:
            gate_up = gate_up + w13_bias[expert]
        hidden = _expert_activation(gate_up, activation, swiglu_alpha, swiglu_limit, interleaved)
        # FP8 weights: the intermediate is stored in x's dtype before it is quantized, as in Triton.
        hidden = round_inputs(hidden.to(x.dtype))
        down = _expert_linear(hidden, w2, w2_scale, expert, block_size, mxfp4)
        if w2_bias is not None:
            down = down + w2_bias[expert]
        out.index_add_(0, tokens, down.float() * flat_weights[rows, None].float())
    return out.to(x.dtype)


# --- Triton fused MoE -----------------------------------------------------------------------------
#
# 1. moe_align_block_size (atom_kernels.moe_align) sorts the (token, k) entries by expert and pads
#    each expert's run to a multiple of BLOCK_M, so every BLOCK_M rows of the sorted order belong to
#    one expert.
# 2. _moe_gemm_kernel, gated: per block, x[token rows] @ w13[e]^T for the gate and the up halves at once,
#    the activation applied in the epilogue -> hidden [T * top_k, I].
# 3. _moe_gemm_kernel, plain: hidden rows @ w2[e]^T times the routing weight -> [T * top_k, D].
# 4. sum_expert_rows (atom_kernels.moe_reduce) sums the top_k rows of each token.
# Split-K (a tile config's SPLIT_K > 1, for few tokens, where one row block per expert leaves the GPU
# idle along a long K loop): each GEMM program covers one slice of K and stores fp32 partial sums;
# the gated GEMM's partials are summed, biased and activated by reduce_gated_partials, and the down
# GEMM's are summed with the top_k rows in step 4 (it is linear).
# With FP8 weights, x and the hidden rows are quantized to fp8 before their GEMM, and the GEMMs apply
# the scales of both operands: per K step (block FP8) or in the epilogue (per row / per token).
# With MXFP4 weights the GEMMs decode each weight tile to the activations' dtype: on Hopper with bf16
# activations and row blocks of up to 32, in registers with the weight tile as the MMA's left operand
# (_mxfp4_step_registers, mx_register_decode); otherwise through Triton's microscaled dot, or, in the
# interpreter and for fp32 activations, with explicit decoding (_mxfp4_step).


@triton.jit
def _mxfp4_step(
    acc,
    a_rows,
    w_cols,
    w_scales,
    codes,
    k0,
    K,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MX_DOT: tl.constexpr,
    A_FORMAT: tl.constexpr,
):
    """``acc`` + the K step at ``k0`` of A @ W^T with MXFP4 W. ``a_rows`` [BLOCK_M, 1] and ``w_cols``
    / ``w_scales`` [1, BLOCK_N] point at the rows of A, of W's bytes and of W's scales.

    With ``MX_DOT`` the compiler's microscaled dot takes the packed bytes and the step's e8m0 scale
    ``codes`` (:func:`_mxfp4_scale_codes`) as they are stored (it upcasts them to A's format itself);
    Triton's interpreter lacks it, and fp32 A is not one of its formats, so there the step decodes
    the weight tile explicitly (``codes`` None, the scales read through ``w_scales``): A's even
    columns meet the low nibbles, its odd columns the high ones."""
    pairs = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # byte j holds values 2j and 2j + 1
    valid = pairs < K // 2
    packed = tl.load(w_cols + pairs[:, None], mask=valid[:, None], other=0)
    if MX_DOT:
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows + ks[None, :], mask=(ks < K)[None, :], other=0.0)
        return tl.dot_scaled(a, None, A_FORMAT, packed, codes, "e2m1", acc, fast_math=True)
    a_even = tl.load(a_rows + 2 * pairs[None, :], mask=valid[None, :], other=0.0)
    a_odd = tl.load(a_rows + 2 * pairs[None, :] + 1, mask=valid[None, :], other=0.0)
    # 16 bytes (32 values) per scale.
    scale_codes = tl.load(w_scales + (pairs // 16)[:, None], mask=valid[:, None], other=0)
    scale = e8m0_to_float(scale_codes)
    low = (e2m1_to_float(packed & 15) * scale).to(a_even.dtype)
    high = (e2m1_to_float(packed >> 4) * scale).to(a_even.dtype)
    acc = tl.dot(a_even, low, acc, input_precision=DOT_PRECISION)
    return tl.dot(a_odd, high, acc, input_precision=DOT_PRECISION)


@triton.jit
def _mxfp4_scale_codes(w_scales, k0, K, BLOCK_K: tl.constexpr):
    """The uint8 e8m0 scale codes of the K step at ``k0``, [BLOCK_N, BLOCK_K / 32], of W's columns whose
    scales ``w_scales`` [1, BLOCK_N] point at (127, a factor of 1, past K). The microscaled dot's loop
    loads them a step ahead of their use: too few bytes a row, and rows too unevenly aligned, for the
    compiler to pipeline them through shared memory as it does the weights, so a load in the step that
    used them stalled every step for a round trip to memory. The register decoding loads them in the
    step: carried from step to step they made it slower (docs/performance.md)."""
    groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    return tl.load(tl.trans(w_scales) + groups[None, :], mask=(groups < K // 32)[None, :], other=127)


@triton.jit
def _mxfp4_step_registers(acc_t, a_rows, w_rows, codes, k0, K, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``acc_t`` + the K step at ``k0`` of (A @ W^T)^T with MXFP4 W, decoded in registers: the weight
    tile is the MMA's left operand (its BLOCK_N rows the wide side, the BLOCK_M tokens the narrow
    one), so the decoded values feed the MMA from registers. One MMA per step: the tile's K columns
    in the order [low nibbles | high nibbles] (W's even columns, then its odd ones), and A's columns
    permuted to match. ``w_rows`` [BLOCK_N, 1] point at W's bytes; ``codes`` are the step's e8m0 scales
    (:func:`_mxfp4_scale_codes`).
    The result is 1 / REGISTER_DECODE_RESCALE times the true one (:func:`e8m0_to_decode_factor`)."""
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // 32
    ks = k0 + tl.arange(0, BLOCK_K)
    a = tl.load(a_rows + ks[None, :], mask=(ks < K)[None, :], other=0.0)
    a = tl.reshape(tl.permute(tl.reshape(a, [BLOCK_M, HALF, 2]), [0, 2, 1]), [BLOCK_M, BLOCK_K])
    pairs = k0 // 2 + tl.arange(0, HALF)  # byte j holds values 2j and 2j + 1
    packed = tl.load(w_rows + pairs[None, :], mask=(pairs < K // 2)[None, :], other=0)
    factors = tl.broadcast_to(e8m0_to_decode_factor(codes)[:, :, None], [BLOCK_N, GROUPS, 16])
    low, high = e2m1_pairs_to_bf16(packed, tl.reshape(factors, [BLOCK_N, HALF]))
    w = tl.reshape(tl.permute(tl.join(low, high), [0, 2, 1]), [BLOCK_N, BLOCK_K])
    return tl.dot(w, tl.trans(a), acc_t)


@triton.jit
def _dense_step(acc, a, a_scale, w_cols, w_scales, ks, k0, K, EVEN_K: tl.constexpr, W8A8: tl.constexpr,
                SCALE_BLOCK: tl.constexpr, SWAP_AB: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One K step of a bf16 or fp8 expert GEMM: ``a`` [BLOCK_M, BLOCK_K] (its step's block scales
    ``a_scale``) times the weight columns ``w_cols`` [1, BLOCK_N] point at, into ``acc`` [BLOCK_M,
    BLOCK_N], or with ``SWAP_AB`` into its transpose: the weight tile is then the MMA's M side and
    the rows its N side, which Hopper's wgmma takes 16 wide (the dense FP8 GEMM's swapped tiles,
    atom_kernels.gemm). fp8: a fresh dot per K step, added in fp32 (Hopper's fp8 MMA accumulates with
    fewer bits than fp32); block scaled, BLOCK_K divides SCALE_BLOCK, so the step lies in one K group."""
    if SWAP_AB:
        w_ptrs, k_valid = tl.trans(w_cols) + ks[None, :], (ks < K)[None, :]
    else:
        w_ptrs, k_valid = w_cols + ks[:, None], (ks < K)[:, None]
    if EVEN_K:
        w = tl.load(w_ptrs)
    else:
        w = tl.load(w_ptrs, mask=k_valid, other=0.0)
    if SWAP_AB:
        left, right = w, tl.trans(a)
    else:
        left, right = a, w
    if SCALE_BLOCK > 0:
        w_scale = tl.load(w_scales + k0 // SCALE_BLOCK)
        if SWAP_AB:
            scale = w_scale[:, None] * a_scale[None, :]
        else:
            scale = a_scale[:, None] * w_scale[None, :]
        acc += tl.dot(left, right) * scale
    elif W8A8:
        acc += tl.dot(left, right)
    else:
        acc = tl.dot(left, right, acc, input_precision=DOT_PRECISION)
    return acc


# a_scale_stride_k: 1 for the row-major scales run_fused_moe makes, the token count for group-major ones
# (atom_kernels.quant.new_scales) and per-token [M, 1] scales (never read along K there): unspecialised.
@triton.jit(do_not_specialize=["num_entries", "split_k", "a_scale_stride_k"])
def _moe_gemm_kernel(
    a_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    topk_weights_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    a_scale_ptr,
    w_scale_ptr,
    num_entries,
    N,
    K,
    a_stride,
    w_stride_e,
    w_stride_n,
    bias_stride_e,
    out_stride,
    a_scale_stride,
    a_scale_stride_k,
    w_scale_stride_e,
    w_scale_stride_n,
    up_offset,
    gate_up_step,
    alpha,
    limit,
    split_k,
    A_ROW_DIVISOR: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    W8A8: tl.constexpr,
    MXFP4: tl.constexpr,
    MX_DOT: tl.constexpr,
    MX_REGISTERS: tl.constexpr,
    A_FORMAT: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
    PARTIAL: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    # Grouped program order: GROUP_M row blocks share each weight column block while it is in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.num_programs(0) // tl.cdiv(N, BLOCK_N)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_size
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_size

    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    entries = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_valid = entries < num_entries
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = cols < N
    # Padding rows read row 0 and columns past N wrap around: the loads stay in bounds without
    # masks, and the store drops those rows and columns.
    a_row_ids = tl.where(row_valid, entries // A_ROW_DIVISOR, 0).to(tl.int64)
    a_rows = a_ptr + a_row_ids[:, None] * a_stride
    w_expert = w_ptr + expert * w_stride_e
    # Gate/up row n of w13 is n * gate_up_step (+ up_offset for up): step 1 and offset I for the
    # stacked [gate | up] layout, step 2 and offset 1 for interleaved rows.
    w_rows = (cols % N) * gate_up_step
    w_cols = w_expert + w_rows.to(tl.int64)[None, :] * w_stride_n
    if MX_REGISTERS or SWAP_AB:  # transposed accumulators (_mxfp4_step_registers, _dense_step)
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if GATED:
        up_cols = w_expert + (w_rows + up_offset).to(tl.int64)[None, :] * w_stride_n
        if MX_REGISTERS or SWAP_AB:
            acc_up = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        else:
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_scales, up_scales = None, None  # bf16 weights have none
    if W8A8:
        # fp8 A and W. A's scale rows are gathered like its rows; weight row r has scale row
        # r // SCALE_BLOCK (blocks of SCALE_BLOCK x SCALE_BLOCK), or r with SCALE_BLOCK 0 (per row).
        a_scales = a_scale_ptr + a_row_ids * a_scale_stride
        scale_rows = w_rows
        up_scale_rows = w_rows + up_offset
        if SCALE_BLOCK > 0:
            scale_rows = scale_rows // SCALE_BLOCK
            up_scale_rows = up_scale_rows // SCALE_BLOCK
        w_scale_expert = w_scale_ptr + expert * w_scale_stride_e
        w_scales = w_scale_expert + scale_rows.to(tl.int64) * w_scale_stride_n
        up_scales = w_scale_expert + up_scale_rows.to(tl.int64) * w_scale_stride_n
    if MXFP4:
        # Packed W: a row's K values are K / 2 bytes; its scales, one per 32 values, a row of their own.
        w_scale_expert = w_scale_ptr + expert * w_scale_stride_e
        w_scales = w_scale_expert + w_rows.to(tl.int64)[None, :] * w_scale_stride_n
        up_scales = w_scale_expert + (w_rows + up_offset).to(tl.int64)[None, :] * w_scale_stride_n
    k_begin, k_end = 0, K
    if PARTIAL:
        # Split-K: program_id(1) of split_k takes an equal run of whole K steps.
        split = tl.program_id(1)
        steps = tl.cdiv(tl.cdiv(K, BLOCK_K), split_k)
        k_begin = split * steps * BLOCK_K
        k_end = tl.minimum(K, k_begin + steps * BLOCK_K)
    codes, up_codes = None, None  # explicit and register decoding read the scales in the step
    if MX_DOT:
        codes = _mxfp4_scale_codes(w_scales, k_begin, K, BLOCK_K)
        if GATED:
            up_codes = _mxfp4_scale_codes(up_scales, k_begin, K, BLOCK_K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        if MX_DOT:
            # The next step's scale codes, loaded a step ahead (_mxfp4_scale_codes).
            next_codes = _mxfp4_scale_codes(w_scales, k0 + BLOCK_K, K, BLOCK_K)
            if GATED:
                next_up_codes = _mxfp4_scale_codes(up_scales, k0 + BLOCK_K, K, BLOCK_K)
        if MX_REGISTERS:
            acc = _mxfp4_step_registers(acc, a_rows, tl.trans(w_cols), _mxfp4_scale_codes(w_scales, k0, K, BLOCK_K),
                                        k0, K, BLOCK_M, BLOCK_N, BLOCK_K)
            if GATED:
                acc_up = _mxfp4_step_registers(acc_up, a_rows, tl.trans(up_cols),
                                               _mxfp4_scale_codes(up_scales, k0, K, BLOCK_K),
                                               k0, K, BLOCK_M, BLOCK_N, BLOCK_K)
        elif MXFP4:
            acc = _mxfp4_step(acc, a_rows, w_cols, w_scales, codes, k0, K, BLOCK_K, DOT_PRECISION,
                              MX_DOT, A_FORMAT)
            if GATED:
                acc_up = _mxfp4_step(acc_up, a_rows, up_cols, up_scales, up_codes, k0, K, BLOCK_K,
                                     DOT_PRECISION, MX_DOT, A_FORMAT)
        else:
            ks = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                a = tl.load(a_rows + ks[None, :])
            else:
                a = tl.load(a_rows + ks[None, :], mask=(ks < K)[None, :], other=0.0)
            a_scale = None
            if SCALE_BLOCK > 0:
                a_scale = tl.load(a_scales + (k0 // SCALE_BLOCK) * a_scale_stride_k)
            acc = _dense_step(acc, a, a_scale, w_cols, w_scales, ks, k0, K, EVEN_K, W8A8, SCALE_BLOCK, SWAP_AB,
                              DOT_PRECISION)
            if GATED:
                acc_up = _dense_step(acc_up, a, a_scale, up_cols, up_scales, ks, k0, K, EVEN_K, W8A8, SCALE_BLOCK,
                                     SWAP_AB, DOT_PRECISION)
        if MX_DOT:
            codes = next_codes
            if GATED:
                up_codes = next_up_codes

    if MX_REGISTERS:
        acc = tl.trans(acc) * REGISTER_DECODE_RESCALE
        if GATED:
            acc_up = tl.trans(acc_up) * REGISTER_DECODE_RESCALE
    elif SWAP_AB:
        acc = tl.trans(acc)
        if GATED:
            acc_up = tl.trans(acc_up)
    if W8A8 and SCALE_BLOCK == 0:
        a_scale = tl.load(a_scales)[:, None]
        acc *= a_scale * tl.load(w_scales)[None, :]
        if GATED:
            acc_up *= a_scale * tl.load(up_scales)[None, :]
    store_mask = row_valid[:, None] & col_valid[None, :]
    if PARTIAL and GATED:
        # fp32 partial sums of gate and up, side by side in a row of 2N: reduce_gated_partials adds
        # the splits, the bias and the activation.
        out = out_ptr + (entries.to(tl.int64) * split_k + split)[:, None] * out_stride + cols[None, :]
        tl.store(out, acc, mask=store_mask)
        tl.store(out + N, acc_up, mask=store_mask)
        return
    if HAS_BIAS:
        bias_row = bias_ptr + expert * bias_stride_e
        bias = tl.load(bias_row + cols * gate_up_step, mask=col_valid, other=0.0).to(tl.float32)
        if PARTIAL:
            bias = bias * (split == 0).to(tl.float32)  # one split adds it
        acc += bias[None, :]
        if GATED:
            up_bias = tl.load(bias_row + cols * gate_up_step + up_offset, mask=col_valid, other=0.0)
            acc_up += up_bias.to(tl.float32)[None, :]
    if GATED:
        acc = apply_gated_activation(acc, acc_up, ACT, alpha, limit)
    if MUL_ROUTED_WEIGHT:
        acc = (
            acc
            * tl.load(topk_weights_ptr + entries, mask=row_valid, other=0.0).to(tl.float32)[:, None]
        )
    rows = entries.to(tl.int64)
    if PARTIAL:
        rows = rows * split_k + split  # the splits of an entry are consecutive rows
    out = out_ptr + rows[:, None] * out_stride + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=store_mask)


# Tile sizes by the expected rows per expert (up to the first number), for GPUs with no tuned table:
# one row block size (it fixes the sort's padding) and the same tiles for both GEMMs.
DEFAULT_MOE_TILES = (
    (16, 16, {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 3}),
    (64, 32, {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 4, "num_warps": 4, "num_stages": 3}),
    (math.inf, 64, {"BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}),
)


def default_moe_configs() -> list[dict]:
    """:func:`moe_config`'s form of each :data:`DEFAULT_MOE_TILES` entry."""
    return [{"BLOCK_M": block_m, "gate_up": dict(tiles), "down": dict(tiles)}
            for _, block_m, tiles in DEFAULT_MOE_TILES]


def default_moe_config(num_entries: int, num_experts: int) -> dict:
    """The default config for ``num_entries`` routed rows (:data:`DEFAULT_MOE_TILES`)."""
    rows_per_expert = num_entries / num_experts
    bucket = next(i for i, (bound, _, _) in enumerate(DEFAULT_MOE_TILES) if rows_per_expert <= bound)
    return default_moe_configs()[bucket]


def moe_shape_key(num_experts: int, hidden: int, inter: int, top_k: int, dtype: torch.dtype) -> str:
    """The key of a fused-MoE shape in the tuned tables (atom_kernels.tuned); ``dtype`` is the
    weights', so FP8 experts have keys of their own."""
    return f"E={num_experts},D={hidden},I={inter},top_k={top_k},dtype={str(dtype).split('.')[-1]}"


def moe_config(shape_key: str, num_tokens: int, num_experts: int, top_k: int, x: torch.Tensor) -> dict:
    """{"BLOCK_M", "gate_up": tiles, "down": tiles}: this GPU's tuned entry for ``shape_key``
    (:func:`moe_shape_key`), else the defaults."""
    tuned = tuned_config("fused_moe", shape_key, num_tokens, x.device)
    return tuned or default_moe_config(num_tokens * top_k, num_experts)


def mx_dot_format(a: torch.Tensor) -> str | None:
    """The format name of ``a`` for Triton's microscaled dot, or None where the MXFP4 GEMM decodes
    its weight tiles itself (the interpreter; fp32 activations)."""
    if interpreting():
        return None
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(a.dtype)


# Scale tensors checked for register decoding, by (address, shape, strides, device) of the tensor (a
# view's base): a weak reference to the tensor checked, its version counter then, the result. An
# entry stands while that tensor lives (so the memory is still its own: another tensor object at the
# same address is an alias of it, as a graph's parameter inputs can be) and is unchanged.
_checked_scales: dict[tuple, tuple[weakref.ref, int, bool]] = {}


def _codes_in_register_range(w_scale: torch.Tensor) -> bool | None:
    """Whether every e8m0 code of ``w_scale`` lies within REGISTER_DECODE_CODES. A view is judged by its
    whole base (a layer's scales are usually a view of its parameter). Checked once per tensor and
    version (the check syncs); None while a CUDA graph is being captured and the tensor is unchecked."""
    owner = w_scale if w_scale._base is None or w_scale._base.dtype != w_scale.dtype else w_scale._base
    key = (owner.data_ptr(), tuple(owner.shape), owner.stride(), owner.device)
    entry = _checked_scales.get(key)
    if entry is not None:
        checked = entry[0]()
        if checked is not None and checked._version == entry[1]:
            return entry[2]
    if owner.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    low, high = REGISTER_DECODE_CODES
    in_range = bool(((owner >= low) & (owner <= high)).all())

    def forget(ref: weakref.ref) -> None:
        if _checked_scales.get(key, (None,))[0] is ref:
            del _checked_scales[key]

    _checked_scales[key] = (weakref.ref(owner, forget), owner._version, in_range)
    return in_range


def mx_register_decode(a: torch.Tensor, w_scale: torch.Tensor, block_m: int) -> bool:
    """Whether an MXFP4 GEMM decodes its weight tiles in registers (_mxfp4_step_registers) instead of
    through Triton's microscaled dot: bf16 activations on an NVIDIA GPU with sm_90's bf16x2 multiply,
    row blocks of at most 32 (at 64 rows a block the microscaled dot measured as fast or faster:
    benchmarks/kernels/experiments/mxfp4-tiled-decode-h200.json), and scales whose every code the
    register decoding covers (:data:`atom_kernels.mxfp4.REGISTER_DECODE_CODES`; others keep the
    microscaled dot, also while a graph is captured before the tensor was checked)."""
    if interpreting() or a.dtype != torch.bfloat16 or block_m > 32 or not a.is_cuda:
        return False
    if torch.version.hip is not None or torch.cuda.get_device_capability(a.device) < (9, 0):
        return False
    return bool(_codes_in_register_range(w_scale))


def launch_moe_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    topk_weights: torch.Tensor | None,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_entries: int,
    a_row_divisor: int,
    block_m: int,
    tiles: dict[str, int],
    *,
    gated: bool = False,
    act: int = ACT_SILU,
    interleaved: bool = False,
    alpha: float = 0.0,
    limit: float = math.inf,
    a_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
    block_size: int = 0,
    mxfp4: bool = False,
    expert_ids: torch.Tensor | None = None,
) -> None:
    """One GEMM of the fused MoE. FP8 ``a`` and ``w`` come with their scales: with ``block_size``,
    ``a_scale`` [a rows, K groups] and ``w_scale`` [E, row blocks, K blocks]; with ``block_size`` 0,
    ``a_scale`` [a rows, 1] and ``w_scale`` [E, rows] or [E, rows, 1]. MXFP4 ``w`` (``mxfp4``) is
    packed [E, rows, K / 2] with ``w_scale`` uint8 [E, rows, K / 32], and ``a`` is not quantized.

    ``tiles["SWAP_AB"]`` (default False; bf16 and fp8 weights): each K step multiplies the weight
    tile by the rows (:func:`_dense_step`). ``tiles["SPLIT_K"]`` (default 1) > 1 splits K among that
    many programs per output tile. Gated,
    their fp32 partials are reduced here into ``out`` (``expert_ids``, the flat top-k ids, find each
    row's bias). Plain, ``out`` holds the partials: fp32, ``SPLIT_K`` consecutive rows per entry,
    for the caller to sum with the entry's other top-k rows (:func:`sum_expert_rows`)."""
    tiles = dict(tiles)
    split_k = tiles.pop("SPLIT_K", 1)
    swap_ab = tiles.pop("SWAP_AB", False)
    if swap_ab and mxfp4:
        raise ValueError("launch_moe_gemm: SWAP_AB is for bf16 and fp8 weights (MXFP4 tiles decode in registers)")
    n, k = out.shape[1], a.shape[1]
    if split_k > 1 and not gated and out.shape[0] != num_entries * split_k:
        raise ValueError(f"launch_moe_gemm: SPLIT_K {split_k} needs {num_entries * split_k} output "
                         f"rows, not {out.shape[0]}")
    up_offset, step = (1, 2) if interleaved else (n, 1)
    if not gated:
        up_offset, step = 0, 1
    if block_size:
        # A K step must lie inside one scale block: BLOCK_K (a power of two) clamped to a divisor.
        tiles = {**tiles, "BLOCK_K": math.gcd(tiles["BLOCK_K"], block_size)}
    if mxfp4:
        # A K step covers whole 32-value scale blocks (and each half of the decoding step is a dot
        # of at least 16).
        tiles = {**tiles, "BLOCK_K": max(tiles["BLOCK_K"], 32)}
    result = out
    if split_k > 1 and gated:
        out = torch.empty((num_entries * split_k, 2 * n), dtype=torch.float32, device=a.device)
    grid = (block_expert.shape[0] * cdiv(n, tiles["BLOCK_N"]), split_k)
    _moe_gemm_kernel[grid](
        a,
        w,
        bias,
        out,
        topk_weights,
        sorted_ids,
        block_expert,
        a_scale,
        w_scale,
        num_entries,
        n,
        k,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        bias.stride(0) if bias is not None else 0,
        out.stride(0),
        a_scale.stride(0) if a_scale is not None else 0,
        a_scale.stride(1) if a_scale is not None else 0,
        w_scale.stride(0) if w_scale is not None else 0,
        w_scale.stride(1) if w_scale is not None else 0,
        up_offset,
        step,
        alpha,
        limit,
        split_k,
        A_ROW_DIVISOR=a_row_divisor,
        GATED=gated,
        ACT=act,
        HAS_BIAS=bias is not None,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        W8A8=w_scale is not None and not mxfp4,
        MXFP4=mxfp4,
        MX_DOT=mxfp4 and mx_dot_format(a) is not None,
        MX_REGISTERS=mxfp4 and mx_register_decode(a, w_scale, block_m),
        A_FORMAT=mx_dot_format(a) or "",
        SCALE_BLOCK=block_size if w_scale is not None else 0,
        DOT_PRECISION=dot_precision(a.dtype),
        EVEN_K=k % tiles["BLOCK_K"] == 0,
        PARTIAL=split_k > 1,
        SWAP_AB=swap_ab,
        BLOCK_M=block_m,
        **tiles,
    )
    if split_k > 1 and gated:
        reduce_gated_partials(out, result, split_k, bias, expert_ids, act, alpha, limit,
                              up_offset, step)


@fused_moe.register("triton")
def fused_moe_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    interleaved: bool = False,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block_size: int = 0,
    weight_format: str = "auto",
    input_format: str = "auto",
) -> torch.Tensor:
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"fused_moe: unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}"
        )
    w13_scale, w2_scale = _check_fused_moe_args(
        x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block_size, weight_format,
        input_format
    )
    tensors = {"x": x, "w13": w13, "w2": w2, "w13_scale": w13_scale, "w2_scale": w2_scale}
    for name, t in tensors.items():
        if t is not None:
            check_last_dim_contiguous(name, t)
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    if num_tokens == 0:
        return torch.zeros_like(x)
    gemm_options = {
        "act": ACTIVATIONS[activation],
        "interleaved": interleaved,
        "alpha": swiglu_alpha,
        "limit": swiglu_limit,
        "w13_bias": w13_bias,
        "w2_bias": w2_bias,
        "w13_scale": w13_scale,
        "w2_scale": w2_scale,
        "block_size": block_size,
        "weight_format": weight_format,
        "input_format": input_format,
    }
    key = moe_shape_key(num_experts, hidden, inter, top_k, w13.dtype)
    if key not in _warmed_up_shapes:
        # For hosts that did not call warm_up_fused_moe before serving: the first call of a shape
        # compiles its tuned configs (an engine's warm-up pass makes that call).
        warm_up_fused_moe(w13, w2, top_k, activation=activation, interleaved=interleaved,
                          w13_bias=w13_bias, w2_bias=w2_bias, swiglu_alpha=swiglu_alpha,
                          swiglu_limit=swiglu_limit, w13_scale=w13_scale, w2_scale=w2_scale,
                          block_size=block_size, weight_format=weight_format,
                          input_format=input_format, x_dtype=x.dtype)
    plain_ok = plain_gate_up_supported(gemm_options["act"], interleaved, w13_bias is not None,
                                       weight_format == "mxfp4", inter, block_size)
    config = servable_config(moe_config(key, num_tokens, num_experts, top_k, x), plain_ok)
    return run_fused_moe(x, w13, w2, topk_weights, topk_ids, config, **gemm_options)


_warmed_up_shapes: set[str] = set()


def warm_up_fused_moe(
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    *,
    activation: str = "silu",
    interleaved: bool = False,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block_size: int = 0,
    weight_format: str = "auto",
    input_format: str = "auto",
    x_dtype: torch.dtype | None = None,
) -> None:
    """Compile the Triton fused MoE for every tile config one layer's shape runs on this GPU (its
    tuned ones, or the defaults where this GPU has none for it), so that no batch size compiles one
    while serving: one-token runs with fp32 routing weights and int32
    ids (what :mod:`atom_kernels.routing` returns). Arguments as :func:`fused_moe`'s for the layer;
    ``x_dtype`` is the activations' dtype, by default the weights' (FP8 and MXFP4 weights need it). Once per
    shape; nothing to do off CUDA, or while a CUDA graph is being captured (compiling is not
    capturable: the shape stays pending)."""
    if not w13.is_cuda or torch.cuda.is_current_stream_capturing():
        return
    # D and I from the dims that are not packed along K (MXFP4 stores K / 2 bytes).
    num_experts, two_i, hidden = w13.shape[0], w13.shape[1], w2.shape[1]
    key = moe_shape_key(num_experts, hidden, two_i // 2, top_k, w13.dtype)
    if key in _warmed_up_shapes:
        return
    if x_dtype is None and w13.dtype in (FP8_DTYPE, torch.uint8):
        raise ValueError("warm_up_fused_moe: FP8 and MXFP4 weights need x_dtype, the activations' "
                         "dtype")
    _warmed_up_shapes.add(key)
    x = torch.zeros((1, hidden), dtype=x_dtype or w13.dtype, device=w13.device)
    topk_ids = (torch.arange(top_k, device=w13.device) % num_experts).to(torch.int32)[None, :]
    topk_weights = torch.full((1, top_k), 1.0 / top_k, dtype=torch.float32, device=w13.device)
    plain_ok = plain_gate_up_supported(ACTIVATIONS[activation], interleaved, w13_bias is not None,
                                       weight_format == "mxfp4", two_i // 2, block_size)
    configs = [servable_config(config, plain_ok)
               for config in all_tuned_configs("fused_moe", key, w13.device) or default_moe_configs()]
    for config in configs:
        run_fused_moe(x, w13, w2, topk_weights, topk_ids, config, act=ACTIVATIONS[activation],
                      interleaved=interleaved, alpha=swiglu_alpha, limit=swiglu_limit,
                      w13_bias=w13_bias, w2_bias=w2_bias, w13_scale=w13_scale, w2_scale=w2_scale,
                      block_size=block_size, weight_format=weight_format, input_format=input_format)
    for block_m in {config["BLOCK_M"] for config in configs if "BLOCK_M" in config}:
        warm_up_moe_align(num_experts, block_m, w13.device)


def run_fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: dict,
    *,
    act: int = ACT_SILU,
    interleaved: bool = False,
    alpha: float = 1.702,
    limit: float = 7.0,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block_size: int = 0,
    weight_format: str = "auto",
    input_format: str = "auto",
) -> torch.Tensor:
    """The Triton fused MoE with a given tile config (:func:`moe_config`'s form, or with ``"GEMV"``
    for MXFP4 experts: :mod:`atom_kernels.moe_gemv`; gate/up tiles with ``"PLAIN": True`` run
    :func:`plain_gate_up`); no checks."""
    mxfp4 = weight_format == "mxfp4"
    round_inputs = mxfp4_quant_dequant_triton if input_format == "mxfp4" else None
    if round_inputs is not None:
        x = round_inputs(x)
    if config.get("GEMV"):
        if not mxfp4:
            raise ValueError("run_fused_moe: GEMV configs are for MXFP4 experts only")
        return run_fused_moe_mxfp4_gemv(x, w13, w2, topk_weights, topk_ids, config, act=act,
                                        interleaved=interleaved, alpha=alpha, limit=limit,
                                        w13_bias=w13_bias, w2_bias=w2_bias, w13_scale=w13_scale,
                                        w2_scale=w2_scale, round_hidden=round_inputs)
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    num_entries = num_tokens * top_k
    block_m = config["BLOCK_M"]
    sorted_ids, block_expert = moe_align_block_size_triton(topk_ids, num_experts, block_m)
    fp8 = w13_scale is not None and not mxfp4
    a, a_scale = quantize_activations(x, block_size, "triton") if fp8 else (x, None)
    gate_up_tiles = dict(config["gate_up"])
    if gate_up_tiles.pop("PLAIN", False):
        if not plain_gate_up_supported(act, interleaved, w13_bias is not None, mxfp4, inter, block_size):
            raise ValueError("run_fused_moe: PLAIN gate/up tiles are for SiLU over stacked [gate | up] rows "
                             "without biases, bf16 or FP8 experts (I a multiple of the FP8 block)")
        a, a_scale = plain_gate_up(a, a_scale, w13, w13_scale, block_size, sorted_ids, block_expert,
                                    num_entries, top_k, block_m, gate_up_tiles, x.dtype)
    else:
        hidden_states = torch.empty((num_entries, inter), dtype=x.dtype, device=x.device)
        launch_moe_gemm(a, w13, w13_bias, hidden_states, None, sorted_ids, block_expert, num_entries, top_k, block_m,
                        gate_up_tiles, gated=True, act=act, interleaved=interleaved, alpha=alpha, limit=limit,
                        a_scale=a_scale, w_scale=w13_scale, block_size=block_size, mxfp4=mxfp4,
                        expert_ids=topk_ids.reshape(-1))
        if round_inputs is not None:
            hidden_states = round_inputs(hidden_states)
        a, a_scale = quantize_activations(hidden_states, block_size, "triton") if fp8 else (hidden_states, None)
    down_split = config["down"].get("SPLIT_K", 1)
    expert_out = torch.empty((num_entries * down_split, hidden),
                             dtype=torch.float32 if down_split > 1 else x.dtype, device=x.device)
    launch_moe_gemm(a, w2, w2_bias, expert_out, topk_weights.reshape(-1).contiguous(), sorted_ids, block_expert,
                    num_entries, 1, block_m, config["down"], a_scale=a_scale, w_scale=w2_scale, block_size=block_size,
                    mxfp4=mxfp4)
    return sum_expert_rows(expert_out, num_tokens, top_k * down_split, x.dtype)


def plain_gate_up_supported(act: int, interleaved: bool, has_bias: bool, mxfp4: bool, inter: int,
                            block_size: int) -> bool:
    """What :func:`plain_gate_up`'s activation launch computes: SiLU over stacked [gate | up] rows
    without biases, of bf16 or FP8 experts whose I fills whole FP8 blocks."""
    return act == ACT_SILU and not interleaved and not has_bias and not mxfp4 and inter % max(block_size, 1) == 0


def servable_config(config: dict, plain_ok: bool) -> dict:
    """``config`` with its gate/up tiles in the gated form where ``plain_ok`` is False: a table entry
    is keyed by the layer's shape alone, so a PLAIN one tuned for a SiLU model is served gated to a
    layer with another activation, interleaved rows or biases, rather than refused."""
    if plain_ok or not config.get("gate_up", {}).get("PLAIN"):
        return config
    return {**config, "gate_up": {k: v for k, v in config["gate_up"].items() if k != "PLAIN"}}


def plain_gate_up(a, a_scale, w13, w13_scale, block_size, sorted_ids, block_expert, num_entries, top_k, block_m,
                   tiles, out_dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gate/up GEMM of a ``PLAIN`` tile config: one GEMM over w13's 2I stacked rows into [entries,
    2I], then SiLU * mul in a launch of its own that also quantizes for the down GEMM with FP8 experts
    (vLLM's form; the gated kernel instead holds a gate and an up accumulator a program and applies the
    activation in its epilogue). Returns the down GEMM's input and its scales (None for bf16)."""
    if tiles.get("SPLIT_K", 1) > 1:
        raise ValueError("run_fused_moe: PLAIN gate/up tiles take no SPLIT_K")
    gate_up = torch.empty((num_entries, w13.shape[1]), dtype=out_dtype, device=a.device)
    launch_moe_gemm(a, w13, None, gate_up, None, sorted_ids, block_expert, num_entries, top_k, block_m, tiles,
                    a_scale=a_scale, w_scale=w13_scale, block_size=block_size)
    if w13_scale is None:
        return silu_and_mul.impl("triton")(gate_up), None
    return launch_gated_activation(gate_up, ACT_SILU, fp8=FP8_DTYPE, group_size=block_size or None,
                                   row_major_scales=True)
