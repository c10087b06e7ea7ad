"""Which classes serve a loaded vLLM model: for the demo, the benchmarks and the tests, which pass
:func:`describe_served_model` to ``LLM.apply_model`` (it runs where the model lives)."""

from __future__ import annotations


def describe_served_model(model) -> dict:
    """The model class, the class under its ``model`` attribute (for a vision-language model, under
    its language model's), the attention impl classes of its
    attention layers (vLLM's ``AttentionLayerBase``: MHA, MLA and ATOM's MLA layer alike), and the
    scales each layer's KV cache applies: ``[K, V]`` (vLLM's ``_k_scale`` / ``_v_scale``), or ``[K]``
    for ATOM's MLA layer, whose latent cache has one."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    def name(obj) -> str:
        return type(obj).__module__ + "." + type(obj).__name__

    inner = getattr(model, "model", None)
    if inner is None and hasattr(model, "language_model"):
        inner = getattr(model.language_model, "model", model.language_model)
    impls = {name(m.impl) for m in model.modules() if isinstance(m, AttentionLayerBase) and hasattr(m, "impl")}
    return {
        "model_class": name(model),
        "inner_class": name(inner),
        "attention_impls": sorted(i for i in impls if "Impl" in i),
        "kv_cache_scales": {m.layer_name: [scale.item() for scale in (m._k_scale, getattr(m, "_v_scale", None))
                                           if scale is not None]
                            for m in model.modules() if isinstance(m, AttentionLayerBase) and hasattr(m, "_k_scale")},
    }
