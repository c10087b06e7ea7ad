"""A malformed checkpoint fails loading with an error naming the offending tensor."""

import re

import pytest
import torch
from transformers import AutoConfig

from atom_core import Config
from atom_core.hosting.build import build_atom_model
from atom_core.loader import CheckpointError, iter_safetensors


def fresh_model(model_dir: str):
    """ATOM's model for the checkpoint, unloaded, built as the hosts build it (HF's defaults for the
    config keys an older transformers lacks)."""
    hf_config = AutoConfig.from_pretrained(model_dir)
    config = Config(model=model_dir, hf_config=hf_config, torch_dtype=torch.float32)
    return build_atom_model(config, hf_config.architectures[0], "this test")


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
    # KV-cache scales are optional (expect no shard): this checkpoint has none.
    assert not any(torch.isnan(p).any() for p in model.parameters() if p.expected_shards)


@pytest.mark.parametrize("names,loaded", [
    (("self_attn.k_scale", "self_attn.v_scale"), (0.5, 0.25)),
    (("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"), (0.5, 0.25)),
    (("self_attn.kv_scale",), (0.5, -1.0)),  # legacy: the host copies K's scale to V
], ids=["compressed-tensors", "fp8-proj", "legacy"])
def test_kv_cache_scales_load_into_the_attention_layer(tiny_model_dir, names, loaded):
    model_dir = tiny_model_dir("Qwen3ForCausalLM")
    weights = checkpoint(model_dir)
    for name, value in zip(names, (0.5, 0.25)):
        weights[f"model.layers.1.{name}"] = torch.tensor(value)
    weights["model.layers.1.self_attn.k_zero_point"] = torch.zeros(1)  # compressed-tensors, unused
    model = fresh_model(model_dir)
    model.load_weights(weights.items())
    attn = model.model.layers[1].self_attn.attn
    assert (attn.k_scale.item(), attn.v_scale.item()) == loaded
    assert model.model.layers[0].self_attn.attn.k_scale.item() == -1.0  # none in the checkpoint


def test_fp8_attention_scales_are_skipped_with_one_log_line(tiny_model_dir, caplog):
    """Query / probability scales of FP8 attention: ATOM's attention keeps both in 16 bits, and the
    checkpoint loads (vLLM alone serves it)."""
    model_dir = tiny_model_dir("Qwen3ForCausalLM")
    weights = checkpoint(model_dir)
    want = fresh_model(model_dir)
    want.load_weights(weights.items())
    for layer in (0, 1):
        weights[f"model.layers.{layer}.self_attn.q_scale"] = torch.tensor(0.5)
        weights[f"model.layers.{layer}.self_attn.prob_scale"] = torch.tensor(0.25)
    model = fresh_model(model_dir)
    with caplog.at_level("INFO", logger="atom"):
        model.load_weights(weights.items())
    lines = [r.getMessage() for r in caplog.records if "FP8-attention scales" in r.getMessage()]
    assert len(lines) == 1 and "skipped the checkpoint's 4" in lines[0]
    for (name, got), expected in zip(model.state_dict().items(), want.state_dict().values()):
        assert torch.equal(got, expected), name


@pytest.mark.parametrize("name,tensor,reason", [
    ("model.layers.0.self_attn.k_scale", torch.full((2,), 0.5), "one value per layer, got shape (2,)"),
    ("model.layers.2.self_attn.v_proj.v_scale", torch.tensor(0.0), "must be positive and finite, got 0.0"),
    ("model.layers.1.self_attn.kv_scale", torch.tensor(-0.5), "must be positive and finite, got -0.5"),
    ("model.layers.1.self_attn.k_scale", torch.tensor(float("nan")), "must be positive and finite"),
])
def test_malformed_kv_cache_scale_is_named(tiny_model_dir, name, tensor, reason):
    model_dir = tiny_model_dir("Qwen3ForCausalLM")
    weights = {**checkpoint(model_dir), name: tensor}
    with pytest.raises(CheckpointError, match=f"'{re.escape(name)}'.*{re.escape(reason)}"):
        fresh_model(model_dir).load_weights(weights.items())


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"])
def test_later_loads_update_any_subset(tiny_model_dir, architecture):
    """Once the checkpoint is in, a load updates the tensors it is given (a running engine's weights
    sent in buckets, as RL frameworks send them): each lands in its parameter and the others stay,
    while the first load still needs them all (above)."""
    model_dir = tiny_model_dir(architecture)
    weights = checkpoint(model_dir)
    model = fresh_model(model_dir)
    model.load_weights(weights.items())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    name = "model.layers.1.self_attn.k_proj.weight"
    model.load_weights([(name, weights[name] + 1.0)])
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed == ["model.layers.1.self_attn.qkv_proj.weight"]
    model.load_weights([(name, weights[name])])
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
