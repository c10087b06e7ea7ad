"""Qwen3-MoE: Qwen3 attention with a softmax top-k routed expert MLP (dense on mlp_only_layers)."""

from __future__ import annotations

from typing import Any

from atom_core.config import Config
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.moe import FusedMoE, SparseMoeBlock, TopKRouter
from atom_core.loader import ExpertWeightNames, WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer
from atom_core.models.qwen3 import QWEN3_HF_DEFAULTS, qwen3_attention


def is_sparse_layer(hf: Any, layer_id: int) -> bool:
    return (
        layer_id not in (hf.mlp_only_layers or [])
        and hf.num_experts > 0
        and (layer_id + 1) % hf.decoder_sparse_step == 0
    )


class Qwen3MoeForCausalLM(CausalLM):
    hf_defaults = {**QWEN3_HF_DEFAULTS, "num_experts_per_tok": 8, "norm_topk_prob": False,
                   "decoder_sparse_step": 1, "mlp_only_layers": []}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config

        def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
            mlp_prefix = f"{layer_prefix}.mlp"
            if is_sparse_layer(hf, layer_id):
                mlp = SparseMoeBlock(
                    TopKRouter(hf.hidden_size, hf.num_experts, hf.num_experts_per_tok,
                               renormalize=hf.norm_topk_prob, prefix=f"{mlp_prefix}.gate"),
                    FusedMoE(hf.num_experts, hf.hidden_size, hf.moe_intermediate_size,
                             prefix=f"{mlp_prefix}.experts"),
                )
            else:
                mlp = GatedMLP(hf.hidden_size, hf.intermediate_size, mlp_prefix)
            return DecoderLayer(qwen3_attention(config, layer_id, layer_prefix), mlp,
                                hf.hidden_size, hf.rms_norm_eps)

        weight_map = WeightMap(stacked=list(STACKED_QKV_GATE_UP), experts=ExpertWeightNames())
        super().__init__(config, make_layer, weight_map, prefix)
