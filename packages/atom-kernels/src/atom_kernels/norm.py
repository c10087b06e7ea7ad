"""RMSNorm, fused residual-add + RMSNorm. Per-head QK-norm is ``rms_norm`` on a [..., head_dim] view."""

from __future__ import annotations

import torch

from atom_kernels.registry import define_op

rms_norm = define_op("rms_norm", "rms_norm(x, weight, eps) -> y, normalised over the last dim")
fused_add_rms_norm = define_op(
    "fused_add_rms_norm",
    "fused_add_rms_norm(x, residual, weight, eps) -> (rms_norm(x + residual), x + residual)",
)


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
