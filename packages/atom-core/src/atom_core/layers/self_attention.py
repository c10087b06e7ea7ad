"""The decoder self-attention block shared by the model families.

qkv projection -> optional per-head QK RMSNorm -> RoPE -> :class:`Attention` -> optional output
gate -> o projection. Family differences (bias, QK-norm, partial rotary, sliding window, sinks,
output gate) are fields of :class:`SelfAttentionSpec`, which a model fills once from its HF config;
the sliding window, which may differ per layer, is a constructor argument. Partial rotary comes from
the rope settings (``partial_rotary_factor``). ``sinks`` adds a learned per-head logit that joins
the softmax denominator (GPT-OSS), checkpoint name ``<prefix>.sinks``, split across TP ranks with
the heads. ``output_gate`` (Qwen3-Next): ``q_proj`` yields, per head, the query and then a gate of
the same size; the attention output is multiplied by ``sigmoid(gate)`` before ``o_proj``. The fused
projection treats each (query, gate) pair as two heads, so a TP rank's rows are whole pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from atom_core.distributed import divide
from atom_core.layers.attention import Attention, AttentionSpec
from atom_core.layers.linear import (
    QKVParallelLinear,
    RowParallelLinear,
    make_param,
    rank_sharded_weight_loader,
)
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import RopeSpec, shared_rotary_embedding
from atom_core.quantization.fp8 import QuantizedActivation


@dataclass(frozen=True)
class SelfAttentionSpec:
    """The self-attention of every layer of one model (head counts before TP splitting).
    ``qk_norm_eps`` None: no QK-norm; ``qk_norm_zero_centred``: its weights scale by ``1 + w``
    (:class:`RMSNorm`)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: RopeSpec
    max_position: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm_eps: float | None = None
    qk_norm_zero_centred: bool = False
    sinks: bool = False
    output_gate: bool = False


class DecoderSelfAttention(nn.Module):
    def __init__(self, spec: SelfAttentionSpec, layer_id: int, prefix: str,
                 sliding_window: int | None = None):
        super().__init__()
        head_dim = spec.head_dim
        q_heads_per_head = 2 if spec.output_gate else 1
        self.qkv_proj = QKVParallelLinear(
            spec.hidden_size, head_dim, spec.num_heads * q_heads_per_head, spec.num_kv_heads,
            spec.qkv_bias, prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            spec.num_heads * head_dim, spec.hidden_size, spec.o_bias, prefix=f"{prefix}.o_proj"
        )
        # The input goes straight into qkv_proj: the norm before may quantize it for it.
        self.input_quant = self.qkv_proj.input_quant
        self.head_dim = head_dim
        self.output_gate = spec.output_gate
        self.num_heads = divide(self.qkv_proj.num_heads, q_heads_per_head)
        self.q_size = self.qkv_proj.num_heads * head_dim  # with the gates
        self.kv_size = self.qkv_proj.num_kv_heads * head_dim
        if spec.qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, spec.qk_norm_eps, spec.qk_norm_zero_centred)
            self.k_norm = RMSNorm(head_dim, spec.qk_norm_eps, spec.qk_norm_zero_centred)
        else:
            self.q_norm = self.k_norm = None
        rotary_dim = int(head_dim * spec.rope.partial_rotary_factor)
        self.rotary_emb = shared_rotary_embedding(head_dim, rotary_dim, spec.max_position, spec.rope)
        self.sinks = (
            make_param((self.num_heads,), rank_sharded_weight_loader(0))
            if spec.sinks else None
        )
        self.attn = Attention(
            AttentionSpec(
                num_heads=self.num_heads,
                num_kv_heads=self.qkv_proj.num_kv_heads,
                head_size=head_dim,
                scale=head_dim**-0.5,
                prefix=f"{prefix}.attn",
                layer_id=layer_id,
                sliding_window=sliding_window,
                sinks=self.sinks,
            )
        )

    def forward(self, positions: torch.Tensor,
                hidden_states: torch.Tensor | QuantizedActivation) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        gate = None
        if self.output_gate:
            q, gate = q.unflatten(-1, (self.num_heads, 2, self.head_dim)).unbind(-2)
            q, gate = q.flatten(-2), gate.flatten(-2)
        if self.q_norm is None:
            q, k = self.rotary_emb(positions, q, k)
        else:
            q, k = self.rotary_emb.forward_with_qk_norm(positions, q, k, self.q_norm, self.k_norm)
        out = self.attn(q, k, v)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)
