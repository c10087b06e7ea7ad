"""The decoder self-attention block shared by the model families.

qkv projection -> optional per-head QK RMSNorm -> RoPE -> :class:`Attention` -> o projection.
Family differences (bias, QK-norm, partial rotary, sliding window, sinks) are fields of
:class:`SelfAttentionSpec`, which a model fills once from its HF config; the sliding window, which
may differ per layer, is a constructor argument. Partial rotary comes from the rope settings
(``partial_rotary_factor``). ``sinks`` adds a learned per-head logit that joins the softmax
denominator (GPT-OSS), checkpoint name ``<prefix>.sinks``, split across TP ranks with the heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from atom_core.layers.attention import Attention, AttentionSpec
from atom_core.layers.linear import (
    QKVParallelLinear,
    RowParallelLinear,
    make_param,
    rank_sharded_weight_loader,
)
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import RopeSpec, shared_rotary_embedding


@dataclass(frozen=True)
class SelfAttentionSpec:
    """The self-attention of every layer of one model (head counts before TP splitting).
    ``qk_norm_eps`` None: no QK-norm."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: RopeSpec
    max_position: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm_eps: float | None = None
    sinks: bool = False


class DecoderSelfAttention(nn.Module):
    def __init__(self, spec: SelfAttentionSpec, layer_id: int, prefix: str,
                 sliding_window: int | None = None):
        super().__init__()
        head_dim = spec.head_dim
        self.qkv_proj = QKVParallelLinear(
            spec.hidden_size, head_dim, spec.num_heads, spec.num_kv_heads, spec.qkv_bias,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            spec.num_heads * head_dim, spec.hidden_size, spec.o_bias, prefix=f"{prefix}.o_proj"
        )
        self.head_dim = head_dim
        self.q_size = self.qkv_proj.num_heads * head_dim
        self.kv_size = self.qkv_proj.num_kv_heads * head_dim
        if spec.qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, spec.qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, spec.qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        rotary_dim = int(head_dim * spec.rope.partial_rotary_factor)
        self.rotary_emb = shared_rotary_embedding(head_dim, rotary_dim, spec.max_position, spec.rope)
        self.sinks = (
            make_param((self.qkv_proj.num_heads,), rank_sharded_weight_loader(0))
            if spec.sinks else None
        )
        self.attn = Attention(
            AttentionSpec(
                num_heads=self.qkv_proj.num_heads,
                num_kv_heads=self.qkv_proj.num_kv_heads,
                head_size=head_dim,
                scale=head_dim**-0.5,
                prefix=f"{prefix}.attn",
                layer_id=layer_id,
                sliding_window=sliding_window,
                sinks=self.sinks,
            )
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is None:
            q, k = self.rotary_emb(positions, q, k)
        else:
            q, k = self.rotary_emb.forward_with_qk_norm(positions, q, k, self.q_norm, self.k_norm)
        return self.o_proj(self.attn(q, k, v))
