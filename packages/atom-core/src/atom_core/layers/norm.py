"""RMSNorm with the residual add fused by signature: ``norm(x)`` -> y, ``norm(x, r)`` -> (y, x + r)."""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels
from atom_core.layers.linear import default_weight_loader, make_param


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = make_param((hidden_size,), default_weight_loader)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return atom_kernels.rms_norm(x, self.weight, self.eps)
        return atom_kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
