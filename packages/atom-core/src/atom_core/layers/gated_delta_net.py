"""Gated DeltaNet: the linear-attention token mixer of Qwen3-Next's hybrid layers.

x -> ``in_proj_qkvz`` (q, k, v and the output gate z) and ``in_proj_ba`` (beta and the decay input
a) -> core (short causal conv of q|k|v with SiLU, then the gated delta rule with L2-normalised q, k:
atom_core.layers.gated_delta_core, where the recurrent state lives) -> per-head RMSNorm gated by
``silu(z)`` -> ``out_proj``. Per value head ``h``: ``beta = sigmoid(b)``,
``g = -exp(A_log[h]) * softplus(a + dt_bias[h])`` (the log decay, in fp32).

Checkpoint layouts (HF's names), both loaded into ATOM's ``in_proj_qkvz`` and ``in_proj_ba``:

- grouped (Qwen3-Next): the rows of ``in_proj_qkvz`` come in groups, one per key head:
  ``[q (K) | k (K) | v (r x V) | z (r x V)]`` for its ``r = HV / HK`` value heads; ``in_proj_ba``
  likewise ``[b (r) | a (r)]``. A TP rank takes whole groups (contiguous rows), so the projections
  split as plain column-parallel layers.
- split (Qwen3.5, ``split_projections``): ``in_proj_qkv`` ``[q (HK x K) | k (HK x K) | v (HV x V)]``,
  ``in_proj_z`` [HV x V], ``in_proj_b`` and ``in_proj_a`` [HV]. ATOM fuses them as sections of merged
  column-parallel layers (``[q | k | v | z]``, ``[b | a]``), each section split across TP ranks, so
  the conv input is the first three sections as they come out of the GEMM.

``conv1d.weight`` [q | k | v channels of all heads, 1, W] splits per section
(:class:`ShortConvolution`); ``A_log`` and ``dt_bias`` split by value head. Value head ``h`` reads
key head ``h // r`` in both layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.distributed import divide, get_tp_group
from atom_core.layers.gated_delta_core import GatedDeltaCoreSpec, build_gated_delta_core, run_core
from atom_core.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    RowParallelLinear,
    make_param,
    rank_sharded_weight_loader,
)
from atom_core.layers.norm import GatedRMSNorm
from atom_core.layers.short_conv import ShortConvolution


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    """The Gated DeltaNet of every linear-attention layer of one model (head counts before TP
    splitting); ``rms_norm_eps`` is the gated output norm's."""

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel_size: int
    rms_norm_eps: float
    split_projections: bool = False


class GatedDeltaNet(nn.Module):
    def __init__(self, spec: GatedDeltaNetSpec, layer_id: int, prefix: str):
        super().__init__()
        tp_size = get_tp_group().world_size
        if spec.num_v_heads % spec.num_k_heads:
            raise ValueError(f"{prefix}: {spec.num_v_heads} value heads are not a multiple of "
                             f"{spec.num_k_heads} key heads")
        self.num_k_heads = divide(spec.num_k_heads, tp_size)
        self.num_v_heads = divide(spec.num_v_heads, tp_size)
        self.head_k_dim, self.head_v_dim = spec.head_k_dim, spec.head_v_dim
        self.v_per_k = spec.num_v_heads // spec.num_k_heads
        key_dim = spec.num_k_heads * spec.head_k_dim
        value_dim = spec.num_v_heads * spec.head_v_dim
        self.split_projections = spec.split_projections
        if spec.split_projections:
            self.in_proj_qkvz = MergedColumnParallelLinear(
                spec.hidden_size, [key_dim, key_dim, value_dim, value_dim], prefix=f"{prefix}.in_proj_qkvz")
            self.in_proj_ba = MergedColumnParallelLinear(
                spec.hidden_size, [spec.num_v_heads] * 2, prefix=f"{prefix}.in_proj_ba")
        else:
            self.in_proj_qkvz = ColumnParallelLinear(spec.hidden_size, 2 * key_dim + 2 * value_dim,
                                                     prefix=f"{prefix}.in_proj_qkvz")
            self.in_proj_ba = ColumnParallelLinear(spec.hidden_size, 2 * spec.num_v_heads,
                                                   prefix=f"{prefix}.in_proj_ba")
        self.conv1d = ShortConvolution((key_dim, key_dim, value_dim), spec.conv_kernel_size)
        # fp32: g is computed in fp32 from them.
        self.A_log = make_param((self.num_v_heads,), rank_sharded_weight_loader(0), dtype=torch.float32)
        self.dt_bias = make_param((self.num_v_heads,), rank_sharded_weight_loader(0),
                                  dtype=torch.float32)
        self.norm = GatedRMSNorm(spec.head_v_dim, spec.rms_norm_eps)
        self.out_proj = RowParallelLinear(value_dim, spec.hidden_size, prefix=f"{prefix}.out_proj")
        self.core_spec = GatedDeltaCoreSpec(
            self.num_k_heads, self.num_v_heads, spec.head_k_dim, spec.head_v_dim, self.conv1d,
            f"{prefix}.core", layer_id,
        )
        self.core = build_gated_delta_core(self.core_spec)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The conv input [T, q | k | v channels], z, b and a of ``x``, from either layout."""
        value_dim = self.num_v_heads * self.head_v_dim
        if self.split_projections:
            mixed_qkv, z = self.in_proj_qkvz(x).split([2 * self.num_k_heads * self.head_k_dim + value_dim,
                                                        value_dim], dim=-1)
            b, a = self.in_proj_ba(x).chunk(2, dim=-1)
            return mixed_qkv, z, b, a
        k_dim, v_dims = self.head_k_dim, self.v_per_k * self.head_v_dim
        q, k, v, z = self.in_proj_qkvz(x).unflatten(-1, (self.num_k_heads, -1)).split(
            [k_dim, k_dim, v_dims, v_dims], dim=-1)
        mixed_qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=-1)
        b, a = self.in_proj_ba(x).unflatten(-1, (self.num_k_heads, -1)).split(
            [self.v_per_k, self.v_per_k], dim=-1)
        return mixed_qkv, z, b, a

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """``positions`` is unused: the layer has no position encoding but the sequence order."""
        num_tokens = hidden_states.shape[0]
        mixed_qkv, z, b, a = self.project(hidden_states)
        beta = b.reshape(num_tokens, self.num_v_heads).sigmoid()
        g = -self.A_log.exp() * F.softplus(a.reshape(num_tokens, self.num_v_heads).float() + self.dt_bias)
        core_out = run_core(self.core_spec, self.core, mixed_qkv, g, beta)
        out = self.norm(core_out, z.reshape(num_tokens, self.num_v_heads, self.head_v_dim))
        return self.out_proj(out.flatten(1))
