"""Gated activations as modules (the op lives in atom_kernels)."""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels
from atom_core.quantization.fp8 import ActivationQuant, QuantizedActivation


class SiluAndMul(nn.Module):
    """``silu(gate) * up``; with ``quant`` (the next FP8 linear's, see
    :func:`atom_core.layers.linear.input_quant_of`) quantized for it by the same kernel."""

    def __init__(self, quant: ActivationQuant | None = None):
        super().__init__()
        self.quant = quant

    def forward(self, x: torch.Tensor) -> torch.Tensor | QuantizedActivation:
        if self.quant is None:
            return atom_kernels.silu_and_mul(x)
        return QuantizedActivation(
            *atom_kernels.silu_and_mul_quant_fp8(x, self.quant.group_size), x.dtype)
