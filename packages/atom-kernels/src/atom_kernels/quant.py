"""Dynamic fp8 quantisation: per tensor, per token (row) and per group of 128 channels.

``x ~= q.float() * scale`` with ``scale = amax / fp8_max`` over the tensor, each row, or each
``group_size`` channels of each row; ``q = clamp(x / scale, -fp8_max, fp8_max)`` rounded to nearest
even. Scales are fp32: [1] per tensor, [M, 1] per token, [M, K / group_size] per group, the dynamic
ones stored group-major (:func:`new_scales`; row-major by :func:`per_group_quant_fp8_row_major`, for the
fused MoE). The fp8 type defaults to ``float8_e4m3fn`` (NVIDIA, MI350); MI300 uses ``float8_e4m3fnuz``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous, next_pow2

FP8_DTYPE = torch.float8_e4m3fn
# The smallest amax a scale is computed from, so an all-zero row gets a finite scale.
MIN_AMAX = 1e-10


@define_op
def per_tensor_quant_fp8(
    x: torch.Tensor, scale: torch.Tensor | None = None, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q fp8, scale [1])``; dynamic when ``scale`` is None."""


@define_op
def per_token_quant_fp8(
    x: torch.Tensor, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q fp8, scale [M, 1])``, dynamic."""


@define_op
def per_group_quant_fp8(
    x: torch.Tensor, group_size: int = 128, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q fp8, scale [M, K / group_size])``, dynamic."""


def new_scales(rows, groups, device: torch.device, row_major: bool = False) -> torch.Tensor:
    """An fp32 [rows, groups] buffer stored group-major (each group's column of rows contiguous),
    as every dynamic quantizer op here returns its scales: torch's library GEMM (block-wise recipe)
    reads activation scales so, and took a transposing copy per call of row-major ones. The
    Triton consumers read either layout through strides. (Also the fake ops' layout: real and fake
    strides must agree under torch.compile.) ``row_major``: each row's groups contiguous instead, for
    the fused MoE (:func:`per_group_quant_fp8_row_major`)."""
    if row_major:
        return torch.empty((rows, groups), dtype=torch.float32, device=device)
    return torch.empty((groups, rows), dtype=torch.float32, device=device).t()


