"""GPT-OSS: attention with q/k/v/o bias and per-head sinks, alternating sliding-window and full
layers (``layer_types``), yarn rope; every layer a MoE whose router has a bias and whose experts
have biases and a clamped SwiGLU over interleaved gate/up rows.

HF checkpoints (bf16 layout) store each layer's experts stacked and transposed
(``mlp.experts.gate_up_proj`` [E, D, 2I], ``down_proj`` [E, I, D], ``*_bias``) and call the router
``mlp.router``.
"""

from __future__ import annotations

from atom_core.config import Config
from atom_core.layers.moe import STACKED_TRANSPOSED, FusedMoE, SparseMoeBlock, TopKRouter
from atom_core.loader import WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer, hf_self_attention

# HF GPT-OSS names -> ATOM's SparseMoeBlock / FusedMoE parameter names.
GPT_OSS_RENAMED = {
    "router": "gate",
    "gate_up_proj": "w13_weight",
    "gate_up_proj_bias": "w13_bias",
    "down_proj": "w2_weight",
    "down_proj_bias": "w2_bias",
}


class GptOssForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": True,
                   "sliding_window": 128, "num_experts_per_tok": 4, "swiglu_alpha": 1.702,
                   "swiglu_limit": 7.0}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config

        def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
            attention = hf_self_attention(
                config, layer_id, layer_prefix, qkv_bias=hf.attention_bias, o_bias=hf.attention_bias,
                sinks=True,
            )
            mlp_prefix = f"{layer_prefix}.mlp"
            moe = SparseMoeBlock(
                TopKRouter(hf.hidden_size, hf.num_local_experts, hf.num_experts_per_tok,
                           renormalize=True, prefix=f"{mlp_prefix}.gate", bias=True),
                FusedMoE(hf.num_local_experts, hf.hidden_size, hf.intermediate_size,
                         prefix=f"{mlp_prefix}.experts", activation="clamped_swiglu",
                         interleaved=True, bias=True, swiglu_alpha=hf.swiglu_alpha,
                         swiglu_limit=hf.swiglu_limit, checkpoint_layout=STACKED_TRANSPOSED),
            )
            return DecoderLayer(attention, moe, hf.hidden_size, hf.rms_norm_eps)

        weight_map = WeightMap(stacked=list(STACKED_QKV_GATE_UP), renamed=dict(GPT_OSS_RENAMED))
        super().__init__(config, make_layer, weight_map, prefix)
