"""RMSNorm, fused residual-add + RMSNorm. Per-head QK-norm is ``rms_norm`` on a [..., head_dim] view.

The ``*_quant_fp8`` variants emit the normed rows as dynamic fp8 for the next FP8 GEMM instead:
per token and ``group_size``-channel group (block FP8), or per token (``group_size`` None). They
round the normed value to the input dtype before quantising, as the unfused norm stores it, so
their fp8 codes and scales are those of the norm followed by :mod:`atom_kernels.quant` (on an H200
not always for ``rms_norm_quant_fp8`` at 128+ rows, not yet explained: docs/quantization.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.quant import (
    FP8_DTYPE,
    MIN_AMAX,
    check_fused_quant_group,
    dynamic_quant_fp8_torch,
    fp8_dtype_max,
    new_scales,
    quantize_fp8_groups,
)
from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous, next_pow2


@define_op
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dim, times ``weight``; ``x`` may be a strided [T, H, D] view
    (per-head QK-norm), read in place."""


@define_op
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``."""


@define_op
def rms_norm_quant_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None = 128,
    *,
    dtype: torch.dtype = FP8_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(x)`` quantised to fp8 in one pass: ``(q [..., N], scale)``, scale [M, N / group_size]
    as :func:`atom_kernels.per_group_quant_fp8`'s, or [M, 1] per token when ``group_size`` is None."""


