"""Mixtral: Llama-style attention (optional sliding window) and a softmax top-k routed MoE in
every layer. HF checkpoints name the block ``block_sparse_moe`` and the experts' gate/down/up
``w1``/``w2``/``w3``."""

from __future__ import annotations

from atom_core.config import Config
from atom_core.layers.moe import FusedMoE, SparseMoeBlock, TopKRouter
from atom_core.loader import ExpertWeightNames, WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer, hf_self_attention


class MixtralForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": None,
                   "num_experts_per_tok": 2}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config

        def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
            mlp_prefix = f"{layer_prefix}.mlp"
            moe = SparseMoeBlock(
                TopKRouter(hf.hidden_size, hf.num_local_experts, hf.num_experts_per_tok,
                           renormalize=True, prefix=f"{mlp_prefix}.gate"),
                FusedMoE(hf.num_local_experts, hf.hidden_size, hf.intermediate_size,
                         prefix=f"{mlp_prefix}.experts"),
            )
            return DecoderLayer(hf_self_attention(config, layer_id, layer_prefix), moe,
                                hf.hidden_size, hf.rms_norm_eps)

        weight_map = WeightMap(
            stacked=list(STACKED_QKV_GATE_UP),
            experts=ExpertWeightNames(gate="w1", up="w3", down="w2"),
            renamed={"block_sparse_moe": "mlp"},
        )
        super().__init__(config, make_layer, weight_map, prefix)
