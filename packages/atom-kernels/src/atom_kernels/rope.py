"""Rotary position embedding of q and k from a precomputed cos/sin cache.

``cos_sin_cache`` is [max_position, rotary_dim] holding [cos | sin] halves (each rotary_dim / 2).
q and k are [num_tokens, num_heads * head_size] or [num_tokens, num_heads, head_size]; only the first
``rotary_dim`` channels of each head rotate (partial rotary). ``is_neox`` selects the rotate-half
(neox) pairing; otherwise interleaved (gptj) pairs.
"""

from __future__ import annotations

import math

import torch

from atom_kernels.registry import define_op

rotary_embedding = define_op(
    "rotary_embedding",
    "rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox) -> (q, k)",
)


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
    smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(
        wavelen < high_freq_wavelen,
        inv_freq,
        torch.where(wavelen > low_freq_wavelen, inv_freq / factor, smoothed),
    )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
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
        rot = _rotate(heads[..., :rotary_dim].float(), cos, sin, is_neox).to(x.dtype)
        return torch.cat([rot, heads[..., rotary_dim:]], dim=-1).reshape(x.shape)

    return apply(q), apply(k)
