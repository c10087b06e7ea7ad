"""GLM-4-MoE (GLM-4.5, 4.6): partial rotary, optional QK-norm, q/k/v bias; dense MLP on the first
``first_k_dense_replace`` layers, then a sigmoid group-limited router steered by
``e_score_correction_bias`` with a routed scaling factor, plus shared experts.

Hub checkpoints also carry the multi-token-prediction layers (``model.layers.{n}`` for ``n`` past
``num_hidden_layers``); ATOM serves the base model and skips them, as HF transformers does.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from atom_core.config import Config
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.moe import FusedMoE, SparseMoeBlock, TopKRouter
from atom_core.loader import ExpertWeightNames, WeightMap
from atom_core.models.decoder import (
    STACKED_QKV_GATE_UP,
    CausalLM,
    DecoderLayer,
    hf_self_attention,
    mtp_layer_patterns,
)


def glm4_moe_mlp(hf: Any, layer_id: int, prefix: str) -> nn.Module:
    if layer_id < hf.first_k_dense_replace:
        return GatedMLP(hf.hidden_size, hf.intermediate_size, prefix)
    shared = None
    if hf.n_shared_experts:
        shared = GatedMLP(hf.hidden_size, hf.moe_intermediate_size * hf.n_shared_experts,
                          f"{prefix}.shared_experts")
    return SparseMoeBlock(
        TopKRouter(
            hf.hidden_size, hf.n_routed_experts, hf.num_experts_per_tok,
            renormalize=hf.norm_topk_prob, prefix=f"{prefix}.gate", scoring="sigmoid",
            num_expert_group=hf.n_group, topk_group=hf.topk_group, correction_bias=True,
            routed_scaling_factor=hf.routed_scaling_factor,
        ),
        FusedMoE(hf.n_routed_experts, hf.hidden_size, hf.moe_intermediate_size,
                 prefix=f"{prefix}.experts"),
        shared,
    )


class Glm4MoeForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
                   "num_experts_per_tok": 8, "norm_topk_prob": True, "n_shared_experts": 1,
                   "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
                   "first_k_dense_replace": 1, "use_qk_norm": False, "num_nextn_predict_layers": 1}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config

        def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
            attention = hf_self_attention(
                config, layer_id, layer_prefix, qkv_bias=hf.attention_bias,
                qk_norm_eps=hf.rms_norm_eps if hf.use_qk_norm else None,
            )
            return DecoderLayer(attention, glm4_moe_mlp(hf, layer_id, f"{layer_prefix}.mlp"),
                                hf.hidden_size, hf.rms_norm_eps)

        weight_map = WeightMap(
            stacked=list(STACKED_QKV_GATE_UP),
            experts=ExpertWeightNames(),
            ignored=mtp_layer_patterns(hf),
        )
        super().__init__(config, make_layer, weight_map, prefix)
