"""Gated MLP: down(act(gate(x)) * up(x)) with gate|up fused into one column-parallel GEMM. Under
dynamic FP8 the activation emits down's input quantized, and the MLP takes its input quantized for
gate/up (``input_quant``)."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.layers.activation import SiluAndMul
from atom_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from atom_core.quantization.fp8 import QuantizedActivation


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, prefix: str, bias: bool = False):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul(self.down_proj.input_quant)
        self.input_quant = self.gate_up_proj.input_quant

    def forward(self, x: torch.Tensor | QuantizedActivation) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
