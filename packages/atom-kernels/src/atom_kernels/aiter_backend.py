"""Adapters from ATOM's op signatures onto AMD AITER (the ``aiter`` backend).

UNTESTED ON HARDWARE: no AMD GPU was reachable when these were written. Signatures follow ROCm/aiter's
main branch as read in its sources (see the package README); AITER's Python API drifts between
releases, so pin AITER and run ``tests/`` on a ROCm machine before trusting a release.

``aiter`` is imported inside each adapter, never at module import: importing it builds or loads its
compiled core, and it does not exist on NVIDIA or CPU. The registry selects this backend only on ROCm
with ``aiter`` installed (:func:`atom_kernels.registry.backend_available`). Options that AITER has no
kernel for fall through to our Triton kernels, which also run on ROCm.
"""

from __future__ import annotations

import torch

from atom_kernels.activation import (
    clamped_swiglu,
    clamped_swiglu_triton,
    gelu_and_mul,
    silu_and_mul,
)
from atom_kernels.attention import paged_attention, varlen_attention
from atom_kernels.cache import concat_and_cache_mla, reshape_and_cache
from atom_kernels.gemm import fp8_block_scaled_mm, fp8_scaled_mm
from atom_kernels.mla import fused_qk_rope_concat_and_cache_mla, mla_decode
from atom_kernels.moe import fused_moe, fused_moe_triton, grouped_topk, topk_softmax
from atom_kernels.moe_align import moe_align_block_size, moe_align_block_size_triton
from atom_kernels.norm import fused_add_rms_norm, rms_norm
from atom_kernels.quant import (
    FP8_DTYPE,
    per_group_quant_fp8,
    per_tensor_quant_fp8,
    per_token_quant_fp8,
)
from atom_kernels.rope import qk_norm_rope, qk_norm_rope_triton, rotary_embedding


@rms_norm.register("aiter")
def rms_norm_aiter(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    import aiter

    return aiter.rmsnorm2d_fwd(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)


@fused_add_rms_norm.register("aiter")
def fused_add_rms_norm_aiter(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    import aiter

    rows, res_rows = x.reshape(-1, x.shape[-1]), residual.reshape(-1, x.shape[-1])
    out, residual_out = torch.empty_like(rows), torch.empty_like(rows)
    aiter.rmsnorm2d_fwd_with_add(out, rows, res_rows, residual_out, weight, eps)
    return out.view(x.shape), residual_out.view(x.shape)


def _gated(fn_name: str, x: torch.Tensor) -> torch.Tensor:
    import aiter

    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    getattr(aiter, fn_name)(out, x)
    return out


@silu_and_mul.register("aiter")
def silu_and_mul_aiter(x: torch.Tensor) -> torch.Tensor:
    return _gated("silu_and_mul", x)


@gelu_and_mul.register("aiter")
def gelu_and_mul_aiter(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return _gated("gelu_tanh_and_mul" if approximate == "tanh" else "gelu_and_mul", x)


# AITER's activation kernels have no alpha/limit clamped SwiGLU: GPT-OSS's runs on our Triton kernel.
clamped_swiglu.register("aiter")(clamped_swiglu_triton)


@rotary_embedding.register("aiter")
def rotary_embedding_aiter(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    import aiter

    # AITER rotates in place on [1, T, H, D] views with separate cos/sin [max_pos, 1, 1, rot / 2].
    num_tokens = positions.numel()
    q_out = q.reshape(1, num_tokens, -1, head_size).clone()
    k_out = k.reshape(1, num_tokens, -1, head_size).clone()
    cos, sin = cos_sin_cache.chunk(2, dim=-1)
    half = cos.shape[-1]
    aiter.rope_cached_positions_2c_fwd_inplace(
        q_out,
        k_out,
        cos.reshape(-1, 1, 1, half).to(q.dtype),
        sin.reshape(-1, 1, 1, half).to(q.dtype),
        positions.reshape(1, -1),
        0 if is_neox else 1,
        True,
        False,
    )
    return q_out.view(q.shape), k_out.view(k.shape)


# AITER has no fused per-head RMSNorm + rotary of this signature: QK-norm models run our Triton kernel.
qk_norm_rope.register("aiter")(qk_norm_rope_triton)


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
) -> torch.Tensor:
    import aiter

    # AITER skips the q rows of padding tokens (slot < 0): they stay unwritten, which our contract
    # allows (nothing reads them).
    if out is None:
        out = torch.empty((*q_nope.shape[:2], q_nope.shape[-1] + q_pe.shape[-1]), dtype=q_nope.dtype,
                          device=q_nope.device)  # fmt: skip
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
        one,
        one,
        positions,
        cos.to(q_nope.dtype).contiguous(),
        sin.to(q_nope.dtype).contiguous(),
        is_neox,
        True,  # is_nope_first: q_out = [q_nope | q_pe], cache entry = [kv_c | k_pe]
    )
    return out


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
) -> torch.Tensor:
    # AITER's Triton unified attention reads our [num_blocks, block_size, KH, D] (flash) layout as is.
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
        None,
        None,
        sinks=sinks,
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
    )
    return out


