"""MXFP4 weights (OCP microscaling, as gpt-oss ships its experts): decoding, in torch and in Triton.

A weight [N, K] is stored as ``blocks`` uint8 [N, K / 2] and ``scales`` uint8 [N, K / 32]:

- each byte holds two e2m1 values, value ``2j`` of a row in the low nibble of byte ``j`` and value
  ``2j + 1`` in the high nibble; a nibble is sign (bit 3), 2 exponent bits and 1 mantissa bit,
  :data:`E2M1_VALUES` by code;
- each block of :data:`MXFP4_BLOCK` consecutive values of a row along K shares one e8m0 scale, the
  power of two ``2 ** (scale - 127)``.

Every decoded value is exact in fp32 and bf16 (a 2-bit significand times a power of two).

:func:`mxfp4_quant_dequant` rounds activations to MXFP4 and back (AMD Quark's W4A4 checkpoints
quantize every quantized linear's input so; where no FP4 matrix unit runs it, the hosts emulate it the
same way): per 32 consecutive values along the last dim, the shared scale is ``2 ** (e - 2)`` with
``e`` the exponent of the block's amax rounded to a power of two (up from 1.75 times one: Quark's
``even`` scale mode, which keeps the largest value at most 6 after scaling), and each value divided
by the scale is rounded to the nearest e2m1 value, ties to even, saturating at 6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous, next_pow2

MXFP4_BLOCK = 32
E8M0_BIAS = 127
E2M1_MAX = 6.0
E2M1_EMAX = 2  # the exponent of e2m1's largest value
# fp32 bits: adding 1 << 21 to an amax carries into the exponent from a mantissa of 1.75 up (Quark's
# ``even`` rounding of the shared scale); the mask keeps the exponent.
_EVEN_ROUNDING_ADD = 1 << 21
_FP32_EXPONENT_MASK = 0x7F800000
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


# Register decoding for Hopper's MMA (the fused MoE's MXFP4 GEMMs, ``atom_kernels.moe``). Per 16-bit
# register two packed bytes, per 32-bit register their two bf16 factors; out: the two low nibbles'
# bf16 values ($0) and the two high nibbles' ($1). A nibble's sign goes to bf16 bit 15 and its three
# magnitude bits to bits 8-6, so the bf16 reads 2 ** -126 times the e2m1 value (exactly, the
# subnormal 0.5 included): with the bytes spread to the two halves (prmt), each nibble masked, then
# one integer multiply by (1 << s) + (1 << (s + 6)) places both copies (their bits do not overlap, so
# the sum is an OR) and one mask keeps bits 15 and 8-6 of each half. One bf16x2 multiply by the factor
# applies the block scale. Needs sm_90's bf16x2 multiply.
_E2M1_PAIRS_TO_BF16 = tl.constexpr("""
{
.reg .b32 t, m, y;
cvt.u32.u16 t, $2;
prmt.b32 t, t, 0, 0x4140;
and.b32 m, t, 0x000F000F;
mul.lo.u32 y, m, 0x1040;
and.b32 y, y, 0x81C081C0;
mul.rn.bf16x2 $0, y, $3;
and.b32 m, t, 0x00F000F0;
mul.lo.u32 y, m, 0x104;
and.b32 y, y, 0x81C081C0;
mul.rn.bf16x2 $1, y, $3;
}
""")
# The factor of e8m0 code c is 2 ** (c - 127) * 2 ** (126 - REGISTER_DECODE_SHIFT): the decoded values
# come out 2 ** -REGISTER_DECODE_SHIFT times the true ones (the GEMM multiplies its fp32 sums back). A
# power of two scales every product and partial sum alike, so the sums are the unshifted ones, exactly,
# for codes in REGISTER_DECODE_CODES: within them the factor is a normal bf16 and so is each product
# (also for the smallest nonzero e2m1 value).
REGISTER_DECODE_SHIFT = 26
REGISTER_DECODE_RESCALE = tl.constexpr(2.0**REGISTER_DECODE_SHIFT)
REGISTER_DECODE_CODES = (28, 154)


@triton.jit
def e8m0_to_decode_factor(codes):
    """bf16 factors of :func:`e2m1_pairs_to_bf16` for uint8 e8m0 codes within
    :data:`REGISTER_DECODE_CODES` (bits (c + 127 - 27) << 7: 2 ** (c - 27))."""
    return ((codes.to(tl.uint16) + 100) << 7).to(tl.bfloat16, bitcast=True)


@triton.jit
def e2m1_pairs_to_bf16(packed, factors):
    """bf16 (low, high): the values of the low and the high nibble of each uint8 of ``packed``, times
    the bf16 ``factors`` (:func:`e8m0_to_decode_factor`, the shape of ``packed``) and 2 ** -126."""
    return tl.inline_asm_elementwise(_E2M1_PAIRS_TO_BF16, "=r,=r,h,r", [packed, factors],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@define_op
def mxfp4_quant_dequant(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., K] (K a multiple of 32) rounded to MXFP4 and back, in x's dtype: per 32 values a
    power-of-two scale from their amax (Quark's ``even`` mode), each value rounded to the nearest
    e2m1 value times that scale (ties to even, saturating at 6; module docstring)."""


