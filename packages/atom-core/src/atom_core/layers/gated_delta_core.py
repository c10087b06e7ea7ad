"""The stateful core of a Gated DeltaNet layer, where a host's recurrent-state cache plugs in.

A Gated DeltaNet layer (atom_core.layers.gated_delta_net) projects its input, then hands the core
the conv input ``mixed_qkv`` [T, conv channels] (q | k | v of this rank's heads), the log decay
``g`` [T, HV] (fp32) and ``beta`` [T, HV]; the core runs the short convolution and the gated delta
rule over each sequence, carrying per-sequence state between calls, and returns [T, HV, V]. The
two states a sequence carries are the conv state [conv channels, kernel_size - 1] (its last inputs)
and the recurrent state [HV, K, V]; where they live and which sequences continue from them is the
core's business, chosen by the host through :func:`set_gated_delta_core_factory` as attention
backends are (atom_core.layers.attention).

Standalone (tests, HF parity): :class:`StandaloneGatedDeltaCore` runs each sequence of the batch
given by :func:`atom_core.layers.attention.standalone_batch` whole, from zero state, and keeps none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

import atom_kernels
from atom_core.layers.attention import standalone_cu_seqlens
from atom_core.layers.short_conv import ShortConvolution


@dataclass(frozen=True)
class GatedDeltaCoreSpec:
    """One layer's core, per TP rank: head counts and sizes, its convolution (weights and op),
    and the layer's name and index."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv: ShortConvolution
    prefix: str
    layer_id: int

    def split_heads(self, mixed_qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolved [T, conv channels] as views q, k [T, HK, K] and v [T, HV, V]."""
        key_dim = self.num_k_heads * self.head_k_dim
        q, k, v = mixed_qkv.split([key_dim, key_dim, self.num_v_heads * self.head_v_dim], dim=-1)
        return (q.unflatten(-1, (self.num_k_heads, self.head_k_dim)),
                k.unflatten(-1, (self.num_k_heads, self.head_k_dim)),
                v.unflatten(-1, (self.num_v_heads, self.head_v_dim)))


GatedDeltaCoreFactory = Callable[[GatedDeltaCoreSpec], nn.Module]
"""Builds a layer's core: ``module(mixed_qkv, g, beta) -> [T, HV, V]`` (shapes in the module
docstring)."""


class StandaloneGatedDeltaCore(nn.Module):
    """Each sequence of the standalone batch whole, from zero conv and recurrent state."""

    def __init__(self, spec: GatedDeltaCoreSpec):
        super().__init__()
        self.spec = spec

    def forward(self, mixed_qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        s = self.spec
        cu_seqlens = standalone_cu_seqlens(mixed_qkv.device)
        num_seqs = cu_seqlens.numel() - 1
        fresh = torch.zeros(num_seqs, dtype=torch.bool, device=mixed_qkv.device)
        conv_state = mixed_qkv.new_zeros(num_seqs, s.conv.channels, s.conv.kernel_size - 1)
        q, k, v = s.split_heads(s.conv.prefill(mixed_qkv, cu_seqlens, conv_state, fresh))
        state = torch.zeros(num_seqs, s.num_v_heads, s.head_k_dim, s.head_v_dim,
                            dtype=torch.float32, device=mixed_qkv.device)
        return atom_kernels.gated_delta_rule(q, k, v, g, beta, cu_seqlens, state, fresh)


_factory: GatedDeltaCoreFactory = StandaloneGatedDeltaCore


def set_gated_delta_core_factory(factory: GatedDeltaCoreFactory) -> None:
    global _factory
    _factory = factory


def build_gated_delta_core(spec: GatedDeltaCoreSpec) -> nn.Module:
    """The core of one layer, from the factory set now (the standalone one unless a host set its)."""
    return _factory(spec)
