"""Qwen3 (dense): GQA attention with per-head QK RMSNorm, SwiGLU MLP."""

from __future__ import annotations

from typing import Any

from atom_core.config import Config
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.rotary import hf_rope_parameters
from atom_core.layers.self_attention import DecoderSelfAttention
from atom_core.loader import WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer


def qwen3_attention(hf: Any, layer_id: int, prefix: str) -> DecoderSelfAttention:
    window = getattr(hf, "sliding_window", None) if getattr(hf, "use_sliding_window", False) else None
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is not None and layer_types[layer_id] != "sliding_attention":
        window = None
    return DecoderSelfAttention(
        hidden_size=hf.hidden_size,
        num_heads=hf.num_attention_heads,
        num_kv_heads=hf.num_key_value_heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        rope=hf_rope_parameters(hf),
        max_position=hf.max_position_embeddings,
        layer_id=layer_id,
        prefix=f"{prefix}.self_attn",
        qkv_bias=getattr(hf, "attention_bias", False),
        qk_norm_eps=hf.rms_norm_eps,
        sliding_window=window,
    )


class Qwen3ForCausalLM(CausalLM):
    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config

        def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
            return DecoderLayer(
                qwen3_attention(hf, layer_id, layer_prefix),
                GatedMLP(hf.hidden_size, hf.intermediate_size, f"{layer_prefix}.mlp"),
                hf.hidden_size,
                hf.rms_norm_eps,
            )

        super().__init__(config, make_layer, WeightMap(stacked=list(STACKED_QKV_GATE_UP)), prefix)