def _check_mxfp4_qdq_input(x: torch.Tensor) -> None:
    if x.shape[-1] % MXFP4_BLOCK:
        raise ValueError(f"mxfp4_quant_dequant: last dim {x.shape[-1]} is not a multiple of "
                         f"{MXFP4_BLOCK}")


@mxfp4_quant_dequant.register("torch")
def mxfp4_quant_dequant_torch(x: torch.Tensor) -> torch.Tensor:
    _check_mxfp4_qdq_input(x)
    groups = x.float().unflatten(-1, (-1, MXFP4_BLOCK))
    amax = groups.abs().amax(-1, keepdim=True)
    biased = ((amax.view(torch.int32) + _EVEN_ROUNDING_ADD) & _FP32_EXPONENT_MASK) >> 23
    # The scale's exponent, within e8m0's range (an all-zero block takes the smallest scale).
    exponent = (biased - E8M0_BIAS - E2M1_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS).float()
    scaled = groups * torch.exp2(-exponent)
    magnitude = scaled.abs()
    # e2m1 values lie 0.5 apart below 2, 1 apart below 4, then 2 apart: round to that grid.
    step = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    rounded = (torch.round(magnitude / step) * step).clamp(max=E2M1_MAX)
    return (torch.copysign(rounded, scaled) * torch.exp2(exponent)).flatten(-2).to(x.dtype)


@triton.jit(do_not_specialize=["num_rows"])
def _mxfp4_quant_dequant_kernel(x_ptr, out_ptr, num_rows, K, x_stride, BLOCK_R: tl.constexpr,
                                BLOCK_K: tl.constexpr):
    """One program: BLOCK_R rows x BLOCK_K columns (whole 32-value groups; masked past K)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows < num_rows)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * x_stride + cols[None, :], mask=mask, other=0.0)
    groups = tl.reshape(x.to(tl.float32), [BLOCK_R, BLOCK_K // 32, 32])
    amax = tl.max(tl.abs(groups), axis=2)
    biased = ((amax.to(tl.int32, bitcast=True) + (1 << 21)) & 0x7F800000) >> 23
    code = tl.minimum(tl.maximum(biased - 2, 0), 254)  # the scale's e8m0 code
    # Powers of two from their bits: multiplying by them is exact (a division may not be).
    scale = e8m0_to_float(code)[:, :, None]
    scaled = groups * e8m0_to_float(254 - code)[:, :, None]
    magnitude = tl.abs(scaled)
    step = tl.where(magnitude < 2.0, 0.5, tl.where(magnitude < 4.0, 1.0, 2.0))
    # Round to nearest even: adding and subtracting 2 ** 23 leaves an fp32 below 2 ** 22 on the
    # integer grid, rounded as fp32 addition rounds.
    units = (magnitude * (1.0 / step) + 8388608.0) - 8388608.0
    rounded = tl.minimum(units * step, 6.0)
    out = tl.where(scaled < 0, -rounded, rounded) * scale
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :],
             tl.reshape(out, [BLOCK_R, BLOCK_K]).to(out_ptr.dtype.element_ty), mask=mask)


@mxfp4_quant_dequant.register("triton")
def mxfp4_quant_dequant_triton(x: torch.Tensor) -> torch.Tensor:
    _check_mxfp4_qdq_input(x)
    check_last_dim_contiguous("mxfp4_quant_dequant input", x)
    rows = x.reshape(-1, x.shape[-1])
    num_rows, k = rows.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    block_k = min(256, next_pow2(k))
    block_r = max(1, 2048 // block_k)
    grid = (cdiv(num_rows, block_r), cdiv(k, block_k))
    _mxfp4_quant_dequant_kernel[grid](rows, out, num_rows, k, rows.stride(0), BLOCK_R=block_r,
                                      BLOCK_K=block_k, num_warps=4)
    return out
