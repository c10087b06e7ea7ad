"""The pre-norm decoder trunk every ATOM causal LM shares, and the HF-config readers the families share.

A family file is one :class:`CausalLM` subclass with the same shape:

- ``WEIGHT_MAP``: a class constant, HF checkpoint names -> ATOM parameter names (never mutated;
  each model instance extends a copy with what its config adds, see :meth:`CausalLM.__init__`);
- ``__init__``: turns the HF config, once, into typed specs (:class:`SelfAttentionSpec` with its
  :class:`RopeSpec`, :class:`MoeSpec`, layer sets), then builds the trunk; layers never see the HF
  config;
- ``make_layer(layer_id, prefix)``: the one method that builds a :class:`DecoderLayer` from them.

Embedding, layer loop, final norm, LM head, logits and weight loading live here once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from atom_core.compile import support_torch_compile
from atom_core.config import Config
from atom_core.distributed import get_tp_group
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.linear import input_quant_of
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.moe import SparseMoeBlock
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import RopeSpec, hf_rope_parameters, rotary_embeddings_shared
from atom_core.layers.self_attention import DecoderSelfAttention, SelfAttentionSpec
from atom_core.loader import StackedWeight, WeightMap, load_weights
from atom_core.log import logger
from atom_core.quantization import quant_config_from_hf, quantized_layers

# HF gate/up projections, fused into one GEMM; with q/k/v likewise.
STACKED_GATE_UP = (
    StackedWeight("gate_proj", "gate_up_proj", 0),
    StackedWeight("up_proj", "gate_up_proj", 1),
)
STACKED_QKV_GATE_UP = (
    StackedWeight("q_proj", "qkv_proj", "q"),
    StackedWeight("k_proj", "qkv_proj", "k"),
    StackedWeight("v_proj", "qkv_proj", "v"),
    *STACKED_GATE_UP,
)


def join_prefix(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass(frozen=True)
class DecoderSpec:
    """The trunk: embedding, layer count, RMSNorm eps (every norm of the trunk and its layers), LM
    head. ``num_mtp_layers``: multi-token-prediction layers that hub checkpoints (GLM-4.5,
    DeepSeek-V3) append after the last decoder layer; ATOM serves the base model and skips them, as
    HF transformers does. ``zero_centred_norms``: the trunk's and layers' norms scale by ``1 + w``
    (:class:`RMSNorm`), a property of the family rather than of its config."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    num_mtp_layers: int
    zero_centred_norms: bool = False

    @classmethod
    def from_hf(cls, hf: Any, zero_centred_norms: bool = False) -> DecoderSpec:
        return cls(
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            num_layers=hf.num_hidden_layers,
            rms_norm_eps=hf.rms_norm_eps,
            tie_word_embeddings=getattr(hf, "tie_word_embeddings", False),
            num_mtp_layers=getattr(hf, "num_nextn_predict_layers", 0) or 0,
            zero_centred_norms=zero_centred_norms,
        )


def hf_rope_spec(hf: Any) -> RopeSpec:
    return RopeSpec.from_parameters(hf_rope_parameters(hf))


def hf_self_attention_spec(config: Config, **family_args: Any) -> SelfAttentionSpec:
    """Self-attention from the HF config fields every family shares (heads, head_dim, rope incl.
    partial rotary); the family's own differences (bias, QK-norm, sinks) come as ``family_args``."""
    hf = config.hf_config
    return SelfAttentionSpec(
        hidden_size=hf.hidden_size,
        num_heads=hf.num_attention_heads,
        num_kv_heads=hf.num_key_value_heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        rope=hf_rope_spec(hf),
        max_position=config.rope_positions,
        **family_args,
    )


def hf_sliding_windows(hf: Any) -> tuple[int | None, ...]:
    """Each layer's sliding window: ``sliding_window`` on the layers that ``layer_types`` marks
    ``sliding_attention`` (on all layers if the config has no layer types), unless the config turns
    it off (``use_sliding_window=False``)."""
    layer_types = getattr(hf, "layer_types", None)
    window = getattr(hf, "sliding_window", None) if getattr(hf, "use_sliding_window", True) else None
    return tuple(
        None if layer_types is not None and layer_types[i] != "sliding_attention" else window
        for i in range(hf.num_hidden_layers)
    )


