"""Plug vLLM's TP group, attention layers and state cache into atom-core (see
atom_core.distributed, and atom_core.layers.attention / atom_core.layers.mla /
atom_core.layers.gated_delta_core)."""

from __future__ import annotations

import functools

import torch
from torch import nn

from atom_core.compile import set_piece_wrapper
from atom_core.distributed import TPGroup, set_tp_group
from atom_core.layers.attention import AttentionSpec, set_attention_factory
from atom_core.layers.gated_delta_core import GatedDeltaCoreSpec, set_gated_delta_core_factory
from atom_core.layers.mla import LatentAttentionSpec, set_latent_attention_factory


@functools.cache
def vllm_attention_class() -> type[nn.Module]:
    """vLLM's ``Attention`` layer, able to write into a caller's buffer (``writes_into_out``, see
    atom_core.layers.attention): vLLM's own forward allocates an output that ATOM's compiled graph
    would then copy, a hidden-sized copy per layer and step (the size of the 1.1 ms of device
    copies in a 183 ms Qwen3-8B prefill step on an H200). Built on first use: vLLM's layer modules
    must not load with the plugin."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention.attention import unified_attention_with_output

    class ATOMVllmAttention(Attention):
        writes_into_out = True

        def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
            # Straight to the impl only where vLLM's forward would add nothing: no query or KV-scale
            # quantization, and a backend that writes the KV cache itself (ATOM's do).
            direct = (
                self.attn_backend.forward_includes_kv_cache_update
                and self.query_quant is None
                # vLLM 0.26 can compute KV scales at run time (--calculate-kv-scales); later releases dropped it.
                and not getattr(self, "calculate_kv_scales", False)
            )
            if out is None or not direct:
                result = super().forward(query, key, value)
                return result if out is None else out.copy_(result)
            unified_attention_with_output(
                query.view(-1, self.num_heads, self.head_size),
                key.view(-1, self.num_kv_heads, self.head_size),
                value.view(-1, self.num_kv_heads, self.head_size_v),
                out.view(-1, self.num_heads, self.head_size_v),
                self.layer_name,
            )
            return out

        def load_kv_cache_scales(self, **scales: torch.Tensor) -> None:
            """The checkpoint's scales (atom_core.layers.attention) into the ``k_scale`` / ``v_scale``
            parameters vLLM's KV-cache method of the checkpoint's quantization put on this layer;
            vLLM's post-load step then applies them as for its own models. Without such a method
            (an unquantized or MXFP4 checkpoint) vLLM would not load them either."""
            for name, scale in scales.items():
                host_scale = getattr(self, name, None)
                if host_scale is not None:
                    host_scale.data.copy_(scale.reshape(host_scale.shape))

    return ATOMVllmAttention


def vllm_attention(spec: AttentionSpec) -> nn.Module:
    """A vLLM ``Attention`` layer: vLLM binds its KV cache and builds its metadata; the backend
    (ATOM's unless disabled) comes from ATOMPlatform.get_attn_backend_cls. It gets the checkpoint's
    quantization config as vLLM's models give it: vLLM's KV-cache method then treats the checkpoint's
    KV scales (and a compressed-tensors ``kv_cache_scheme`` under ``--kv-cache-dtype auto``) as for
    its own models."""
    from vllm.config import get_current_vllm_config

    vllm_config = get_current_vllm_config()
    extra = {} if spec.sinks is None else {"sinks": spec.sinks}
    return vllm_attention_class()(
        spec.num_heads,
        spec.head_size,
        spec.scale,
        num_kv_heads=spec.num_kv_heads,
        cache_config=vllm_config.cache_config,
        quant_config=vllm_config.quant_config,
        per_layer_sliding_window=spec.sliding_window,
        prefix=spec.prefix,
        **extra,
    )


def vllm_latent_attention(spec: LatentAttentionSpec) -> nn.Module:
    """ATOM's MLA layer for vLLM (vLLM's own MLAAttention cannot take ATOM's layers; see
    atom_vllm.attention.mla)."""
    from atom_vllm.attention.mla import ATOMMLAAttention

    return ATOMMLAAttention(spec)


def vllm_gated_delta_core(spec: GatedDeltaCoreSpec) -> nn.Module:
    """A Gated DeltaNet core whose states live in vLLM's state cache (atom_vllm.attention.gated_delta)."""
    from atom_vllm.attention.gated_delta import ATOMGatedDeltaCore

    return ATOMGatedDeltaCore(spec)


def vllm_piecewise_cudagraph_wrapper(vllm_config):
    """Wrap each of ATOM's compiled pieces in vLLM's static-graph wrapper (PIECEWISE), as vLLM does
    for its own compiled models: vLLM then captures and replays the pieces per batch size, and
    attention runs eagerly between them. None where vLLM runs no piecewise CUDA graphs."""
    from vllm.config import CUDAGraphMode
    from vllm.platforms import current_platform

    mode = vllm_config.compilation_config.cudagraph_mode
    if mode is None or not mode.has_piecewise_cudagraphs() or not current_platform.is_cuda_alike():
        return None
    from vllm.compilation.cuda_graph import CUDAGraphOptions
    from vllm.utils.import_utils import resolve_obj_by_qualname

    wrapper_cls = resolve_obj_by_qualname(current_platform.get_static_graph_wrapper_cls())

    def wrap(piece, index: int, count: int):
        options = CUDAGraphOptions(
            debug_log_enable=index == 0,
            gc_disable=index != 0,
            weak_ref_output=index == count - 1,
        )
        return wrapper_cls(piece, vllm_config, CUDAGraphMode.PIECEWISE, options)

    return wrap


def install_vllm_hooks(vllm_config) -> None:
    import vllm.distributed

    set_tp_group(TPGroup.from_host(vllm.distributed))
    set_attention_factory(vllm_attention)
    set_piece_wrapper(vllm_piecewise_cudagraph_wrapper(vllm_config))
    set_latent_attention_factory(vllm_latent_attention)
    set_gated_delta_core_factory(vllm_gated_delta_core)
