"""SGLang's breakable prefill CUDA graph finds ATOM's transformer body and attention layers the way it
finds its own models' (atom_sglang.prefill_graph), read with SGLang's own discovery functions. On CPU:
the capture itself needs a GPU (it ran on an H200, docs/performance.md, "SGLang on an H200")."""

import pytest
import torch
from torch import nn

from atom_core import Config
from atom_core.hosting.build import build_atom_model
from atom_core.layers import attention
from atom_core.testing.tiny_models import tiny_hf_config
from atom_sglang.host_hooks import RadixAttentionImpl
from atom_sglang.prefill_graph import PrefillBody

pytestmark = pytest.mark.sglang


@pytest.fixture
def radix_attention_layers(monkeypatch):
    """ATOM's attention layers as SGLang's glue builds them (a RadixAttention each), for this test."""
    monkeypatch.setattr(attention, "_factory", RadixAttentionImpl)


def wrapped(architecture: str) -> nn.Module:
    """A module holding ATOM's model as the SGLang wrapper does: the model registered, its body as
    ``.model``."""
    holder = nn.Module()
    holder.hf_config = tiny_hf_config(architecture)
    config = Config(model="tiny", hf_config=holder.hf_config, torch_dtype=torch.float32)
    holder.atom_model = build_atom_model(config, architecture, "SGLang")
    holder.model = PrefillBody(holder.atom_model)
    return holder


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM"])
def test_sglang_captures_the_body_with_each_layers_radix_attention(radix_attention_layers, architecture):
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.model_runner_components.layer_setup import compute_attention_and_moe_layers
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import _resolve_transformer_layer_model

    holder = wrapped(architecture)
    body = _resolve_transformer_layer_model(holder)
    assert body is holder.model
    layers = compute_attention_and_moe_layers(body)
    num_layers = holder.hf_config.num_hidden_layers
    assert len(layers.attention_layers) == num_layers  # else SGLang turns the prefill graph off
    assert all(isinstance(layer, RadixAttention) for layer in layers.attention_layers)
    # The eager break at replay finds each layer by its id in this list.
    assert [layer.layer_id for layer in layers.attention_layers] == list(range(num_layers))
    # Nothing added to the parameters: the body is no module.
    assert {name.split(".")[0] for name, _ in holder.named_parameters()} == {"atom_model"}


def test_layers_that_read_the_batch_on_the_host_keep_prefill_eager(radix_attention_layers):
    """Qwen3-Next's Gated DeltaNet layers have no RadixAttention: no body layers, so the wrapper keeps
    SGLang's prefill graph off for it."""
    assert wrapped("Qwen3NextForCausalLM").model.layers == []