def _routing_buffers(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (router_logits.shape[0], top_k)
    return (
        torch.empty(shape, dtype=torch.float32, device=router_logits.device),
        torch.empty(shape, dtype=torch.int32, device=router_logits.device),
    )


@topk_softmax.register("aiter")
def topk_softmax_aiter(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    import aiter

    weights, ids = _routing_buffers(router_logits, top_k)
    token_expert_indices = torch.empty_like(ids)
    aiter.topk_softmax(weights, ids, token_expert_indices, router_logits, renormalize)
    return weights, ids


@grouped_topk.register("aiter")
def grouped_topk_aiter(
    router_logits: torch.Tensor,
    top_k: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    scoring_func: str = "sigmoid",
    e_score_correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    import aiter

    weights, ids = _routing_buffers(router_logits, top_k)
    if e_score_correction_bias is not None:
        if scoring_func != "sigmoid":
            raise ValueError("grouped_topk (aiter): a correction bias needs sigmoid scoring")
        aiter.biased_grouped_topk(
            router_logits,
            e_score_correction_bias.to(router_logits.dtype),
            weights,
            ids,
            num_expert_group,
            topk_group,
            renormalize,
            routed_scaling_factor,
        )
    else:
        aiter.grouped_topk(
            router_logits,
            weights,
            ids,
            num_expert_group,
            topk_group,
            renormalize,
            scoring_func,
            routed_scaling_factor,
        )
    return weights, ids


# AITER's fused_moe sorts inside itself; its standalone sort has another output layout, so the
# aiter backend of this op (used only by the Triton fused MoE) is our Triton kernel.
moe_align_block_size.register("aiter")(moe_align_block_size_triton)


@fused_moe.register("aiter")
def fused_moe_aiter(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    interleaved: bool = False,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
) -> torch.Tensor:
    kinds = {"silu": "Silu", "gelu": "Gelu"}
    if activation not in kinds or interleaved or w13_bias is not None or w2_bias is not None:
        return fused_moe_triton(
            x,
            w13,
            w2,
            topk_weights,
            topk_ids,
            activation=activation,
            interleaved=interleaved,
            w13_bias=w13_bias,
            w2_bias=w2_bias,
            swiglu_alpha=swiglu_alpha,
            swiglu_limit=swiglu_limit,
        )
    from aiter import ActivationType
    from aiter.fused_moe import fused_moe as aiter_fused_moe

    return aiter_fused_moe(
        x, w13, w2, topk_weights, topk_ids, activation=getattr(ActivationType, kinds[activation])
    )


def _hip_quant(kind: str):
    from aiter import QuantType, get_hip_quant

    return get_hip_quant(getattr(QuantType, kind))


@per_tensor_quant_fp8.register("aiter")
def per_tensor_quant_fp8_aiter(
    x: torch.Tensor, scale: torch.Tensor | None = None, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = _hip_quant("per_Tensor")(x, scale=scale, quant_dtype=dtype)
    return q, scale.float().reshape(1)


@per_token_quant_fp8.register("aiter")
def per_token_quant_fp8_aiter(
    x: torch.Tensor, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = _hip_quant("per_Token")(x, quant_dtype=dtype)
    return q, scale.float().reshape(-1, 1)


@per_group_quant_fp8.register("aiter")
def per_group_quant_fp8_aiter(
    x: torch.Tensor, group_size: int = 128, *, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    if group_size != 128:
        raise ValueError(f"per_group_quant_fp8 (aiter): only group_size 128, got {group_size}")
    q, scale = _hip_quant("per_1x128")(x, quant_dtype=dtype, transpose_scale=False)
    return q, scale.float().reshape(-1, x.shape[-1] // group_size)


@fp8_scaled_mm.register("aiter")
def fp8_scaled_mm_aiter(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    import aiter

    # gemm_a8w8 takes per-token x per-channel scales; a per-tensor scale is broadcast to that.
    x_scale = a_scale.float().reshape(-1, 1).expand(a.shape[0], 1).contiguous()
    w_scale = b_scale.float().reshape(1, -1).expand(1, b.shape[0]).contiguous()
    return aiter.gemm_a8w8(a, b, x_scale, w_scale, bias, out_dtype)


@fp8_block_scaled_mm.register("aiter")
def fp8_block_scaled_mm_aiter(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    block_size: int = 128,
) -> torch.Tensor:
    import aiter

    if block_size != 128:
        raise ValueError(f"fp8_block_scaled_mm (aiter): only 128 blocks, got {block_size}")
    return aiter.gemm_a8w8_blockscale(a, b, a_scale, b_scale, out_dtype)
