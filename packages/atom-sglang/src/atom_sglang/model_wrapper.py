"""SGLang model classes that serve every ATOM architecture: SGLang's model contract on the outside,
an atom-core model inside.

SGLang's registry keys a model class by its ``__name__``, which must be the HF architecture, so each
architecture gets its own subclass of :class:`ATOMForCausalLM` (see :func:`entry_class`); they differ
only in name.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

import atom_kernels
from atom_core.config import set_current_atom_config
from atom_core.log import logger
from atom_core.models import get_model_class
from atom_sglang.config_translation import atom_config_from_sglang
from atom_sglang.host_hooks import bind_forward_batch, install_sglang_hooks

_backends_logged = False


class ATOMForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        from sglang.srt.distributed import get_tensor_model_parallel_rank
        from sglang.srt.layers.logits_processor import LogitsProcessor
        from sglang.srt.server_args import get_global_server_args

        global _backends_logged
        architecture = type(self).__name__
        if quant_config is not None:
            raise NotImplementedError(
                f"ATOM's {architecture} in SGLang does not take SGLang quantization configs "
                f"({type(quant_config).__name__}) yet; set ATOM_DISABLE_SGLANG_PLUGIN=1 to serve "
                "this checkpoint with SGLang's own model"
            )
        server_args = get_global_server_args()
        self.config = config  # SGLang's model convention (its loader and LoRA read model.config)
        self.atom_config = atom_config_from_sglang(
            server_args, server_args.get_model_config(), config, get_tensor_model_parallel_rank()
        )
        set_current_atom_config(self.atom_config)
        install_sglang_hooks()
        model_cls = get_model_class(architecture)
        logger.info("Use ATOM model %s.%s for %s in SGLang", model_cls.__module__, model_cls.__name__,
                    architecture)
        if not _backends_logged:
            logger.info(atom_kernels.backend_report_line())
            _backends_logged = True
        self.model = model_cls(self.atom_config, prefix=prefix)
        self.logits_processor = LogitsProcessor(config)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.model.embed_tokens

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
        if pp_proxy_tensors is not None:
            raise NotImplementedError("ATOM models do not support pipeline parallelism yet")
        if get_embedding:
            raise NotImplementedError("ATOM models serve generation, not embeddings")
        with bind_forward_batch(forward_batch):
            hidden_states = self.model(input_ids, positions, input_embeds)
        return self.logits_processor(input_ids, hidden_states, self.model.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return {f"model.{name}" for name in self.model.load_weights(weights)}


def entry_class(architecture: str) -> type[ATOMForCausalLM]:
    """The SGLang model class for ``architecture``: an :class:`ATOMForCausalLM` of that name."""
    return type(architecture, (ATOMForCausalLM,), {"__module__": __name__, "__qualname__": architecture})
