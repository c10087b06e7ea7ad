"""Qwen3.5: the language models of ``Qwen3_5ForConditionalGeneration`` (dense) and
``Qwen3_5MoeForConditionalGeneration``, Qwen3-Next hybrids.

| differs from Qwen3-Next (:mod:`atom_core.models.qwen3_next`) | Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM |
|---|---|
| MLP | dense SwiGLU on every layer / Qwen3-Next's experts and gated shared expert on every layer, top-k always renormalised |
| Gated DeltaNet projections | shipped unfused: ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` (ATOM fuses them into ``in_proj_qkvz`` / ``in_proj_ba``) |
| rope | multimodal (M-RoPE, interleaved ``mrope_section``): positions [3, T] from the host for image tokens (atom_core.layers.rotary) |

The model reads the text config (``text_config`` of the published config). The vision tower, the
multimodal processor and the placement of image embeddings stay the host's: the host hands this
model the merged input embeddings and the M-RoPE positions.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from atom_core.layers.moe import MoeSpec
from atom_core.loader import ExpertWeightNames, Sections, StackedWeight, WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP
from atom_core.models.qwen3_next import Qwen3NextForCausalLM

STACKED_SPLIT_GATED_DELTA = (
    StackedWeight("in_proj_qkv", "in_proj_qkvz", Sections((0, 1, 2))),
    StackedWeight("in_proj_z", "in_proj_qkvz", 3),
    StackedWeight("in_proj_b", "in_proj_ba", 0),
    StackedWeight("in_proj_a", "in_proj_ba", 1),
)


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    # transformers 5.23's Qwen3_5TextConfig defaults; partial_rotary_factor sits in rope_parameters
    # on the releases that put it there, at the top level on older ones.
    hf_defaults = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                   "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25}
    split_gdn_projections = True
    WEIGHT_MAP = WeightMap(stacked=(*STACKED_QKV_GATE_UP, *STACKED_SPLIT_GATED_DELTA),
                           ignored=(r"mtp\..*",))

    def read_mlp_specs(self, hf: Any) -> None:
        self.intermediate_size = hf.intermediate_size
        self.sparse_layers = frozenset()


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    """Qwen3.5-MoE's language model: Qwen3.5 with Qwen3-Next's experts on every layer (softmax
    top-k, always renormalised, plus the sigmoid-gated shared expert)."""

    hf_defaults = {**Qwen3_5ForCausalLM.hf_defaults, "num_experts_per_tok": 8, "num_experts": 256,
                   "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}
    WEIGHT_MAP = WeightMap(stacked=Qwen3_5ForCausalLM.WEIGHT_MAP.stacked, experts=ExpertWeightNames(),
                           renamed=MappingProxyType({"shared_expert": "shared_experts"}),
                           ignored=Qwen3_5ForCausalLM.WEIGHT_MAP.ignored)

    def read_mlp_specs(self, hf: Any) -> None:
        self.intermediate_size = None  # no dense layer
        self.moe = MoeSpec(num_experts=hf.num_experts, top_k=hf.num_experts_per_tok,
                           intermediate_size=hf.moe_intermediate_size, renormalize=True,
                           shared_intermediate_size=hf.shared_expert_intermediate_size, shared_gate=True)
        self.sparse_layers = frozenset(range(hf.num_hidden_layers))
