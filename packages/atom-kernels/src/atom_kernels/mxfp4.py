"""MXFP4 weights (OCP microscaling, as gpt-oss ships its experts): decoding, in torch and in Triton.

A weight [N, K] is stored as ``blocks`` uint8 [N, K / 2] and ``scales`` uint8 [N, K / 32]:

- each byte holds two e2m1 values, value ``2j`` of a row in the low nibble of byte ``j`` and value
  ``2j + 1`` in the high nibble; a nibble is sign (bit 3), 2 exponent bits and 1 mantissa bit,
  :data:`E2M1_VALUES` by code;
- each block of :data:`MXFP4_BLOCK` consecutive values of a row along K shares one e8m0 scale, the
  power of two ``2 ** (scale - 127)``.

Every decoded value is exact in fp32 and bf16 (a 2-bit significand times a power of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MXFP4_BLOCK = 32
E8M0_BIAS = 127
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., N, K] in ``dtype`` from ``blocks`` uint8 [..., N, K / 2] and ``scales`` uint8
    [..., N, K / 32]."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2).long()
    values = table[codes].unflatten(-1, (-1, MXFP4_BLOCK))
    powers = torch.exp2(scales.float() - E8M0_BIAS)
    return (values * powers[..., None]).flatten(-2).to(dtype)


@triton.jit
def e2m1_to_float(code):
    """fp32 values of 4-bit e2m1 codes (an integer tensor, one code per element)."""
    exponent = (code >> 1) & 3
    mantissa = (code & 1).to(tl.float32)
    # Subnormal (exponent 0): 0 or 0.5; normal: (1 + m / 2) * 2 ** (exponent - 1).
    power = (1 << tl.maximum(exponent - 1, 0)).to(tl.float32)
    magnitude = tl.where(exponent == 0, 0.5 * mantissa, (1.0 + 0.5 * mantissa) * power)
    return tl.where((code & 8) != 0, -magnitude, magnitude)


@triton.jit
def e8m0_to_float(scale):
    """fp32 ``2 ** (scale - 127)`` of uint8 e8m0 scales, built from the bits (exact, also for the
    subnormal 2 ** -127 of scale 0)."""
    bits = scale.to(tl.int32) << 23
    power = bits.to(tl.float32, bitcast=True)
    return tl.where(scale == 0, 2.0**-127, power)
