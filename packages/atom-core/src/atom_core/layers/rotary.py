"""Rotary embedding: :class:`RopeSpec` (the typed rope settings a model reads from its HF config
once), the cos/sin cache built from it, and the module that applies it to q and k.

Multimodal rope (M-RoPE: Qwen2-VL, Qwen3-VL, Qwen3.5): a spec with ``mrope_section`` takes positions
of shape [3, T], one row per axis (temporal, height, width; all three equal for text tokens), and
rotates each frequency by the position of the axis that owns it. ``mrope_section`` gives the number
of frequencies per axis: contiguous runs (Qwen2-VL), or with ``mrope_interleaved`` (Qwen3-VL,
Qwen3.5) frequency ``j`` belongs to height if ``j % 3 == 1`` and ``j < 3 * sections[1]``, to width if
``j % 3 == 2`` and ``j < 3 * sections[2]``, else to time. Each token's [cos | sin] row is gathered
from the usual table per frequency, and the rope kernels run on those rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import atom_kernels
from atom_core.layers.norm import RMSNorm
from atom_kernels import rope as rope_ops


def hf_rope_parameters(hf_config: Any) -> dict[str, Any]:
    """Rope settings of an HF config as one dict with ``rope_theta``, ``rope_type`` and
    ``partial_rotary_factor``: what :meth:`RopeSpec.from_parameters` reads at the model boundary,
    and what atom_core.hosting.takeover checks the rope type of.

    transformers 5 keeps them in ``rope_parameters``; older configs use ``rope_theta``,
    ``rope_scaling`` and a top-level ``partial_rotary_factor``.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if "partial_rotary_factor" not in params:
        params["partial_rotary_factor"] = getattr(hf_config, "partial_rotary_factor", None) or 1.0
    return params


# The rope types whose tables ATOM builds; configs with any other (dynamic, longrope, ...) are served
# by the host (atom_core.hosting.takeover).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    """Rope settings of one model. ``factor`` scales ``linear``, ``llama3`` and ``yarn`` tables;
    ``llama3`` also reads ``low_freq_factor`` / ``high_freq_factor`` and ``yarn`` ``beta_fast`` /
    ``beta_slow`` / ``truncate`` / ``attention_factor`` (or DeepSeek's ``mscale`` /
    ``mscale_all_dim``); both read ``original_max_position_embeddings``. Unset values are None,
    as absent keys are in HF's rope parameters."""

    rope_type: str = "default"
    theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False

    @classmethod
    def from_parameters(cls, params: Mapping[str, Any]) -> RopeSpec:
        """From a rope-parameters dict (``rope_type``, ``rope_theta``, ... as
        :func:`hf_rope_parameters` returns); keys a supported rope type does not read are dropped."""
        return cls(
            rope_type=params.get("rope_type") or "default",
            theta=params.get("rope_theta", 10000.0),
            partial_rotary_factor=params.get("partial_rotary_factor", 1.0),
            factor=params.get("factor"),
            original_max_position_embeddings=params.get("original_max_position_embeddings"),
            low_freq_factor=params.get("low_freq_factor"),
            high_freq_factor=params.get("high_freq_factor"),
            beta_fast=params.get("beta_fast"),
            beta_slow=params.get("beta_slow"),
            truncate=params.get("truncate", True),
            attention_factor=params.get("attention_factor"),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            mrope_section=tuple(params["mrope_section"]) if params.get("mrope_section") else None,
            mrope_interleaved=bool(params.get("mrope_interleaved", False)),
        )

    @classmethod
    def of(cls, rope: RopeSpec | Mapping[str, Any]) -> RopeSpec:
        """``rope`` itself, or the spec of a rope-parameters dict (layers built by hand, tests)."""
        return rope if isinstance(rope, RopeSpec) else cls.from_parameters(rope)


def yarn_attention_factor(rope: RopeSpec) -> float:
    """The cos/sin magnitude of YaRN as HF computes it: ``attention_factor`` if the config sets
    one, else from ``mscale`` / ``mscale_all_dim`` (DeepSeek) or from ``factor`` alone."""
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return rope_ops.deepseek_yarn_mscale(rope.factor, rope.mscale, rope.mscale_all_dim)
    return rope_ops.yarn_mscale(rope.factor)


