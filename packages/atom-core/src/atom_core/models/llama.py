"""Llama (2, 3, 3.1, 3.2): the base decoder (:mod:`atom_core.models.decoder`: GQA self-attention,
rope, SwiGLU MLP, RMSNorm) with

| differs from the base decoder | LlamaForCausalLM |
|---|---|
| bias | q/k/v/o bias if ``attention_bias``, MLP bias if ``mlp_bias`` |
| rope | llama3 scaling, read from the rope settings like every rope type |
"""

from __future__ import annotations

from atom_core.config import Config
from atom_core.layers.mlp import GatedMLP
from atom_core.loader import WeightMap
from atom_core.models.decoder import (
    STACKED_QKV_GATE_UP,
    CausalLM,
    DecoderLayer,
    hf_self_attention_spec,
    hf_sliding_windows,
)


class LlamaForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                   "mlp_bias": False}
    WEIGHT_MAP = WeightMap(stacked=STACKED_QKV_GATE_UP)

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        self.attention = hf_self_attention_spec(config, qkv_bias=hf.attention_bias,
                                                o_bias=hf.attention_bias)
        self.sliding_windows = hf_sliding_windows(hf)
        self.intermediate_size = hf.intermediate_size
        self.mlp_bias = hf.mlp_bias
        super().__init__(config, prefix)

    def make_layer(self, layer_id: int, prefix: str) -> DecoderLayer:
        mlp = GatedMLP(self.decoder.hidden_size, self.intermediate_size, f"{prefix}.mlp", bias=self.mlp_bias)
        return self.self_attention_layer(layer_id, prefix, mlp)
