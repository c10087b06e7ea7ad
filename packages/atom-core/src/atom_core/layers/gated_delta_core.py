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

A host that keeps the states in a cache of slots (one row per sequence: the conv state and the
recurrent state of :func:`gated_delta_state_shapes`) describes each batch as a
:class:`CachedStateBatch` and runs :func:`forward_with_state_cache`: decodes step the recurrent
kernels, prefill/extend chunks run the chunked rule from the state their slot holds, and both write
their final states back to their slots.

Under torch.compile a layer reaches its core through the custom op ``torch.ops.atom.gated_delta_core``
(:func:`run_core`), which finds the core by name: ATOM's compile backend splits the graph there, as at
attention, so the core reads the host's state and per-step metadata eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

import atom_kernels
from atom_core.layers.attention import standalone_cu_seqlens
from atom_core.layers.short_conv import ShortConvolution
from atom_core.layers.splitting_op import define_splitting_op


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


    def state_shapes(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        return gated_delta_state_shapes(self.num_k_heads, self.num_v_heads, self.head_k_dim,
                                        self.head_v_dim, self.conv.kernel_size)


def gated_delta_state_shapes(num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                             conv_kernel_size: int) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """One sequence's conv state [conv channels, kernel_size - 1] and recurrent state [HV, K, V],
    for a rank's head counts."""
    conv_channels = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    return (conv_channels, conv_kernel_size - 1), (num_v_heads, head_k_dim, head_v_dim)


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


@dataclass(frozen=True)
class CachedStateBatch:
    """One batch over a cache of state slots. Tokens come decodes first: ``num_decodes`` sequences
    of one token each, then the prefill/extend chunks of the others (``num_prefill_tokens`` tokens,
    ``prefill_cu_seqlens`` [P + 1] counted from the first of them). ``*_slots`` are the cache rows
    of the sequences; ``prefill_has_initial_state`` [P] marks chunks that continue a sequence (the
    others start from zero state); the prefill fields may be None without prefill tokens. Tokens
    past both (a host's padding) are left alone."""

    num_decodes: int
    decode_slots: torch.Tensor
    num_prefill_tokens: int
    prefill_cu_seqlens: torch.Tensor | None
    prefill_slots: torch.Tensor | None
    prefill_has_initial_state: torch.Tensor | None


def forward_with_state_cache(spec: GatedDeltaCoreSpec, mixed_qkv: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, conv_cache: torch.Tensor, state_cache: torch.Tensor,
                             batch: CachedStateBatch) -> torch.Tensor:
    """The core over ``batch``, reading and writing the states in place in their rows of
    ``conv_cache`` [slots, *conv state] and ``state_cache`` [slots, *recurrent state]
    (:meth:`GatedDeltaCoreSpec.state_shapes`; rows at any stride, any float dtype: the kernels
    compute in fp32). Returns [T, HV, V] (zeros past the batch)."""
    out = mixed_qkv.new_zeros(mixed_qkv.shape[0], spec.num_v_heads, spec.head_v_dim)
    if batch.num_decodes:
        tokens, slots = slice(0, batch.num_decodes), batch.decode_slots
        x = spec.conv.decode(mixed_qkv[tokens], conv_cache, slots)
        out[tokens] = atom_kernels.gated_delta_rule_decode(*spec.split_heads(x), g[tokens], beta[tokens],
                                                           state_cache, state_slots=slots)
    if batch.num_prefill_tokens:
        tokens = slice(batch.num_decodes, batch.num_decodes + batch.num_prefill_tokens)
        slots, initial = batch.prefill_slots, batch.prefill_has_initial_state
        x = spec.conv.prefill(mixed_qkv[tokens], batch.prefill_cu_seqlens, conv_cache, initial, slots)
        out[tokens] = atom_kernels.gated_delta_rule(*spec.split_heads(x), g[tokens], beta[tokens],
                                                    batch.prefill_cu_seqlens, state_cache, initial,
                                                    state_slots=slots)
    return out


_factory: GatedDeltaCoreFactory = StandaloneGatedDeltaCore
_cores_by_name: dict[str, nn.Module] = {}


def set_gated_delta_core_factory(factory: GatedDeltaCoreFactory) -> None:
    global _factory
    _factory = factory


def build_gated_delta_core(spec: GatedDeltaCoreSpec) -> nn.Module:
    """The core of one layer, from the factory set now (the standalone one unless a host set its).
    The latest model built in this process owns the name (tests build several models)."""
    core = _factory(spec)
    _cores_by_name[spec.prefix] = core
    return core


def gated_delta_core(mixed_qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, output: torch.Tensor,
                     layer_name: str) -> None:
    output.copy_(_cores_by_name[layer_name](mixed_qkv, g, beta))


define_splitting_op(gated_delta_core)


def run_core(spec: GatedDeltaCoreSpec, core: nn.Module, mixed_qkv: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> torch.Tensor:
    """``core(mixed_qkv, g, beta)``; under torch.compile through ``atom::gated_delta_core``."""
    if not torch.compiler.is_compiling():
        return core(mixed_qkv, g, beta)
    output = mixed_qkv.new_empty(mixed_qkv.shape[0], spec.num_v_heads, spec.head_v_dim)
    torch.ops.atom.gated_delta_core(mixed_qkv, g, beta, output, spec.prefix)
    return output
