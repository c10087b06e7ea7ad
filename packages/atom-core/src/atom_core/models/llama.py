"""Llama (2, 3, 3.1, 3.2): GQA attention, optional q/k/v/o and MLP biases, llama3 rope scaling
(read from the rope settings), SwiGLU MLP."""

from __future__ import annotations

from atom_core.config import Config
from atom_core.layers.mlp import GatedMLP
from atom_core.loader import WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer, hf_self_attention


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        attention_bias = getattr(hf, "attention_bias", False)

        def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
            return DecoderLayer(
                hf_self_attention(hf, layer_id, layer_prefix,
                                  qkv_bias=attention_bias, o_bias=attention_bias),
                GatedMLP(hf.hidden_size, hf.intermediate_size, f"{layer_prefix}.mlp",
                         bias=getattr(hf, "mlp_bias", False)),
                hf.hidden_size,
                hf.rms_norm_eps,
            )

        super().__init__(config, make_layer, WeightMap(stacked=list(STACKED_QKV_GATE_UP)), prefix)
