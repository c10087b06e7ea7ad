"""Gated activations as modules (the op lives in atom_kernels)."""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return atom_kernels.silu_and_mul(x)
