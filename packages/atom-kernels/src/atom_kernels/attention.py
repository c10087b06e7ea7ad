"""Attention over variable-length sequences: fresh K/V (prefill) and a paged KV cache (decode, extend).

Shapes: q [num_tokens, num_heads, head_size]; k, v [num_tokens, num_kv_heads, head_size]; caches as in
:mod:`atom_kernels.cache`. Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (GQA).
Causal masks align the last query with the last key. ``sliding_window`` w lets a query at position p
see keys at positions > p - w. ``sinks`` [num_heads] are per-head logits that join the softmax
denominator without a value (GPT-OSS attention sinks).

Keyword-only extras: ``out`` (a preallocated [num_tokens, num_heads, head_size] output, as vLLM's
attention layers pass), and for ``paged_attention`` the GPU-kernel hints ``max_seq_len`` (caps the
split-K factor without reading lengths back from the GPU) and ``num_splits`` (forces it), and the
scales ``k_scale`` / ``v_scale`` of FP8 caches (see :mod:`atom_kernels.cache`): the kernel reads FP8
tiles, widens them to the query's type and folds the scales into the softmax scale and the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels import prefill_attention
from atom_kernels.cache import check_cache_scale, from_cache_dtype, is_fp8_cache
from atom_kernels.registry import define_op
from atom_kernels.triton_utils import (
    cdiv,
    check_last_dim_contiguous,
    check_same_device,
    dot_precision,
    locate_block,
    next_pow2,
    sm_count,
)
from atom_kernels.tuned import tuned_config


@define_op
def varlen_attention(
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
    """Attention over packed variable-length sequences (prefill): q [T, H, D], k/v [S, KH, D]."""


@define_op
def paged_attention(
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
    """Attention over the paged cache; the queries are the last tokens of each sequence (decode,
    extend)."""


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


def output_buffer(
    out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor
) -> torch.Tensor:
    """``out`` checked against ``shape``, or a new tensor like ``like`` when the caller gave none."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if tuple(out.shape) != shape or out.stride(-1) != 1:
        raise ValueError(
            f"attention out: shape {tuple(out.shape)} != {shape} or last dim not contiguous"
        )
    return out


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
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    out = output_buffer(out, tuple(q.shape), q)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(starts_q) - 1):
        qs, qe, ks, ke = starts_q[i], starts_q[i + 1], starts_k[i], starts_k[i + 1]
        out[qs:qe] = attend_one_sequence(
            q[qs:qe], k[ks:ke], v[ks:ke], scale, causal, sliding_window, sinks
        )
    return out


def gather_sequence_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_row: torch.Tensor,
    length: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``length`` cached K and V of one sequence: [length, num_kv_heads, head_size] each
    (FP8 caches dequantized to fp32)."""
    block_size = key_cache.shape[1]
    blocks = block_row[: (length + block_size - 1) // block_size].long()
    k = key_cache[blocks].flatten(0, 1)[:length]
    v = value_cache[blocks].flatten(0, 1)[:length]
    if is_fp8_cache(key_cache):
        k, v = from_cache_dtype(k, k_scale), from_cache_dtype(v, v_scale)
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
    *,
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``max_seq_len`` and ``num_splits`` are hints for the GPU kernels; the reference ignores them."""
    check_cache_scale("k_scale", key_cache, k_scale)
    check_cache_scale("v_scale", value_cache, v_scale)
    out = output_buffer(out, tuple(q.shape), q)
    starts = query_start_loc.tolist()
    lengths = seq_lens.tolist()
    for i in range(len(starts) - 1):
        qs, qe = starts[i], starts[i + 1]
        k, v = gather_sequence_kv(key_cache, value_cache, block_table[i], lengths[i], k_scale, v_scale)
        out[qs:qe] = attend_one_sequence(q[qs:qe], k, v, scale, True, sliding_window, sinks)
    return out


