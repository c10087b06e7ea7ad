"""AITER adapters of :mod:`atom_kernels.gemm` (fp8 GEMMs): ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.gemm import fp8_block_scaled_mm, fp8_scaled_mm


@fp8_scaled_mm.register("aiter")
def fp8_scaled_mm_aiter(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    import aiter

    # gemm_a8w8 takes per-token x per-channel scales; a per-tensor scale is broadcast to that.
    x_scale = a_scale.float().reshape(-1, 1).expand(a.shape[0], 1).contiguous()
    w_scale = b_scale.float().reshape(1, -1).expand(1, b.shape[0]).contiguous()
    return aiter.gemm_a8w8(a, b, x_scale, w_scale, bias, out_dtype)


@fp8_block_scaled_mm.register("aiter")
def fp8_block_scaled_mm_aiter(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    block_size: int = 128,
) -> torch.Tensor:
    import aiter

    if block_size != 128:
        raise ValueError(f"fp8_block_scaled_mm (aiter): only 128 blocks, got {block_size}")
    # Row-major activation scales, as aiter's per_1x128 quantization writes them.
    return aiter.gemm_a8w8_blockscale(a, b, a_scale.contiguous(), b_scale, out_dtype)
