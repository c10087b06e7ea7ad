"""Qwen3 (dense): GQA attention with per-head QK RMSNorm, SwiGLU MLP."""

from __future__ import annotations

from atom_core.config import Config
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.self_attention import DecoderSelfAttention
from atom_core.loader import WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer, hf_self_attention


QWEN3_HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                     "use_sliding_window": False, "sliding_window": None}


def qwen3_attention(config: Config, layer_id: int, prefix: str) -> DecoderSelfAttention:
    hf = config.hf_config
    return hf_self_attention(config, layer_id, prefix, qkv_bias=hf.attention_bias,
                             o_bias=hf.attention_bias, qk_norm_eps=hf.rms_norm_eps)


class Qwen3ForCausalLM(CausalLM):
    hf_defaults = QWEN3_HF_DEFAULTS

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config

        def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
            return DecoderLayer(
                qwen3_attention(config, layer_id, layer_prefix),
                GatedMLP(hf.hidden_size, hf.intermediate_size, f"{layer_prefix}.mlp"),
                hf.hidden_size,
                hf.rms_norm_eps,
            )

        super().__init__(config, make_layer, WeightMap(stacked=list(STACKED_QKV_GATE_UP)), prefix)
