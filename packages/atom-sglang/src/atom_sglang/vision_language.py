"""SGLang's vision-language models with ATOM's language model inside.

Each class here is SGLang's own VLM class (vision tower, multimodal processor, placement of image
embeddings, M-RoPE positions: all SGLang's), built by SGLang's own constructor. Qwen3.5's takes the
class of its language model as an argument (``language_model_cls``): ATOM's (:class:`ATOMLanguageModel`),
built with the text config. SGLang hands it the merged input embeddings and, for M-RoPE models,
positions of shape [3, T]. The LM head is ATOM's too; SGLang's logits processor runs on it. Kimi-K2.5's
builds its language model itself: see :class:`KimiK25ForConditionalGeneration`.

Each class has the architecture's name: SGLang's registry keys a class by it, and SGLang finds a
VLM's multimodal processor by it. Where ATOM does not serve the configuration
(atom_core.hosting.takeover), the constructor returns SGLang's own model instead, as the text
classes do (atom_sglang.model_wrapper).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import torch
from sglang.srt.models import kimi_k25 as sglang_kimi_k25
from sglang.srt.models import qwen3_5 as sglang_qwen3_5
from torch import nn

from atom_core.hosting.hf_config import language_model_name
from atom_sglang.config_translation import LANGUAGE_MODEL_ARCHITECTURES
from atom_sglang.host_hooks import bind_forward_batch
from atom_sglang.model_wrapper import (
    build_atom_model_in_sglang,
    entry_class,
    new_atom_or_sglang_model,
    warm_up_moe,
)
from atom_sglang.prefill_graph import keep_prefill_eager
from atom_sglang.resolved_args import server_args_in_effect


class ATOMLanguageModel(nn.Module):
    """ATOM's model as the language model of SGLang's VLM: SGLang's language-model contract outside
    (``embed_tokens``, ``forward(input_ids, positions, forward_batch, input_embeds)`` returning the
    final hidden states), ATOM's model for ``architecture`` (the VLM's) inside."""

    def __init__(self, architecture: str, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self.config = config  # SGLang's VLM reads its language model's config (layer counts)
        self.atom_model = build_atom_model_in_sglang(architecture, config, prefix)
        # The language models ATOM serves in VLMs have layers that read the batch on the host (Gated
        # DeltaNet), which a prefill replay would repeat as captured (atom_sglang.prefill_graph).
        keep_prefill_eager(server_args_in_effect())

    @property
    def embed_tokens(self) -> nn.Module:
        return self.atom_model.model.embed_tokens

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None, pp_proxy_tensors=None,
                input_deepstack_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """``input_deepstack_embeds``: SGLang's Qwen3-VL machinery hands them over; Qwen3.5 has none
        (HF's model adds none, the published configs list no deepstack layers), so they are not read."""
        with bind_forward_batch(forward_batch):
            return self.atom_model(input_ids, positions, input_embeds)


class VisionLanguageWrapper:
    """The parts every ATOM VLM class shares, before SGLang's VLM class in the bases."""

    def __new__(cls, config, quant_config=None, prefix: str = ""):
        return new_atom_or_sglang_model(cls, config, quant_config, prefix)

    def __init__(self, config, quant_config=None, prefix: str = ""):
        language_model_cls = functools.partial(ATOMLanguageModel, type(self).__name__)
        super().__init__(config, quant_config, prefix, language_model_cls=language_model_cls)
        self.lm_head = self.model.atom_model.lm_head  # in place of the head SGLang's constructor made

    def precompile_kernels_after_loading(self) -> None:
        warm_up_moe(self.model.atom_model)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The vision tower's tensors (``model.visual.*``) through SGLang's loader, the others (the
        language model's, renamed as ATOM's language model names them) through ATOM's."""
        vision_tower = []

        def language_model_tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith("model.visual."):
                    vision_tower.append((name, tensor))
                else:
                    yield language_model_name(name), tensor

        loaded = {f"model.atom_model.{name}" for name in self.model.atom_model.load_weights(language_model_tensors())}
        return loaded | set(super().load_weights(vision_tower) or ())


class Qwen3_5ForConditionalGeneration(VisionLanguageWrapper, sglang_qwen3_5.Qwen3_5ForConditionalGeneration):
    pass


class Qwen3_5MoeForConditionalGeneration(VisionLanguageWrapper, sglang_qwen3_5.Qwen3_5MoeForConditionalGeneration):
    pass


class KimiK25ForConditionalGeneration(sglang_kimi_k25.KimiK25ForConditionalGeneration):
    """SGLang's Kimi-K2.5 (MoonViT tower, projector, processor) around ATOM's DeepSeek-V3. SGLang's
    constructor builds its ``DeepseekV3ForCausalLM`` directly, unless the config is encoder-only (the
    vision half of SGLang's encoder/language disaggregation): it is built that way here, and ATOM's
    SGLang class of the language model's architecture goes in as ``language_model``. That class keeps
    SGLang's causal-LM contract (embeddings in, logits out), which SGLang's forward and weight loading
    (``language_model.*`` names, prefix dropped) already call."""

    def __new__(cls, config, quant_config=None, prefix: str = "", **kwargs):
        return new_atom_or_sglang_model(cls, config, quant_config, prefix)

    def __init__(self, config, quant_config=None, prefix: str = "", **kwargs):
        encoder_only, config.encoder_only = config.encoder_only, True
        try:
            super().__init__(config, quant_config, prefix, **kwargs)
        finally:
            config.encoder_only = encoder_only
        language_model_cls = entry_class(LANGUAGE_MODEL_ARCHITECTURES[type(self).__name__])
        self.language_model = language_model_cls(config.text_config, quant_config, prefix)

    def precompile_kernels_after_loading(self) -> None:
        self.language_model.precompile_kernels_after_loading()

    def post_load_weights(self) -> None:
        """SGLang's DeepSeek-V3 derives its absorbed MLA weights here; ATOM's model does that in its
        own ``load_weights``, so there is nothing left to do."""