def build_cos_sin_cache(rotary_dim: int, max_position: int,
                        rope: RopeSpec | Mapping[str, Any]) -> torch.Tensor:
    rope = RopeSpec.of(rope)
    rope_type = rope.rope_type
    if rope_type == "yarn":
        inv_freq = rope_ops.yarn_inv_freq(
            rotary_dim,
            rope.theta,
            rope.factor,
            rope.original_max_position_embeddings,
            beta_fast=rope.beta_fast or 32,
            beta_slow=rope.beta_slow or 1,
            truncate=rope.truncate,
        )
        return rope_ops.compute_cos_sin_cache(inv_freq, max_position, yarn_attention_factor(rope))
    inv_freq = rope_ops.default_inv_freq(rotary_dim, rope.theta)
    if rope_type == "llama3":
        inv_freq = rope_ops.llama3_inv_freq(
            inv_freq,
            rope.factor,
            rope.low_freq_factor,
            rope.high_freq_factor,
            rope.original_max_position_embeddings,
        )
    elif rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope_type != "default":
        raise NotImplementedError(f"rope_type {rope_type!r} is not supported yet")
    return rope_ops.compute_cos_sin_cache(inv_freq, max_position)


def mrope_axis_of_columns(rotary_dim: int, sections: tuple[int, ...], interleaved: bool) -> torch.Tensor:
    """The M-RoPE axis (0 time, 1 height, 2 width) of each column of a [cos | sin] table row."""
    half = rotary_dim // 2
    if sum(sections) != half:
        raise ValueError(f"mrope_section {list(sections)} must sum to half the rotary dim ({half})")
    if interleaved:
        j = torch.arange(half)
        axis = torch.zeros(half, dtype=torch.long)
        axis[(j % 3 == 1) & (j < 3 * sections[1])] = 1
        axis[(j % 3 == 2) & (j < 3 * sections[2])] = 2
    else:
        axis = torch.repeat_interleave(torch.arange(len(sections)), torch.tensor(sections))
    return torch.cat([axis, axis])


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int,
                 rope: RopeSpec | Mapping[str, Any], is_neox: bool = True):
        super().__init__()
        rope = RopeSpec.of(rope)
        self.head_size = head_size
        self.is_neox = is_neox
        self.register_buffer(
            "cos_sin_cache", build_cos_sin_cache(rotary_dim, max_position, rope), persistent=False
        )
        axis = (None if rope.mrope_section is None
                else mrope_axis_of_columns(rotary_dim, rope.mrope_section, rope.mrope_interleaved))
        self.register_buffer("mrope_axis", axis, persistent=False)

    def table_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions, table) for the rope kernels: as given for [T] positions; for M-RoPE's [3, T],
        each token's row gathered per column from its axis's position, indexed by token."""
        if positions.dim() == 1:
            return positions, self.cos_sin_cache
        if self.mrope_axis is None:
            raise ValueError(f"positions of shape {tuple(positions.shape)} need an M-RoPE spec")
        columns = torch.arange(self.mrope_axis.numel(), device=positions.device)
        rows = self.cos_sin_cache[positions[self.mrope_axis].T, columns]
        return torch.arange(positions.shape[-1], device=positions.device), rows

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        positions, table = self.table_rows(positions)
        return atom_kernels.rotary_embedding(positions, q, k, table, self.head_size, self.is_neox)

    def forward_with_qk_norm(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_norm: RMSNorm,
        k_norm: RMSNorm,
    ):
        """``forward`` of q and k after ``q_norm`` / ``k_norm`` over each head, in one kernel. The
        two norms share ``q_norm.eps`` (the attention block builds both from one eps)."""
        positions, table = self.table_rows(positions)
        return atom_kernels.qk_norm_rope(
            positions, q, k, q_norm.weight, k_norm.weight, q_norm.eps, table, self.head_size,
            self.is_neox,
        )


_shared: dict[tuple, RotaryEmbedding] | None = None


@contextlib.contextmanager
def rotary_embeddings_shared():
    """Within this block (one model's construction), :func:`shared_rotary_embedding` hands every
    layer with the same settings the same module. Models never share one with another model."""
    global _shared
    outer, _shared = _shared, {}
    try:
        yield
    finally:
        _shared = outer


def shared_rotary_embedding(head_size: int, rotary_dim: int, max_position: int,
                            rope: RopeSpec | Mapping[str, Any], is_neox: bool = True) -> RotaryEmbedding:
    """The model's RotaryEmbedding for these settings, shared by its layers inside
    :func:`rotary_embeddings_shared` (a fresh one outside it). The fp32 cos/sin cache of a
    long-context model is tens of MB; once per layer it would cost ~0.7 GB (Qwen3-8B: 36 x 20 MB)
    that the KV cache could use."""
    rope = RopeSpec.of(rope)
    if _shared is None:
        return RotaryEmbedding(head_size, rotary_dim, max_position, rope, is_neox)
    key = (head_size, rotary_dim, max_position, is_neox, rope)
    if key not in _shared:
        _shared[key] = RotaryEmbedding(head_size, rotary_dim, max_position, rope, is_neox)
    return _shared[key]
