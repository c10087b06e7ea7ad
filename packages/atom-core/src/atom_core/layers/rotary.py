"""Rotary embedding module: builds the cos/sin cache from an HF rope config, applies it to q and k."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import atom_kernels
from atom_kernels import rope as rope_ops


def hf_rope_parameters(hf_config: Any) -> dict[str, Any]:
    """Rope settings of an HF config as one dict with ``rope_theta`` and ``rope_type``.

    transformers 5 keeps them in ``rope_parameters``; older configs use ``rope_theta`` and
    ``rope_scaling``.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def build_cos_sin_cache(rotary_dim: int, max_position: int, rope: dict[str, Any]) -> torch.Tensor:
    inv_freq = rope_ops.default_inv_freq(rotary_dim, rope["rope_theta"])
    rope_type = rope["rope_type"]
    if rope_type == "llama3":
        inv_freq = rope_ops.llama3_inv_freq(
            inv_freq,
            rope["factor"],
            rope["low_freq_factor"],
            rope["high_freq_factor"],
            rope["original_max_position_embeddings"],
        )
    elif rope_type != "default":
        raise NotImplementedError(f"rope_type {rope_type!r} is not supported yet")
    return rope_ops.compute_cos_sin_cache(inv_freq, max_position)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, rope: dict[str, Any],
                 is_neox: bool = True):
        super().__init__()
        self.head_size = head_size
        self.is_neox = is_neox
        self.register_buffer(
            "cos_sin_cache", build_cos_sin_cache(rotary_dim, max_position, rope), persistent=False
        )

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return atom_kernels.rotary_embedding(
            positions, q, k, self.cos_sin_cache, self.head_size, self.is_neox
        )
