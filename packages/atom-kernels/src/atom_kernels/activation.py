"""Gated activations: the input holds [gate | up] along the last dim; the output is act(gate) * up."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_kernels.registry import define_op

silu_and_mul = define_op("silu_and_mul", "silu_and_mul(x[..., 2d]) -> silu(x[..., :d]) * x[..., d:]")


@silu_and_mul.register("torch")
def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)
