"""Llama, Mixtral, GLM-4-MoE and GPT-OSS: what the HF parity test relies on.

- The tiny checkpoints have the hub's tensor layout (transformers 5 fuses MoE experts in memory;
  ``save_pretrained`` must still write Mixtral's ``w1/w2/w3``, GLM's per-expert tensors and
  ``e_score_correction_bias``, GPT-OSS's stacked ``gate_up_proj`` with biases).
- Each tiny config exercises each family feature: switching the feature off in the loaded ATOM
  model moves the logits far beyond the parity tolerance (1e-4), so parity proves the feature.
- Loading names the offending tensor for each family's own layout.
"""

import pytest
import torch
from safetensors import safe_open
from test_hf_parity import atom_model, hf_logits
from test_loader_errors import checkpoint, fresh_model

from atom_core.layers.attention import AttentionSpec, standalone_batch
from atom_core.layers.rotary import build_cos_sin_cache
from atom_core.loader import CheckpointError, iter_safetensors
from atom_core.testing.tiny_models import tiny_hf_config

LENGTHS = [7, 1, 23, 40]


def tensor_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    with safe_open(f"{model_dir}/model.safetensors", framework="pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def test_checkpoints_have_hub_layout(tiny_model_dir):
    d, i, e = tiny_hf_config("MixtralForCausalLM").hidden_size, 48, 6
    mixtral = tensor_shapes(tiny_model_dir("MixtralForCausalLM"))
    assert mixtral["model.layers.0.block_sparse_moe.gate.weight"] == (e, d)
    assert mixtral["model.layers.2.block_sparse_moe.experts.5.w1.weight"] == (i, d)
    assert mixtral["model.layers.2.block_sparse_moe.experts.5.w2.weight"] == (d, i)
    assert mixtral["model.layers.2.block_sparse_moe.experts.5.w3.weight"] == (i, d)

    glm = tensor_shapes(tiny_model_dir("Glm4MoeForCausalLM"))
    assert "model.layers.0.mlp.gate_proj.weight" in glm  # first_k_dense_replace = 1
    assert glm["model.layers.1.mlp.gate.e_score_correction_bias"] == (8,)
    assert glm["model.layers.1.mlp.experts.7.gate_proj.weight"] == (i, d)
    assert glm["model.layers.1.mlp.shared_experts.down_proj.weight"] == (d, i)
    assert glm["model.layers.1.self_attn.q_norm.weight"] == (32,)

    gpt_oss = tensor_shapes(tiny_model_dir("GptOssForCausalLM"))
    assert gpt_oss["model.layers.0.mlp.router.bias"] == (e,)
    assert gpt_oss["model.layers.0.mlp.experts.gate_up_proj"] == (e, d, 2 * i)
    assert gpt_oss["model.layers.0.mlp.experts.gate_up_proj_bias"] == (e, 2 * i)
    assert gpt_oss["model.layers.0.mlp.experts.down_proj"] == (e, i, d)
    assert gpt_oss["model.layers.0.mlp.experts.down_proj_bias"] == (e, d)
    assert gpt_oss["model.layers.0.self_attn.sinks"] == (4,)


def without_sliding_window(model) -> None:
    for layer in model.model.layers:
        impl = layer.self_attn.attn.impl
        impl.spec = AttentionSpec(**{**impl.spec.__dict__, "sliding_window": None})


def with_plain_rope(theta: float, rotary_dim: int):
    def mutate(model) -> None:
        cache = build_cos_sin_cache(rotary_dim, 1024, {"rope_type": "default", "rope_theta": theta})
        for layer in model.model.layers:
            layer.self_attn.rotary_emb.cos_sin_cache = cache
    return mutate


def for_layers(mutate_layer, first: int = 0):
    def mutate(model) -> None:
        for layer in model.model.layers[first:]:
            mutate_layer(layer)
    return mutate


def zero(get):
    return lambda layer: get(layer).data.zero_()


def setter(get, name, value):
    return lambda layer: setattr(get(layer), name, value)


def ungrouped(layer) -> None:
    layer.mlp.gate.num_expert_group = layer.mlp.gate.topk_group = 1


FEATURES = {
    "LlamaForCausalLM": {
        "llama3 rope scaling": with_plain_rope(10000.0, 32),
        "attention bias": for_layers(zero(lambda layer: layer.self_attn.qkv_proj.bias)),
        "mlp bias": for_layers(zero(lambda layer: layer.mlp.down_proj.bias)),
    },
    "MixtralForCausalLM": {
        "sliding window": without_sliding_window,
        "top-2 renormalised": for_layers(setter(lambda layer: layer.mlp.gate, "renormalize", False)),
    },
    "Glm4MoeForCausalLM": {
        "partial rotary": with_plain_rope(10000.0, 32),
        "QK-norm": for_layers(setter(lambda layer: layer.self_attn, "q_norm", None)),
        "attention bias": for_layers(zero(lambda layer: layer.self_attn.qkv_proj.bias)),
        "shared experts": for_layers(setter(lambda layer: layer.mlp, "shared_experts", None), first=1),
        "e_score_correction_bias": for_layers(zero(lambda layer: layer.mlp.gate.e_score_correction_bias), first=1),
        "expert groups": for_layers(ungrouped, first=1),
        "routed scaling": for_layers(setter(lambda layer: layer.mlp.gate, "routed_scaling_factor", 1.0), first=1),
    },
    "GptOssForCausalLM": {
        "sliding window": without_sliding_window,
        "sinks": for_layers(lambda layer: layer.self_attn.sinks.data.fill_(-1e9)),
        "yarn rope": with_plain_rope(150000.0, 32),
        "attention bias": for_layers(zero(lambda layer: layer.self_attn.o_proj.bias)),
        "router bias": for_layers(zero(lambda layer: layer.mlp.gate.bias)),
        "expert gate_up bias": for_layers(zero(lambda layer: layer.mlp.experts.w13_bias)),
        "expert down bias": for_layers(zero(lambda layer: layer.mlp.experts.w2_bias)),
        "SwiGLU clamp": for_layers(setter(lambda layer: layer.mlp.experts, "swiglu_limit", 1e9)),
    },
}


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """(model_dir, sequences, HF logits) per architecture, computed once."""
    cache = {}

    def get(architecture: str):
        if architecture not in cache:
            model_dir = tiny_model_dir(architecture)
            generator = torch.Generator().manual_seed(3)
            sequences = [torch.randint(4, 499, (n,), generator=generator).tolist() for n in LENGTHS]
            cache[architecture] = model_dir, sequences, torch.cat(hf_logits(model_dir, sequences))
        return cache[architecture]

    return get


def relative_error(model, sequences, expected) -> float:
    input_ids = torch.tensor([t for seq in sequences for t in seq])
    positions = torch.cat([torch.arange(len(seq)) for seq in sequences])
    with torch.no_grad(), standalone_batch([len(seq) for seq in sequences]):
        logits = model.compute_logits(model(input_ids, positions))
    return ((logits - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize(
    "architecture,feature",
    [(arch, feature) for arch, features in FEATURES.items() for feature in features],
)
def test_tiny_config_exercises_feature(reference, architecture, feature):
    if feature == "SwiGLU clamp" and tiny_hf_config(architecture).swiglu_limit >= 7.0:
        pytest.skip("transformers < 5.19 fixes GPT-OSS's SwiGLU limit at 7.0 (atom_core.testing.tiny_models), "
                    "which the tiny model's activations do not reach")
    model_dir, sequences, expected = reference(architecture)
    model = atom_model(model_dir)
    assert relative_error(model, sequences, expected) < 1e-4
    FEATURES[architecture][feature](model)
    assert relative_error(model, sequences, expected) > 1e-2, f"{feature} does not change the logits"


def test_attention_specs_follow_the_config(tiny_model_dir):
    """What the host's attention backend gets per layer: GPT-OSS's ``layer_types`` alternate
    window 8 and full attention, each layer with its sinks; Mixtral slides on every layer."""

    def specs(architecture: str) -> list:
        model = fresh_model(tiny_model_dir(architecture))
        return [layer.self_attn.attn.spec for layer in model.model.layers]

    gpt_oss = specs("GptOssForCausalLM")
    assert [s.sliding_window for s in gpt_oss] == [8, None, 8]
    assert all(s.sinks is not None and s.sinks.shape == (4,) for s in gpt_oss)
    assert [s.sliding_window for s in specs("MixtralForCausalLM")] == [16, 16, 16]
    assert [(s.sliding_window, s.sinks) for s in specs("LlamaForCausalLM")] == [(None, None)] * 3


@pytest.mark.parametrize("architecture,unknown", [
    ("MixtralForCausalLM", "model.layers.0.block_sparse_moe.experts.0.w4.weight"),
    ("Glm4MoeForCausalLM", "model.layers.3.eh_proj.weight"),  # an MTP layer the config does not declare
    ("GptOssForCausalLM", "model.layers.0.mlp.experts.gate_up_proj_scales"),
])
def test_unknown_tensor_is_named(tiny_model_dir, architecture, unknown):
    model_dir = tiny_model_dir(architecture)
    weights = checkpoint(model_dir)
    weights[unknown] = torch.zeros(4, 4)
    with pytest.raises(CheckpointError, match=f"'{unknown}'"):
        fresh_model(model_dir).load_weights(weights.items())


def test_wrong_expert_layout_is_named(tiny_model_dir):
    """A GPT-OSS expert tensor in nn.Linear orientation ([E, 2I, D]) is refused by name."""
    model_dir = tiny_model_dir("GptOssForCausalLM")
    weights = checkpoint(model_dir)
    name = "model.layers.1.mlp.experts.gate_up_proj"
    weights[name] = weights[name].transpose(1, 2).contiguous()
    with pytest.raises(CheckpointError, match=f"checkpoint tensor '{name}'"):
        fresh_model(model_dir).load_weights(weights.items())


def checkpoint_params(model) -> list:
    """The parameters every checkpoint fills: all but the optional KV-cache scales (no shard
    expected; atom_core.layers.attention)."""
    return [p for p in model.parameters() if p.expected_shards]


def test_glm_mtp_layers_are_skipped(tiny_model_dir):
    """Hub GLM-4.5 checkpoints carry ``num_nextn_predict_layers`` MTP layers after the last one."""
    model_dir = tiny_model_dir("Glm4MoeForCausalLM", num_nextn_predict_layers=1)
    model = fresh_model(model_dir)
    weights = checkpoint(model_dir)
    weights["model.layers.3.eh_proj.weight"] = torch.zeros(4, 4)
    weights["model.layers.3.mlp.experts.0.up_proj.weight"] = torch.zeros(4, 4)
    for param in model.parameters():
        param.data.fill_(float("nan"))
    model.load_weights(weights.items())
    assert not any(torch.isnan(p).any() for p in checkpoint_params(model))


def test_every_parameter_is_loaded(tiny_model_dir):
    for architecture in FEATURES:
        model = fresh_model(tiny_model_dir(architecture))
        for param in model.parameters():
            param.data.fill_(float("nan"))
        model.load_weights(iter_safetensors(tiny_model_dir(architecture)))
        assert not any(torch.isnan(p).any() for p in checkpoint_params(model)), architecture

