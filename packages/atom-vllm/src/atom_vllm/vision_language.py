"""vLLM's vision-language models with ATOM's language model inside.

Each class here is vLLM's own VLM class (vision tower, multimodal processor, placement of image
embeddings, M-RoPE positions: all vLLM's), built by vLLM's own constructor, with one difference: the
language model it builds is ATOM's (:class:`ATOMLanguageModel`), which reads the text config. vLLM
hands it the merged input embeddings and, for M-RoPE models, positions of shape [3, T].

Where ATOM does not serve the configuration (atom_core.hosting.takeover), the constructor returns
vLLM's own model instead, as the text wrappers do (atom_vllm.model_wrapper).

Host internal used: vLLM 0.26's VLM constructors build their language model by a module-level class
name (``qwen3_5.Qwen3_5ForCausalLM``), which :func:`language_model_built_by_atom` points at ATOM's
class for the duration of the constructor. A constructor argument or registry lookup for the
language model (as Kimi-K2.5's ``init_vllm_registered_model`` is) would let it go.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import torch
from vllm.model_executor.models.qwen3_5 import (
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration,
)

from atom_vllm.model_wrapper import ATOMModelBase, RecurrentStateSizing, new_atom_or_vllm_model


class ATOMLanguageModel(ATOMModelBase):
    """ATOM's model as the ``language_model`` of a vLLM VLM: built with the VLM's config (ATOM reads
    its text config), loaded with the VLM's language-model tensors (``model.*``, ``lm_head.*``)."""

    def __new__(cls, *, vllm_config, prefix: str = ""):
        return object.__new__(cls)  # the VLM class decided already


@contextlib.contextmanager
def language_model_built_by_atom(module_name: str, class_name: str) -> Iterator[None]:
    module = importlib.import_module(module_name)
    host_class = getattr(module, class_name)
    setattr(module, class_name, ATOMLanguageModel)
    try:
        yield
    finally:
        setattr(module, class_name, host_class)


class VisionLanguageWrapper:
    """The parts every ATOM VLM class shares. ``LANGUAGE_MODEL``: (module, class name) of the
    language model vLLM's constructor builds."""

    LANGUAGE_MODEL: tuple[str, str]

    def __new__(cls, *, vllm_config, prefix: str = ""):
        return new_atom_or_vllm_model(cls, vllm_config, prefix)

    def __init__(self, *, vllm_config, prefix: str = "model"):
        with language_model_built_by_atom(*self.LANGUAGE_MODEL):
            super().__init__(vllm_config=vllm_config, prefix=prefix)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        return self.language_model(input_ids, positions, inputs_embeds=inputs_embeds)


class ATOMQwen3_5ForConditionalGeneration(VisionLanguageWrapper, RecurrentStateSizing,
                                          Qwen3_5ForConditionalGeneration):
    LANGUAGE_MODEL = ("vllm.model_executor.models.qwen3_5", "Qwen3_5ForCausalLM")


class ATOMQwen3_5MoeForConditionalGeneration(VisionLanguageWrapper, RecurrentStateSizing,
                                             Qwen3_5MoeForConditionalGeneration):
    LANGUAGE_MODEL = ("vllm.model_executor.models.qwen3_5", "Qwen3_5MoeForCausalLM")

    def set_moe_parameters(self) -> None:
        """vLLM's constructor collects its expert layers for expert-parallel load balancing; ATOM's
        experts keep no such state, so the model reports no MoE layers to balance (vLLM's
        ``is_mixture_of_experts`` is then False, as for ATOM's text MoE wrapper)."""
