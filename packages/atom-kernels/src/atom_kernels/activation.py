"""Gated activations: the input holds [gate | up] along the last dim; the output is act(gate) * up.

``clamped_swiglu`` is GPT-OSS's: gate and up are interleaved (gate = x[..., 0::2], up = x[..., 1::2],
the layout of its checkpoints and of HF's ``GptOssExperts._apply_gate``), gate is clamped from above
and up on both sides at ``limit``, and out = (up + 1) * gate * sigmoid(alpha * gate).

``silu_and_mul_quant_fp8`` emits ``silu_and_mul``'s output as dynamic fp8 for the next FP8 GEMM,
rounded to the input dtype before quantising (as the unfused op stores it), so its fp8 codes and
scales are those of ``silu_and_mul`` followed by :mod:`atom_kernels.quant`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from atom_kernels.quant import (
    FP8_DTYPE,
    MIN_AMAX,
    check_fused_quant_group,
    dynamic_quant_fp8_torch,
    fp8_dtype_max,
    new_scales,
    quantize_fp8_groups,
)
from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous, next_pow2


@define_op
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` [..., 2d] = [gate | up]."""


@define_op
def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(x[..., :d]) * x[..., d:]``; ``approximate`` is ``"none"`` or ``"tanh"``."""


@define_op
def clamped_swiglu(
    x: torch.Tensor, alpha: float = 1.702, limit: float = 7.0, interleaved: bool = True
) -> torch.Tensor:
    """GPT-OSS's gated activation of ``x`` [..., 2d] (interleaved gate/up rows by default): gate
    clamped above at ``limit``, up to [-limit, limit], ``(up + 1) * gate * sigmoid(alpha * gate)``."""


@define_op
def silu_and_mul_quant_fp8(
    x: torch.Tensor, group_size: int | None = 128, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu_and_mul(x)`` quantised to fp8 in one pass: ``(q [..., d], scale)``, scale [M, d /
    group_size] as :func:`atom_kernels.per_group_quant_fp8`'s, or [M, 1] per token when
    ``group_size`` is None."""


# Activation kinds, shared with the fused MoE kernel's epilogue.
ACT_SILU, ACT_GELU, ACT_GELU_TANH, ACT_CLAMPED_SWIGLU = 0, 1, 2, 3


@silu_and_mul.register("torch")
def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)


