"""The fused MoE's GEMMs for a few tokens with MXFP4 experts, as matrix-vector products.

At one to a few tokens a routed entry (token, k) meets its expert's weights alone: the tiled GEMMs
(atom_kernels.moe) pad each entry to a 16-row block, sort the entries by expert, and
upcast every weight tile for the tensor cores. Here one program takes one entry and BLOCK_N output
columns, reads the packed rows straight from the entry's expert (no sort) and multiplies on the
CUDA cores: per byte two e2m1 decodes (bit moves into an fp16, :func:`e2m1_to_float_scaled`) and two
FMAs; each 32-value block's partial sum is scaled once. A tuned config with ``"GEMV": true`` selects
this path (:func:`atom_kernels.moe.run_fused_moe`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from atom_kernels.activation import apply_gated_activation
from atom_kernels.moe_reduce import sum_expert_rows
from atom_kernels.mxfp4 import MXFP4_BLOCK, e8m0_to_float
from atom_kernels.triton_utils import cdiv

# e2m1_to_float_scaled gives 2 ** -14 times e2m1's values.
E2M1_FP16_SCALE: tl.constexpr = tl.constexpr(2.0**14)


@triton.jit
def e2m1_to_float_scaled(code):
    """fp32 ``2 ** -14`` times the values of e2m1 codes (a uint16 tensor, a code in its low 4 bits).
    The sign goes to fp16's bit 15 and the 2 exponent bits and the mantissa bit to bits 11-9, so
    the fp16 reads 2 ** (e - 15) * (1 + m / 2) for exponent e > 0, and its subnormal m * 2 ** -15
    for e = 0: both 2 ** -14 times the code's value, exactly."""
    bits = ((code & 8) << 12) | ((code & 7) << 9)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _mxfp4_rows_dot(x_row, w_rows, s_rows, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N] fp32: the dot products of the x row (``x_row``, K values) with BLOCK_N MXFP4 weight
    rows (``w_rows`` / ``s_rows`` [BLOCK_N, 1]: pointers to each row's bytes and scales)."""
    GROUPS: tl.constexpr = BLOCK_K // 32
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        pairs = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # byte j holds values 2j and 2j + 1
        valid = pairs < K // 2
        packed = tl.load(w_rows + pairs[None, :], mask=valid[None, :], other=0).to(tl.uint16)
        x_even = tl.load(x_row + 2 * pairs, mask=valid, other=0.0).to(tl.float32)
        x_odd = tl.load(x_row + 2 * pairs + 1, mask=valid, other=0.0).to(tl.float32)
        products = (e2m1_to_float_scaled(packed & 15) * x_even[None, :]
                    + e2m1_to_float_scaled(packed >> 4) * x_odd[None, :])
        # 16 bytes (32 values) per scale.
        block_sums = tl.sum(tl.reshape(products, [BLOCK_N, GROUPS, 16]), axis=2)
        groups = k0 // 32 + tl.arange(0, GROUPS)
        codes = tl.load(s_rows + groups[None, :], mask=(groups < K // 32)[None, :], other=0)
        acc += tl.sum(block_sums * e8m0_to_float(codes), axis=1)
    return acc * E2M1_FP16_SCALE


@triton.jit
def _mxfp4_gemv_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    expert_ids_ptr,
    topk_weights_ptr,
    N,
    K,
    x_stride,
    w_stride_e,
    w_stride_n,
    scale_stride_e,
    scale_stride_n,
    bias_stride_e,
    out_stride,
    up_offset,
    gate_up_step,
    alpha,
    limit,
    X_ROW_DIVISOR: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    entry = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = cols < N
    expert = tl.load(expert_ids_ptr + entry).to(tl.int64)
    x_row = x_ptr + (entry // X_ROW_DIVISOR) * x_stride
    # Columns past N wrap (the store drops them). Gate/up rows as in atom_kernels.moe:
    # row n * gate_up_step, + up_offset for up.
    rows = ((cols % N) * gate_up_step).to(tl.int64)
    w_expert = w_ptr + expert * w_stride_e
    s_expert = scale_ptr + expert * scale_stride_e
    acc = _mxfp4_rows_dot(x_row, w_expert + rows[:, None] * w_stride_n,
                          s_expert + rows[:, None] * scale_stride_n, K, BLOCK_N, BLOCK_K)
    if GATED:
        up_rows = rows + up_offset
        acc_up = _mxfp4_rows_dot(x_row, w_expert + up_rows[:, None] * w_stride_n,
                                 s_expert + up_rows[:, None] * scale_stride_n, K, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        bias_row = bias_ptr + expert * bias_stride_e
        acc += tl.load(bias_row + cols * gate_up_step, mask=col_valid, other=0.0).to(tl.float32)
        if GATED:
            acc_up += tl.load(bias_row + cols * gate_up_step + up_offset, mask=col_valid,
                              other=0.0).to(tl.float32)
    if GATED:
        acc = apply_gated_activation(acc, acc_up, ACT, alpha, limit)
    if MUL_ROUTED_WEIGHT:
        acc = acc * tl.load(topk_weights_ptr + entry).to(tl.float32)
    tl.store(out_ptr + entry * out_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=col_valid)


def launch_mxfp4_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    expert_ids: torch.Tensor,
    topk_weights: torch.Tensor | None,
    x_row_divisor: int,
    tiles: dict[str, int],
    *,
    gated: bool = False,
    act: int = 0,
    interleaved: bool = False,
    alpha: float = 0.0,
    limit: float = float("inf"),
) -> None:
    """One GEMM of the fused MoE, an entry a program row: ``out[e]`` = x[e // x_row_divisor] @
    w[expert_ids[e]]^T (+ bias; gated: the activation of gate and up; times ``topk_weights[e]``).
    ``w`` uint8 [E, rows, K / 2], ``w_scale`` uint8 [E, rows, K / 32]; ``tiles``: BLOCK_N, BLOCK_K
    (a multiple of 32), num_warps."""
    n, k = out.shape[1], x.shape[1]
    up_offset, step = (1, 2) if interleaved else (n, 1)
    if not gated:
        up_offset, step = 0, 1
    tiles = {**tiles, "BLOCK_K": max(tiles["BLOCK_K"], MXFP4_BLOCK)}
    grid = (out.shape[0], cdiv(n, tiles["BLOCK_N"]))
    _mxfp4_gemv_kernel[grid](
        x, w, w_scale, bias, out, expert_ids, topk_weights,
        n, k,
        x.stride(0), w.stride(0), w.stride(1), w_scale.stride(0), w_scale.stride(1),
        bias.stride(0) if bias is not None else 0, out.stride(0),
        up_offset, step, alpha, limit,
        X_ROW_DIVISOR=x_row_divisor,
        GATED=gated,
        ACT=act,
        HAS_BIAS=bias is not None,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        **tiles,
    )


def run_fused_moe_mxfp4_gemv(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: dict,
    *,
    act: int,
    interleaved: bool,
    alpha: float,
    limit: float,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    round_hidden: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The fused MoE with MXFP4 experts by :func:`launch_mxfp4_gemv`: gate/up, down, then each token's
    top_k rows summed. ``config``: {"GEMV": True, "gate_up": tiles, "down": tiles}. ``round_hidden``:
    applied to the activation's output before the down GEMM (W4A4 checkpoints round it to MXFP4)."""
    num_tokens, hidden = x.shape
    inter, top_k = w13.shape[1] // 2, topk_ids.shape[1]
    expert_ids = topk_ids.reshape(-1)
    hidden_states = torch.empty((expert_ids.shape[0], inter), dtype=x.dtype, device=x.device)
    launch_mxfp4_gemv(x, w13, w13_scale, w13_bias, hidden_states, expert_ids, None, top_k,
                      config["gate_up"], gated=True, act=act, interleaved=interleaved, alpha=alpha,
                      limit=limit)
    if round_hidden is not None:
        hidden_states = round_hidden(hidden_states)
    rows = torch.empty((expert_ids.shape[0], hidden), dtype=torch.float32, device=x.device)
    launch_mxfp4_gemv(hidden_states, w2, w2_scale, w2_bias, rows, expert_ids,
                      topk_weights.reshape(-1).contiguous(), 1, config["down"])
    return sum_expert_rows(rows, num_tokens, top_k, x.dtype)
