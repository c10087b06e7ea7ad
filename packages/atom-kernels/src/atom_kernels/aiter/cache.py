"""AITER adapters of :mod:`atom_kernels.cache` (KV-cache writes): ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.cache import concat_and_cache_mla, reshape_and_cache


@reshape_and_cache.register("aiter")
def reshape_and_cache_aiter(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    import aiter

    one = torch.ones(1, dtype=torch.float32, device=key.device)
    num_heads, head_size = key_cache.shape[2], key_cache.shape[3]
    aiter.reshape_and_cache_flash(
        key.view(-1, num_heads, head_size),
        value.view(-1, num_heads, head_size),
        key_cache,
        value_cache,
        slot_mapping,
        "auto",
        one,
        one,
    )


@concat_and_cache_mla.register("aiter")
def concat_and_cache_mla_aiter(
    kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    import aiter

    one = torch.ones(1, dtype=torch.float32, device=kv_c.device)
    aiter.concat_and_cache_mla(kv_c, k_pe.reshape(k_pe.shape[0], -1), kv_cache, slot_mapping, "auto", one)
