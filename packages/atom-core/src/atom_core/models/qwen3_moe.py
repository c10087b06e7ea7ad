"""Qwen3-MoE: Qwen3 (:mod:`atom_core.models.qwen3`) with routed experts.

| differs from the base decoder | Qwen3MoeForCausalLM |
|---|---|
| attention | Qwen3's: QK-norm, ``attention_bias``, ``use_sliding_window`` |
| MLP | softmax top-k experts (renormalised if ``norm_topk_prob``), no shared experts, on every ``decoder_sparse_step``-th layer; dense SwiGLU on ``mlp_only_layers`` |
"""

from __future__ import annotations

from typing import Any

from atom_core.config import Config
from atom_core.layers.moe import MoeSpec
from atom_core.loader import ExpertWeightNames, WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer, hf_sliding_windows
from atom_core.models.qwen3 import QWEN3_HF_DEFAULTS, qwen3_attention_spec


def qwen3_moe_sparse_layers(hf: Any) -> frozenset[int]:
    """The layers with experts: every ``decoder_sparse_step``-th but the ``mlp_only_layers``."""
    return frozenset(
        i for i in range(hf.num_hidden_layers)
        if i not in (hf.mlp_only_layers or []) and hf.num_experts > 0
        and (i + 1) % hf.decoder_sparse_step == 0
    )


class Qwen3MoeForCausalLM(CausalLM):
    hf_defaults = {**QWEN3_HF_DEFAULTS, "num_experts_per_tok": 8, "norm_topk_prob": False,
                   "decoder_sparse_step": 1, "mlp_only_layers": []}
    WEIGHT_MAP = WeightMap(stacked=STACKED_QKV_GATE_UP, experts=ExpertWeightNames())

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        self.attention = qwen3_attention_spec(config)
        self.sliding_windows = hf_sliding_windows(hf)
        self.intermediate_size = hf.intermediate_size
        self.moe = MoeSpec(num_experts=hf.num_experts, top_k=hf.num_experts_per_tok,
                           intermediate_size=hf.moe_intermediate_size, renormalize=hf.norm_topk_prob)
        self.sparse_layers = qwen3_moe_sparse_layers(hf)
        super().__init__(config, prefix)

    def make_layer(self, layer_id: int, prefix: str) -> DecoderLayer:
        return self.self_attention_layer(layer_id, prefix, self.sparse_or_dense_mlp(layer_id, prefix))
