"""ATOM's Gated DeltaNet core for vLLM: the layer's conv and recurrent states live in vLLM's state
cache (atom_core.layers.gated_delta_core).

vLLM treats the core as one of its Mamba-like layers (``MambaBase``): it sizes the layer's
``MambaSpec`` from :meth:`get_state_shape` / :meth:`get_state_dtype` (ATOM's layout: conv state
[channels, kernel_size - 1], recurrent state [HV, K, V]), binds ``kv_cache`` = (conv states,
recurrent states), one row per state block, and each step builds the layer's metadata with its
GDN_ATTN backend (``GDNAttentionMetadata``): decodes first, then the prefill/extend chunks, and the
state block of every request. The core reads each request's state from that block and writes the
final state back to it; under prefix caching (vLLM's ``mamba_cache_mode="align"``) vLLM copies a
request's state into the block before the step, as for its own Qwen3-Next.

Speculative decoding is handed back to vLLM (atom_core.hosting.takeover).
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from atom_core.hosting.warmup import run_gated_delta_prefill_kernels
from atom_core.layers.gated_delta_core import (
    CachedStateBatch,
    GatedDeltaCoreSpec,
    forward_with_state_cache,
)


def state_dtypes(vllm_config) -> tuple[torch.dtype, torch.dtype]:
    """The conv and recurrent state dtypes vLLM's cache settings ask for (``mamba_cache_dtype``,
    ``mamba_ssm_cache_dtype``; the model dtype by default)."""
    cache_config = vllm_config.cache_config
    return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        vllm_config.model_config.dtype, cache_config.mamba_cache_dtype,
        cache_config.mamba_ssm_cache_dtype,
    )


class ATOMGatedDeltaCore(nn.Module, MambaBase):
    def __init__(self, spec: GatedDeltaCoreSpec):
        super().__init__()
        self.spec = spec
        self.prefix = spec.prefix
        vllm_config = get_current_vllm_config()
        self.state_dtypes = state_dtypes(vllm_config)
        self.kv_cache = (torch.tensor([]), torch.tensor([]))  # bound by vLLM once it allocates the caches
        self.prefill_kernels_compiled = False
        # vLLM finds its attention-like layers, and binds their caches, by name here.
        layers = vllm_config.compilation_config.static_forward_context
        if self.prefix in layers:
            raise ValueError(f"Duplicate layer name: {self.prefix}")
        layers[self.prefix] = self

    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        return self.spec.state_shapes()

    def get_state_dtype(self) -> tuple[torch.dtype, torch.dtype]:
        return self.state_dtypes

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.GDN_ATTN

    def forward(self, mixed_qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        metadata = get_forward_context().attn_metadata
        if metadata is None:
            # vLLM's profiling and warm-up runs: no requests, no state to read or write. The first
            # warm-up run after vLLM bound the caches compiles the prefill kernels for their layout
            # (decode kernels compile when vLLM captures its decode CUDA graphs).
            conv_cache, state_cache = self.kv_cache
            capturing = mixed_qkv.is_cuda and torch.cuda.is_current_stream_capturing()
            if not self.prefill_kernels_compiled and conv_cache.numel() and not capturing:
                self.prefill_kernels_compiled = run_gated_delta_prefill_kernels(
                    self.spec, mixed_qkv, g, beta, conv_cache, state_cache)
            return mixed_qkv.new_zeros(mixed_qkv.shape[0], self.spec.num_v_heads, self.spec.head_v_dim)
        m = metadata[self.prefix]
        prefills = m.num_prefills > 0
        batch = CachedStateBatch(
            num_decodes=m.num_decodes,
            decode_slots=m.non_spec_state_indices_tensor[:m.num_decodes],
            num_prefill_tokens=m.num_prefill_tokens,
            prefill_cu_seqlens=m.prefill_query_start_loc if prefills else None,
            prefill_slots=m.prefill_state_indices if prefills else None,
            prefill_has_initial_state=m.prefill_has_initial_state if prefills else None,
        )
        conv_cache, state_cache = self.kv_cache
        return forward_with_state_cache(self.spec, mixed_qkv, g, beta, conv_cache, state_cache, batch)
