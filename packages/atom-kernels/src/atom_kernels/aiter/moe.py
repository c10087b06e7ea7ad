"""AITER adapters of :mod:`atom_kernels.moe` (fused MoE): ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.moe import fused_moe, fused_moe_triton
from atom_kernels.moe_align import moe_align_block_size, moe_align_block_size_triton

# AITER's fused_moe sorts inside itself; its standalone sort has another output layout, so the
# aiter backend of this op (used only by the Triton fused MoE) is our Triton kernel.
moe_align_block_size.register("aiter")(moe_align_block_size_triton)


@fused_moe.register("aiter")
def fused_moe_aiter(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    interleaved: bool = False,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block_size: int = 0,
    weight_format: str = "auto",
    input_format: str = "auto",
) -> torch.Tensor:
    kinds = {"silu": "Silu", "gelu": "Gelu"}
    # Interleaved gate/up rows, biases and FP8 or MXFP4 experts (AITER's quantized MoE is not
    # wired up here) run our Triton kernel.
    unsupported = interleaved or weight_format != "auto" or any(
        t is not None for t in (w13_bias, w2_bias, w13_scale, w2_scale)
    )
    if activation not in kinds or unsupported:
        return fused_moe_triton(
            x,
            w13,
            w2,
            topk_weights,
            topk_ids,
            activation=activation,
            interleaved=interleaved,
            w13_bias=w13_bias,
            w2_bias=w2_bias,
            swiglu_alpha=swiglu_alpha,
            swiglu_limit=swiglu_limit,
            w13_scale=w13_scale,
            w2_scale=w2_scale,
            block_size=block_size,
            weight_format=weight_format,
            input_format=input_format,
        )
    from aiter import ActivationType
    from aiter.fused_moe import fused_moe as aiter_fused_moe

    return aiter_fused_moe(
        x, w13, w2, topk_weights, topk_ids, activation=getattr(ActivationType, kinds[activation])
    )
