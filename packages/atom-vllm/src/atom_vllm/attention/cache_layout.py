"""How ATOM's attention kernels see the KV cache vLLM hands each layer, per vLLM release.

ATOM's kernels read K and V as ``[blocks, block_size, heads, head_size]`` tensors (any strides with a
contiguous last dimension) and the MLA latent cache as ``[blocks, block_size, dim]``. What vLLM
hands a layer changed in vLLM 0.29:

- vLLM 0.26 to 0.28 allocate the shape the backend declares (``get_kv_cache_shape``): ATOM's MHA
  cache is ``(2, blocks, block_size, heads, head_size)``, K and V outermost; the latent cache
  ``(blocks, block_size, dim)``.
- vLLM 0.29 and later own the shape: every layer gets the logical ``[blocks, heads, block_size, C]``
  view, C being K‖V for MHA (``2 * head_size``) and the latent entry for MLA (one head), in a physical
  order negotiated from the backends' ``supported_kv_cache_layouts``. ATOM's MHA backend asks for
  ``LBNHC`` (a block is ``[block_size, heads, K‖V]`` in memory), so K and V are the two halves of C.
  Verified on vLLM 0.32 (CPU).
"""

from __future__ import annotations

import torch

from atom_vllm.version import vllm_release

# vLLM 0.29+: vLLM, not the backend, sets the cache's shape. Read once: the views below run every step.
HOST_OWNS_LAYOUT = vllm_release() >= (0, 29)


def supported_mha_layouts() -> tuple | None:
    """The physical orders ATOM's MHA backend reads (vLLM 0.29+; None before: the backend sets the shape)."""
    if not HOST_OWNS_LAYOUT:
        return None
    from vllm.v1.kv_cache_layout import KVCacheLayout

    return (KVCacheLayout.LBNHC,)


def key_value_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_cache, value_cache), each ``[blocks, block_size, heads, head_size]``, of an MHA layer's cache."""
    if not HOST_OWNS_LAYOUT:
        return kv_cache.unbind(0)
    by_token = kv_cache.transpose(1, 2)  # logical [blocks, heads, block_size, K‖V] -> [blocks, block_size, heads, K‖V]
    head_size = by_token.shape[-1] // 2
    return by_token[..., :head_size], by_token[..., head_size:]


def one_block_mha_cache(heads: int, head_size: int, block_size: int, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
    """A zeroed one-block MHA cache laid out as vLLM lays out the real ones (for compiling kernels
    on the strides they will see)."""
    if not HOST_OWNS_LAYOUT:
        return torch.zeros((2, 1, block_size, heads, head_size), dtype=dtype, device=device)
    return torch.zeros((1, block_size, heads, 2 * head_size), dtype=dtype, device=device).transpose(1, 2)


def latent_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """An MLA layer's cache as ``[blocks, block_size, dim]`` (before vLLM binds the cache, the empty
    placeholder as it is)."""
    return kv_cache.squeeze(1) if HOST_OWNS_LAYOUT and kv_cache.dim() == 4 else kv_cache
