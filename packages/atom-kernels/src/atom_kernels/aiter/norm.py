"""AITER adapters of :mod:`atom_kernels.norm` (RMSNorm): ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.norm import fused_add_rms_norm, rms_norm


@rms_norm.register("aiter")
def rms_norm_aiter(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    import aiter

    return aiter.rmsnorm2d_fwd(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)


@fused_add_rms_norm.register("aiter")
def fused_add_rms_norm_aiter(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    import aiter

    rows, res_rows = x.reshape(-1, x.shape[-1]), residual.reshape(-1, x.shape[-1])
    out, residual_out = torch.empty_like(rows), torch.empty_like(rows)
    aiter.rmsnorm2d_fwd_with_add(out, rows, res_rows, residual_out, weight, eps)
    return out.view(x.shape), residual_out.view(x.shape)
