"""Causal self-attention over fresh variable-length sequences, with K/V tiles read by Hopper's tensor
memory accelerator (TMA): the prefill path of ``varlen_attention`` on NVIDIA sm_90+ GPUs.

Why a second kernel beside ``attention._attention_kernel``: that one serves every layout (paged,
MLA, windows, sinks) through computed pointers, and reached ~250 TFLOP/s on an H200 for Qwen3-8B
prefill (8 x 1024 tokens). This one reads tiles through host-made tensor descriptors, runs one query
head per program with the heads of a GQA group on neighbouring programs (they share K/V tiles in L2),
and starts the longest query blocks first. In ``benchmarks/kernels`` on an H200 it reaches 342
TFLOP/s at 8 x 1024 tokens and 407 at 4 x 2048, against 392 and 485 for FlashAttention 3 in the same
run (1.15x and 1.19x its time; the general kernel was 1.6x).

It covers the common case only: causal, queries and keys the same tokens (``cu_seqlens_k is
cu_seqlens_q``), no window, no sinks, 16-bit types, head_dim 64 or 128. Everything else stays on the
general kernel.

Tiles near a sequence's end read the next sequence's rows (masked out of the scores) or, past the
last token, zeros (the descriptor's bounds); the output store is masked by hand.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from atom_kernels.triton_utils import interpreting, locate_block

# Built-in tiles, the best of a one-off H200 sweep at head_dim 128 (bf16, script not kept): 64 x 64
# with 4 warps and 3 stages beat 128 x 128 with 8 warps by 16 % (8 x 1024 tokens) and 15 % (ragged).
BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES = 64, 64, 4, 3
LOG2E = 1.4426950408889634


def supports(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, sliding_window, sinks) -> bool:
    """Whether :func:`prefill_attention` serves this call (the cases the module docstring lists)."""
    if not causal or cu_seqlens_k is not cu_seqlens_q or sinks is not None:
        return False
    if sliding_window is not None and sliding_window > 0:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or not (k.dtype == v.dtype == q.dtype):
        return False
    if q.shape[-1] not in (64, 128) or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return False
    if not interpreting():
        if q.device.type != "cuda" or torch.version.hip is not None:
            return False
        if torch.cuda.get_device_capability(q.device)[0] < 9:
            return False
    # TMA wants 16-byte aligned bases and row strides, and each row's heads contiguous.
    for t in (q, k, v):
        if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
            return False
        if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


@triton.jit
def _attend(acc, m_i, l_i, q, k_desc, v_desc, seq_start, kv_col, tile_lo, tile_hi, q_pos, seq_len,
            qk_scale, MASKED: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Online softmax over key tiles [tile_lo, tile_hi) of one sequence; MASKED applies causality and
    the sequence's end (the diagonal tiles). Scores stay unscaled until the exponent."""
    for tile in tl.range(tile_lo, tile_hi, num_stages=NUM_STAGES):
        k = k_desc.load([seq_start + tile * BLOCK_N, kv_col])
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            key = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            visible = (key[None, :] <= q_pos[:, None]) & (key < seq_len)[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = v_desc.load([seq_start + tile * BLOCK_N, kv_col])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(
    do_not_specialize=["num_seqs", "num_q_blocks"],
    do_not_specialize_on_alignment=["cu_ptr"],
)
def _prefill_attention_kernel(
    q_desc,
    k_desc,
    v_desc,
    out_ptr,
    cu_ptr,
    o_stride_t,
    o_stride_h,
    num_seqs,
    num_q_blocks,
    qk_scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    head = tl.program_id(0)
    # Later query blocks see more keys: start them first so short blocks fill the tail of the grid.
    q_block = num_q_blocks - 1 - tl.program_id(1)
    _, seq_start, seq_len, first = locate_block(cu_ptr, q_block, num_seqs, BLOCK_M)
    if first >= seq_len:
        return
    kv_col = (head // GROUP) * HEAD_DIM
    q = q_desc.load([seq_start + first, head * HEAD_DIM])
    q_pos = first + tl.arange(0, BLOCK_M)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Tiles wholly at or before the block's first query need no mask; the rest hold the diagonal.
    unmasked = (first + 1) // BLOCK_N
    last = tl.cdiv(tl.minimum(seq_len, first + BLOCK_M), BLOCK_N)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_desc, v_desc, seq_start, kv_col, 0, unmasked,
                            q_pos, seq_len, qk_scale, False, BLOCK_N, NUM_STAGES)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_desc, v_desc, seq_start, kv_col, unmasked, last,
                            q_pos, seq_len, qk_scale, True, BLOCK_N, NUM_STAGES)

    out = acc / l_i[:, None]
    dims = tl.arange(0, HEAD_DIM)
    rows = (seq_start + q_pos).to(tl.int64)
    tl.store(
        out_ptr + rows[:, None] * o_stride_t + head * o_stride_h + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=(q_pos < seq_len)[:, None],
    )


def _rows_descriptor(t: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """``t`` [tokens, heads, head_dim] as a 2-D [tokens, heads * head_dim] descriptor of
    [block_rows, head_dim] tiles."""
    tokens, heads, head_dim = t.shape
    return TensorDescriptor(t, [tokens, heads * head_dim], [t.stride(0), 1], [block_rows, head_dim])


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, cu_seqlens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence over itself; call only where :func:`supports` holds.
    q [T, H, D], k and v [T, KH, D], out [T, H, D] (last dim contiguous)."""
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = cu_seqlens.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return out
    # An upper bound of the query blocks: sequence s's blocks are numbered from cu[s] // BLOCK_M + s.
    num_q_blocks = num_tokens // BLOCK_M + num_seqs
    _prefill_attention_kernel[(num_heads, num_q_blocks)](
        _rows_descriptor(q, BLOCK_M),
        _rows_descriptor(k, BLOCK_N),
        _rows_descriptor(v, BLOCK_N),
        out,
        cu_seqlens,
        out.stride(0),
        out.stride(1),
        num_seqs,
        num_q_blocks,
        scale * LOG2E,
        GROUP=num_heads // k.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS,
    )
    return out
