"""Rotary position embedding of q and k from a precomputed cos/sin cache.

``cos_sin_cache`` is [max_position, rotary_dim] holding [cos | sin] halves (each rotary_dim / 2).
q and k are [num_tokens, num_heads * head_size] or [num_tokens, num_heads, head_size]; only the first
``rotary_dim`` channels of each head rotate (partial rotary). ``is_neox`` selects the rotate-half
(neox) pairing; otherwise interleaved (gptj) pairs. ``qk_norm_rope`` first RMS-normalises each head
(QK-norm, as Qwen3) in the same pass.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from atom_kernels.norm import rms_norm_torch
from atom_kernels.registry import define_op
from atom_kernels.triton_utils import check_last_dim_contiguous, next_pow2


@define_op
def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """New ``(q, k)`` rotated at ``positions``; ``cos_sin_cache`` is [max_position, rot] of
    [cos | sin] halves (``rot < head_size``: partial rotary); neox or gptj pairing."""


@define_op
def qk_norm_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over each head of q and of k (Qwen3's QK-norm), then :func:`rotary_embedding`."""


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))


def compute_cos_sin_cache(
    inv_freq: torch.Tensor, max_position: int, mscale: float = 1.0
) -> torch.Tensor:
    """[max_position, rotary_dim] fp32 cache of [cos | sin] for the given inverse frequencies."""
    t = torch.arange(max_position, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq.to(torch.float64))
    return torch.cat([freqs.cos() * mscale, freqs.sin() * mscale], dim=-1).float()


