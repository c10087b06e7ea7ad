"""GLM-4-MoE (GLM-4.5, 4.6): the base decoder (:mod:`atom_core.models.decoder`) with

| differs from the base decoder | Glm4MoeForCausalLM |
|---|---|
| attention | q/k/v bias if ``attention_bias`` (no o bias); per-head QK RMSNorm if ``use_qk_norm``; partial rotary (``partial_rotary_factor``) |
| MLP | dense SwiGLU on the first ``first_k_dense_replace`` layers, then experts: sigmoid router over ``n_group`` groups (best ``topk_group``) steered by ``e_score_correction_bias``, ``routed_scaling_factor``, plus ``n_shared_experts`` shared experts (the MoE block of DeepSeek-V3) |
| checkpoint | hub checkpoints carry ``num_nextn_predict_layers`` multi-token-prediction layers, skipped |
"""

from __future__ import annotations

from atom_core.config import Config
from atom_core.layers.moe import MoeSpec
from atom_core.loader import ExpertWeightNames, WeightMap
from atom_core.models.decoder import (
    STACKED_QKV_GATE_UP,
    CausalLM,
    DecoderLayer,
    hf_self_attention_spec,
    hf_sliding_windows,
)


class Glm4MoeForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
                   "num_experts_per_tok": 8, "norm_topk_prob": True, "n_shared_experts": 1,
                   "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
                   "first_k_dense_replace": 1, "use_qk_norm": False, "num_nextn_predict_layers": 1}
    WEIGHT_MAP = WeightMap(stacked=STACKED_QKV_GATE_UP, experts=ExpertWeightNames())

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        self.attention = hf_self_attention_spec(
            config, qkv_bias=hf.attention_bias, qk_norm_eps=hf.rms_norm_eps if hf.use_qk_norm else None
        )
        self.sliding_windows = hf_sliding_windows(hf)
        self.intermediate_size = hf.intermediate_size
        self.moe = MoeSpec(
            num_experts=hf.n_routed_experts, top_k=hf.num_experts_per_tok,
            intermediate_size=hf.moe_intermediate_size, renormalize=hf.norm_topk_prob,
            scoring="sigmoid", num_expert_group=hf.n_group, topk_group=hf.topk_group,
            correction_bias=True, routed_scaling_factor=hf.routed_scaling_factor,
            shared_intermediate_size=hf.moe_intermediate_size * (hf.n_shared_experts or 0),
        )
        self.sparse_layers = frozenset(range(hf.first_k_dense_replace, hf.num_hidden_layers))
        super().__init__(config, prefix)

    def make_layer(self, layer_id: int, prefix: str) -> DecoderLayer:
        return self.self_attention_layer(layer_id, prefix, self.sparse_or_dense_mlp(layer_id, prefix))
