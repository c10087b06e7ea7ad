"""MXFP4 linear math (AMD Quark's W4A4 checkpoints): the parameters an MXFP4 linear layer holds and
its forward, ``y = qdq(x) @ dequant(W)^T (+ b)``.

The weight stays packed as the checkpoint ships it: ``weight`` uint8 [N, K / 2] (two e2m1 values a
byte, the even one in the low nibble) and ``weight_scale`` uint8 [N, K / 32] (e8m0). The GEMM
(``atom_kernels.mxfp4_linear``) decodes it tile by tile; for W4A4 the input is first rounded to
MXFP4 and back per 32 values (``atom_kernels.mxfp4_quant_dequant``): the hosts' own emulation of
FP4 activations where no FP4 matrix unit runs them.
"""

from __future__ import annotations

import torch

import atom_kernels
from atom_core.quantization.scheme import Mxfp4Scheme


def mxfp4_param_shapes(scheme: Mxfp4Scheme, out_features: int, in_features: int) -> dict[str, tuple[int, int]]:
    """The uint8 parameters of an MXFP4 linear [out_features, in_features]."""
    return {"weight": (out_features, in_features // 2),
            "weight_scale": (out_features, in_features // scheme.block)}


def mxfp4_linear(x: torch.Tensor, scheme: Mxfp4Scheme, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [..., K] in the model dtype -> [..., N]."""
    if scheme.quantized_inputs:
        x = atom_kernels.mxfp4_quant_dequant(x)
    rows = x.reshape(-1, x.shape[-1])
    return atom_kernels.mxfp4_linear(rows, weight, weight_scale, bias).view(*x.shape[:-1], weight.shape[0])
