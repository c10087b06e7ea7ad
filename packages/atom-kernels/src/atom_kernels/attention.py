"""Attention over variable-length sequences: fresh K/V (prefill) and a paged KV cache (decode, extend).

Shapes: q [num_tokens, num_heads, head_size]; k, v [num_tokens, num_kv_heads, head_size]; caches as in
:mod:`atom_kernels.cache`. Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (GQA).
Causal masks align the last query with the last key. ``sliding_window`` w lets a query at position p
see keys at positions > p - w. ``sinks`` [num_heads] are per-head logits that join the softmax
denominator without a value (GPT-OSS attention sinks).
"""

from __future__ import annotations

import torch

from atom_kernels.registry import define_op

varlen_attention = define_op(
    "varlen_attention",
    "varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, sliding_window, sinks) -> out",
)
paged_attention = define_op(
    "paged_attention",
    "paged_attention(q, key_cache, value_cache, query_start_loc, seq_lens, block_table, scale, "
    "sliding_window, sinks) -> out: queries are the last tokens of each sequence (decode, extend)",
)


def attend_one_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    sliding_window: int | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Reference attention of one sequence: q [Lq, H, D] over k, v [Lk, KH, D] -> [Lq, H, D]."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_pos = torch.arange(q.shape[0], device=q.device)[:, None] + (k.shape[0] - q.shape[0])
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    mask = torch.zeros_like(scores[0], dtype=torch.bool)
    if causal:
        mask |= k_pos > q_pos
    if sliding_window is not None:
        mask |= k_pos <= q_pos - sliding_window
    scores = scores.masked_fill(mask, float("-inf"))
    if sinks is not None:
        sink_col = sinks.float()[:, None, None].expand(-1, q.shape[0], 1)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


@varlen_attention.register("torch")
def varlen_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    out = torch.empty_like(q)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(starts_q) - 1):
        qs, qe, ks, ke = starts_q[i], starts_q[i + 1], starts_k[i], starts_k[i + 1]
        out[qs:qe] = attend_one_sequence(
            q[qs:qe], k[ks:ke], v[ks:ke], scale, causal, sliding_window, sinks
        )
    return out


def gather_sequence_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_row: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``length`` cached K and V of one sequence: [length, num_kv_heads, head_size] each."""
    block_size = key_cache.shape[1]
    blocks = block_row[: (length + block_size - 1) // block_size].long()
    k = key_cache[blocks].flatten(0, 1)[:length]
    v = value_cache[blocks].flatten(0, 1)[:length]
    return k, v


@paged_attention.register("torch")
def paged_attention_torch(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lengths = seq_lens.tolist()
    for i in range(len(starts) - 1):
        qs, qe = starts[i], starts[i + 1]
        k, v = gather_sequence_kv(key_cache, value_cache, block_table[i], lengths[i])
        out[qs:qe] = attend_one_sequence(q[qs:qe], k, v, scale, True, sliding_window, sinks)
    return out
