"""AITER adapters of :mod:`atom_kernels.cache` (KV-cache writes): ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.cache import concat_and_cache_mla, is_fp8_cache, reshape_and_cache


def _dtype_and_scale(cache: torch.Tensor, scale: torch.Tensor | None) -> tuple[str, torch.Tensor]:
    """AITER's kv_cache_dtype string and the scale it divides by (1.0 unless given)."""
    one = torch.ones(1, dtype=torch.float32, device=cache.device)
    return ("fp8" if is_fp8_cache(cache) else "auto"), (one if scale is None else scale)


@reshape_and_cache.register("aiter")
def reshape_and_cache_aiter(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    import aiter

    cache_dtype, k_scale = _dtype_and_scale(key_cache, k_scale)
    v_scale = _dtype_and_scale(value_cache, v_scale)[1]
    num_heads, head_size = key_cache.shape[2], key_cache.shape[3]
    aiter.reshape_and_cache_flash(
        key.view(-1, num_heads, head_size),
        value.view(-1, num_heads, head_size),
        key_cache,
        value_cache,
        slot_mapping,
        cache_dtype,
        k_scale,
        v_scale,
    )


@concat_and_cache_mla.register("aiter")
def concat_and_cache_mla_aiter(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
) -> None:
    import aiter

    cache_dtype, scale = _dtype_and_scale(kv_cache, scale)
    aiter.concat_and_cache_mla(kv_c, k_pe.reshape(k_pe.shape[0], -1), kv_cache, slot_mapping, cache_dtype, scale)
