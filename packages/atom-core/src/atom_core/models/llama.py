"""Llama (2, 3, 3.1, 3.2): GQA attention, optional q/k/v/o and MLP biases, llama3 rope scaling
(read from the rope settings), SwiGLU MLP."""

from __future__ import annotations

from atom_core.config import Config
from atom_core.layers.mlp import GatedMLP
from atom_core.loader import WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer, hf_self_attention


class LlamaForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                   "mlp_bias": False}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config

        def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
            return DecoderLayer(
                hf_self_attention(config, layer_id, layer_prefix,
                                  qkv_bias=hf.attention_bias, o_bias=hf.attention_bias),
                GatedMLP(hf.hidden_size, hf.intermediate_size, f"{layer_prefix}.mlp",
                         bias=hf.mlp_bias),
                hf.hidden_size,
                hf.rms_norm_eps,
            )

        super().__init__(config, make_layer, WeightMap(stacked=list(STACKED_QKV_GATE_UP)), prefix)
