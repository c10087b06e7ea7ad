"""Paged KV-cache write.

Cache layout (ATOM's, declared to vLLM by the attention backend): key_cache and value_cache are each
[num_blocks, block_size, num_kv_heads, head_size]. ``slot_mapping[t] = block * block_size + offset``;
a negative slot (padding) is skipped.
"""

from __future__ import annotations

import torch

from atom_kernels.registry import define_op

reshape_and_cache = define_op(
    "reshape_and_cache",
    "reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None (writes the caches)",
)


@reshape_and_cache.register("torch")
def reshape_and_cache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    num_tokens = slot_mapping.shape[0]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[:num_tokens][valid].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[:num_tokens][valid].to(value_cache.dtype)
