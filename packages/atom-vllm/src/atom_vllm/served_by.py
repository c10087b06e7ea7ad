"""Which classes serve a loaded vLLM model: for the demo, the benchmarks and the tests, which pass
:func:`describe_served_model` to ``LLM.apply_model`` (it runs where the model lives)."""

from __future__ import annotations


def describe_served_model(model) -> dict:
    """The model class, the class under its ``model`` attribute, the attention impl classes of its
    attention layers (vLLM's ``AttentionLayerBase``: MHA, MLA and ATOM's MLA layer alike), and the
    K and V scales each MHA layer's KV cache applies (vLLM's ``_k_scale`` / ``_v_scale``)."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    def name(obj) -> str:
        return type(obj).__module__ + "." + type(obj).__name__

    impls = {name(m.impl) for m in model.modules() if isinstance(m, AttentionLayerBase) and hasattr(m, "impl")}
    return {
        "model_class": name(model),
        "inner_class": name(getattr(model, "model", None)),
        "attention_impls": sorted(i for i in impls if "Impl" in i),
        "kv_cache_scales": {m.layer_name: [m._k_scale.item(), m._v_scale.item()]
                            for m in model.modules() if isinstance(m, Attention)},
    }
