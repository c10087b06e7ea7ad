"""A malformed checkpoint fails loading with an error naming the offending tensor."""

import pytest
import torch
from transformers import AutoConfig

from atom_core import Config
from atom_core.loader import CheckpointError, iter_safetensors
from atom_core.models import get_model_class


def fresh_model(model_dir: str):
    hf_config = AutoConfig.from_pretrained(model_dir)
    config = Config(model=model_dir, hf_config=hf_config, torch_dtype=torch.float32)
    return get_model_class(hf_config.architectures[0])(config)


def checkpoint(model_dir: str) -> dict[str, torch.Tensor]:
    return dict(iter_safetensors(model_dir))


@pytest.mark.parametrize("architecture,missing", [
    ("Qwen3ForCausalLM", "model.layers.1.self_attn.k_proj.weight"),
    ("Qwen3ForCausalLM", "model.layers.0.mlp.up_proj.weight"),
    ("Qwen3ForCausalLM", "model.norm.weight"),
    ("Qwen3MoeForCausalLM", "model.layers.2.mlp.experts.4.down_proj.weight"),
    ("Qwen3MoeForCausalLM", "model.layers.0.mlp.experts.0.up_proj.weight"),
    ("LlamaForCausalLM", "model.layers.2.self_attn.o_proj.bias"),
    ("LlamaForCausalLM", "model.layers.0.mlp.up_proj.bias"),
    ("MixtralForCausalLM", "model.layers.1.block_sparse_moe.experts.3.w3.weight"),
    ("MixtralForCausalLM", "model.layers.2.block_sparse_moe.experts.5.w2.weight"),
    ("MixtralForCausalLM", "model.layers.0.block_sparse_moe.gate.weight"),
    ("Glm4MoeForCausalLM", "model.layers.1.mlp.gate.e_score_correction_bias"),
    ("Glm4MoeForCausalLM", "model.layers.2.mlp.shared_experts.up_proj.weight"),
    ("Glm4MoeForCausalLM", "model.layers.1.self_attn.k_norm.weight"),
    ("GptOssForCausalLM", "model.layers.1.mlp.experts.gate_up_proj"),
    ("GptOssForCausalLM", "model.layers.1.mlp.experts.gate_up_proj_bias"),
    ("GptOssForCausalLM", "model.layers.0.mlp.experts.down_proj_bias"),
    ("GptOssForCausalLM", "model.layers.2.mlp.router.bias"),
    ("GptOssForCausalLM", "model.layers.0.self_attn.sinks"),
])
def test_missing_tensor_is_named(tiny_model_dir, architecture, missing):
    model_dir = tiny_model_dir(architecture)
    weights = checkpoint(model_dir)
    del weights[missing]
    with pytest.raises(CheckpointError, match=f"missing tensor '{missing}'"):
        fresh_model(model_dir).load_weights(weights.items())


def test_unexpected_tensor_is_named(tiny_model_dir):
    model_dir = tiny_model_dir("Qwen3ForCausalLM")
    weights = checkpoint(model_dir)
    weights["model.layers.0.self_attn.extra_proj.weight"] = torch.zeros(4, 4)
    with pytest.raises(CheckpointError, match="'model.layers.0.self_attn.extra_proj.weight'"):
        fresh_model(model_dir).load_weights(weights.items())


def test_wrong_shape_is_named(tiny_model_dir):
    model_dir = tiny_model_dir("Qwen3MoeForCausalLM")
    weights = checkpoint(model_dir)
    name = "model.layers.0.mlp.experts.3.gate_proj.weight"
    weights[name] = weights[name][:-1]
    with pytest.raises(CheckpointError, match=f"checkpoint tensor '{name}'"):
        fresh_model(model_dir).load_weights(weights.items())


def test_complete_checkpoint_loads_every_parameter(tiny_model_dir):
    model_dir = tiny_model_dir("Qwen3MoeForCausalLM")
    model = fresh_model(model_dir)
    for param in model.parameters():
        param.data.fill_(float("nan"))
    loaded = model.load_weights(iter_safetensors(model_dir))
    assert loaded == {name for name, _ in model.named_parameters()}
    assert not any(torch.isnan(p).any() for p in model.parameters())