class DecoderLayer(nn.Module):
    """x -> norm -> mixer -> (+res) norm -> mlp, with residual adds fused into the norms.

    The mixer (``mixer(positions, x)``) is self-attention, named ``self_attn``, or in hybrid models
    another token mixer under its checkpoint name (``mixer_name``: Qwen3-Next's ``linear_attn``).
    Each norm emits its output quantized where the module after it takes it so (``input_quant_of``:
    dynamic FP8 QKV or gate/up)."""

    def __init__(self, mixer: nn.Module, mlp: nn.Module, hidden_size: int, eps: float,
                 zero_centred_norms: bool = False, mixer_name: str = "self_attn"):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps, zero_centred_norms, input_quant_of(mixer))
        self.mixer_name = mixer_name
        self.add_module(mixer_name, mixer)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps, zero_centred_norms,
                                                input_quant_of(mlp))
        self.mlp = mlp

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = getattr(self, self.mixer_name)(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


@support_torch_compile
class DecoderModel(nn.Module):
    def __init__(self, config: Config, spec: DecoderSpec, make_layer: Callable[[int, str], nn.Module],
                 prefix: str):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size,
                                                   f"{prefix}.embed_tokens")
        with rotary_embeddings_shared():
            self.layers = nn.ModuleList(
                make_layer(i, f"{prefix}.layers.{i}") for i in range(spec.num_layers)
            )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.zero_centred_norms)

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
    reads, for configs and transformers releases that lack them (atom_core.hosting.hf_config).
    A subclass sets ``WEIGHT_MAP`` (and ``zero_centred_norms`` if its norms scale by ``1 + w``),
    reads its specs in ``__init__`` before calling this one, and implements :meth:`make_layer`."""

    hf_defaults: ClassVar[dict[str, Any]] = {}
    zero_centred_norms: ClassVar[bool] = False
    WEIGHT_MAP: ClassVar[WeightMap]

    def __init__(self, config: Config, prefix: str = ""):
        super().__init__()
        self.config = config
        self.decoder = DecoderSpec.from_hf(config.hf_config, self.zero_centred_norms)
        with quantized_layers(quant_config_from_hf(config.hf_config), self.WEIGHT_MAP.checkpoint_modules):
            self.model = DecoderModel(config, self.decoder, self.make_layer,
                                      join_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(self.decoder.vocab_size, self.decoder.hidden_size,
                                      join_prefix(prefix, "lm_head"))
        first_mtp, num_mtp = self.decoder.num_layers, self.decoder.num_mtp_layers
        ignored = [*self.WEIGHT_MAP.ignored, r".*rotary_emb\.inv_freq",
                   *(rf"model\.layers\.{i}\..*" for i in range(first_mtp, first_mtp + num_mtp))]
        if self.decoder.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
            ignored.append(r"lm_head\.weight")
        self.weight_map = dataclasses.replace(self.WEIGHT_MAP, ignored=ignored)
        self.weights_loaded = False
        tp = get_tp_group()
        logger.info("%s: TP rank %d of %d holds %d parameters", type(self).__name__, tp.rank,
                    tp.world_size, sum(p.numel() for p in self.parameters()))

    def make_layer(self, layer_id: int, prefix: str) -> nn.Module:
        """Decoder layer ``layer_id``, named ``prefix``, built from the specs ``__init__`` read."""
        raise NotImplementedError

    def self_attention_layer(self, layer_id: int, prefix: str, mlp: nn.Module) -> DecoderLayer:
        """The layer of the families with HF-style self-attention: ``self.attention`` (the
        :class:`SelfAttentionSpec`) with this layer's window from ``self.sliding_windows``, then
        ``mlp``."""
        attention = DecoderSelfAttention(self.attention, layer_id, f"{prefix}.self_attn",
                                         self.sliding_windows[layer_id])
        return self.decoder_layer(attention, mlp)

    def decoder_layer(self, mixer: nn.Module, mlp: nn.Module,
                      mixer_name: str = "self_attn") -> DecoderLayer:
        """A :class:`DecoderLayer` of this trunk's width and norms around ``mixer`` and ``mlp``."""
        d = self.decoder
        return DecoderLayer(mixer, mlp, d.hidden_size, d.rms_norm_eps, d.zero_centred_norms, mixer_name)

    def sparse_or_dense_mlp(self, layer_id: int, prefix: str) -> nn.Module:
        """The experts (``self.moe``) on the layers in ``self.sparse_layers``, else a dense gated
        MLP of ``self.intermediate_size``."""
        if layer_id in self.sparse_layers:
            return SparseMoeBlock.from_spec(self.moe, self.decoder.hidden_size, f"{prefix}.mlp")
        return GatedMLP(self.decoder.hidden_size, self.intermediate_size, f"{prefix}.mlp")

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The first call loads the checkpoint, which must be complete. Later calls update a running
        engine's weights (RL frameworks send them in buckets), so any subset of the tensors will do."""
        loaded = load_weights(self, weights, self.weight_map, complete=not self.weights_loaded)
        self.weights_loaded = True
        return loaded
