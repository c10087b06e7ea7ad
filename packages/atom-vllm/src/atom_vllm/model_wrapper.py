"""vLLM model classes that serve every ATOM architecture: vLLM's model contract on the outside,
an atom-core model inside. ``ATOMForCausalLM`` (dense) and ``ATOMMoEForCausalLM`` (MoE) differ only
in name, so logs and `vllm` model inspection tell them apart; ``ATOMHybridForCausalLM`` serves
architectures with recurrent-state layers (Qwen3-Next), and tells vLLM how to size their state cache.

Constructing one first decides whether ATOM serves this configuration at all
(atom_core.hosting.takeover); where it does not, the constructor returns vLLM's own model instead,
built as vLLM would have built it, and vLLM's attention serves it too (atom_vllm.platform).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from atom_core.hosting.build import build_atom_model
from atom_core.hosting.takeover import new_wrapper_or_host_model
from atom_core.models import get_model_class
from atom_vllm.config_translation import atom_config_from_vllm, takeover_decision
from atom_vllm.host_hooks import install_vllm_hooks


def host_class(vllm_config) -> type:
    """vLLM's own model class for this configuration's architecture."""
    from vllm import ModelRegistry

    from atom_vllm.registry_entry import host_model_class

    return host_model_class(ModelRegistry, vllm_config.model_config.architectures[0])


def build_host_model(vllm_config, prefix: str) -> nn.Module:
    """vLLM's own model for this configuration, as vLLM's loader builds it: its class for the
    architecture, converted for a pooling runner the way vLLM converts it."""
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.model_executor.models.adapters import as_embedding_model, as_seq_cls_model

    model_config = vllm_config.model_config
    model_class = host_class(vllm_config)
    convert = {"none": lambda cls: cls, "embed": as_embedding_model, "classify": as_seq_cls_model}
    model_class = convert[model_config.convert_type](model_class)
    return initialize_model(vllm_config, prefix=prefix, model_class=model_class)


def new_atom_or_vllm_model(cls: type, vllm_config, prefix: str):
    """What an ATOM model class's ``__new__`` returns: a new ``cls`` where ATOM serves this
    configuration, else vLLM's own model (atom_core.hosting.takeover.new_wrapper_or_host_model)."""
    return new_wrapper_or_host_model(
        cls, takeover_decision(vllm_config), lambda: build_host_model(vllm_config, prefix)
    )


class ATOMModelBase(nn.Module):
    def __new__(cls, *, vllm_config, prefix: str = ""):
        return new_atom_or_vllm_model(cls, vllm_config, prefix)

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        install_vllm_hooks(vllm_config)
        self.model = build_atom_model(
            atom_config_from_vllm(vllm_config),
            vllm_config.model_config.architectures[0],
            "vLLM",
            prefix,
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors=None, inputs_embeds: torch.Tensor | None = None,
                **kwargs) -> torch.Tensor:
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden_states)

    def make_empty_intermediate_tensors(self, *args, **kwargs):
        """vLLM's pipeline-parallel hook, which its VLM constructors read off their language model
        (Kimi-K2.5's builds ATOM's through vLLM's registry); ATOM hands pipeline parallelism back."""
        raise NotImplementedError("ATOM hands pipeline parallelism back to vLLM")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return {f"model.{name}" for name in self.model.load_weights(weights)}


class ATOMForCausalLM(ATOMModelBase):
    pass


class ATOMMoEForCausalLM(ATOMModelBase):
    pass


class RecurrentStateSizing:
    """vLLM's hybrid-model class methods (its ``IsHybrid`` interface, which the registry entry reports
    from vLLM's own class), for ATOM's classes of models with recurrent-state layers. vLLM calls them
    on the registered class, before any model is built, to size the state cache: ATOM's state layout
    where ATOM serves, vLLM's own class's where it hands the model back. The copy functions vLLM asks
    of the built model, so a handed-back model gives its own."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config) -> tuple[tuple[int, ...], ...]:
        if not takeover_decision(vllm_config).atom_serves:
            return host_class(vllm_config).get_mamba_state_shape_from_config(vllm_config)
        model_config = vllm_config.model_config
        return get_model_class(model_config.architectures[0]).recurrent_state_shapes(
            model_config.hf_text_config, vllm_config.parallel_config.tensor_parallel_size)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config) -> tuple[torch.dtype, ...]:
        if not takeover_decision(vllm_config).atom_serves:
            return host_class(vllm_config).get_mamba_state_dtype_from_config(vllm_config)
        from atom_vllm.attention.gated_delta import state_dtypes

        return state_dtypes(vllm_config)

    @classmethod
    def get_mamba_state_copy_func(cls):
        """How vLLM copies a state block under prefix caching: whole blocks (without speculative
        decoding, which ATOM hands back, vLLM's Gated DeltaNet copy functions copy whole blocks
        whatever their layout)."""
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator

        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()

    @classmethod
    def get_mamba_state_copy_funcs(cls, mamba_types) -> dict:
        """The same per state-backend type: what vLLM 0.32's runner asks (0.26's asks the one above)."""
        return dict.fromkeys(mamba_types, cls.get_mamba_state_copy_func())


class ATOMHybridForCausalLM(RecurrentStateSizing, ATOMModelBase):
    pass
