"""RMSNorm, fused residual-add + RMSNorm. Per-head QK-norm is ``rms_norm`` on a [..., head_dim] view."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import check_last_dim_contiguous, next_pow2


@define_op
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dim, times ``weight``; ``x`` may be a strided [T, H, D] view
    (per-head QK-norm), read in place."""


@define_op
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``."""


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


@triton.jit(do_not_specialize=["num_rows"])
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    res_out_ptr,
    num_rows,
    inner_rows,
    x_stride_outer,
    x_stride_inner,
    r_stride_outer,
    r_stride_inner,
    N,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Rows are addressed as (outer, inner) so that a strided [T, H, D] view (QK-norm on a slice of the
    # fused qkv output) is read in place. Outputs are contiguous [num_rows, N].
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < num_rows
    mask = row_mask[:, None] & (cols < N)[None, :]
    outer, inner = rows // inner_rows, rows % inner_rows
    x_offs = (outer * x_stride_outer + inner * x_stride_inner)[:, None] + cols[None, :]
    x = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
    out_offs = rows[:, None] * N + cols[None, :]
    if HAS_RESIDUAL:
        r_offs = (outer * r_stride_outer + inner * r_stride_inner)[:, None] + cols[None, :]
        r = tl.load(res_ptr + r_offs, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + out_offs, summed, mask=mask)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=1) / N
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(variance + eps)[:, None] * w[None, :]
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
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
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
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(y) if residual is not None else y
    # Small rows (QK-norm over head_dim) are packed several to a program; about 4K elements each.
    block_r = max(1, min(64, 4096 // block_n))
    tile = block_r * block_n
    # The fused add on rows of 4096+ takes 16 warps: 66.7-67.0 vs 67.4-67.6 us at 8192 x 4096; plain
    # RMSNorm keeps 8 (34.7-35.0 vs 38.4 us with 16). bench_kernels.py on H200s, 2026-11.
    num_warps = 16 if residual is not None and block_n >= 4096 else 8 if tile >= 4096 else 4
    grid = (triton.cdiv(num_rows, block_r),)
    if num_rows > 0:
        _rms_norm_kernel[grid](
            xr,
            rr,
            weight,
            y,
            res_out,
            num_rows,
            xr.shape[1],
            xr.stride(0),
            xr.stride(1),
            rr.stride(0),
            rr.stride(1),
            n,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK_R=block_r,
            BLOCK_N=block_n,
            num_warps=num_warps,
        )
    return y, (res_out if residual is not None else None)


@rms_norm.register("triton")
def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch_rms_norm(x, None, weight, eps)[0]


@fused_add_rms_norm.register("triton")
def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    y, summed = _launch_rms_norm(x, residual, weight, eps)
    return y, summed
