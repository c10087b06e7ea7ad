"""Multi-head latent attention (DeepSeek MLA) over the latent paged cache.

The cache is [num_blocks, block_size, kv_lora_rank + rope_dim] (written by
:func:`atom_kernels.concat_and_cache_mla` or :func:`fused_qk_rope_concat_and_cache_mla`): one KV
"head" shared by all query heads, whose first ``kv_lora_rank`` channels are also the values.

- ``mla_decode``: q is [T, H, kv_lora_rank + rope_dim] (the nope part already absorbed through
  W_UK); the output is [T, H, kv_lora_rank] (W_UV is applied afterwards). Queries are the last
  tokens of their sequences, as in :func:`atom_kernels.paged_attention`, so speculative multi-token
  decode works too.
- ``fused_qk_rope_concat_and_cache_mla``: the step before attention, in one pass: rotate the rope
  part of q and of the shared key, write ``[kv_c | rope(k_pe)]`` into each token's cache slot and
  return ``q_out = [q_nope | rope(q_pe)]``. ``q_nope`` is whatever precedes the rope part: the raw
  nope query (prefill, expanded K/V) or the absorbed one of width kv_lora_rank (decode).
  ``cos_sin_cache`` is [max_position, rope_dim] of [cos | sin] halves, as for
  :func:`atom_kernels.rotary_embedding`. A token with a negative slot (padding) writes no cache
  entry and its q_out row is unspecified (AITER skips it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.attention import (
    attend_one_sequence,
    choose_num_splits,
    gather_sequence_kv,
    launch_attention,
    output_buffer,
)
from atom_kernels.cache import cache_fp8_max, check_cache_scale, concat_and_cache_mla_torch, is_fp8_cache
from atom_kernels.registry import define_op
from atom_kernels.rope import rotate_torch
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous, check_same_device, next_pow2


@define_op
def mla_decode(
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
    """MLA over the latent cache: q [T, H, kv_lora_rank + rope_dim] -> out [T, H, kv_lora_rank].
    An FP8 cache holds the entries divided by ``kv_scale`` (see :mod:`atom_kernels.cache`)."""


@define_op
def fused_qk_rope_concat_and_cache_mla(
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
    """``q_out`` [T, H, nope + rope] = ``[q_nope | rope(q_pe)]``; writes ``[kv_c | rope(k_pe)]`` to
    each token's cache slot (an FP8 cache: divided by ``kv_scale``, from the fp32 rotation)."""


