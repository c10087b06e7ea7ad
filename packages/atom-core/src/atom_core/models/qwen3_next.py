"""Qwen3-Next (Qwen3-Next-80B-A3B): a hybrid of Gated DeltaNet linear attention and gated
self-attention over Qwen3-MoE's experts.

| differs from Qwen3-MoE (:mod:`atom_core.models.qwen3_moe`) | Qwen3NextForCausalLM |
|---|---|
| token mixer | per ``layer_types``: ``linear_attention`` layers run a Gated DeltaNet (:mod:`atom_core.layers.gated_delta_net`, checkpoint name ``linear_attn``), ``full_attention`` layers (every ``full_attention_interval``-th in published configs) self-attention |
| self-attention | QK-norm, partial rotary (``partial_rotary_factor``, 0.25 published), and a per-head sigmoid output gate from ``q_proj`` |
| norms | zero-centred: every RMSNorm but the Gated DeltaNet's output norm scales by ``1 + w`` |
| MLP | Qwen3-MoE's softmax top-k experts plus one shared expert (``shared_expert``) scaled by ``sigmoid(shared_expert_gate(x))`` |

Hub checkpoints carry a multi-token-prediction block (``mtp.*``); ATOM serves the base model and
skips it, as HF transformers does.

Its Gated DeltaNet layers keep a recurrent state per sequence, which the host caches
(:mod:`atom_core.layers.gated_delta_core`; :meth:`Qwen3NextForCausalLM.recurrent_state_shapes` sizes
it): vLLM's glue keeps it in vLLM's state cache, SGLang's glue in SGLang's state pool.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import ClassVar

from atom_core.config import Config
from atom_core.distributed import divide
from atom_core.hosting.hf_config import complete_hf_config
from atom_core.layers.gated_delta_core import gated_delta_state_shapes
from atom_core.layers.gated_delta_net import GatedDeltaNet, GatedDeltaNetSpec
from atom_core.layers.moe import MoeSpec
from atom_core.loader import ExpertWeightNames, WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP, CausalLM, DecoderLayer, hf_self_attention_spec
from atom_core.models.qwen3_moe import qwen3_moe_sparse_layers

LINEAR_ATTENTION = "linear_attention"


class Qwen3NextForCausalLM(CausalLM):
    hf_defaults = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                   "num_experts_per_tok": 10, "norm_topk_prob": True, "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "linear_conv_kernel_dim": 4,
                   "shared_expert_intermediate_size": 512}
    zero_centred_norms = True
    WEIGHT_MAP = WeightMap(
        stacked=STACKED_QKV_GATE_UP,
        experts=ExpertWeightNames(),
        renamed=MappingProxyType({"shared_expert": "shared_experts"}),
        ignored=(r"mtp\..*",),
    )

    # Qwen3.5's checkpoints ship the Gated DeltaNet projections unfused (atom_core.layers.gated_delta_net).
    split_gdn_projections: ClassVar[bool] = False

    def __init__(self, config: Config, prefix: str = ""):
        hf = config.hf_config
        self.attention = hf_self_attention_spec(
            config, qkv_bias=hf.attention_bias, o_bias=hf.attention_bias,
            qk_norm_eps=hf.rms_norm_eps, qk_norm_zero_centred=True, output_gate=True,
        )
        self.sliding_windows = (None,) * hf.num_hidden_layers
        self.linear_attention = GatedDeltaNetSpec(
            hidden_size=hf.hidden_size,
            num_k_heads=hf.linear_num_key_heads,
            num_v_heads=hf.linear_num_value_heads,
            head_k_dim=hf.linear_key_head_dim,
            head_v_dim=hf.linear_value_head_dim,
            conv_kernel_size=hf.linear_conv_kernel_dim,
            rms_norm_eps=hf.rms_norm_eps,
            split_projections=self.split_gdn_projections,
        )
        self.layer_types = tuple(hf.layer_types)
        self.read_mlp_specs(hf)
        super().__init__(config, prefix)

    def read_mlp_specs(self, hf) -> None:
        """The MLP of each layer (:meth:`CausalLM.sparse_or_dense_mlp`): Qwen3-MoE's experts with a
        gated shared expert, dense on ``mlp_only_layers``."""
        self.intermediate_size = hf.intermediate_size
        self.moe = MoeSpec(num_experts=hf.num_experts, top_k=hf.num_experts_per_tok,
                           intermediate_size=hf.moe_intermediate_size, renormalize=hf.norm_topk_prob,
                           shared_intermediate_size=hf.shared_expert_intermediate_size,
                           shared_gate=True)
        self.sparse_layers = qwen3_moe_sparse_layers(hf)

    @classmethod
    def recurrent_state_shapes(cls, hf_config, tp_size: int) -> tuple[tuple[int, ...], ...]:
        """The per-sequence states of each Gated DeltaNet layer on one of ``tp_size`` ranks, as
        its core keeps them (atom_core.layers.gated_delta_core): for a host sizing its state cache
        before the model is built."""
        hf = complete_hf_config(hf_config, cls.hf_defaults)
        return gated_delta_state_shapes(
            divide(hf.linear_num_key_heads, tp_size), divide(hf.linear_num_value_heads, tp_size),
            hf.linear_key_head_dim, hf.linear_value_head_dim, hf.linear_conv_kernel_dim,
        )

    def make_layer(self, layer_id: int, prefix: str) -> DecoderLayer:
        mlp = self.sparse_or_dense_mlp(layer_id, prefix)
        if self.layer_types[layer_id] == LINEAR_ATTENTION:
            mixer = GatedDeltaNet(self.linear_attention, layer_id, f"{prefix}.linear_attn")
            return self.decoder_layer(mixer, mlp, mixer_name="linear_attn")
        return self.self_attention_layer(layer_id, prefix, mlp)
