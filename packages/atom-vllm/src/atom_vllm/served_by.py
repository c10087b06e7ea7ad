"""Which classes serve a loaded vLLM model: for the demo, the benchmarks and the tests, which pass
:func:`describe_served_model` to ``LLM.apply_model`` (it runs where the model lives)."""

from __future__ import annotations


def describe_served_model(model) -> dict:
    """The model class, the class under its ``model`` attribute, and the attention impl classes of
    its attention layers (vLLM's ``AttentionLayerBase``: MHA, MLA and ATOM's MLA layer alike)."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    def name(obj) -> str:
        return type(obj).__module__ + "." + type(obj).__name__

    impls = {name(m.impl) for m in model.modules() if isinstance(m, AttentionLayerBase) and hasattr(m, "impl")}
    return {
        "model_class": name(model),
        "inner_class": name(getattr(model, "model", None)),
        "attention_impls": sorted(i for i in impls if "Impl" in i),
    }
