"""AITER adapters of :mod:`atom_kernels.quant` (fp8 quantisation): ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.quant import (
    FP8_DTYPE,
    as_group_major,
    per_group_quant_fp8,
    per_tensor_quant_fp8,
    per_token_quant_fp8,
)


def _hip_quant(kind: str):
    from aiter import QuantType, get_hip_quant

    return get_hip_quant(getattr(QuantType, kind))


@per_tensor_quant_fp8.register("aiter")
def per_tensor_quant_fp8_aiter(
    x: torch.Tensor, scale: torch.Tensor | None = None, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = _hip_quant("per_Tensor")(x, scale=scale, quant_dtype=dtype)
    return q, scale.float().reshape(1)


@per_token_quant_fp8.register("aiter")
def per_token_quant_fp8_aiter(
    x: torch.Tensor, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = _hip_quant("per_Token")(x, quant_dtype=dtype)
    return q, as_group_major(scale.float().reshape(-1, 1))


@per_group_quant_fp8.register("aiter")
def per_group_quant_fp8_aiter(
    x: torch.Tensor, group_size: int = 128, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    if group_size != 128:
        raise ValueError(f"per_group_quant_fp8 (aiter): only group_size 128, got {group_size}")
    q, scale = _hip_quant("per_1x128")(x, quant_dtype=dtype, transpose_scale=False)
    # In the layout of the other backends' scales (atom_kernels.quant.new_scales).
    return q, as_group_major(scale.float().reshape(-1, x.shape[-1] // group_size))
