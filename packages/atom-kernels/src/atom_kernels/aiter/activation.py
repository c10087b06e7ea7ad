"""AITER adapters of :mod:`atom_kernels.activation`: ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.activation import (
    clamped_swiglu,
    clamped_swiglu_triton,
    gelu_and_mul,
    silu_and_mul,
)


def _gated(fn_name: str, x: torch.Tensor) -> torch.Tensor:
    import aiter

    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    getattr(aiter, fn_name)(out, x)
    return out


@silu_and_mul.register("aiter")
def silu_and_mul_aiter(x: torch.Tensor) -> torch.Tensor:
    return _gated("silu_and_mul", x)


@gelu_and_mul.register("aiter")
def gelu_and_mul_aiter(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return _gated("gelu_tanh_and_mul" if approximate == "tanh" else "gelu_and_mul", x)


# AITER's activation kernels have no alpha/limit clamped SwiGLU: GPT-OSS's runs on our Triton kernel.
clamped_swiglu.register("aiter")(clamped_swiglu_triton)
