"""ATOM's Gated DeltaNet core for SGLang: the layer's conv and recurrent states live in SGLang's state
pool of hybrid models (atom_core.layers.gated_delta_core).

SGLang sizes its ``MambaPool`` for Qwen3-Next from the HF config alone, so ATOM's model gets the pool
SGLang's own would: per linear-attention layer (``req_to_token_pool.mamba2_layer_cache(layer_id)``)
conv states [slots, channels, kernel_size - 1], ATOM's layout, and recurrent states
[slots, HV, V, K], read by ATOM's kernels as the transposed view [slots, HV, K, V]. Slot 0 is
SGLang's dummy slot; a request's slot comes from ``req_to_token_pool`` per forward.

SGLang runs a hybrid model's attention through ``HybridLinearAttnBackend``: full-attention layers
on the model's attention backend (``atom`` or SGLang's), linear-attention layers on a linear one.
ATOM's layers run their own kernels, so their linear backend (:class:`GatedDeltaMetadataBackend`,
put in place by atom_sglang.patches) only plans each batch's state slots and sequence offsets, as
SGLang's own GDN backend plans them, CUDA-graph decode buffers included. The scheduling, the radix
cache's state copies and chunked prefill stay SGLang's: a chunk that continues a sequence (a prefix
already in its slot, ``extend_prefix_lens > 0``) starts from the slot's state. The prefill kernels
compile when SGLang creates the backends (:func:`hybrid_backend`).
"""

from __future__ import annotations

import time

import torch
from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend, MambaAttnBackendBase
from sglang.srt.model_executor.forward_context import get_attn_backend
from torch import nn

from atom_core.hosting.warmup import WARM_UP_TOKENS, log_warm_up, run_gated_delta_prefill_kernels
from atom_core.layers.gated_delta_core import CachedStateBatch, GatedDeltaCoreSpec, forward_with_state_cache
from atom_sglang.host_hooks import current_forward_batch


class GatedDeltaMetadataBackend(MambaAttnBackendBase):
    """The linear side of SGLang's ``HybridLinearAttnBackend`` for ATOM's models: SGLang's per-batch
    state metadata (``forward_metadata``: ``query_start_loc``, ``mamba_cache_indices``), no kernels
    (ATOM's cores run them; SGLang's GDN backend would import CPU kernels ``sgl_kernel`` lacks)."""

    needs_cpu_seq_lens = False


class RadixGatedDeltaCore(nn.Module):
    """A Gated DeltaNet layer's core over SGLang's state pool: a decode batch steps each request's
    state, an extend batch (prefill, chunked prefill, radix-cache hits, mixed chunks with their
    decodes as one-token extends) runs the chunked rule from each slot."""

    def __init__(self, spec: GatedDeltaCoreSpec):
        super().__init__()
        self.spec = spec

    def forward(self, mixed_qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        forward_batch = current_forward_batch()
        backend = get_attn_backend().linear_attn_backend
        metadata = backend.forward_metadata
        # Rows SGLang pads (CUDA-graph batches) have slot -1, which ATOM's kernels do not skip: they
        # step SGLang's dummy slot 0 instead.
        slots = metadata.mamba_cache_indices.clamp(min=0)
        if forward_batch.forward_mode.is_decode():
            batch = CachedStateBatch(num_decodes=slots.shape[0], decode_slots=slots, num_prefill_tokens=0,
                                     prefill_cu_seqlens=None, prefill_slots=None, prefill_has_initial_state=None)
        else:
            batch = CachedStateBatch(
                num_decodes=0, decode_slots=slots[:0], num_prefill_tokens=sum(forward_batch.extend_seq_lens_cpu),
                prefill_cu_seqlens=metadata.query_start_loc, prefill_slots=slots,
                prefill_has_initial_state=forward_batch.extend_prefix_lens > 0,
            )
        cache = backend.req_to_token_pool.mamba2_layer_cache(self.spec.layer_id)
        return forward_with_state_cache(self.spec, mixed_qkv, g, beta, cache.conv[0],
                                        cache.temporal.transpose(-1, -2), batch)


def hybrid_backend(runner, full_attn_backend, full_attention_layer_ids: list[int]) -> HybridLinearAttnBackend:
    """SGLang's hybrid wrapper over ``full_attn_backend`` and ATOM's metadata backend, once the
    Gated DeltaNet prefill kernels of ``runner.model`` have compiled."""
    backend = GatedDeltaMetadataBackend(runner)
    start = time.perf_counter()
    geometries = compile_prefill_kernels(runner.model, backend.req_to_token_pool, runner.dtype, runner.device)
    log_warm_up(f"Gated DeltaNet prefill kernels of {geometries} layer shape(s)", time.perf_counter() - start)
    return HybridLinearAttnBackend(full_attn_backend, backend, full_attention_layer_ids)


def compile_prefill_kernels(model: nn.Module, req_to_token_pool, dtype: torch.dtype, device) -> int:
    """Run the prefill kernels once per Gated DeltaNet geometry of ``model``
    (atom_core.hosting.warmup) on zero inputs laid out as Qwen3-Next's layers hand them over (the conv
    input and ``beta`` contiguous in ``dtype``, ``g`` in fp32) and state rows laid out as the layer's
    rows of SGLang's pool, so that Triton compiles them before the first request (SGLang runs no
    prefill forward at start-up). The number of geometries."""
    specs = {}
    for module in model.modules():
        if isinstance(module, RadixGatedDeltaCore):
            specs.setdefault(module.spec.state_shapes(), module.spec)
    for (conv_shape, _), spec in specs.items():
        cache = req_to_token_pool.mamba2_layer_cache(spec.layer_id)
        heads = torch.zeros(WARM_UP_TOKENS, spec.num_v_heads, dtype=dtype, device=device)
        run_gated_delta_prefill_kernels(spec, torch.zeros(WARM_UP_TOKENS, conv_shape[0], dtype=dtype, device=device),
                                        heads.float(), heads, cache.conv[0], cache.temporal.transpose(-1, -2))
    return len(specs)