@silu_and_mul_quant_fp8.register("torch")
def silu_and_mul_quant_fp8_torch(
    x: torch.Tensor, group_size: int | None = 128, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    return dynamic_quant_fp8_torch(silu_and_mul_torch(x), group_size, dtype)


@gelu_and_mul.register("torch")
def gelu_and_mul_torch(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return (F.gelu(gate.float(), approximate=approximate) * up.float()).to(x.dtype)


def split_gate_up(x: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    return x.chunk(2, dim=-1)


@clamped_swiglu.register("torch")
def clamped_swiglu_torch(
    x: torch.Tensor, alpha: float = 1.702, limit: float = 7.0, interleaved: bool = True
) -> torch.Tensor:
    gate, up = split_gate_up(x.float(), interleaved)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return ((up + 1) * gate * torch.sigmoid(gate * alpha)).to(x.dtype)


@triton.jit
def apply_gated_activation(gate, up, ACT: tl.constexpr, alpha, limit):
    """act(gate) * up in fp32 for one of the ACT_* kinds (a helper of this kernel and fused MoE's)."""
    if ACT == 0:
        out = gate * tl.sigmoid(gate) * up
    elif ACT == 1:
        out = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476)) * up
    elif ACT == 2:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        tanh = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
        out = 0.5 * gate * (1.0 + tanh) * up
    else:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        out = (up + 1.0) * gate * tl.sigmoid(alpha * gate)
    return out


@triton.jit(do_not_specialize=["num_rows", "scale_stride_group"])
def _gated_activation_kernel(
    x_ptr,
    out_ptr,
    scale_ptr,
    num_rows,
    d,
    x_row_stride,
    scale_stride_row,
    scale_stride_group,
    alpha,
    limit,
    num_groups,
    fp8_max,
    min_amax,
    ACT: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    QUANT_GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # With QUANT_GROUP > 0 (a divisor of BLOCK) out_ptr takes fp8 codes and scale_ptr
    # [num_rows, num_groups] their scales (group-major, atom_kernels.quant.new_scales, or row-major).
    # fp32 whoever launches: Inductor passes Python floats as fp64 (ATOM_INDUCTOR_OPS).
    alpha, limit = tl.cast(alpha, tl.float32), tl.cast(limit, tl.float32)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    x_row = x_ptr + row * x_row_stride
    if INTERLEAVED:
        gate = tl.load(x_row + 2 * cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_row + 2 * cols + 1, mask=mask, other=0.0).to(tl.float32)
    else:
        gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_row + d + cols, mask=mask, other=0.0).to(tl.float32)
    out = apply_gated_activation(gate, up, ACT, alpha, limit)
    if QUANT_GROUP > 0:
        # Rounded to the input dtype first, as the unfused op stores it.
        out = out.to(x_ptr.dtype.element_ty).to(tl.float32)
        q, scale = quantize_fp8_groups(out[None, :], QUANT_GROUP, fp8_max, min_amax)
        out = tl.reshape(q, (BLOCK,))
        groups = tl.program_id(1) * (BLOCK // QUANT_GROUP) + tl.arange(0, BLOCK // QUANT_GROUP)
        tl.store(
            scale_ptr + groups * scale_stride_group + row * scale_stride_row,
            tl.reshape(scale, (BLOCK // QUANT_GROUP,)),
            mask=groups < num_groups,
        )
    tl.store(out_ptr + row * d + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def launch_gated_activation(
    x: torch.Tensor,
    act: int,
    alpha: float = 0.0,
    limit: float = math.inf,
    interleaved: bool = False,
    fp8: torch.dtype | None = None,
    group_size: int | None = None,
    row_major_scales: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """act(gate) * up; with ``fp8``, as (fp8 codes, scales) per ``group_size`` group or per token, the
    scales laid out as ``atom_kernels.quant.new_scales(..., row_major_scales)``."""
    if x.shape[-1] % 2:
        raise ValueError(f"gated activation: last dim {x.shape[-1]} is not even")
    check_last_dim_contiguous("gated activation input", x)
    d = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    out = torch.empty((*x.shape[:-1], d), dtype=fp8 or x.dtype, device=x.device)
    # 1024 columns per program and 16-byte accesses per thread (8 bf16 values: 4 warps), as Inductor
    # runs the same fused silu * mul; 8 warps (8-byte accesses) ran at ~3.8 TB/s against Inductor's
    # ~4.25 on an H200 at Qwen3-8B prefill size (8192 x 12288).
    block = min(1024, next_pow2(d))
    scale, quant_group, num_groups = None, 0, 0
    if fp8 is not None:
        check_fused_quant_group("silu_and_mul_quant_fp8", d, group_size)
        # A program quantises whole groups; per token, the whole row.
        if group_size is None:
            if d > 65536:
                raise ValueError(f"silu_and_mul_quant_fp8: row length {d} above the kernel's 65536")
            block = quant_group = next_pow2(d)
            num_groups = 1
        else:
            block, quant_group, num_groups = max(block, group_size), group_size, d // group_size
        scale = new_scales(rows.shape[0], num_groups, x.device, row_major_scales)
    if out.numel() == 0:
        return out if fp8 is None else (out, scale)
    # Interleaved gate / up load at stride 2, not 16 bytes at a time: 8 warps, as before 26c8d43 (clamped
    # SwiGLU at 8192 x 2880 on an H200, benchmarks/kernels/results-h200.json: 40.96 us at a723dec, with 8;
    # 52.06 at 50752a9, with 4). Not re-measured.
    num_warps = 8 if interleaved else max(1, min(8, block * x.element_size() // (32 * 16)))
    grid = (rows.shape[0], cdiv(d, block))
    _gated_activation_kernel[grid](
        rows,
        out,
        scale,
        rows.shape[0],
        d,
        rows.stride(0),
        scale.stride(0) if scale is not None else 0,
        scale.stride(-1) if scale is not None else 0,
        alpha,
        limit,
        num_groups,
        fp8_dtype_max(fp8) if fp8 is not None else 0.0,
        MIN_AMAX,
        ACT=act,
        INTERLEAVED=interleaved,
        QUANT_GROUP=quant_group,
        BLOCK=block,
        num_warps=num_warps,
    )
    return out if fp8 is None else (out, scale)


@silu_and_mul.register("triton")
def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    return launch_gated_activation(x, ACT_SILU)


@silu_and_mul_quant_fp8.register("triton")
def silu_and_mul_quant_fp8_triton(
    x: torch.Tensor, group_size: int | None = 128, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_gated_activation(x, ACT_SILU, fp8=dtype, group_size=group_size)


def gelu_kind(approximate: str) -> int:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return ACT_GELU_TANH if approximate == "tanh" else ACT_GELU


@gelu_and_mul.register("triton")
def gelu_and_mul_triton(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return launch_gated_activation(x, gelu_kind(approximate))


@clamped_swiglu.register("triton")
def clamped_swiglu_triton(
    x: torch.Tensor, alpha: float = 1.702, limit: float = 7.0, interleaved: bool = True
) -> torch.Tensor:
    return launch_gated_activation(x, ACT_CLAMPED_SWIGLU, alpha, limit, interleaved)