@mla_decode.register("torch")
def mla_decode_torch(
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
    check_cache_scale("kv_scale", kv_cache, kv_scale)
    out = output_buffer(out, (q.shape[0], q.shape[1], kv_lora_rank), q)
    starts, lengths = query_start_loc.tolist(), seq_lens.tolist()
    for i in range(len(starts) - 1):
        latent = gather_sequence_kv(kv_cache, kv_cache, block_table[i], lengths[i], kv_scale, kv_scale)[0]
        latent = latent.unsqueeze(1)
        qs, qe = starts[i], starts[i + 1]
        out[qs:qe] = attend_one_sequence(
            q[qs:qe], latent, latent[..., :kv_lora_rank], scale, True, None, None
        )
    return out


@mla_decode.register("triton")
def mla_decode_triton(
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
    check_same_device(q=q, kv_cache=kv_cache, seq_lens=seq_lens, block_table=block_table)
    check_cache_scale("kv_scale", kv_cache, kv_scale)
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != q.shape[-1]:
        raise ValueError(f"mla_decode: kv_cache {tuple(kv_cache.shape)} vs q {tuple(q.shape)}")
    out = output_buffer(out, (q.shape[0], q.shape[1], kv_lora_rank), q)
    num_seqs, num_heads = seq_lens.shape[0], q.shape[1]
    heads_per_program = min(16, next_pow2(num_heads))
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs, cdiv(num_heads, heads_per_program), q.device, max_seq_len, tile=32
        )
    latent = kv_cache.unsqueeze(2)
    return launch_attention(
        q,
        latent,
        latent,
        out,
        query_start_loc,
        scale,
        True,
        None,
        None,
        seq_lens=seq_lens,
        block_table=block_table,
        head_dim=kv_lora_rank,
        heads_per_program=heads_per_program,
        num_splits=num_splits,
        decode=True,
        k_scale=kv_scale,
        v_scale=kv_scale,
    )


def _check_rope_cache_args(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> torch.Tensor:
    """Validate the shapes; returns k_pe as [T, rope_dim]."""
    num_tokens = q_nope.shape[0]
    k_pe = k_pe.reshape(k_pe.shape[0], -1)
    rope_dim = q_pe.shape[-1]
    if (
        q_pe.shape[:2] != q_nope.shape[:2]
        or k_pe.shape != (num_tokens, rope_dim)
        or kv_c.shape[0] != num_tokens
        or slot_mapping.shape[0] != num_tokens
        or positions.shape[0] != num_tokens
        or cos_sin_cache.shape[-1] != rope_dim
        or kv_cache.dim() != 3
        or kv_cache.shape[-1] != kv_c.shape[-1] + rope_dim
    ):
        raise ValueError(
            f"fused_qk_rope_concat_and_cache_mla: q_nope {tuple(q_nope.shape)}, q_pe {tuple(q_pe.shape)}, "
            f"kv_c {tuple(kv_c.shape)}, k_pe {tuple(k_pe.shape)}, kv_cache {tuple(kv_cache.shape)}, "
            f"{slot_mapping.shape[0]} slots, {positions.shape[0]} positions, "
            f"cos_sin_cache {tuple(cos_sin_cache.shape)}"
        )
    return k_pe


@fused_qk_rope_concat_and_cache_mla.register("torch")
def fused_qk_rope_concat_and_cache_mla_torch(
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
    k_pe = _check_rope_cache_args(q_nope, q_pe, kv_c, k_pe, kv_cache, slot_mapping, positions, cos_sin_cache)
    nope_dim = q_nope.shape[-1]
    out = output_buffer(out, (*q_nope.shape[:2], nope_dim + q_pe.shape[-1]), q_nope)
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    out[..., :nope_dim] = q_nope
    out[..., nope_dim:] = rotate_torch(q_pe.float(), cos.unsqueeze(1), sin.unsqueeze(1), is_neox)
    k_rot = rotate_torch(k_pe.float(), cos, sin, is_neox)
    if not is_fp8_cache(kv_cache):
        k_rot = k_rot.to(k_pe.dtype)
    concat_and_cache_mla_torch(kv_c, k_rot, kv_cache, slot_mapping, scale=kv_scale)
    return out


@triton.jit
def _rotate_rows(
    src_ptr,
    dst_ptr,
    rows,
    row_mask,
    src_row_stride,
    dst_row_stride,
    cos,
    sin,
    scale_ptr,
    IS_NEOX: tl.constexpr,
    HALF: tl.constexpr,
    HALF_P2: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """Rotate ``rows`` (a [R, 1] index column) of 2 * HALF channels each, from src to dst; FP8_MAX > 0
    quantizes as :func:`atom_kernels.cache._copy_rows_to_slot` does."""
    pairs = tl.arange(0, HALF_P2)[None, :]
    mask = row_mask & (pairs < HALF)
    if IS_NEOX:
        first, second = pairs, pairs + HALF
    else:
        first, second = 2 * pairs, 2 * pairs + 1
    src = src_ptr + rows * src_row_stride
    dst = dst_ptr + rows * dst_row_stride
    x1 = tl.load(src + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + second, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if FP8_MAX > 0:
        if scale_ptr is not None:
            scale = tl.load(scale_ptr)
            y1 = y1 / scale
            y2 = y2 / scale
        y1 = tl.clamp(y1, -FP8_MAX, FP8_MAX)
        y2 = tl.clamp(y2, -FP8_MAX, FP8_MAX)
    tl.store(dst + first, y1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + second, y2.to(dst_ptr.dtype.element_ty), mask=mask)


# A prefill's positions and slots start after the batch's decode tokens, 16-byte aligned or not with
# their count: one variant for both, or the first batch of the other parity compiles a second.
@triton.jit(do_not_specialize_on_alignment=["slot_mapping_ptr", "positions_ptr"])
def _fused_qk_rope_concat_and_cache_mla_kernel(
    q_nope_ptr,
    q_pe_ptr,
    kv_c_ptr,
    k_pe_ptr,
    kv_cache_ptr,
    slot_mapping_ptr,
    positions_ptr,
    cos_sin_ptr,
    out_ptr,
    kv_scale_ptr,
    q_nope_token_stride,
    q_nope_head_stride,
    q_pe_token_stride,
    q_pe_head_stride,
    kv_c_stride,
    k_pe_stride,
    cache_block_stride,
    cache_slot_stride,
    out_token_stride,
    out_head_stride,
    cos_sin_stride,
    num_heads,
    block_size,
    NOPE_DIM: tl.constexpr,
    RANK: tl.constexpr,
    CHUNK: tl.constexpr,
    HALF: tl.constexpr,
    HALF_P2: tl.constexpr,
    HEADS: tl.constexpr,
    IS_NEOX: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """One token x HEADS query heads; the first head block of a token also writes its cache slot."""
    token = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    pairs = tl.arange(0, HALF_P2)[None, :]
    cos = tl.load(cos_sin_ptr + pos * cos_sin_stride + pairs, mask=pairs < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * cos_sin_stride + HALF + pairs, mask=pairs < HALF, other=0.0).to(
        tl.float32
    )
    heads = head_block * HEADS + tl.arange(0, HEADS)[:, None]
    head_mask = heads < num_heads
    out_row = out_ptr + token * out_token_stride
    _rotate_rows(
        q_pe_ptr + token * q_pe_token_stride,
        out_row + NOPE_DIM,
        heads,
        head_mask,
        q_pe_head_stride,
        out_head_stride,
        cos,
        sin,
        None,
        IS_NEOX,
        HALF,
        HALF_P2,
        0.0,
    )
    for start in tl.static_range(0, NOPE_DIM, CHUNK):
        dims = start + tl.arange(0, CHUNK)[None, :]
        mask = head_mask & (dims < NOPE_DIM)
        x = tl.load(q_nope_ptr + token * q_nope_token_stride + heads * q_nope_head_stride + dims, mask=mask)
        tl.store(out_row + heads * out_head_stride + dims, x.to(out_ptr.dtype.element_ty), mask=mask)
    if head_block == 0:
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
        if slot >= 0:
            dst = kv_cache_ptr + (slot // block_size) * cache_block_stride + (slot % block_size) * cache_slot_stride
            # Names distinct from the 2-D q loop's: Triton rejects a variable whose shape changes
            # inside an `if` (seen on an H200: "dims redefined").
            for start in tl.static_range(0, RANK, CHUNK):
                rank_dims = start + tl.arange(0, CHUNK)
                rank_mask = rank_dims < RANK
                latent = tl.load(kv_c_ptr + token * kv_c_stride + rank_dims, mask=rank_mask)
                if FP8_MAX > 0:
                    latent = latent.to(tl.float32)
                    if kv_scale_ptr is not None:
                        latent = latent / tl.load(kv_scale_ptr)
                    latent = tl.clamp(latent, -FP8_MAX, FP8_MAX)
                tl.store(dst + rank_dims, latent.to(kv_cache_ptr.dtype.element_ty), mask=rank_mask)
            one_row = tl.arange(0, 1)[:, None]
            _rotate_rows(
                k_pe_ptr + token * k_pe_stride,
                dst + RANK,
                one_row,
                one_row < 1,
                0,
                0,
                cos,
                sin,
                kv_scale_ptr,
                IS_NEOX,
                HALF,
                HALF_P2,
                FP8_MAX,
            )


@fused_qk_rope_concat_and_cache_mla.register("triton")
def fused_qk_rope_concat_and_cache_mla_triton(
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
    k_pe = _check_rope_cache_args(q_nope, q_pe, kv_c, k_pe, kv_cache, slot_mapping, positions, cos_sin_cache)
    check_cache_scale("kv_scale", kv_cache, kv_scale)
    check_same_device(q_nope=q_nope, q_pe=q_pe, kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping,
                      positions=positions, cos_sin_cache=cos_sin_cache)
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("kv_c", kv_c), ("k_pe", k_pe), ("kv_cache", kv_cache)):
        check_last_dim_contiguous(name, t)
    if cos_sin_cache.stride(-1) != 1:
        cos_sin_cache = cos_sin_cache.contiguous()
    num_tokens, num_heads, nope_dim = q_nope.shape
    rope_dim, rank = q_pe.shape[-1], kv_c.shape[-1]
    out = output_buffer(out, (num_tokens, num_heads, nope_dim + rope_dim), q_nope)
    if num_tokens == 0:
        return out
    heads = min(16, next_pow2(num_heads))
    _fused_qk_rope_concat_and_cache_mla_kernel[(num_tokens, cdiv(num_heads, heads))](
        q_nope,
        q_pe,
        kv_c,
        k_pe,
        kv_cache,
        slot_mapping,
        positions,
        cos_sin_cache,
        out,
        kv_scale,
        q_nope.stride(0),
        q_nope.stride(1),
        q_pe.stride(0),
        q_pe.stride(1),
        kv_c.stride(0),
        k_pe.stride(0),
        kv_cache.stride(0),
        kv_cache.stride(1),
        out.stride(0),
        out.stride(1),
        cos_sin_cache.stride(0),
        num_heads,
        kv_cache.shape[1],
        NOPE_DIM=nope_dim,
        RANK=rank,
        CHUNK=min(128, next_pow2(max(nope_dim, rank))),
        HALF=rope_dim // 2,
        HALF_P2=next_pow2(rope_dim // 2),
        HEADS=heads,
        IS_NEOX=is_neox,
        FP8_MAX=cache_fp8_max(kv_cache),
        num_warps=4,
    )
    return out


@define_op
def concat_mla_k(k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """The expanded form's per-head keys ``[k_nope | k_pe]`` [S, H, P + R] from ``k_nope`` [S, H, P]
    (a strided view of kv_b_proj's output is fine) and each token's one rope key ``k_pe`` [S, R],
    shared by all heads."""


@concat_mla_k.register("torch")
def concat_mla_k_torch(k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    return torch.cat([k_nope, k_pe[:, None].expand(-1, k_nope.shape[1], -1)], dim=-1)


@triton.jit
def _concat_mla_k_kernel(
    k_nope, k_pe, out,
    stride_nope_s, stride_nope_h, stride_pe_s, stride_out_s, stride_out_h,
    num_heads,
    NOPE_DIM: tl.constexpr, NOPE_P2: tl.constexpr, ROPE_DIM: tl.constexpr, ROPE_P2: tl.constexpr,
    HEADS: tl.constexpr,
):
    """One token, HEADS heads: copy the nope keys and broadcast the token's rope key."""
    s = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    head_ok = heads < num_heads
    p = tl.arange(0, NOPE_P2)
    nope_mask = head_ok[:, None] & (p[None, :] < NOPE_DIM)
    nope = tl.load(k_nope + s * stride_nope_s + heads[:, None] * stride_nope_h + p[None, :], mask=nope_mask)
    row = out + s * stride_out_s + heads[:, None] * stride_out_h
    tl.store(row + p[None, :], nope, mask=nope_mask)
    r = tl.arange(0, ROPE_P2)
    pe = tl.load(k_pe + s * stride_pe_s + r, mask=r < ROPE_DIM)
    rope_mask = head_ok[:, None] & (r[None, :] < ROPE_DIM)
    tl.store(row + NOPE_DIM + r[None, :], tl.broadcast_to(pe[None, :], (HEADS, ROPE_P2)), mask=rope_mask)


@concat_mla_k.register("triton")
def concat_mla_k_triton(k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    check_same_device(k_nope=k_nope, k_pe=k_pe)
    check_last_dim_contiguous("k_nope", k_nope)
    check_last_dim_contiguous("k_pe", k_pe)
    num_tokens, num_heads, nope_dim = k_nope.shape
    if k_pe.dim() != 2 or k_pe.shape[0] != num_tokens or k_pe.dtype != k_nope.dtype:
        raise ValueError(f"concat_mla_k: k_pe must be [{num_tokens}, R] of {k_nope.dtype}, "
                         f"got {tuple(k_pe.shape)} of {k_pe.dtype}")
    rope_dim = k_pe.shape[1]
    out = k_nope.new_empty(num_tokens, num_heads, nope_dim + rope_dim)
    if num_tokens == 0:
        return out
    heads = min(16, next_pow2(num_heads))
    _concat_mla_k_kernel[(num_tokens, cdiv(num_heads, heads))](
        k_nope, k_pe, out,
        k_nope.stride(0), k_nope.stride(1), k_pe.stride(0), out.stride(0), out.stride(1),
        num_heads,
        NOPE_DIM=nope_dim, NOPE_P2=next_pow2(nope_dim), ROPE_DIM=rope_dim, ROPE_P2=next_pow2(rope_dim),
        HEADS=heads, num_warps=4,
    )
    return out
