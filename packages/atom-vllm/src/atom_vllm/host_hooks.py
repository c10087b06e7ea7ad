"""Plug vLLM's TP group and attention layers into atom-core (see atom_core.distributed, and
atom_core.layers.attention / atom_core.layers.mla)."""

from __future__ import annotations

from torch import nn

from atom_core.compile import set_piece_wrapper
from atom_core.distributed import TPGroup, set_tp_group
from atom_core.layers.attention import AttentionSpec, set_attention_factory
from atom_core.layers.mla import LatentAttentionSpec, set_latent_attention_factory


def vllm_attention(spec: AttentionSpec) -> nn.Module:
    """A vLLM ``Attention`` layer: vLLM binds its KV cache and builds its metadata; the backend
    (ATOM's unless disabled) comes from ATOMPlatform.get_attn_backend_cls."""
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.attention import Attention

    extra = {} if spec.sinks is None else {"sinks": spec.sinks}
    return Attention(
        spec.num_heads,
        spec.head_size,
        spec.scale,
        num_kv_heads=spec.num_kv_heads,
        cache_config=get_current_vllm_config().cache_config,
        per_layer_sliding_window=spec.sliding_window,
        prefix=spec.prefix,
        **extra,
    )


def vllm_latent_attention(spec: LatentAttentionSpec) -> nn.Module:
    """ATOM's MLA layer for vLLM (vLLM's own MLAAttention cannot take ATOM's layers; see
    atom_vllm.attention.mla)."""
    from atom_vllm.attention.mla import ATOMMLAAttention

    return ATOMMLAAttention(spec)


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
