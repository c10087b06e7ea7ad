"""Gated MLP: down(act(gate(x)) * up(x)) with gate|up fused into one column-parallel GEMM. Under
dynamic FP8 the activation emits down's input quantized, and the MLP takes its input quantized for
gate/up (``input_quant``). ``reduce_results=False`` leaves the sum over TP ranks to the caller
(:class:`RowParallelLinear`)."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.layers.activation import SiluAndMul
from atom_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from atom_core.quantization.fp8 import QuantizedActivation


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, prefix: str, bias: bool = False,
                 reduce_results: bool = True):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, prefix=f"{prefix}.down_proj",
                                           reduce_results=reduce_results)
        # SiLU * mul quantizes down's input itself per 128-group only: per token its kernel holds a
        # whole row in one program, and on an H200 it took 0.98-1.18x the time of the two launches
        # from 1 to 16384 rows (benchmarks/kernels/fp8-fusion-h200-9db1219.json); the fused norms
        # took 0.32-0.70x in both forms.
        down_quant = self.down_proj.input_quant
        self.act_fn = SiluAndMul(down_quant if down_quant is not None and down_quant.group_size else None)
        self.input_quant = self.gate_up_proj.input_quant

    def forward(self, x: torch.Tensor | QuantizedActivation) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
