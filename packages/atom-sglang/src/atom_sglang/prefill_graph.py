"""ATOM's models under SGLang's prefill CUDA graph.

On a GPU, SGLang (0.5.17 to 0.5.23) captures prefill by default with its "breakable" CUDA-graph
backend: it follows ``.model`` from the model until a module with ``layers``, the transformer body,
and calls it with SGLang's body signature ``(input_ids, positions, forward_batch, input_embeds)``. It
captures the body per token count, breaking the graph at every attention layer: that layer's
``RadixAttention`` (found as ``layers[i].self_attn.attn``) runs eagerly at replay, on the live batch's
metadata. At replay SGLang swaps the body's ``forward`` for the graphs and runs the model's own
``forward`` eagerly around it (embedding lookup inside the body, logits after it).

ATOM's decoder has atom-core's signature and reads the batch from the model wrapper's context
(atom_sglang.host_hooks), so the wrapper hands SGLang a :class:`PrefillBody` as its ``.model`` instead.
Eager prefill costs MoE models much of their speed: the GPU waits on Python between kernels (Qwen3-30B-
A3B-FP8 on an H200: SGLang alone with its prefill graph off idles about as long as ATOM did,
docs/performance.md, "SGLang on an H200").

Only models whose every layer attends through one ATOM ``RadixAttentionImpl`` (MHA / GQA) are
captured. Gated DeltaNet cores read the batch on the host and MLA impls branch on it, which a replay
would repeat as captured: those models prefill eagerly (:func:`keep_prefill_eager`); decode keeps
SGLang's CUDA graphs either way.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from atom_core.log import logger
from atom_sglang.host_hooks import RadixAttentionImpl, bind_forward_batch


class PrefillBody:
    """ATOM's model as SGLang's transformer body. A plain object, not a module, so that it adds nothing
    to the wrapper's parameters: the model itself stays registered on the wrapper."""

    def __init__(self, causal_lm: nn.Module):
        self.causal_lm = causal_lm
        self.layers = attention_of_each_layer(causal_lm) or []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """The final hidden states (the wrapper's ``forward`` computes the logits)."""
        with bind_forward_batch(forward_batch):
            return self.causal_lm(input_ids, positions, input_embeds)


def attention_of_each_layer(causal_lm: nn.Module) -> list[SimpleNamespace] | None:
    """Per decoder layer, what SGLang reads of it when it collects the attention layers:
    ``self_attn.attn``, the layer's ``RadixAttention``. None where some layer does not attend through
    exactly one MHA / GQA impl (Gated DeltaNet, MLA)."""
    layers = []
    for layer in causal_lm.model.layers:
        impls = [m for m in layer.modules() if isinstance(m, RadixAttentionImpl)]
        if len(impls) != 1:
            return None
        layers.append(SimpleNamespace(self_attn=SimpleNamespace(attn=impls[0].attn)))
    return layers


def keep_prefill_eager(server_args) -> None:
    """Set the prefill phase of SGLang's resolved CUDA-graph config to disabled, in ``server_args`` and
    in the runtime's published copy where that is another object (each is read at graph capture)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec

    configs = [server_args.cuda_graph_config]
    try:
        published = get_exec().graph.cuda_graph_config
    except ValueError:  # not published in this process
        published = None
    if published is not None and published is not configs[0]:
        configs.append(published)
    if all(config.prefill.backend == Backend.DISABLED for config in configs):
        return
    for config in configs:
        config.prefill.backend = Backend.DISABLED
    logger.info("SGLang's prefill CUDA graph is off for this ATOM model (its layers read the batch on the "
                "host; prefill runs eagerly, decode keeps its CUDA graphs)")
