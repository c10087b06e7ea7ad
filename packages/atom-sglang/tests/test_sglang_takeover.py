"""A configuration ATOM does not support is handed back to SGLang (real SGLang 0.5.17, CPU engine):
SGLang's own model class and its default attention backend serve, one log line says why, and the
greedy tokens equal SGLang alone's. Here: a Llama with dynamic rope scaling, which ATOM hands back
(atom_core.hosting.takeover); the reasons themselves are tested in atom-core's test_takeover.py.
"""

import pytest
from sglang_testing import run_sglang

from atom_sglang.served_by import describe_served_model

pytestmark = pytest.mark.sglang

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40))]


def test_dynamic_rope_is_served_by_sglang_as_without_atom(tiny_model_dir):
    # mlp_bias off: SGLang's own Llama has no MLP bias (conftest.TINY_OVERRIDES).
    model = tiny_model_dir("LlamaForCausalLM", mlp_bias=False,
                           rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    runs = [{"model": model, "phases": [PROMPTS], "max_tokens": 12}]
    [[with_atom], [alone]] = run_sglang((runs, {}), (runs, {"ATOM_DISABLE_SGLANG_PLUGIN": "1"}))
    served = describe_served_model(with_atom["log"], with_atom)
    assert served["architecture"] == "LlamaForCausalLM"
    assert served["handed_back"].startswith("rope type 'dynamic' is not supported")
    assert served["atom_model"] is None
    assert with_atom["attention_backend"] == alone["attention_backend"] != "atom"
    assert with_atom["phases"] == alone["phases"]


def test_model_impl_transformers_is_served_by_sglang_as_without_atom(tiny_model_dir):
    """``--model-impl transformers``: SGLang builds its Transformers backend, never ATOM's class; ATOM
    leaves the attention default to SGLang too and says why."""
    runs = [{"model": tiny_model_dir("Qwen3ForCausalLM"), "phases": [PROMPTS], "max_tokens": 12,
             "engine_kwargs": {"model_impl": "transformers"}}]
    [[with_atom], [alone]] = run_sglang((runs, {}), (runs, {"ATOM_DISABLE_SGLANG_PLUGIN": "1"}))
    served = describe_served_model(with_atom["log"], with_atom)
    assert served["architecture"] == "Qwen3ForCausalLM"
    assert served["handed_back"] == "--model-impl transformers asks for SGLang's transformers implementation"
    assert served["atom_model"] is None
    assert with_atom["attention_backend"] == alone["attention_backend"] != "atom"
    assert with_atom["phases"] == alone["phases"]
