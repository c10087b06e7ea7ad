"""Qwen3 (dense): the base decoder (:mod:`atom_core.models.decoder`: GQA self-attention, rope,
SwiGLU MLP, RMSNorm) with

| differs from the base decoder | Qwen3ForCausalLM |
|---|---|
| QK-norm | per-head RMSNorm of q and k (eps ``rms_norm_eps``) |
| bias | q/k/v/o bias if ``attention_bias`` |
| sliding window | only with ``use_sliding_window`` (off by HF's default) |
"""

from __future__ import annotations

from atom_core.config import Config
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.self_attention import SelfAttentionSpec
from atom_core.loader import WeightMap
from atom_core.models.decoder import (
    STACKED_QKV_GATE_UP,
    CausalLM,
    DecoderLayer,
    hf_self_attention_spec,
    hf_sliding_windows,
)

QWEN3_HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                     "use_sliding_window": False, "sliding_window": None}


def qwen3_attention_spec(config: Config) -> SelfAttentionSpec:
    hf = config.hf_config
    return hf_self_attention_spec(config, qkv_bias=hf.attention_bias, o_bias=hf.attention_bias,
                                  qk_norm_eps=hf.rms_norm_eps)


class Qwen3ForCausalLM(CausalLM):
    hf_defaults = QWEN3_HF_DEFAULTS
    WEIGHT_MAP = WeightMap(stacked=STACKED_QKV_GATE_UP)

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        self.attention = qwen3_attention_spec(config)
        self.sliding_windows = hf_sliding_windows(hf)
        self.intermediate_size = hf.intermediate_size
        super().__init__(config, prefix)

    def make_layer(self, layer_id: int, prefix: str) -> DecoderLayer:
        return self.self_attention_layer(
            layer_id, prefix, GatedMLP(self.decoder.hidden_size, self.intermediate_size, f"{prefix}.mlp"))
