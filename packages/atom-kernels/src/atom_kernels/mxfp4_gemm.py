"""The GEMM of a linear layer with MXFP4 weights (AMD Quark's W4A4 checkpoints: dense MLPs and shared
experts of the DeepSeek-V3 family), ``y = x @ dequant(W)^T (+ b)``.

The torch reference decodes the whole weight to x's dtype and multiplies: at DeepSeek-V3's dense
MLP width that writes a half-gigabyte temporary per call. The Triton implementation reads the packed
weight in the fused MoE's GEMM kernel (:func:`atom_kernels.moe.launch_moe_gemm`) as one expert that
every row is routed to: each weight tile is upcast in registers (on Hopper with bf16 activations and
up to 64 rows by the GEMM's own decoding, else Triton's microscaled dot on 16-bit activations),
nothing else is written.
"""

from __future__ import annotations

import torch

from atom_kernels.moe import default_moe_config, launch_moe_gemm
from atom_kernels.mxfp4 import MXFP4_BLOCK, dequantize_mxfp4
from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous


@define_op
def mxfp4_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x`` [M, K] (16- or 32-bit floats) times the MXFP4 weight [N, K], stored as ``weight`` uint8
    [N, K / 2] (two e2m1 values a byte, the even one in the low nibble) and ``weight_scale`` uint8
    [N, K / 32] (e8m0), plus ``bias`` [N]: [M, N] in x's dtype."""


def _check_mxfp4_linear_args(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                             bias: torch.Tensor | None) -> None:
    if x.dim() != 2:
        raise ValueError(f"mxfp4_linear: x must be [M, K], got {tuple(x.shape)}")
    n, k = weight.shape[0], x.shape[1]
    if weight.dtype != torch.uint8 or weight_scale.dtype != torch.uint8:
        raise ValueError(f"mxfp4_linear: weight and weight_scale must be uint8, got {weight.dtype} and "
                         f"{weight_scale.dtype}")
    if k % MXFP4_BLOCK or tuple(weight.shape) != (n, k // 2) or tuple(weight_scale.shape) != (n, k // MXFP4_BLOCK):
        raise ValueError(f"mxfp4_linear: for x [M, {k}] (K a multiple of {MXFP4_BLOCK}) weight must be "
                         f"[N, {k // 2}] and weight_scale [N, {k // MXFP4_BLOCK}], got {tuple(weight.shape)} "
                         f"and {tuple(weight_scale.shape)}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"mxfp4_linear: bias must be [{n}], got {tuple(bias.shape)}")


@mxfp4_linear.register("torch")
def mxfp4_linear_torch(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    _check_mxfp4_linear_args(x, weight, weight_scale, bias)
    return torch.nn.functional.linear(x, dequantize_mxfp4(weight, weight_scale, x.dtype), bias)


@mxfp4_linear.register("triton")
def mxfp4_linear_triton(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    _check_mxfp4_linear_args(x, weight, weight_scale, bias)
    for name, t in (("x", x), ("weight", weight), ("weight_scale", weight_scale)):
        check_last_dim_contiguous(name, t)
    rows, n = x.shape[0], weight.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    # The MoE's built-in tiles for `rows` entries of one expert (no tuned table for these shapes).
    config = default_moe_config(rows, 1)
    block_m = config["BLOCK_M"]
    row_blocks = cdiv(rows, block_m)
    # Every row block belongs to expert 0; ids past `rows` mark padding, which the kernel skips.
    sorted_ids = torch.arange(row_blocks * block_m, dtype=torch.int32, device=x.device)
    block_expert = torch.zeros(row_blocks, dtype=torch.int32, device=x.device)
    launch_moe_gemm(x, weight.unsqueeze(0), None if bias is None else bias.unsqueeze(0), out, None,
                    sorted_ids, block_expert, rows, 1, block_m, config["down"],
                    w_scale=weight_scale.unsqueeze(0), mxfp4=True)
    return out
