"""RMSNorm with the residual add fused by signature: ``norm(x)`` -> y, ``norm(x, r)`` -> (y, x + r);
and the gated RMSNorm of Qwen3-Next's Gated DeltaNet output. An RMSNorm built with the next FP8
linear's :class:`ActivationQuant` returns ``y`` quantized for it (atom_core.quantization.fp8)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import atom_kernels
from atom_core.layers.linear import copy_checked, default_weight_loader, make_param
from atom_core.quantization.fp8 import ActivationQuant, QuantizedActivation


def zero_centred_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """Loader of a zero-centred norm weight: the checkpoint holds ``w``, the norm scales by ``1 + w``;
    the parameter stores ``1 + w`` so that the plain RMSNorm kernels apply it."""
    if shard_id is not None:
        raise ValueError(f"a norm weight got shard {shard_id!r}")
    copy_checked(param.data, loaded.float() + 1.0)


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``. ``zero_centred``: the checkpoint weight ``w`` scales by ``1 + w``
    (Qwen3-Next, Gemma); the parameter then holds ``1 + w`` in fp32, as HF computes it, since in
    bf16 the spacing near 1 (2^-7) would round away most of ``w``. ``quant``: ``y`` is the input of
    an FP8 linear that takes it so quantized (:func:`atom_core.layers.linear.input_quant_of`), and
    the norm's kernel emits it quantized."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, zero_centred: bool = False,
                 quant: ActivationQuant | None = None):
        super().__init__()
        self.eps = eps
        self.quant = quant
        self.weight = (
            make_param((hidden_size,), zero_centred_weight_loader, dtype=torch.float32)
            if zero_centred else make_param((hidden_size,), default_weight_loader)
        )

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.quant is None:
            if residual is None:
                return atom_kernels.rms_norm(x, self.weight, self.eps)
            return atom_kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
        group = self.quant.group_size
        if residual is None:
            return QuantizedActivation(
                *atom_kernels.rms_norm_quant_fp8(x, self.weight, self.eps, group), x.dtype)
        q, scale, residual = atom_kernels.fused_add_rms_norm_quant_fp8(x, residual, self.weight,
                                                                        self.eps, group)
        return QuantizedActivation(q, scale, x.dtype), residual


class GatedRMSNorm(nn.Module):
    """``rms_norm(x) * silu(gate)`` over the last dim (a head): Qwen3-Next's norm of the linear
    attention's output, gated by its ``z`` projection. The product is taken in fp32, as HF does."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = make_param((hidden_size,), default_weight_loader)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = atom_kernels.rms_norm(x, self.weight, self.eps)
        return (normed.float() * F.silu(gate.float())).to(x.dtype)
