"""The fused MoE's reductions over rows of one token or one entry (:mod:`atom_kernels.moe`).

- :func:`sum_expert_rows`: a token's output is the sum of its top_k expert rows (already weighted),
  or of top_k x SPLIT_K rows where the down GEMM was split along K.
- :func:`reduce_gated_partials`: with the gate/up GEMM split along K, an entry's gate and up are
  the sums of SPLIT_K fp32 partial rows; the bias and the activation apply to the sums.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.activation import apply_gated_activation
from atom_kernels.triton_utils import cdiv, next_pow2


@triton.jit
def _sum_rows_kernel(rows_ptr, out_ptr, width, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[t] = sum over r of rows[t * ROWS + r], for one BLOCK_D slice."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < width
    acc = tl.zeros([BLOCK_D], tl.float32)
    for r in tl.static_range(ROWS):
        acc += tl.load(rows_ptr + (token * ROWS + r) * width + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * width + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def sum_expert_rows(rows: torch.Tensor, num_tokens: int, rows_per_token: int, dtype: torch.dtype) -> torch.Tensor:
    """[num_tokens, width] in ``dtype``: each token's ``rows_per_token`` consecutive rows of
    ``rows`` [num_tokens * rows_per_token, width] summed in fp32."""
    width = rows.shape[1]
    out = torch.empty((num_tokens, width), dtype=dtype, device=rows.device)
    block_d = min(1024, next_pow2(width))
    _sum_rows_kernel[(num_tokens, cdiv(width, block_d))](rows, out, width, ROWS=rows_per_token, BLOCK_D=block_d,
                                                         num_warps=4)
    return out


@triton.jit(do_not_specialize=["split_k"])
def _gated_partials_kernel(partials_ptr, out_ptr, bias_ptr, expert_ids_ptr, n, split_k, bias_stride_e, gate_up_step,
                           up_offset, alpha, limit, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    entry = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n
    gate = tl.zeros([BLOCK_N], tl.float32)
    up = tl.zeros([BLOCK_N], tl.float32)
    for split in range(split_k):
        row = partials_ptr + (entry * split_k + split) * 2 * n
        gate += tl.load(row + cols, mask=mask, other=0.0)
        up += tl.load(row + n + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        bias_row = bias_ptr + tl.load(expert_ids_ptr + entry).to(tl.int64) * bias_stride_e
        gate += tl.load(bias_row + cols * gate_up_step, mask=mask, other=0.0).to(tl.float32)
        up += tl.load(bias_row + cols * gate_up_step + up_offset, mask=mask, other=0.0).to(tl.float32)
    out = apply_gated_activation(gate, up, ACT, alpha, limit)
    tl.store(out_ptr + entry * n + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def reduce_gated_partials(
    partials: torch.Tensor,
    out: torch.Tensor,
    split_k: int,
    bias: torch.Tensor | None,
    expert_ids: torch.Tensor | None,
    act: int,
    alpha: float,
    limit: float,
    up_offset: int,
    gate_up_step: int,
) -> None:
    """``out`` [entries, N] = act(gate + gate bias) * (up + up bias), gate and up summed over the
    ``split_k`` consecutive fp32 rows [gate | up] of ``partials`` [entries * split_k, 2N]. The bias
    row of entry e is ``bias[expert_ids[e]]``, its gate and up at ``n * gate_up_step`` (+
    ``up_offset``), as the GEMM reads w13's rows."""
    if bias is not None and expert_ids is None:
        raise ValueError("reduce_gated_partials: a bias needs expert_ids")
    entries, n = out.shape
    block_n = min(1024, next_pow2(n))
    _gated_partials_kernel[(entries, cdiv(n, block_n))](
        partials, out, bias, expert_ids, n, split_k, bias.stride(0) if bias is not None else 0, gate_up_step,
        up_offset, alpha, limit, ACT=act, HAS_BIAS=bias is not None, BLOCK_N=block_n, num_warps=4)
