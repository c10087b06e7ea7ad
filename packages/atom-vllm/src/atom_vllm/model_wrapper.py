"""vLLM model classes that serve every ATOM architecture: vLLM's model contract on the outside,
an atom-core model inside. ``ATOMForCausalLM`` (dense) and ``ATOMMoEForCausalLM`` (MoE) differ only
in name, so logs and `vllm` model inspection tell them apart."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

import atom_kernels
from atom_core.config import set_current_atom_config
from atom_core.log import logger
from atom_core.models import get_model_class
from atom_vllm import envs
from atom_vllm.config_translation import atom_config_from_vllm
from atom_vllm.host_hooks import install_vllm_hooks

_backends_logged = False


class ATOMModelBase(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        global _backends_logged
        self.atom_config = atom_config_from_vllm(
            vllm_config, use_atom_attention=not envs.attention_disabled()
        )
        set_current_atom_config(self.atom_config)
        install_vllm_hooks(vllm_config)
        architecture = vllm_config.model_config.architectures[0]
        model_cls = get_model_class(architecture)
        logger.info("Use ATOM model %s.%s for %s", model_cls.__module__, model_cls.__name__, architecture)
        if not _backends_logged:
            logger.info(atom_kernels.backend_report_line())
            _backends_logged = True
        self.model = model_cls(self.atom_config, prefix=prefix)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors=None, inputs_embeds: torch.Tensor | None = None,
                **kwargs) -> torch.Tensor:
        if intermediate_tensors is not None:
            raise NotImplementedError("ATOM models do not support pipeline parallelism yet")
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return {f"model.{name}" for name in self.model.load_weights(weights)}


class ATOMForCausalLM(ATOMModelBase):
    pass


class ATOMMoEForCausalLM(ATOMModelBase):
    pass
