"""FP8 linear math: the parameters an FP8 layer holds and its forward,
``y = dequant(quant(x)) @ dequant(W)^T (+ b)`` on atom_kernels' FP8 GEMMs.

| scheme | weight scale parameter | activation quantization | GEMM |
|---|---|---|---|
| block B | [ceil(N/B), ceil(K/B)] fp32 | per token and B-channel group | ``fp8_block_scaled_mm`` |
| per channel, dynamic | [N] fp32 | per token | ``fp8_scaled_mm`` |
| per channel, static | [N] fp32, ``input_scale`` [1] | per tensor, the checkpoint's scale | ``fp8_scaled_mm`` |
"""

from __future__ import annotations

import math

import torch

import atom_kernels
from atom_core.quantization.scheme import Fp8Scheme

FP8_DTYPE = torch.float8_e4m3fn


def weight_scale_shape(scheme: Fp8Scheme, out_features: int, in_features: int) -> tuple[int, ...]:
    block = scheme.weight_block
    if block is None:
        return (out_features,)
    return (math.ceil(out_features / block), math.ceil(in_features / block))


def fp8_linear(x: torch.Tensor, scheme: Fp8Scheme, weight: torch.Tensor, weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [..., K] in the model dtype -> [..., N]; ``weight`` fp8 [N, K]."""
    rows = x.reshape(-1, x.shape[-1])
    block = scheme.weight_block
    if block is not None:
        xq, x_scale = atom_kernels.per_group_quant_fp8(rows, block)
        y = atom_kernels.fp8_block_scaled_mm(xq, weight, x_scale, weight_scale, x.dtype, block)
        if bias is not None:
            y = y + bias
    else:
        if scheme.static_input:
            xq, x_scale = atom_kernels.per_tensor_quant_fp8(rows, input_scale)
        else:
            xq, x_scale = atom_kernels.per_token_quant_fp8(rows)
        y = atom_kernels.fp8_scaled_mm(xq, weight, x_scale, weight_scale, x.dtype, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: int | None) -> torch.Tensor:
    """fp32 ``weight * scale``: ``scale`` per B x B block (``block``), or per output row / tensor."""
    if block is None:
        return weight.float() * scale.float().reshape(-1, 1)
    rows, cols = weight.shape
    expanded = scale.float().repeat_interleave(block, 0).repeat_interleave(block, 1)
    return weight.float() * expanded[:rows, :cols]
