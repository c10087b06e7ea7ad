"""AITER adapters of :mod:`atom_kernels.mla`: ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.mla import fused_qk_rope_concat_and_cache_mla, mla_decode


@fused_qk_rope_concat_and_cache_mla.register("aiter")
def fused_qk_rope_concat_and_cache_mla_aiter(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    *,
    out: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    import aiter

    # AITER skips the q rows of padding tokens (slot < 0): they stay unwritten, which our contract
    # allows (nothing reads them).
    if out is None:
        out = torch.empty((*q_nope.shape[:2], q_nope.shape[-1] + q_pe.shape[-1]), dtype=q_nope.dtype,
                          device=q_nope.device)
    one = torch.ones(1, dtype=torch.float32, device=q_nope.device)
    cos, sin = cos_sin_cache.chunk(2, dim=-1)
    aiter.fused_qk_rope_concat_and_cache_mla(
        q_nope,
        q_pe,
        kv_c,
        k_pe.reshape(k_pe.shape[0], -1),
        kv_cache,
        out,
        slot_mapping,
        one if kv_scale is None else kv_scale,
        one,
        positions,
        cos.to(q_nope.dtype).contiguous(),
        sin.to(q_nope.dtype).contiguous(),
        is_neox,
        True,  # is_nope_first: q_out = [q_nope | q_pe], cache entry = [kv_c | k_pe]
    )
    return out


@mla_decode.register("aiter")
def mla_decode_aiter(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
    *,
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    from aiter.mla import mla_decode_fwd

    # AITER takes the pages of all sequences as one flat list (kv_indptr / kv_indices) and the fill
    # of each sequence's last page.
    block_size = kv_cache.shape[1]
    pages = (seq_lens + block_size - 1) // block_size
    kv_indptr = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=q.device)
    kv_indptr[1:] = pages.cumsum(0)
    used = torch.arange(block_table.shape[1], device=q.device)[None, :] < pages[:, None]
    kv_indices = block_table[used].to(torch.int32)
    last_page_lens = (seq_lens - (pages - 1) * block_size).to(torch.int32)
    if out is None:
        out = torch.empty((*q.shape[:2], kv_lora_rank), dtype=q.dtype, device=q.device)
    mla_decode_fwd(
        q,
        kv_cache.view(kv_cache.shape[0], block_size, 1, kv_cache.shape[-1]),
        out,
        query_start_loc,
        kv_indptr,
        kv_indices,
        last_page_lens,
        int((query_start_loc[1:] - query_start_loc[:-1]).max()),
        page_size=block_size,
        nhead_kv=1,
        sm_scale=scale,
        kv_scale=kv_scale,
    )
    return out
