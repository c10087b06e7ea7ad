"""AITER adapters of :mod:`atom_kernels.attention`: ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.attention import paged_attention, varlen_attention


def _window(sliding_window: int | None) -> tuple[int, int]:
    # Ours: a query sees the last ``sliding_window`` keys including itself; FlashAttention's
    # (left, right) counts the keys to the left.
    if sliding_window is None or sliding_window <= 0:
        return (-1, -1)
    return (sliding_window - 1, 0)


@varlen_attention.register("aiter")
def varlen_attention_aiter(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    import aiter

    left, right = _window(sliding_window)
    result = aiter.flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()),
        int((cu_seqlens_k[1:] - cu_seqlens_k[:-1]).max()),
        softmax_scale=scale,
        causal=causal,
        window_size=(left, right if causal else -1, 0),
        out=out,
        sink_ptr=sinks,
    )
    return result[0] if isinstance(result, tuple) else result


@paged_attention.register("aiter")
def paged_attention_aiter(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    # AITER's Triton unified attention reads our [num_blocks, block_size, KH, D] (flash) layout as is,
    # FP8 caches too, with their scales as its k_descale / v_descale.
    from aiter.ops.triton.attention.unified_attention import unified_attention

    out = torch.empty_like(q) if out is None else out
    max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    unified_attention(
        q,
        key_cache,
        value_cache,
        out,
        query_start_loc,
        max_query_len,
        seq_lens,
        max_seq_len if max_seq_len is not None else int(seq_lens.max()),
        scale,
        True,
        _window(sliding_window),
        block_table,
        0.0,
        None,
        k_scale,
        v_scale,
        sinks=sinks,
    )
    return out
