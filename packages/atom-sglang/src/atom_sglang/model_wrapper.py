"""SGLang model classes that serve every ATOM architecture: SGLang's model contract on the outside,
an atom-core model inside.

Constructing one first decides whether ATOM serves this configuration at all
(atom_core.hosting.takeover); where it does not, the constructor returns SGLang's own model instead,
and SGLang's attention serves it too (atom_sglang.patches).

SGLang's registry keys a model class by its ``__name__``, which must be the HF architecture, so each
architecture gets its own subclass of :class:`ATOMForCausalLM` (see :func:`entry_class`); they differ
only in name.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from torch import nn

from atom_core.hosting.build import build_atom_model
from atom_core.hosting.takeover import new_wrapper_or_host_model
from atom_core.hosting.warmup import log_warm_up, warm_up_moe_layers
from atom_sglang.config_translation import atom_config_from_sglang, takeover_decision
from atom_sglang.host_hooks import install_sglang_hooks
from atom_sglang.prefill_graph import PrefillBody, keep_prefill_eager
from atom_sglang.resolved_args import model_config_of, server_args_in_effect


def host_model_class(architecture: str) -> type[nn.Module]:
    """SGLang's own model class for ``architecture`` (the one ATOM's package replaced in SGLang's
    registry; SGLang's import of its package is cached, so this imports nothing new)."""
    from sglang.srt.models.registry import import_model_classes

    classes = import_model_classes("sglang.srt.models")
    if architecture not in classes:
        raise RuntimeError(f"SGLang has no model class of its own for {architecture} to hand it back to "
                           "(is it in SGLANG_DISABLED_MODEL_ARCHS?)")
    return classes[architecture]


def new_atom_or_sglang_model(cls: type, config, quant_config, prefix: str) -> nn.Module:
    """The ``__new__`` of ATOM's SGLang model classes: an instance of ``cls`` where ATOM serves the
    configuration, else SGLang's own model for the architecture (``cls.__name__``)."""
    server_args = server_args_in_effect()
    return new_wrapper_or_host_model(
        cls,
        takeover_decision(server_args, model_config_of(server_args)),
        lambda: host_model_class(cls.__name__)(config=config, quant_config=quant_config, prefix=prefix),
    )


def build_atom_model_in_sglang(architecture: str, hf_config, prefix: str) -> nn.Module:
    """ATOM's model for ``architecture``, from the HF config SGLang hands the model class (a
    vision-language model's text config for its language model), with ATOM's hooks into SGLang."""
    install_sglang_hooks()
    atom_config = atom_config_from_sglang(model_config_of(server_args_in_effect()), hf_config)
    return build_atom_model(atom_config, architecture, "SGLang", prefix)


def warm_up_moe(atom_model: nn.Module) -> None:
    """Compile the routing and the fused MoE for every batch size before serving
    (atom_core.hosting.warmup), from SGLang's hook right after loading
    (``precompile_kernels_after_loading``). Otherwise their first call at a new size would: in the
    decode CUDA-graph capture's warm-up runs where SGLang captures, in the first request where it
    does not."""
    start = time.perf_counter()
    expert_layers = warm_up_moe_layers(atom_model, atom_model.model.embed_tokens.weight.dtype)
    if expert_layers:
        log_warm_up(f"routing and fused MoE of {expert_layers} expert layer(s)", time.perf_counter() - start)


class ATOMForCausalLM(nn.Module):
    def __new__(cls, config, quant_config=None, prefix: str = ""):
        return new_atom_or_sglang_model(cls, config, quant_config, prefix)

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        from sglang.srt.layers.logits_processor import LogitsProcessor

        self.config = config  # SGLang's model convention (its loader and LoRA read model.config)
        self.atom_model = build_atom_model_in_sglang(type(self).__name__, config, prefix)
        server_args = server_args_in_effect()
        # SGLang's name for its transformer body, which its prefill CUDA graph captures (prefill_graph).
        self.model = PrefillBody(self.atom_model)
        if not self.model.layers:
            keep_prefill_eager(server_args)
        self.logits_processor = LogitsProcessor(config)

    def get_input_embeddings(self) -> nn.Module:
        return self.atom_model.model.embed_tokens

    def get_attention_sliding_window_size(self) -> int | None:
        """SGLang-convention window of the windowed layers (one per model in every ATOM family)."""
        from sglang.srt.layers.radix_attention import RadixAttention

        windows = {m.sliding_window_size for m in self.modules()
                   if isinstance(m, RadixAttention) and m.sliding_window_size >= 0}
        return max(windows) if windows else None

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None, get_embedding: bool = False,
                pp_proxy_tensors=None):
        # Through the body's own ``forward``: SGLang swaps it for its captured graphs at a prefill replay.
        hidden_states = self.model.forward(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden_states, self.atom_model.lm_head, forward_batch)

    def precompile_kernels_after_loading(self) -> None:
        warm_up_moe(self.atom_model)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return {f"atom_model.{name}" for name in self.atom_model.load_weights(weights)}


def entry_class(architecture: str) -> type[ATOMForCausalLM]:
    """The SGLang model class for ``architecture``: an :class:`ATOMForCausalLM` of that name."""
    return type(architecture, (ATOMForCausalLM,), {"__module__": __name__, "__qualname__": architecture})
