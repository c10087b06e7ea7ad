"""The pre-norm decoder trunk every ATOM causal LM shares.

A family file supplies one function, ``make_layer(layer_id, prefix) -> DecoderLayer``, and a
:class:`~atom_core.loader.WeightMap`; embedding, layer loop, final norm, LM head, logits and weight
loading live here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from atom_core.compile import support_torch_compile
from atom_core.config import Config
from atom_core.distributed import get_tp_group
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import hf_rope_parameters, rotary_embeddings_shared
from atom_core.layers.self_attention import DecoderSelfAttention
from atom_core.loader import StackedWeight, WeightMap, load_weights
from atom_core.log import logger

# HF q/k/v and gate/up projections, fused into one GEMM each.
STACKED_QKV_GATE_UP = [
    StackedWeight("q_proj", "qkv_proj", "q"),
    StackedWeight("k_proj", "qkv_proj", "k"),
    StackedWeight("v_proj", "qkv_proj", "v"),
    StackedWeight("gate_proj", "gate_up_proj", 0),
    StackedWeight("up_proj", "gate_up_proj", 1),
]


def join_prefix(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def layer_sliding_window(hf: Any, layer_id: int) -> int | None:
    """The sliding window of one layer: ``sliding_window`` on the layers that ``layer_types`` marks
    ``sliding_attention`` (on all layers if the config has no layer types), unless the config turns
    it off (``use_sliding_window=False``)."""
    if not getattr(hf, "use_sliding_window", True):
        return None
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is not None and layer_types[layer_id] != "sliding_attention":
        return None
    return getattr(hf, "sliding_window", None)


def mtp_layer_patterns(hf: Any) -> list[str]:
    """Checkpoint-name patterns of the ``num_nextn_predict_layers`` multi-token-prediction layers
    that hub checkpoints (GLM-4.5, DeepSeek-V3) append after the last decoder layer. ATOM serves
    the base model and skips them, as HF transformers does."""
    num_mtp_layers = getattr(hf, "num_nextn_predict_layers", 0) or 0
    first = hf.num_hidden_layers
    return [rf"model\.layers\.{i}\..*" for i in range(first, first + num_mtp_layers)]


def hf_self_attention(config: Config, layer_id: int, prefix: str, **family_args: Any) -> DecoderSelfAttention:
    """Self-attention of layer ``layer_id`` from the HF config fields every family shares (heads,
    head_dim, rope incl. partial rotary, sliding window); the family's own differences (bias,
    QK-norm, sinks) come as ``family_args``."""
    hf = config.hf_config
    return DecoderSelfAttention(
        hidden_size=hf.hidden_size,
        num_heads=hf.num_attention_heads,
        num_kv_heads=hf.num_key_value_heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        rope=hf_rope_parameters(hf),
        max_position=config.rope_positions,
        layer_id=layer_id,
        prefix=f"{prefix}.self_attn",
        sliding_window=layer_sliding_window(hf, layer_id),
        **family_args,
    )


class DecoderLayer(nn.Module):
    """x -> norm -> self_attn -> (+res) norm -> mlp, with residual adds fused into the norms."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.mlp = mlp

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


@support_torch_compile
class DecoderModel(nn.Module):
    def __init__(self, config: Config, make_layer: Callable[[int, str], nn.Module], prefix: str):
        super().__init__()
        hf = config.hf_config
        self.embed_tokens = VocabParallelEmbedding(hf.vocab_size, hf.hidden_size, f"{prefix}.embed_tokens")
        with rotary_embeddings_shared():
            self.layers = nn.ModuleList(
                make_layer(i, f"{prefix}.layers.{i}") for i in range(hf.num_hidden_layers)
            )
        self.norm = RMSNorm(hf.hidden_size, hf.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class CausalLM(nn.Module):
    """Base of every ATOM causal LM: ``forward`` returns hidden states, ``compute_logits`` logits.

    ``hf_defaults``: HF's defaults (transformers 5.23) of the optional config keys the family
    reads, for configs and transformers releases that lack them (atom_core.hosting.hf_config)."""

    hf_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: Config, make_layer: Callable[[int, str], nn.Module],
                 weight_map: WeightMap, prefix: str = ""):
        super().__init__()
        hf = config.hf_config
        self.config = config
        self.model = DecoderModel(config, make_layer, join_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(hf.vocab_size, hf.hidden_size, join_prefix(prefix, "lm_head"))
        self.weight_map = weight_map
        self.weight_map.ignored.append(r".*rotary_emb\.inv_freq")
        if getattr(hf, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
            self.weight_map.ignored.append(r"lm_head\.weight")
        tp = get_tp_group()
        logger.info("%s: TP rank %d of %d holds %d parameters", type(self).__name__, tp.rank,
                    tp.world_size, sum(p.numel() for p in self.parameters()))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_weights(self, weights, self.weight_map)