def llama3_inv_freq(
    inv_freq: torch.Tensor,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position: int,
) -> torch.Tensor:
    low_freq_wavelen = original_max_position / low_freq_factor
    high_freq_wavelen = original_max_position / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (original_max_position / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(
        wavelen < high_freq_wavelen,
        inv_freq,
        torch.where(wavelen > low_freq_wavelen, inv_freq / factor, smoothed),
    )


def yarn_inv_freq(
    rotary_dim: int,
    base: float,
    factor: float,
    original_max_position: int,
    beta_fast: float = 32,
    beta_slow: float = 1,
    extrapolation_factor: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN inverse frequencies: interpolated (/ factor) below a ramp of dims, extrapolated above it.

    As vLLM's ``YaRNScalingRotaryEmbedding`` and HF's ``_compute_yarn_parameters``; the cache should
    cover ``original_max_position * factor`` positions and be scaled by :func:`yarn_mscale` (or
    :func:`deepseek_yarn_mscale`).
    """
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)

    def correction_dim(num_rotations: float) -> float:
        return (rotary_dim * math.log(original_max_position / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = (1 - ramp) * extrapolation_factor
    return interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight


def yarn_get_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_mscale(factor: float, attn_factor: float = 1.0) -> float:
    """The cos/sin magnitude scale of plain YaRN."""
    return yarn_get_mscale(factor) * attn_factor


def deepseek_yarn_mscale(
    factor: float, mscale: float, mscale_all_dim: float, attn_factor: float = 1.0
) -> float:
    """The cos/sin magnitude scale of DeepSeek's YaRN (``rope_scaling`` mscale, mscale_all_dim).

    DeepSeek models additionally multiply the softmax scale by ``yarn_get_mscale(factor,
    mscale_all_dim) ** 2``; that belongs to the attention layer, not to the cache.
    """
    return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim) * attn_factor


def rotate_torch(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool
) -> torch.Tensor:
    """The reference rotation of ``x`` [..., rot] by ``cos``/``sin`` [..., rot / 2] (neox: halves
    paired; gptj: neighbours), shared with MLA's reference."""
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


@rotary_embedding.register("torch")
def rotary_embedding_torch(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def apply(x: torch.Tensor) -> torch.Tensor:
        heads = x.reshape(x.shape[0], -1, head_size)
        rot = rotate_torch(heads[..., :rotary_dim].float(), cos, sin, is_neox).to(x.dtype)
        return torch.cat([rot, heads[..., rotary_dim:]], dim=-1).reshape(x.shape)

    return apply(q), apply(k)


@qk_norm_rope.register("torch")
def qk_norm_rope_torch(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm_torch(x.reshape(x.shape[0], -1, head_size), weight, eps).reshape(x.shape)

    return rotary_embedding_torch(
        positions, norm(q, q_weight), norm(k, k_weight), cos_sin_cache, head_size, is_neox
    )


@triton.jit
def _rms_scaled(x, rstd, w_ptrs, w_mask, OUT_DTYPE: tl.constexpr):
    """``x * rstd * w`` rounded to the output dtype, as rms_norm hands it to rotary_embedding."""
    w = tl.load(w_ptrs, mask=w_mask, other=0.0).to(tl.float32)
    return (x * rstd * w).to(OUT_DTYPE).to(tl.float32)


@triton.jit
def _rope_heads(
    src_ptr,
    dst_ptr,
    w_ptr,
    num_heads,
    head_size,
    eps,
    cos,
    sin,
    IS_NEOX: tl.constexpr,
    NORM: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_P2: tl.constexpr,
    HALF_P2: tl.constexpr,
    PASS_P2: tl.constexpr,
):
    """Rotate the first 2 * HALF channels of each of ``num_heads`` heads of one token; copy the rest.

    With NORM, each head is first RMS-normalised over all its channels and scaled by ``w_ptr``.
    """
    heads = tl.arange(0, HEADS_P2)[:, None]
    pairs = tl.arange(0, HALF_P2)[None, :]
    mask = (heads < num_heads) & (pairs < HALF)
    if IS_NEOX:
        first, second = pairs, pairs + HALF
    else:
        first, second = 2 * pairs, 2 * pairs + 1
    src = src_ptr + heads * head_size
    dst = dst_ptr + heads * head_size
    out_dtype = dst_ptr.dtype.element_ty
    x1 = tl.load(src + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + second, mask=mask, other=0.0).to(tl.float32)
    if PASS_P2 > 0:
        rest = 2 * HALF + tl.arange(0, PASS_P2)[None, :]
        rest_mask = (heads < num_heads) & (rest < head_size)
        x_rest = tl.load(src + rest, mask=rest_mask, other=0.0)
    if NORM:
        sum_sq = tl.sum(x1 * x1 + x2 * x2, axis=1)
        if PASS_P2 > 0:
            x_rest = x_rest.to(tl.float32)
            sum_sq += tl.sum(x_rest * x_rest, axis=1)
        rstd = tl.rsqrt(sum_sq / head_size + eps)[:, None]
        x1 = _rms_scaled(x1, rstd, w_ptr + first, pairs < HALF, out_dtype)
        x2 = _rms_scaled(x2, rstd, w_ptr + second, pairs < HALF, out_dtype)
        if PASS_P2 > 0:
            x_rest = _rms_scaled(x_rest, rstd, w_ptr + rest, rest < head_size, out_dtype)
    tl.store(dst + first, (x1 * cos - x2 * sin).to(out_dtype), mask=mask)
    tl.store(dst + second, (x2 * cos + x1 * sin).to(out_dtype), mask=mask)
    if PASS_P2 > 0:
        tl.store(dst + rest, x_rest.to(out_dtype), mask=rest_mask)


@triton.jit
def _rotary_embedding_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cache_ptr,
    q_weight_ptr,
    k_weight_ptr,
    q_token_stride,
    k_token_stride,
    cache_stride,
    num_q_heads,
    num_k_heads,
    head_size,
    eps,
    IS_NEOX: tl.constexpr,
    NORM: tl.constexpr,
    HALF: tl.constexpr,
    HALF_P2: tl.constexpr,
    Q_HEADS_P2: tl.constexpr,
    K_HEADS_P2: tl.constexpr,
    PASS_P2: tl.constexpr,
):
    # fp32 whoever launches: Inductor passes Python floats as fp64 (ATOM_INDUCTOR_OPS).
    eps = tl.cast(eps, tl.float32)
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    pairs = tl.arange(0, HALF_P2)[None, :]
    cos = tl.load(cache_ptr + pos * cache_stride + pairs, mask=pairs < HALF, other=0.0).to(
        tl.float32
    )
    sin = tl.load(cache_ptr + pos * cache_stride + HALF + pairs, mask=pairs < HALF, other=0.0).to(
        tl.float32
    )
    _rope_heads(
        q_ptr + token * q_token_stride,
        q_out_ptr + token * num_q_heads * head_size,
        q_weight_ptr,
        num_q_heads,
        head_size,
        eps,
        cos,
        sin,
        IS_NEOX,
        NORM,
        HALF,
        Q_HEADS_P2,
        HALF_P2,
        PASS_P2,
    )
    _rope_heads(
        k_ptr + token * k_token_stride,
        k_out_ptr + token * num_k_heads * head_size,
        k_weight_ptr,
        num_k_heads,
        head_size,
        eps,
        cos,
        sin,
        IS_NEOX,
        NORM,
        HALF,
        K_HEADS_P2,
        HALF_P2,
        PASS_P2,
    )


def _token_rows(name: str, x: torch.Tensor, head_size: int) -> torch.Tensor:
    """``x`` as [num_tokens, num_heads * head_size] with contiguous heads (copied only if it must be)."""
    rows = x.reshape(x.shape[0], -1) if x.dim() == 3 and x.stride(1) == head_size else x
    if rows.dim() != 2 or rows.stride(-1) != 1:
        rows = x.reshape(x.shape[0], -1).contiguous()
    if rows.shape[1] % head_size:
        raise ValueError(
            f"rotary_embedding: {name} width {rows.shape[1]} is not a multiple of {head_size}"
        )
    return rows


def _launch_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q and k, after per-head RMSNorm when the norm weights are given."""
    rotary_dim = cos_sin_cache.shape[-1]
    if rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(
            f"rotary_embedding: rotary_dim {rotary_dim} must be even and <= {head_size}"
        )
    if cos_sin_cache.stride(-1) != 1:
        cos_sin_cache = cos_sin_cache.contiguous()
    num_tokens = positions.numel()
    if q.shape[0] != num_tokens or k.shape[0] != num_tokens:
        raise ValueError(
            f"rotary_embedding: {num_tokens} positions, q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    q_rows, k_rows = _token_rows("q", q, head_size), _token_rows("k", k, head_size)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    num_q_heads, num_k_heads = q_rows.shape[1] // head_size, k_rows.shape[1] // head_size
    pass_dim = head_size - rotary_dim
    _rotary_embedding_kernel[(num_tokens,)](
        positions,
        q_rows,
        k_rows,
        q_out,
        k_out,
        cos_sin_cache,
        q_rows if q_weight is None else q_weight,  # not read without NORM
        k_rows if k_weight is None else k_weight,
        q_rows.stride(0),
        k_rows.stride(0),
        cos_sin_cache.stride(0),
        num_q_heads,
        num_k_heads,
        head_size,
        eps,
        IS_NEOX=is_neox,
        NORM=q_weight is not None,
        HALF=rotary_dim // 2,
        HALF_P2=next_pow2(rotary_dim // 2),
        Q_HEADS_P2=next_pow2(num_q_heads),
        K_HEADS_P2=next_pow2(num_k_heads),
        PASS_P2=next_pow2(pass_dim) if pass_dim else 0,
        num_warps=4,
    )
    return q_out, k_out


@rotary_embedding.register("triton")
def rotary_embedding_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_rope(positions, q, k, cos_sin_cache, head_size, is_neox)


@qk_norm_rope.register("triton")
def qk_norm_rope_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    for name, weight in (("q_weight", q_weight), ("k_weight", k_weight)):
        if weight.shape != (head_size,):
            raise ValueError(f"qk_norm_rope: {name} shape {tuple(weight.shape)} != ({head_size},)")
        check_last_dim_contiguous(f"qk_norm_rope {name}", weight)
    return _launch_rope(
        positions, q, k, cos_sin_cache, head_size, is_neox, q_weight, k_weight, eps
    )