def as_group_major(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` [rows, groups] in :func:`new_scales`' layout: a view where its memory has that
    layout already (per-token [rows, 1] scales stored contiguously among them), else a copy."""
    rows, groups = scale.shape
    if scale.stride() == (1, rows) or (groups == 1 and scale.stride(0) == 1):
        return scale.as_strided((rows, groups), (1, rows))
    return new_scales(rows, groups, scale.device).copy_(scale)


def fp8_dtype_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fp8_max = fp8_dtype_max(dtype)
    return (x.float() / scale).clamp(-fp8_max, fp8_max).to(dtype)


def _scale_from_amax(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Divide by a tensor: torch divides a CUDA tensor by a Python scalar as a multiplication by its
    # reciprocal, one ulp away from the IEEE quotient the kernels (and the CPU) compute.
    amax = amax.float().clamp(min=MIN_AMAX)
    return amax / torch.full_like(amax, fp8_dtype_max(dtype))


def dynamic_quant_fp8_torch(
    x: torch.Tensor, group_size: int | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference of the fused ops' quantization: per group, or per token (``group_size`` None)."""
    if group_size is None:
        return per_token_quant_fp8_torch(x, dtype=dtype)
    return per_group_quant_fp8_torch(x, group_size, dtype=dtype)


@per_tensor_quant_fp8.register("torch")
def per_tensor_quant_fp8_torch(
    x: torch.Tensor, scale: torch.Tensor | None = None, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    if scale is None:
        scale = _scale_from_amax(x.abs().amax().reshape(1), dtype)
    return _quantize(x, scale.float().reshape(1), dtype), scale.float().reshape(1)


@per_token_quant_fp8.register("torch")
def per_token_quant_fp8_torch(
    x: torch.Tensor, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = x.reshape(-1, x.shape[-1])
    scale = _scale_from_amax(rows.abs().amax(dim=-1, keepdim=True), dtype)
    return _quantize(rows, scale, dtype).view(x.shape), as_group_major(scale)


@per_group_quant_fp8.register("torch")
def per_group_quant_fp8_torch(
    x: torch.Tensor, group_size: int = 128, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[-1] % group_size:
        raise ValueError(
            f"per_group_quant_fp8: last dim {x.shape[-1]} not a multiple of {group_size}"
        )
    groups = x.reshape(-1, x.shape[-1] // group_size, group_size)
    scale = _scale_from_amax(groups.abs().amax(dim=-1), dtype)
    return _quantize(groups, scale.unsqueeze(-1), dtype).view(x.shape), as_group_major(scale)


@triton.jit
def quantize_fp8_groups(x, GROUP: tl.constexpr, fp8_max, min_amax):
    """Dynamic quantisation of a fp32 tile [R, C] in groups of GROUP columns (C a multiple of GROUP,
    both powers of two): (q [R, C] clamped to the fp8 range, not yet converted; scale [R, C // GROUP]).
    The arithmetic of :func:`_quant_fp8_kernel`, for kernels that quantise their own output."""
    # fp32 whoever launches: Inductor passes Python floats as fp64 (ATOM_INDUCTOR_OPS).
    fp8_max, min_amax = tl.cast(fp8_max, tl.float32), tl.cast(min_amax, tl.float32)
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    groups = tl.reshape(x, (R, C // GROUP, GROUP))
    scale = tl.div_rn(tl.maximum(tl.max(tl.abs(groups), axis=2), min_amax), fp8_max)
    q = tl.clamp(tl.div_rn(groups, scale[:, :, None]), -fp8_max, fp8_max)
    return tl.reshape(q, (R, C)), scale


def check_fused_quant_group(op: str, cols: int, group_size: int | None) -> None:
    """The kernels that quantise their own output take power-of-two groups that divide the row."""
    if group_size is not None and (group_size & (group_size - 1) or cols % group_size):
        raise ValueError(f"{op}: group_size {group_size} must be a power of two dividing {cols}")


@triton.jit(do_not_specialize=["num_rows", "scale_stride_group"])
def _quant_fp8_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    num_rows,
    K,
    x_stride,
    scale_stride_row,
    scale_stride_group,
    fp8_max,
    min_amax,
    GROUP: tl.constexpr,
    STATIC_SCALE: tl.constexpr,
    MASKED_FILL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """One program quantises BLOCK_R rows x one group of GROUP channels (GROUP = K: per token).

    With STATIC_SCALE the scale is read (one per tensor); otherwise computed and written.
    MASKED_FILL: the value masked elements load as, 1.0 where only whole rows can be masked (their
    results are never stored), else 0.0. Why: dividing the zeros of a masked row by its tiny scale
    takes, by all signs, the IEEE division's slow path; on an H200, rms_norm + per_group_quant_fp8 of
    one 4096-wide row (32-row programs, 31 rows masked) took 7.8 us with zero fill, 4.0 with ones, and
    as long with either from 64 rows; selects keeping zeros from every division did as well at one row
    but took up to 1.6x the time at prefill sizes (benchmarks/kernels/experiments/fp8-h200.json.gz[quant-zero-guard]).
    """
    # fp32 whoever launches: Inductor passes Python floats as fp64 (ATOM_INDUCTOR_OPS).
    fp8_max, min_amax = tl.cast(fp8_max, tl.float32), tl.cast(min_amax, tl.float32)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    group = tl.program_id(1)
    cols = group * GROUP + tl.arange(0, BLOCK_G)
    mask = (
        (rows < num_rows)[:, None] & (cols < K)[None, :] & (tl.arange(0, BLOCK_G) < GROUP)[None, :]
    )
    x = tl.load(
        x_ptr + rows.to(tl.int64)[:, None] * x_stride + cols[None, :], mask=mask, other=MASKED_FILL
    )
    x = x.to(tl.float32)
    # div_rn: IEEE division, as torch divides (a plain / is approximate on the GPU), so the GPU's
    # scales and fp8 values match the reference bit for bit.
    if STATIC_SCALE:
        scale = tl.load(scale_ptr + tl.zeros([BLOCK_R], tl.int32))
    else:
        scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), min_amax), fp8_max)
        # Group-major (new_scales: scale_stride_group = num_rows, scale_stride_row = 1) or row-major.
        tl.store(scale_ptr + group.to(tl.int64) * scale_stride_group + rows * scale_stride_row, scale,
                 mask=rows < num_rows)
    q = tl.clamp(tl.div_rn(x, scale[:, None]), -fp8_max, fp8_max)
    tl.store(
        q_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :],
        q.to(q_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit(do_not_specialize=["num_rows"])
def _row_amax_kernel(x_ptr, amax_ptr, num_rows, K, x_stride, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    tl.store(amax_ptr + row, tl.max(amax, axis=0))


def _launch_quant(
    x: torch.Tensor, group: int, dtype: torch.dtype, static_scale: torch.Tensor | None = None,
    row_major_scales: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_last_dim_contiguous("fp8 quant input", x)
    rows = x.reshape(-1, x.shape[-1])
    num_rows, k = rows.shape
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    if static_scale is not None:
        scale = static_scale
    else:
        scale = new_scales(num_rows, k // group, x.device, row_major_scales)
    if q.numel() == 0:
        return q, scale
    block_g = next_pow2(group)
    block_r = max(1, min(32, 4096 // block_g))
    grid = (cdiv(num_rows, block_r), cdiv(k, group))
    _quant_fp8_kernel[grid](
        rows,
        q,
        scale,
        num_rows,
        k,
        rows.stride(0),
        scale.stride(0),
        scale.stride(-1),  # a static scale's [1]: never stored
        fp8_dtype_max(dtype),
        MIN_AMAX,
        GROUP=group,
        STATIC_SCALE=static_scale is not None,
        MASKED_FILL=1.0 if block_g == group else 0.0,  # groups tile K (checked): only rows are masked
        BLOCK_R=block_r,
        BLOCK_G=block_g,
        num_warps=4 if block_r * block_g <= 4096 else 8,
    )
    return q, scale


@per_tensor_quant_fp8.register("triton")
def per_tensor_quant_fp8_triton(
    x: torch.Tensor, scale: torch.Tensor | None = None, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    if scale is None:
        check_last_dim_contiguous("fp8 quant input", x)
        rows = x.reshape(-1, x.shape[-1])
        amax = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
        if rows.shape[0]:
            _row_amax_kernel[(rows.shape[0],)](
                rows, amax, rows.shape[0], rows.shape[1], rows.stride(0), BLOCK_K=1024, num_warps=4
            )
        scale = _scale_from_amax(amax.amax().reshape(1), dtype)
    scale = scale.float().reshape(1).contiguous()
    return _launch_quant(x, x.shape[-1], dtype, static_scale=scale)


@per_token_quant_fp8.register("triton")
def per_token_quant_fp8_triton(
    x: torch.Tensor, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[-1] > 65536:
        raise ValueError(f"per_token_quant_fp8: row length {x.shape[-1]} above the kernel's 65536")
    return _launch_quant(x, x.shape[-1], dtype)


@per_group_quant_fp8.register("triton")
def per_group_quant_fp8_triton(
    x: torch.Tensor, group_size: int = 128, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[-1] % group_size:
        raise ValueError(
            f"per_group_quant_fp8: last dim {x.shape[-1]} not a multiple of {group_size}"
        )
    return _launch_quant(x, group_size, dtype)


def per_group_quant_fp8_row_major(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_group_quant_fp8``'s Triton kernel with row-major scales, for the fused MoE: its K loop reads
    a gathered row's groups in turn, which group-major scales spread over cache lines."""
    if x.shape[-1] % group_size:
        raise ValueError(f"per_group_quant_fp8: last dim {x.shape[-1]} not a multiple of {group_size}")
    return _launch_quant(x, group_size, FP8_DTYPE, row_major_scales=True)
