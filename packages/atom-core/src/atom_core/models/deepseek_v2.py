"""DeepSeek-V2 and DeepSeek-V3 (R1, Kimi-K2, Moonlight): the base decoder
(:mod:`atom_core.models.decoder`) with multi-head latent attention (:mod:`atom_core.layers.mla`)
for self-attention, a dense SwiGLU MLP on the first ``first_k_dense_replace`` layers, then (on
every ``moe_layer_freq``-th layer) routed experts plus always-on shared experts, the MoE block of
GLM-4-MoE.

The two architectures differ only in constructor arguments:

| | DeepseekV2ForCausalLM | DeepseekV3ForCausalLM |
|---|---|---|
| router scores | softmax | sigmoid |
| expert choice | top-k (``greedy``) or best ``topk_group`` of ``n_group`` groups by their best expert (``group_limited_greedy``) | ``noaux_tc``: groups ranked by the sum of their two best scores, all steered by ``e_score_correction_bias`` |
| renormalise | ``norm_topk_prob`` (as DeepSeek's code and vLLM; HF transformers ignores it for V2, and every released V2 sets it False) | ``norm_topk_prob`` |
| rope pairs | interleaved | interleaved unless ``rope_interleave`` is False |

A V2 config whose ``topk_method`` is ``noaux_tc`` (a V3 config under V2's name) gets V3's router and
rope, as vLLM's own DeepseekV2ForCausalLM gives it: vLLM builds Kimi-K2.5's language model that way.

Both: ``routed_scaling_factor`` on the routed weights, YaRN rope with DeepSeek's ``mscale`` /
``mscale_all_dim`` (cos/sin magnitude and softmax scale), q through a low-rank ``q_a_proj`` /
``q_b_proj`` when ``q_lora_rank`` is set and a plain ``q_proj`` otherwise. Hub checkpoints may carry
the multi-token-prediction layers (``model.layers.{n}`` for ``n`` past ``num_hidden_layers``); ATOM
serves the base model and skips them, as HF transformers does.
"""

from __future__ import annotations

from typing import Any

from atom_core.config import Config
from atom_core.layers.mla import MultiHeadLatentAttention, MultiHeadLatentAttentionSpec
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.moe import MoeSpec, SparseMoeBlock
from atom_core.loader import ExpertWeightNames, WeightMap
from atom_core.models.decoder import STACKED_GATE_UP, CausalLM, DecoderLayer, hf_rope_spec


class DeepseekCausalLM(CausalLM):
    """What V2 and V3 share: everything but the router, which each reads in its ``__init__``."""

    WEIGHT_MAP = WeightMap(stacked=STACKED_GATE_UP, experts=ExpertWeightNames())

    def __init__(self, config: Config, prefix: str, rope_is_neox: bool, router: dict[str, Any]):
        hf = config.hf_config
        self.attention = MultiHeadLatentAttentionSpec(
            hidden_size=hf.hidden_size,
            num_heads=hf.num_attention_heads,
            qk_nope_head_dim=hf.qk_nope_head_dim,
            qk_rope_head_dim=hf.qk_rope_head_dim,
            v_head_dim=hf.v_head_dim,
            q_lora_rank=hf.q_lora_rank,
            kv_lora_rank=hf.kv_lora_rank,
            rope=hf_rope_spec(hf),
            max_position=config.rope_positions,
            rope_is_neox=rope_is_neox,
            bias=hf.attention_bias,
        )
        self.intermediate_size = hf.intermediate_size
        self.mlp_bias = getattr(hf, "mlp_bias", False)  # DeepSeek-V3's config class has no such key
        self.moe = MoeSpec(
            num_experts=hf.n_routed_experts, top_k=hf.num_experts_per_tok,
            intermediate_size=hf.moe_intermediate_size, renormalize=hf.norm_topk_prob,
            routed_scaling_factor=hf.routed_scaling_factor,
            shared_intermediate_size=hf.moe_intermediate_size * (hf.n_shared_experts or 0),
            shared_bias=self.mlp_bias, **router,
        )
        moe_layer_freq = getattr(hf, "moe_layer_freq", 1)
        self.sparse_layers = frozenset(
            i for i in range(hf.first_k_dense_replace, hf.num_hidden_layers) if i % moe_layer_freq == 0
        )
        super().__init__(config, prefix)

    def make_layer(self, layer_id: int, prefix: str) -> DecoderLayer:
        d = self.decoder
        if layer_id in self.sparse_layers:
            mlp = SparseMoeBlock.from_spec(self.moe, d.hidden_size, f"{prefix}.mlp")
        else:
            mlp = GatedMLP(d.hidden_size, self.intermediate_size, f"{prefix}.mlp", bias=self.mlp_bias)
        return DecoderLayer(
            MultiHeadLatentAttention.from_spec(self.attention, layer_id, f"{prefix}.self_attn"),
            mlp,
            d.hidden_size,
            d.rms_norm_eps,
        )


class DeepseekV2ForCausalLM(DeepseekCausalLM):
    hf_defaults = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                   "mlp_bias": False, "norm_topk_prob": False, "n_shared_experts": 2, "n_group": None,
                   "topk_group": None, "routed_scaling_factor": 1.0, "first_k_dense_replace": 0,
                   "q_lora_rank": 1536, "topk_method": "greedy"}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        if hf.topk_method == "noaux_tc":
            # A V3 config under V2's name, as vLLM's DeepseekV2ForCausalLM takes it too: vLLM builds
            # Kimi-K2.5's language model so (through its registry, so ATOM's class serves it).
            super().__init__(config, prefix, rope_is_neox=not getattr(hf, "rope_interleave", True),
                             router=noaux_tc_router(hf))
            return
        grouped = hf.topk_method == "group_limited_greedy"
        router = dict(
            scoring=getattr(hf, "scoring_func", None) or "softmax",
            num_expert_group=hf.n_group if grouped else 1,
            topk_group=hf.topk_group if grouped else 1,
        )
        super().__init__(config, prefix, rope_is_neox=False, router=router)


def noaux_tc_router(hf: Any) -> dict[str, Any]:
    """DeepSeek-V3's router: sigmoid scores, the best ``topk_group`` of ``n_group`` groups by the sum
    of their two best scores, all steered by ``e_score_correction_bias``."""
    return dict(scoring="sigmoid", num_expert_group=hf.n_group, topk_group=hf.topk_group,
                correction_bias=True)


class DeepseekV3ForCausalLM(DeepseekCausalLM):
    hf_defaults = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                   "num_experts_per_tok": 8, "norm_topk_prob": True, "n_shared_experts": 1,
                   "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
                   "first_k_dense_replace": 3, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
                   "rope_interleave": True}

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        super().__init__(config, prefix, rope_is_neox=not hf.rope_interleave, router=noaux_tc_router(hf))