@define_op
def fused_add_rms_norm_quant_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None = 128,
    *,
    dtype: torch.dtype = FP8_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fused_add_rms_norm`` with its normed output quantised as :func:`rms_norm_quant_fp8`'s:
    ``(q, scale, x + residual)``."""


@rms_norm.register("torch")
def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    variance = xf.pow(2).mean(dim=-1, keepdim=True)
    return (xf * torch.rsqrt(variance + eps) * weight.float()).to(x.dtype)


@fused_add_rms_norm.register("torch")
def fused_add_rms_norm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_torch(summed, weight, eps), summed


@rms_norm_quant_fp8.register("torch")
def rms_norm_quant_fp8_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None = 128,
    *,
    dtype: torch.dtype = FP8_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor]:
    return dynamic_quant_fp8_torch(rms_norm_torch(x, weight, eps), group_size, dtype)


@fused_add_rms_norm_quant_fp8.register("torch")
def fused_add_rms_norm_quant_fp8_torch(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None = 128,
    *,
    dtype: torch.dtype = FP8_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, summed = fused_add_rms_norm_torch(x, residual, weight, eps)
    return *dynamic_quant_fp8_torch(y, group_size, dtype), summed


@triton.jit(do_not_specialize=["num_rows"])
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    res_out_ptr,
    scale_ptr,
    num_rows,
    inner_rows,
    x_stride_outer,
    x_stride_inner,
    r_stride_outer,
    r_stride_inner,
    N,
    eps,
    num_groups,
    fp8_max,
    min_amax,
    HAS_RESIDUAL: tl.constexpr,
    QUANT_GROUP: tl.constexpr,
    MASKED_FILL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # fp32 whoever launches: Inductor passes Python floats as fp64 (ATOM_INDUCTOR_OPS).
    eps = tl.cast(eps, tl.float32)
    # Rows are addressed as (outer, inner) so that a strided [T, H, D] view (QK-norm on a slice of the
    # fused qkv output) is read in place. Outputs are contiguous [num_rows, N]. With QUANT_GROUP > 0
    # y_ptr takes the fp8 codes and scale_ptr [num_rows, num_groups] their scales, group-major
    # (atom_kernels.quant.new_scales). MASKED_FILL: what
    # masked elements load as, 1.0 where only whole rows are masked and quantised (as in
    # atom_kernels.quant, whose docstring says why: a masked row of zeros takes the IEEE division's slow
    # path); a fused norm of one 2048-wide row (two rows a program) took 4.1 us against 2.4 at 16 rows on
    # an H200 (benchmarks/kernels/experiments/fp8-h200.json.gz[fusion-ef17d92]).
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < num_rows
    mask = row_mask[:, None] & (cols < N)[None, :]
    outer, inner = rows // inner_rows, rows % inner_rows
    x_offs = (outer * x_stride_outer + inner * x_stride_inner)[:, None] + cols[None, :]
    x = tl.load(x_ptr + x_offs, mask=mask, other=MASKED_FILL).to(tl.float32)
    out_offs = rows[:, None] * N + cols[None, :]
    if HAS_RESIDUAL:
        r_offs = (outer * r_stride_outer + inner * r_stride_inner)[:, None] + cols[None, :]
        r = tl.load(res_ptr + r_offs, mask=mask, other=MASKED_FILL).to(tl.float32)
        summed = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + out_offs, summed, mask=mask)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=1) / N
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(variance + eps)[:, None] * w[None, :]
    if QUANT_GROUP > 0:
        # Rounded to the input dtype first, as the unfused norm stores it.
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
        y, scale = quantize_fp8_groups(y, QUANT_GROUP, fp8_max, min_amax)
        groups = tl.arange(0, BLOCK_N // QUANT_GROUP)
        scale_mask = row_mask[:, None] & (groups < num_groups)[None, :]
        tl.store(scale_ptr + groups[None, :] * num_rows + rows[:, None], scale, mask=scale_mask)
    tl.store(y_ptr + out_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 3-D [outer, inner, N] view (a copy only when the leading dims cannot be merged)."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    if t.dim() == 1:
        return t.view(1, 1, -1)
    if t.dim() == 2:
        return t.unsqueeze(1)
    if t.dim() > 3:
        return t.reshape(-1, *t.shape[-2:])
    return t


def _launch_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    fp8: torch.dtype | None = None,
    group_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(y, x + residual or None, None); with ``fp8`` (y's fp8 codes, x + residual or None, scales)
    per ``group_size`` group or per token."""
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} != ({n},)")
    check_last_dim_contiguous("rms_norm weight", weight)
    if residual is not None and residual.shape != x.shape:
        raise ValueError(
            f"fused_add_rms_norm: residual {tuple(residual.shape)} != x {tuple(x.shape)}"
        )
    block_n = next_pow2(n)
    if block_n > 65536:
        raise ValueError(f"rms_norm: hidden size {n} is larger than the kernel's 65536 limit")
    xr = _as_rows(x)
    rr = _as_rows(residual) if residual is not None else xr
    num_rows = x.numel() // n
    y = torch.empty(x.shape, dtype=fp8 or x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else y
    scale, quant_group, num_groups = None, 0, 0
    if fp8 is not None:
        check_fused_quant_group("rms_norm_quant_fp8", n, group_size)
        quant_group = block_n if group_size is None else group_size
        num_groups = 1 if group_size is None else n // group_size
        scale = new_scales(num_rows, num_groups, x.device)
    # Small rows (QK-norm over head_dim) are packed several to a program; about 4K elements each.
    block_r = max(1, min(64, 4096 // block_n))
    tile = block_r * block_n
    # The fused add on rows of 4096+ takes 16 warps: 66.7-67.0 vs 67.4-67.6 us at 8192 x 4096; plain
    # RMSNorm keeps 8 (34.7-35.0 vs 38.4 us with 16). bench_kernels.py on H200s, 2026-11.
    num_warps = 16 if residual is not None and block_n >= 4096 else 8 if tile >= 4096 else 4
    grid = (cdiv(num_rows, block_r),)
    if num_rows > 0:
        _rms_norm_kernel[grid](
            xr,
            rr,
            weight,
            y,
            res_out,
            scale,
            num_rows,
            xr.shape[1],
            xr.stride(0),
            xr.stride(1),
            rr.stride(0),
            rr.stride(1),
            n,
            eps,
            num_groups,
            fp8_dtype_max(fp8) if fp8 is not None else 0.0,
            MIN_AMAX,
            HAS_RESIDUAL=residual is not None,
            QUANT_GROUP=quant_group,
            MASKED_FILL=1.0 if fp8 is not None and n == block_n else 0.0,
            BLOCK_R=block_r,
            BLOCK_N=block_n,
            num_warps=num_warps,
        )
    return y, (res_out if residual is not None else None), scale


@rms_norm.register("triton")
def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch_rms_norm(x, None, weight, eps)[0]


@fused_add_rms_norm.register("triton")
def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    y, summed, _ = _launch_rms_norm(x, residual, weight, eps)
    return y, summed


@rms_norm_quant_fp8.register("triton")
def rms_norm_quant_fp8_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None = 128,
    *,
    dtype: torch.dtype = FP8_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor]:
    q, _, scale = _launch_rms_norm(x, None, weight, eps, dtype, group_size)
    return q, scale


@fused_add_rms_norm_quant_fp8.register("triton")
def fused_add_rms_norm_quant_fp8_triton(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group_size: int | None = 128,
    *,
    dtype: torch.dtype = FP8_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, summed, scale = _launch_rms_norm(x, residual, weight, eps, dtype, group_size)
    return q, scale, summed
