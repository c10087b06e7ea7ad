"""DeepSeek-V2 and DeepSeek-V3 (R1, Kimi-K2, Moonlight): multi-head latent attention, dense MLP on the
first ``first_k_dense_replace`` layers, then routed experts plus always-on shared experts.

The two architectures differ only in constructor arguments:

| | DeepseekV2ForCausalLM | DeepseekV3ForCausalLM |
|---|---|---|
| router scores | softmax | sigmoid |
| expert choice | top-k (``greedy``) or best ``topk_group`` of ``n_group`` groups by their best expert (``group_limited_greedy``) | ``noaux_tc``: groups ranked by the sum of their two best scores, all steered by ``e_score_correction_bias`` |
| renormalise | ``norm_topk_prob`` (as DeepSeek's code and vLLM; HF transformers ignores it for V2, and every released V2 sets it False) | ``norm_topk_prob`` |
| rope pairs | interleaved | interleaved unless ``rope_interleave`` is False |

Both: ``routed_scaling_factor`` on the routed weights, YaRN rope with DeepSeek's ``mscale`` /
``mscale_all_dim`` (cos/sin magnitude and softmax scale), q through a low-rank ``q_a_proj`` /
``q_b_proj`` when ``q_lora_rank`` is set and a plain ``q_proj`` otherwise. Hub checkpoints may carry
the multi-token-prediction layers (``model.layers.{n}`` for ``n`` past ``num_hidden_layers``); ATOM
serves the base model and skips them, as HF transformers does.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from atom_core.config import Config
from atom_core.layers.mla import MultiHeadLatentAttention
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.moe import FusedMoE, SparseMoeBlock, TopKRouter
from atom_core.layers.rotary import hf_rope_parameters
from atom_core.loader import ExpertWeightNames, StackedWeight, WeightMap
from atom_core.models.decoder import CausalLM, DecoderLayer

STACKED_GATE_UP = [
    StackedWeight("gate_proj", "gate_up_proj", 0),
    StackedWeight("up_proj", "gate_up_proj", 1),
]


def deepseek_attention(config: Config, layer_id: int, prefix: str,
                       rope_is_neox: bool) -> MultiHeadLatentAttention:
    hf = config.hf_config
    return MultiHeadLatentAttention(
        hidden_size=hf.hidden_size,
        num_heads=hf.num_attention_heads,
        qk_nope_head_dim=hf.qk_nope_head_dim,
        qk_rope_head_dim=hf.qk_rope_head_dim,
        v_head_dim=hf.v_head_dim,
        q_lora_rank=hf.q_lora_rank,
        kv_lora_rank=hf.kv_lora_rank,
        rope=hf_rope_parameters(hf),
        max_position=config.rope_positions,
        layer_id=layer_id,
        prefix=f"{prefix}.self_attn",
        rope_is_neox=rope_is_neox,
        bias=hf.attention_bias,
    )


def deepseek_mlp(hf: Any, layer_id: int, prefix: str, router_args: dict[str, Any]) -> nn.Module:
    mlp_bias = getattr(hf, "mlp_bias", False)  # DeepSeek-V3's config class has no such key
    is_sparse = layer_id >= hf.first_k_dense_replace and layer_id % getattr(hf, "moe_layer_freq", 1) == 0
    if not is_sparse:
        return GatedMLP(hf.hidden_size, hf.intermediate_size, prefix, bias=mlp_bias)
    shared = None
    if hf.n_shared_experts:
        shared = GatedMLP(hf.hidden_size, hf.moe_intermediate_size * hf.n_shared_experts,
                          f"{prefix}.shared_experts", bias=mlp_bias)
    return SparseMoeBlock(
        TopKRouter(
            hf.hidden_size, hf.n_routed_experts, hf.num_experts_per_tok, renormalize=hf.norm_topk_prob,
            prefix=f"{prefix}.gate", routed_scaling_factor=hf.routed_scaling_factor, **router_args,
        ),
        FusedMoE(hf.n_routed_experts, hf.hidden_size, hf.moe_intermediate_size, prefix=f"{prefix}.experts"),
        shared,
    )


def deepseek_make_layer(config: Config, router_args: dict[str, Any], rope_is_neox: bool):
    hf = config.hf_config

    def make_layer(layer_id: int, layer_prefix: str) -> DecoderLayer:
        return DecoderLayer(
            deepseek_attention(config, layer_id, layer_prefix, rope_is_neox),
            deepseek_mlp(hf, layer_id, f"{layer_prefix}.mlp", router_args),
            hf.hidden_size,
            hf.rms_norm_eps,
        )

    return make_layer


def deepseek_weight_map(hf: Any) -> WeightMap:
    num_mtp_layers = getattr(hf, "num_nextn_predict_layers", 0) or 0
    mtp_layers = range(hf.num_hidden_layers, hf.num_hidden_layers + num_mtp_layers)
    return WeightMap(
        stacked=list(STACKED_GATE_UP),
        experts=ExpertWeightNames(),
        ignored=[rf"model\.layers\.{i}\..*" for i in mtp_layers],
    )


class DeepseekV2ForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                   "mlp_bias": False, "norm_topk_prob": False, "n_shared_experts": 2, "n_group": None,
                   "topk_group": None, "routed_scaling_factor": 1.0, "first_k_dense_replace": 0,
                   "q_lora_rank": 1536, "topk_method": "greedy"}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        scoring = getattr(hf, "scoring_func", None) or "softmax"
        grouped = hf.topk_method == "group_limited_greedy"
        router_args = dict(
            scoring=scoring,
            num_expert_group=hf.n_group if grouped else 1,
            topk_group=hf.topk_group if grouped else 1,
        )
        super().__init__(config, deepseek_make_layer(config, router_args, rope_is_neox=False),
                         deepseek_weight_map(hf), prefix)


class DeepseekV3ForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                   "num_experts_per_tok": 8, "norm_topk_prob": True, "n_shared_experts": 1,
                   "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
                   "first_k_dense_replace": 3, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
                   "rope_interleave": True}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        router_args = dict(
            scoring="sigmoid", num_expert_group=hf.n_group, topk_group=hf.topk_group, correction_bias=True
        )
        rope_is_neox = not hf.rope_interleave
        super().__init__(config, deepseek_make_layer(config, router_args, rope_is_neox),
                         deepseek_weight_map(hf), prefix)
