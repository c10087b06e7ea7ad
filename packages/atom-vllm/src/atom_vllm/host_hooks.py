"""Plug vLLM's TP group and attention layers into atom-core (see atom_core.distributed, and
atom_core.layers.attention / atom_core.layers.mla)."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.distributed import TPGroup, set_tp_group
from atom_core.layers.attention import AttentionSpec, set_attention_factory
from atom_core.layers.mla import LatentAttentionSpec, set_latent_attention_factory


def vllm_attention(spec: AttentionSpec) -> nn.Module:
    """A vLLM ``Attention`` layer: vLLM binds its KV cache and builds its metadata; the backend
    (ATOM's unless disabled) comes from ATOMPlatform.get_attn_backend_cls."""
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.attention import Attention

    extra = {} if spec.sinks is None else {"sinks": spec.sinks}
    return Attention(
        spec.num_heads,
        spec.head_size,
        spec.scale,
        num_kv_heads=spec.num_kv_heads,
        cache_config=get_current_vllm_config().cache_config,
        per_layer_sliding_window=spec.sliding_window,
        prefix=spec.prefix,
        **extra,
    )


def vllm_latent_attention(spec: LatentAttentionSpec) -> nn.Module:
    """ATOM's MLA layer for vLLM (vLLM's own MLAAttention cannot take ATOM's layers; see
    atom_vllm.attention.mla)."""
    from atom_vllm.attention.mla import ATOMMLAAttention

    return ATOMMLAAttention(spec)


def _all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_gather

    return tensor_model_parallel_all_gather(x, dim)


def install_vllm_hooks() -> None:
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
        tensor_model_parallel_all_reduce,
    )

    set_tp_group(
        TPGroup(
            rank=get_tensor_model_parallel_rank(),
            world_size=get_tensor_model_parallel_world_size(),
            all_reduce=tensor_model_parallel_all_reduce,
            all_gather=_all_gather,
        )
    )
    set_attention_factory(vllm_attention)
    set_latent_attention_factory(vllm_latent_attention)
