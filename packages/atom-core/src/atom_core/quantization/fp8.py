"""FP8 linear math: the parameters an FP8 layer holds and its forward,
``y = dequant(quant(x)) @ dequant(W)^T (+ b)`` on atom_kernels' FP8 GEMMs.

With dynamic activation scales, ``quant(x)`` may come from the layer before: an RMSNorm or SiLU * mul
built with the linear's :class:`ActivationQuant` (:func:`fused_input_quant`) quantizes its output in
its own kernel and hands the linear a :class:`QuantizedActivation`, saving a launch and a read and
write of the activation; the fp8 codes are the same (atom-kernels' tests). Off with
``ATOM_DISABLE_FP8_ACTIVATION_FUSION=1``.

| scheme | weight scale parameter | activation quantization | GEMM |
|---|---|---|---|
| block B | [ceil(N/B), ceil(K/B)] fp32 | per token and B-channel group | ``fp8_block_scaled_mm`` |
| per channel, dynamic | [N] fp32 | per token | ``fp8_scaled_mm`` |
| per channel, static | [N] fp32, ``input_scale`` [1] | per tensor, the checkpoint's scale | ``fp8_scaled_mm`` |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

import atom_kernels
from atom_core.envs import fp8_activation_fusion_disabled
from atom_core.quantization.scheme import Fp8Scheme, Mxfp4Scheme

FP8_DTYPE = torch.float8_e4m3fn


class QuantizedActivation(NamedTuple):
    """An FP8 linear's input, quantized: ``data`` fp8 [..., K], ``scale`` fp32 [M, K / group] or
    [M, 1] (per token) or [1] (per tensor), and ``dtype``, the model dtype it was quantized from (the
    linear's output dtype)."""

    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


@dataclass(frozen=True)
class ActivationQuant:
    """Dynamic FP8 quantization of a linear's input: per token and ``group_size``-channel group
    (block FP8), or per token (``group_size`` None)."""

    group_size: int | None

    def quantize(self, x: torch.Tensor) -> QuantizedActivation:
        if self.group_size is None:
            return QuantizedActivation(*atom_kernels.per_token_quant_fp8(x), x.dtype)
        return QuantizedActivation(*atom_kernels.per_group_quant_fp8(x, self.group_size), x.dtype)


def fused_input_quant(scheme: Fp8Scheme | Mxfp4Scheme | None) -> ActivationQuant | None:
    """How the layer before one of ``scheme`` may quantize that layer's input in its own kernel: for
    dynamic activations per token, or per group of a power-of-two block (every published
    block-FP8 checkpoint uses 128; the fused kernels tile whole groups). None for unquantized and
    static-input layers, MXFP4 ones, and when ATOM_DISABLE_FP8_ACTIVATION_FUSION=1."""
    if not isinstance(scheme, Fp8Scheme) or scheme.static_input or fp8_activation_fusion_disabled():
        return None
    block = scheme.weight_block
    if block is not None and block & (block - 1):
        return None
    return ActivationQuant(block)


def fusion_report_line() -> str:
    """The startup log line of the fusion switch."""
    state = "off (ATOM_DISABLE_FP8_ACTIVATION_FUSION=1)" if fp8_activation_fusion_disabled() else "on"
    return f"FP8 activation quantization fused into the norm / activation before FP8 linears: {state}"


def weight_scale_shape(scheme: Fp8Scheme, out_features: int, in_features: int) -> tuple[int, ...]:
    block = scheme.weight_block
    if block is None:
        return (out_features,)
    return (math.ceil(out_features / block), math.ceil(in_features / block))


def quantize_input(x: torch.Tensor, scheme: Fp8Scheme,
                   input_scale: torch.Tensor | None) -> QuantizedActivation:
    """``x`` [..., K] quantized as a linear of ``scheme`` takes it."""
    if scheme.static_input:
        return QuantizedActivation(*atom_kernels.per_tensor_quant_fp8(x, input_scale), x.dtype)
    return ActivationQuant(scheme.weight_block).quantize(x)


def fp8_linear(x: torch.Tensor | QuantizedActivation, scheme: Fp8Scheme, weight: torch.Tensor,
               weight_scale: torch.Tensor, input_scale: torch.Tensor | None,
               bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [..., K] in the model dtype, or quantized already as ``scheme`` quantizes it -> [..., N];
    ``weight`` fp8 [N, K]."""
    if not isinstance(x, QuantizedActivation):
        x = quantize_input(x, scheme, input_scale)
    rows = x.data.reshape(-1, x.data.shape[-1])
    block = scheme.weight_block
    if block is not None:
        y = atom_kernels.fp8_block_scaled_mm(rows, weight, x.scale, weight_scale, x.dtype, block)
        if bias is not None:
            y = y + bias
    else:
        y = atom_kernels.fp8_scaled_mm(rows, weight, x.scale, weight_scale, x.dtype, bias)
    return y.view(*x.data.shape[:-1], weight.shape[0])


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: int | None) -> torch.Tensor:
    """fp32 ``weight * scale``: ``scale`` per B x B block (``block``), or per output row / tensor."""
    if block is None:
        return weight.float() * scale.float().reshape(-1, 1)
    rows, cols = weight.shape
    expanded = scale.float().repeat_interleave(block, 0).repeat_interleave(block, 1)
    return weight.float() * expanded[:rows, :cols]
