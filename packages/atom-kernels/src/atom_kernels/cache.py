"""Paged KV-cache writes.

Cache layout (ATOM's, declared to vLLM by the attention backend): key_cache and value_cache are each
[num_blocks, block_size, num_kv_heads, head_size]. ``slot_mapping[t] = block * block_size + offset``;
a negative slot (padding) is skipped.

The MLA latent cache is [num_blocks, block_size, kv_lora_rank + rope_dim]: each slot holds the
compressed KV ``kv_c`` followed by the rotated shared key ``k_pe`` (see :mod:`atom_kernels.mla`).

FP8 caches (``float8_e4m3fn``, or ``float8_e4m3fnuz`` on MI300) hold ``x / scale`` saturated to the
type's range, with one fp32 scale per cache (``k_scale``, ``v_scale``: one-element tensors, so that a
captured CUDA graph reads the value current at replay; 1.0 when omitted). The readers
(:mod:`atom_kernels.attention`) multiply it back. Scales go with FP8 caches only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import check_last_dim_contiguous, next_pow2


@define_op
def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write each token's key and value into the caches [num_blocks, block_size, kv_heads, head_dim]
    at its slot; slot -1 is skipped. FP8 caches store ``key / k_scale`` and ``value / v_scale``."""


@define_op
def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
) -> None:
    """Write ``[kv_c | k_pe]`` into each token's slot of the MLA cache
    [num_blocks, block_size, kv_lora_rank + rope_dim]; slot -1 is skipped. An FP8 cache stores the
    entry divided by ``scale``."""


FP8_CACHE_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def is_fp8_cache(cache: torch.Tensor) -> bool:
    return cache.dtype in FP8_CACHE_DTYPES


def check_cache_scale(name: str, cache: torch.Tensor, scale: torch.Tensor | None) -> None:
    """A scale goes with an FP8 cache only, and is one fp32 value."""
    if scale is None:
        return
    if not is_fp8_cache(cache):
        raise ValueError(f"{name}: a scale was given for a {cache.dtype} cache (FP8 caches only)")
    if scale.numel() != 1 or scale.dtype != torch.float32:
        raise ValueError(f"{name}: one fp32 value expected, got {scale.dtype} {tuple(scale.shape)}")