# --- Triton ---------------------------------------------------------------------------------------
#
# One kernel serves varlen (fresh K/V), paged (decode and extend over the block table) and MLA (one
# latent KV head whose first channels are also the values). A program owns BLOCK_M query rows: BLOCK_Q
# consecutive tokens of one sequence times HEADS heads that share one KV head, so GQA heads reuse each
# K/V tile. Programs along axis 0 are numbered per sequence as query_start // BLOCK_Q + seq (an upper
# bound of the real count, so the grid depends only on the token and sequence counts, not on a
# host-read max_query_len). With NUM_SPLITS > 1 each program takes a slice of the KV tiles (split-K,
# for decode batches too small to fill the GPU) and writes a partial output and its log-sum-exp;
# _merge_splits_kernel combines them.

# A tl.constexpr so the kernels can read it; the launchers use LOG2E.value.
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _attend_tiles(
    acc,
    m_i,
    l_i,
    q,
    q_extra,
    q_pos,
    tile_lo,
    tile_hi,
    kv_lo,
    kv_hi,
    kv_start,
    k_head,
    v_head,
    table_row,
    k_stride_block,
    k_stride_t,
    v_stride_block,
    v_stride_t,
    block_size,
    qk_scale,
    sliding_window,
    dims,
    extra_dims,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PAGED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    V_IS_K: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_P2: tl.constexpr,
    EXTRA_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online softmax over KV tiles [tile_lo, tile_hi); MASKED applies the causal/window/length mask."""
    for tile in range(tile_lo, tile_hi):
        kv_idx = kv_lo + tile * BLOCK_N + tl.arange(0, BLOCK_N)
        kv_valid = kv_idx < kv_hi
        if PAGED:
            block = tl.load(table_row + kv_idx // block_size, mask=kv_valid, other=0).to(tl.int64)
            k_off = block * k_stride_block + (kv_idx % block_size) * k_stride_t
            v_off = block * v_stride_block + (kv_idx % block_size) * v_stride_t
        else:
            k_off = (kv_start + kv_idx).to(tl.int64) * k_stride_t
            v_off = (kv_start + kv_idx).to(tl.int64) * v_stride_t
        if MASKED or HEAD_DIM != HEAD_P2:
            k = tl.load(
                k_head + k_off[None, :] + dims[:, None],
                mask=kv_valid[None, :] & (dims < HEAD_DIM)[:, None],
                other=0.0,
            )
        else:  # a full tile: every key is valid
            k = tl.load(k_head + k_off[None, :] + dims[:, None])
        k = k.to(q.dtype)  # FP8 caches: widened here, their scale is in qk_scale
        s = tl.dot(q, k, input_precision=DOT_PRECISION)
        if EXTRA_DIM > 0:
            k_extra = tl.load(
                k_head + k_off[None, :] + extra_dims[:, None],
                mask=kv_valid[None, :] & (extra_dims < HEAD_DIM + EXTRA_DIM)[:, None],
                other=0.0,
            )
            s += tl.dot(q_extra, k_extra.to(q.dtype), input_precision=DOT_PRECISION)
        # Scores stay unscaled: the scale joins the exponent as one multiply-add (qk_scale > 0).
        if MASKED:
            visible = tl.broadcast_to(kv_valid[None, :], s.shape)
            if CAUSAL:
                visible &= kv_idx[None, :] <= q_pos[:, None]
            if USE_WINDOW:
                visible &= kv_idx[None, :] > q_pos[:, None] - sliding_window
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            m_safe = m_new
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s * qk_scale - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if V_IS_K:
            v = tl.trans(k)
        else:
            if MASKED or HEAD_DIM != HEAD_P2:
                v = tl.load(
                    v_head + v_off[:, None] + dims[None, :],
                    mask=kv_valid[:, None] & (dims < HEAD_DIM)[None, :],
                    other=0.0,
                )
            else:
                v = tl.load(v_head + v_off[:, None] + dims[None, :])
            v = v.to(q.dtype)  # FP8 caches: the scale multiplies the output
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


# Batch metadata pointers are not specialized on alignment: a backend may pass slices such as
# seq_lens[num_decodes:], whose 16-byte alignment changes from batch to batch (each change would compile
# a new variant mid-serving); the kernel only reads scalars and short index vectors from them.
@triton.jit(
    do_not_specialize=["block_table_stride", "num_seqs"],
    do_not_specialize_on_alignment=["query_start_ptr", "kv_start_ptr", "seq_lens_ptr", "block_table_ptr"],
)
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    sinks_ptr,
    k_scale_ptr,
    v_scale_ptr,
    query_start_ptr,
    kv_start_ptr,
    seq_lens_ptr,
    block_table_ptr,
    q_stride_t,
    q_stride_h,
    k_stride_block,
    k_stride_t,
    k_stride_h,
    v_stride_block,
    v_stride_t,
    v_stride_h,
    o_stride_t,
    o_stride_h,
    o_stride_split,
    block_table_stride,
    num_seqs,
    num_q_heads,
    block_size,
    qk_scale,
    sliding_window,
    GROUP: tl.constexpr,
    HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_P2: tl.constexpr,
    EXTRA_DIM: tl.constexpr,
    EXTRA_P2: tl.constexpr,
    CAUSAL: tl.constexpr,
    PAGED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SINKS: tl.constexpr,
    V_IS_K: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // HEADS
    HEAD_BLOCKS: tl.constexpr = (GROUP + HEADS - 1) // HEADS
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    head_block = tl.program_id(1) % HEAD_BLOCKS
    split = tl.program_id(2)

    seq, q_start, q_len, first_token = locate_block(query_start_ptr, q_block, num_seqs, BLOCK_Q)
    if first_token >= q_len:
        return
    if PAGED:
        kv_start = 0
        kv_len = tl.load(seq_lens_ptr + seq)
    else:
        kv_start = tl.load(kv_start_ptr + seq)
        kv_len = tl.load(kv_start_ptr + seq + 1) - kv_start

    rows = tl.arange(0, BLOCK_M)
    token = first_token + rows // HEADS
    head_in_group = head_block * HEADS + rows % HEADS
    head = kv_head * GROUP + head_in_group
    row_valid = (token < q_len) & (head_in_group < GROUP)
    # Causal alignment: the last query of a sequence sits at its last key.
    q_pos = kv_len - q_len + token

    dims = tl.arange(0, HEAD_P2)
    q_rows = (
        q_ptr + (q_start + token).to(tl.int64)[:, None] * q_stride_t + head[:, None] * q_stride_h
    )
    q = tl.load(
        q_rows + dims[None, :], mask=row_valid[:, None] & (dims < HEAD_DIM)[None, :], other=0.0
    )
    if EXTRA_DIM > 0:
        extra_dims = HEAD_DIM + tl.arange(0, EXTRA_P2)
        q_extra = tl.load(
            q_rows + extra_dims[None, :],
            mask=row_valid[:, None] & (extra_dims < HEAD_DIM + EXTRA_DIM)[None, :],
            other=0.0,
        )

    kv_hi = kv_len
    if CAUSAL:
        kv_hi = tl.minimum(kv_len, kv_len - q_len + tl.minimum(q_len, first_token + BLOCK_Q))
    kv_lo = 0
    if USE_WINDOW:
        kv_lo = tl.maximum(0, kv_len - q_len + first_token - sliding_window + 1)
    kv_lo = (kv_lo // BLOCK_N) * BLOCK_N
    num_tiles = tl.cdiv(kv_hi - kv_lo, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_begin = split * tiles_per_split
    tile_end = tl.minimum(num_tiles, tile_begin + tiles_per_split)

    # Tiles that need no score mask (all keys valid, none after any query of this block, none outside
    # any query's window) form one range [full_lo, full_hi) of tile indices; the masked ones around it
    # (the window's edge, the causal diagonal, the ragged end) go through the masked loop.
    first_q_pos = kv_len - q_len + first_token
    last_q_pos = kv_len - q_len + tl.minimum(q_len, first_token + BLOCK_Q) - 1
    full_lo = 0
    if USE_WINDOW:
        before_window = last_q_pos - sliding_window - kv_lo
        full_lo = tl.where(before_window < 0, 0, before_window // BLOCK_N + 1)
    full_hi = (kv_hi - kv_lo) // BLOCK_N
    if CAUSAL:
        full_hi = tl.minimum(full_hi, (first_q_pos + 1 - kv_lo) // BLOCK_N)
    full_hi = tl.maximum(full_hi, full_lo)

    if k_scale_ptr is not None:
        qk_scale *= tl.load(k_scale_ptr)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_P2], tl.float32)
    if EXTRA_DIM == 0:
        q_extra = q
        extra_dims = dims
    k_head = k_ptr + kv_head * k_stride_h
    v_head = v_ptr + kv_head * v_stride_h
    table_row = block_table_ptr
    if PAGED:
        table_row += seq * block_table_stride
    for part in tl.static_range(3):
        if part == 0:
            lo, hi = tile_begin, tl.minimum(tile_end, full_lo)
        elif part == 1:
            lo, hi = tl.maximum(tile_begin, full_lo), tl.minimum(tile_end, full_hi)
        else:
            lo, hi = tl.maximum(tile_begin, full_hi), tile_end
        acc, m_i, l_i = _attend_tiles(
            acc,
            m_i,
            l_i,
            q,
            q_extra,
            q_pos,
            lo,
            hi,
            kv_lo,
            kv_hi,
            kv_start,
            k_head,
            v_head,
            table_row,
            k_stride_block,
            k_stride_t,
            v_stride_block,
            v_stride_t,
            block_size,
            qk_scale,
            sliding_window,
            dims,
            extra_dims,
            MASKED=part != 1,
            CAUSAL=CAUSAL,
            PAGED=PAGED,
            USE_WINDOW=USE_WINDOW,
            V_IS_K=V_IS_K,
            HEAD_DIM=HEAD_DIM,
            HEAD_P2=HEAD_P2,
            EXTRA_DIM=EXTRA_DIM,
            BLOCK_N=BLOCK_N,
            DOT_PRECISION=DOT_PRECISION,
        )

    if v_scale_ptr is not None:
        acc *= tl.load(v_scale_ptr)
    out_rows = (q_start + token).to(tl.int64)[:, None] * o_stride_t + head[:, None] * o_stride_h
    out_mask = row_valid[:, None] & (dims < HEAD_DIM)[None, :]
    if NUM_SPLITS == 1:
        if USE_SINKS:
            sink = tl.load(sinks_ptr + head, mask=row_valid, other=0.0).to(tl.float32) * LOG2E
            m_final = tl.maximum(m_i, sink)
            rescale = tl.exp2(m_i - m_final)
            acc = acc * rescale[:, None]
            l_i = l_i * rescale + tl.exp2(sink - m_final)
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + out_rows + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=out_mask
        )
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + out_rows + split * o_stride_split + dims[None, :], out, mask=out_mask)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        lse_offs = ((q_start + token).to(tl.int64) * num_q_heads + head) * NUM_SPLITS + split
        tl.store(lse_ptr + lse_offs, lse, mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    partial_ptr,
    lse_ptr,
    sinks_ptr,
    out_ptr,
    num_heads,
    p_stride_t,
    p_stride_h,
    p_stride_split,
    o_stride_t,
    o_stride_h,
    HEAD_DIM: tl.constexpr,
    HEAD_P2: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    USE_SINKS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_P2)
    dims = tl.arange(0, HEAD_P2)
    lse = tl.load(
        lse_ptr + (token * num_heads + head) * NUM_SPLITS + splits,
        mask=splits < NUM_SPLITS,
        other=float("-inf"),
    )
    m = tl.max(lse, axis=0)
    if USE_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * LOG2E
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    weights = tl.exp2(lse - m_safe)
    denom = tl.sum(weights, axis=0)
    if USE_SINKS:
        denom += tl.exp2(sink - m_safe)
    partial = tl.load(
        partial_ptr
        + token * p_stride_t
        + head * p_stride_h
        + splits[:, None] * p_stride_split
        + dims[None, :],
        mask=(weights > 0.0)[:, None] & (dims < HEAD_DIM)[None, :],
        other=0.0,
    )
    out = tl.sum(partial * weights[:, None], axis=0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(
        out_ptr + token * o_stride_t + head * o_stride_h + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def attention_config(decode: bool, head_p2: int, heads: int, elem_size: int) -> dict[str, int]:
    """Built-in tile sizes: BLOCK_M query rows (tokens x heads of a group) by BLOCK_N keys per step.

    Prefill with 2-byte types takes 128-key steps (10-15% faster than 64 for prefill and extend in an
    H200 sweep at head_dim 128); fp32 tiles that large would not fit in shared memory.
    """
    if decode:
        block_n, num_warps = (64, 4) if head_p2 <= 128 else (32, 8)
        return {
            "BLOCK_M": max(16, heads),
            "BLOCK_N": block_n,
            "num_warps": num_warps,
            "num_stages": 2,
        }
    if head_p2 <= 128:
        block_n = 128 if elem_size <= 2 else 64
        return {"BLOCK_M": max(128, heads), "BLOCK_N": block_n, "num_warps": 8, "num_stages": 2}
    return {"BLOCK_M": max(64, heads), "BLOCK_N": 32, "num_warps": 8, "num_stages": 1}


def attention_shape_key(paged: bool, head_dim: int, extra_dim: int, group: int, dtype) -> str:
    """The key of a prefill/extend attention shape in the tuned tables (atom_kernels.tuned)."""
    kind = "extend" if paged else "prefill"
    dtype_name = str(dtype).split(".")[-1]
    return f"{kind},head_dim={head_dim},extra={extra_dim},group={group},dtype={dtype_name}"


def launch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    query_start: torch.Tensor,
    scale: float,
    causal: bool,
    sliding_window: int | None,
    sinks: torch.Tensor | None,
    *,
    kv_start: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    head_dim: int,
    heads_per_program: int | None = None,
    num_splits: int = 1,
    decode: bool = False,
    config: dict[str, int] | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run :func:`_attention_kernel`.

    q [T, H, head_dim + extra]; out [T, H, head_dim]. Paged when ``block_table`` is given: k and v are
    [num_blocks, block_size, KH, *] caches; otherwise [total_kv, KH, *] with ``kv_start`` offsets. The
    values are k's first ``head_dim`` channels when ``v is k`` (MLA). ``config`` (HEADS, BLOCK_M,
    BLOCK_N, num_warps, num_stages) overrides the tuned table and the defaults: the tuner's candidates.
    ``k_scale`` and ``v_scale`` are the scales of FP8 caches (the same tensor for MLA's latent).
    """
    num_tokens, num_heads = q.shape[0], q.shape[1]
    paged = block_table is not None
    num_kv_heads = k.shape[-2]
    if num_heads % num_kv_heads:
        raise ValueError(
            f"attention: {num_heads} query heads not a multiple of {num_kv_heads} KV heads"
        )
    extra_dim = q.shape[-1] - head_dim
    if k.shape[-1] != q.shape[-1] or (v is not k and v.shape[-1] != head_dim):
        raise ValueError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_last_dim_contiguous(name, t)
    num_seqs = query_start.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    # tl.dot needs every dim >= 16.
    head_p2 = max(16, next_pow2(head_dim))
    extra_p2 = max(16, next_pow2(extra_dim)) if extra_dim else 0
    if config is None and not decode and heads_per_program is None:
        key = attention_shape_key(paged, head_dim, extra_dim, group, q.dtype)
        config = tuned_config("attention", key, 0, q.device)
    if config is not None:
        config = dict(config)
        heads = config.pop("HEADS")
    else:
        heads = heads_per_program or min(next_pow2(group), 16)
        config = attention_config(decode, head_p2, heads, q.element_size())
    block_m = config["BLOCK_M"]
    window = sliding_window if sliding_window is not None and sliding_window > 0 else 0
    if paged:
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        v_strides = (v.stride(0), v.stride(1), v.stride(2))
        block_size = k.shape[1]
    else:
        k_strides = (0, k.stride(0), k.stride(1))
        v_strides = (0, v.stride(0), v.stride(1))
        block_size = 1
    if num_splits > 1:
        partial = torch.empty(
            (num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        lse = torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32, device=q.device)
        target, o_strides = partial, (partial.stride(0), partial.stride(1), partial.stride(2))
    else:
        lse = None
        target, o_strides = out, (out.stride(0), out.stride(1), 0)
    block_q = block_m // heads
    grid = (num_tokens // block_q + num_seqs, num_kv_heads * cdiv(group, heads), num_splits)
    _attention_kernel[grid](
        q,
        k,
        v,
        target,
        lse,
        sinks,
        k_scale,
        v_scale,
        query_start,
        kv_start,
        seq_lens,
        block_table,
        q.stride(0),
        q.stride(1),
        *k_strides,
        *v_strides,
        *o_strides,
        block_table.stride(0) if paged else 0,
        num_seqs,
        num_heads,
        block_size,
        scale * LOG2E.value,
        window,
        GROUP=group,
        HEADS=heads,
        HEAD_DIM=head_dim,
        HEAD_P2=head_p2,
        EXTRA_DIM=extra_dim,
        EXTRA_P2=extra_p2,
        CAUSAL=causal,
        PAGED=paged,
        USE_WINDOW=window > 0,
        USE_SINKS=sinks is not None,
        V_IS_K=v is k,
        NUM_SPLITS=num_splits,
        DOT_PRECISION=dot_precision(q.dtype),
        **config,
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_tokens, num_heads)](
            partial,
            lse,
            sinks,
            out,
            num_heads,
            partial.stride(0),
            partial.stride(1),
            partial.stride(2),
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            HEAD_P2=head_p2,
            NUM_SPLITS=num_splits,
            SPLITS_P2=next_pow2(num_splits),
            USE_SINKS=sinks is not None,
            num_warps=4,
        )
    return out


@varlen_attention.register("triton")
def varlen_attention_triton(
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
    check_same_device(
        q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, sinks=sinks
    )
    out = output_buffer(out, tuple(q.shape), q)
    if prefill_attention.supports(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, sliding_window, sinks):
        return prefill_attention.prefill_attention(q, k, v, out, cu_seqlens_q, scale)
    return launch_attention(
        q,
        k,
        v,
        out,
        cu_seqlens_q,
        scale,
        causal,
        sliding_window,
        sinks,
        kv_start=cu_seqlens_k,
        head_dim=q.shape[-1],
    )


def choose_num_splits(
    num_seqs: int,
    programs_per_seq: int,
    device: torch.device,
    max_seq_len: int | None,
    tile: int = 64,
) -> int:
    """Split-K factor for a decode batch: enough programs to fill the GPU about twice over, but at
    least 4 KV tiles per split when the longest sequence is known. At most 64 splits: MLA runs all
    16 heads of a sequence in one program, so 4 long sequences need 64 splits to fill 132 SMs."""
    programs = max(1, num_seqs * programs_per_seq)
    target = 2 * sm_count(device)
    if programs >= target:
        return 1
    splits = min(64, next_pow2(cdiv(target, programs)))
    if max_seq_len is not None:
        splits = min(splits, next_pow2(max(1, cdiv(max_seq_len, 4 * tile))))
    return splits


@paged_attention.register("triton")
def paged_attention_triton(
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
    check_same_device(q=q, key_cache=key_cache, value_cache=value_cache, seq_lens=seq_lens)
    check_cache_scale("k_scale", key_cache, k_scale)
    check_cache_scale("v_scale", value_cache, v_scale)
    out = output_buffer(out, tuple(q.shape), q)
    num_seqs = seq_lens.shape[0]
    # Every sequence has at least one query token, so T == num_seqs means one token each: decode.
    decode = q.shape[0] == num_seqs
    if num_splits is None:
        group = q.shape[1] // key_cache.shape[2]
        programs_per_seq = key_cache.shape[2] * cdiv(group, min(next_pow2(group), 16))
        num_splits = (
            choose_num_splits(num_seqs, programs_per_seq, q.device, max_seq_len) if decode else 1
        )
    return launch_attention(
        q,
        key_cache,
        value_cache,
        out,
        query_start_loc,
        scale,
        True,
        sliding_window,
        sinks,
        seq_lens=seq_lens,
        block_table=block_table,
        head_dim=q.shape[-1],
        num_splits=num_splits,
        decode=decode,
        k_scale=k_scale,
        v_scale=v_scale,
    )
