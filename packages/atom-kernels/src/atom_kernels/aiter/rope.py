"""AITER adapters of :mod:`atom_kernels.rope` (rotary embedding): ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.rope import qk_norm_rope, qk_norm_rope_triton, rotary_embedding


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
