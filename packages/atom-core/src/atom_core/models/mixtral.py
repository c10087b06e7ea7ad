"""Mixtral: the base decoder (:mod:`atom_core.models.decoder`) with routed experts in every layer.

| differs from the base decoder | MixtralForCausalLM |
|---|---|
| sliding window | ``sliding_window`` on every layer, if set |
| MLP | softmax top-k experts, renormalised, no shared experts |
| checkpoint names | block ``block_sparse_moe``, experts' gate/down/up ``w1``/``w2``/``w3`` |
"""

from __future__ import annotations

from types import MappingProxyType

from atom_core.config import Config
from atom_core.layers.moe import MoeSpec, SparseMoeBlock
from atom_core.loader import ExpertWeightNames, WeightMap
from atom_core.models.decoder import (
    STACKED_QKV_GATE_UP,
    CausalLM,
    DecoderLayer,
    hf_self_attention_spec,
    hf_sliding_windows,
)


class MixtralForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": None,
                   "num_experts_per_tok": 2}
    WEIGHT_MAP = WeightMap(
        stacked=STACKED_QKV_GATE_UP,
        experts=ExpertWeightNames(gate="w1", up="w3", down="w2"),
        renamed=MappingProxyType({"block_sparse_moe": "mlp"}),
    )

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        self.attention = hf_self_attention_spec(config)
        self.sliding_windows = hf_sliding_windows(hf)
        self.moe = MoeSpec(num_experts=hf.num_local_experts, top_k=hf.num_experts_per_tok,
                           intermediate_size=hf.intermediate_size, renormalize=True)
        super().__init__(config, prefix)

    def make_layer(self, layer_id: int, prefix: str) -> DecoderLayer:
        mlp = SparseMoeBlock.from_spec(self.moe, self.decoder.hidden_size, f"{prefix}.mlp")
        return self.self_attention_layer(layer_id, prefix, mlp)