def to_cache_dtype(x: torch.Tensor, cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``x`` as stored in ``cache``: divided by ``scale`` and saturated when the cache is FP8."""
    if not is_fp8_cache(cache):
        return x.to(cache.dtype)
    fp8_max = torch.finfo(cache.dtype).max
    if scale is not None:
        x = x.float() / scale.float().reshape(())
    return x.float().clamp(-fp8_max, fp8_max).to(cache.dtype)


def from_cache_dtype(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Cached values back in fp32 (FP8 times its scale), for the torch references."""
    if scale is None:
        return x.float()
    return x.float() * scale.float().reshape(())


@reshape_and_cache.register("torch")
def reshape_and_cache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    check_cache_scale("k_scale", key_cache, k_scale)
    check_cache_scale("v_scale", value_cache, v_scale)
    num_tokens = slot_mapping.shape[0]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = to_cache_dtype(key[:num_tokens][valid], key_cache, k_scale)
    value_cache[blocks, offsets] = to_cache_dtype(value[:num_tokens][valid], value_cache, v_scale)


@concat_and_cache_mla.register("torch")
def concat_and_cache_mla_torch(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
) -> None:
    check_cache_scale("scale", kv_cache, scale)
    num_tokens = slot_mapping.shape[0]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    block_size = kv_cache.shape[1]
    entry = torch.cat([kv_c[:num_tokens], k_pe[:num_tokens].reshape(num_tokens, -1)], dim=-1)
    kv_cache[slots // block_size, slots % block_size] = to_cache_dtype(entry[valid], kv_cache, scale)


@triton.jit
def _copy_rows_to_slot(
    src_ptr,
    src_head_stride,
    dst_ptr,
    dst_head_stride,
    num_heads,
    head_size,
    scale_ptr,
    HEADS_P2: tl.constexpr,
    HEAD_P2: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """Copy [num_heads, head_size] rows; FP8_MAX > 0 quantizes them (divided by the value at
    ``scale_ptr`` when it is given, saturated to +-FP8_MAX)."""
    heads = tl.arange(0, HEADS_P2)[:, None]
    dims = tl.arange(0, HEAD_P2)[None, :]
    mask = (heads < num_heads) & (dims < head_size)
    row = tl.load(src_ptr + heads * src_head_stride + dims, mask=mask)
    if FP8_MAX > 0:
        row = row.to(tl.float32)
        if scale_ptr is not None:
            row = row / tl.load(scale_ptr)
        row = tl.clamp(row, -FP8_MAX, FP8_MAX)
    tl.store(dst_ptr + heads * dst_head_stride + dims, row.to(dst_ptr.dtype.element_ty), mask=mask)


def cache_fp8_max(cache: torch.Tensor) -> float:
    """The kernels' FP8_MAX for a cache: its type's largest value, 0.0 for a cache that is not FP8."""
    return float(torch.finfo(cache.dtype).max) if is_fp8_cache(cache) else 0.0


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    k_scale_ptr,
    v_scale_ptr,
    key_token_stride,
    key_head_stride,
    value_token_stride,
    value_head_stride,
    kc_block_stride,
    kc_slot_stride,
    kc_head_stride,
    vc_block_stride,
    vc_slot_stride,
    vc_head_stride,
    block_size,
    num_heads,
    head_size,
    HEADS_P2: tl.constexpr,
    HEAD_P2: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block, offset = slot // block_size, slot % block_size
    _copy_rows_to_slot(
        key_ptr + token * key_token_stride,
        key_head_stride,
        key_cache_ptr + block * kc_block_stride + offset * kc_slot_stride,
        kc_head_stride,
        num_heads,
        head_size,
        k_scale_ptr,
        HEADS_P2,
        HEAD_P2,
        FP8_MAX,
    )
    _copy_rows_to_slot(
        value_ptr + token * value_token_stride,
        value_head_stride,
        value_cache_ptr + block * vc_block_stride + offset * vc_slot_stride,
        vc_head_stride,
        num_heads,
        head_size,
        v_scale_ptr,
        HEADS_P2,
        HEAD_P2,
        FP8_MAX,
    )


def _check_cache(name: str, cache: torch.Tensor, *trailing: int) -> None:
    if cache.dim() != 2 + len(trailing) or tuple(cache.shape[2:]) != trailing:
        raise ValueError(
            f"{name}: shape {tuple(cache.shape)} != [num_blocks, block_size, {trailing}]"
        )
    check_last_dim_contiguous(name, cache)


@reshape_and_cache.register("triton")
def reshape_and_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    check_cache_scale("k_scale", key_cache, k_scale)
    check_cache_scale("v_scale", value_cache, v_scale)
    num_tokens = slot_mapping.shape[0]
    num_heads, head_size = key_cache.shape[2], key_cache.shape[3]
    _check_cache("key_cache", key_cache, num_heads, head_size)
    _check_cache("value_cache", value_cache, num_heads, head_size)
    key = key.view(key.shape[0], num_heads, head_size) if key.dim() == 2 else key
    value = value.view(value.shape[0], num_heads, head_size) if value.dim() == 2 else value
    for name, t in (("key", key), ("value", value)):
        if t.shape[1:] != (num_heads, head_size) or t.shape[0] < num_tokens:
            raise ValueError(
                f"reshape_and_cache: {name} {tuple(t.shape)} vs cache heads {num_heads}x{head_size}"
            )
        check_last_dim_contiguous(name, t)
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        k_scale,
        v_scale,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        key_cache.shape[1],
        num_heads,
        head_size,
        HEADS_P2=next_pow2(num_heads),
        HEAD_P2=next_pow2(head_size),
        FP8_MAX=cache_fp8_max(key_cache),
        num_warps=4,
    )


@triton.jit
def _concat_and_cache_mla_kernel(
    kv_c_ptr,
    k_pe_ptr,
    cache_ptr,
    slot_mapping_ptr,
    scale_ptr,
    kv_c_stride,
    k_pe_stride,
    cache_block_stride,
    cache_slot_stride,
    block_size,
    kv_lora_rank,
    rope_dim,
    RANK_P2: tl.constexpr,
    ROPE_P2: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    dst = (
        cache_ptr
        + (slot // block_size) * cache_block_stride
        + (slot % block_size) * cache_slot_stride
    )
    _copy_rows_to_slot(
        kv_c_ptr + token * kv_c_stride, 0, dst, 0, 1, kv_lora_rank, scale_ptr, 1, RANK_P2, FP8_MAX
    )
    _copy_rows_to_slot(
        k_pe_ptr + token * k_pe_stride, 0, dst + kv_lora_rank, 0, 1, rope_dim, scale_ptr, 1, ROPE_P2,
        FP8_MAX,
    )


@concat_and_cache_mla.register("triton")
def concat_and_cache_mla_triton(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
) -> None:
    check_cache_scale("scale", kv_cache, scale)
    num_tokens = slot_mapping.shape[0]
    k_pe = k_pe.reshape(k_pe.shape[0], -1) if k_pe.dim() == 3 else k_pe
    kv_lora_rank, rope_dim = kv_c.shape[-1], k_pe.shape[-1]
    _check_cache("kv_cache", kv_cache, kv_lora_rank + rope_dim)
    check_last_dim_contiguous("kv_c", kv_c)
    check_last_dim_contiguous("k_pe", k_pe)
    if num_tokens == 0:
        return
    _concat_and_cache_mla_kernel[(num_tokens,)](
        kv_c,
        k_pe,
        kv_cache,
        slot_mapping,
        scale,
        kv_c.stride(0),
        k_pe.stride(0),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.shape[1],
        kv_lora_rank,
        rope_dim,
        RANK_P2=next_pow2(kv_lora_rank),
        ROPE_P2=next_pow2(rope_dim),
        FP8_MAX=cache_fp8_max(kv_cache),
        num_warps=4,
    )
