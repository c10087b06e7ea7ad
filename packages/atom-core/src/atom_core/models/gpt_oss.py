"""GPT-OSS: the base decoder (:mod:`atom_core.models.decoder`) with

| differs from the base decoder | GptOssForCausalLM |
|---|---|
| attention | q/k/v/o bias (``attention_bias``), a learned per-head sink logit |
| sliding window | ``sliding_window`` on the layers ``layer_types`` marks ``sliding_attention``, full attention on the others |
| rope | yarn |
| MLP | experts in every layer: softmax top-k router with a bias, renormalised; expert biases; clamped SwiGLU (``swiglu_alpha``, ``swiglu_limit``) over interleaved gate/up rows; no shared experts |
| checkpoint names | (bf16 layout) experts stacked and transposed (``mlp.experts.gate_up_proj`` [E, D, 2I], ``down_proj`` [E, I, D], ``*_bias``); router ``mlp.router`` |
| MXFP4 (as published) | experts kept packed: ``gate_up_proj_blocks`` / ``_scales``, ``down_proj_blocks`` / ``_scales`` (atom_core.layers.moe); everything else bf16 |
"""

from __future__ import annotations

from types import MappingProxyType

from atom_core.config import Config
from atom_core.layers.moe import STACKED_TRANSPOSED, MoeSpec, SparseMoeBlock
from atom_core.loader import WeightMap
from atom_core.models.decoder import (
    STACKED_QKV_GATE_UP,
    CausalLM,
    DecoderLayer,
    hf_self_attention_spec,
    hf_sliding_windows,
)
from atom_core.quantization import Mxfp4Scheme, quant_config_from_hf

# HF GPT-OSS names -> ATOM's SparseMoeBlock / FusedMoE parameter names, in the bf16 and in the
# MXFP4 checkpoints (one table each, so that a missing tensor is named as its checkpoint has it).
_ROUTER_AND_BIASES = {"router": "gate", "gate_up_proj_bias": "w13_bias", "down_proj_bias": "w2_bias"}
GPT_OSS_RENAMED = MappingProxyType({
    **_ROUTER_AND_BIASES, "gate_up_proj": "w13_weight", "down_proj": "w2_weight",
})
GPT_OSS_MXFP4_RENAMED = MappingProxyType({
    **_ROUTER_AND_BIASES,
    "gate_up_proj_blocks": "w13_weight",
    "gate_up_proj_scales": "w13_weight_scale",
    "down_proj_blocks": "w2_weight",
    "down_proj_scales": "w2_weight_scale",
})


class GptOssForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": True,
                   "sliding_window": 128, "num_experts_per_tok": 4, "swiglu_alpha": 1.702,
                   "swiglu_limit": 7.0}
    WEIGHT_MAP = WeightMap(stacked=STACKED_QKV_GATE_UP, renamed=GPT_OSS_RENAMED)
    MXFP4_WEIGHT_MAP = WeightMap(stacked=STACKED_QKV_GATE_UP, renamed=GPT_OSS_MXFP4_RENAMED)

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        if isinstance(getattr(quant_config_from_hf(hf), "scheme", None), Mxfp4Scheme):
            self.WEIGHT_MAP = self.MXFP4_WEIGHT_MAP
        self.attention = hf_self_attention_spec(
            config, qkv_bias=hf.attention_bias, o_bias=hf.attention_bias, sinks=True
        )
        self.sliding_windows = hf_sliding_windows(hf)
        self.moe = MoeSpec(
            num_experts=hf.num_local_experts, top_k=hf.num_experts_per_tok,
            intermediate_size=hf.intermediate_size, renormalize=True, router_bias=True,
            activation="clamped_swiglu", interleaved=True, expert_bias=True,
            swiglu_alpha=hf.swiglu_alpha, swiglu_limit=hf.swiglu_limit,
            checkpoint_layout=STACKED_TRANSPOSED,
        )
        super().__init__(config, prefix)

    def make_layer(self, layer_id: int, prefix: str) -> DecoderLayer:
        mlp = SparseMoeBlock.from_spec(self.moe, self.decoder.hidden_size, f"{prefix}.mlp")
        return self.self_attention_layer(layer_id, prefix, mlp)
