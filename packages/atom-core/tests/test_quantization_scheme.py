"""Reading ``quantization_config`` (atom_core.quantization.scheme) and the takeover decision it
drives: what ATOM serves, and the reason for what it hands back."""

import dataclasses
import re
from types import SimpleNamespace

import pytest
import torch

from atom_core.hosting.hf_config import language_model_config
from atom_core.hosting.takeover import MXFP4_OPT_IN_REASON, HostedModel, decide_takeover
from atom_core.loader import WeightMap
from atom_core.models.decoder import STACKED_QKV_GATE_UP
from atom_core.quantization import Fp8Scheme, Mxfp4Scheme, UnsupportedQuantization, quant_config_from_hf

FP8 = {"quant_method": "fp8", "fmt": "e4m3"}
FLOAT8 = {"num_bits": 8, "type": "float", "symmetric": True}
KV_CACHE_SCHEME = {**FLOAT8, "strategy": "tensor", "dynamic": False}  # as llm-compressor writes it


def compressed_tensors(weights: dict, inputs: dict | None, **extra) -> dict:
    group = {"targets": ["Linear"], "weights": {**FLOAT8, **weights}}
    if inputs is not None:
        group["input_activations"] = {**FLOAT8, **inputs}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": group}, "ignore": ["lm_head"], **extra}


def parse(quantization: dict):
    return quant_config_from_hf(SimpleNamespace(quantization_config=quantization))


@pytest.mark.parametrize("quantization,scheme", [
    ({**FP8, "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
     Fp8Scheme(128, False, "weight_scale_inv")),
    ({**FP8, "activation_scheme": "dynamic"}, Fp8Scheme(None, False, "weight_scale")),
    ({**FP8, "activation_scheme": "static"}, Fp8Scheme(None, True, "weight_scale")),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]},  # fmt and activation_scheme omitted
     Fp8Scheme(128, False, "weight_scale_inv")),
    (compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True}),
     Fp8Scheme(None, False, "weight_scale")),
    (compressed_tensors({"strategy": "tensor"}, {"strategy": "tensor", "dynamic": False}),
     Fp8Scheme(None, True, "weight_scale")),
    (compressed_tensors({"strategy": "block", "block_structure": [128, 128]},
                        {"strategy": "group", "group_size": 128, "dynamic": True}),
     Fp8Scheme(128, False, "weight_scale")),
])
def test_served_schemes(quantization, scheme):
    assert parse(quantization).scheme == scheme


@pytest.mark.parametrize("quantization,reason", [
    ({"quant_method": "awq"}, "quantization 'awq' is not supported"),
    ({"config_groups": {}}, "quantization_config names no quant_method"),
    ({**FP8, "fmt": "e5m2"}, "fp8 format 'e5m2' is not supported"),
    ({**FP8, "weight_block_size": [128, 64]}, "weight_block_size [128, 64] is not supported"),
    ({**FP8, "activation_scheme": "static", "weight_block_size": [128, 128]},
     "block-FP8 with static activation scales is not supported"),
    (compressed_tensors({"strategy": "channel"}, None), "weight-only"),
    (compressed_tensors({"strategy": "tensor"}, {"strategy": "tensor", "dynamic": True}),
     "weights 'tensor' with dynamic 'tensor' activations are not supported"),
    (compressed_tensors({"strategy": "channel", "num_bits": 4, "type": "int"},
                        {"strategy": "token", "dynamic": True}), "only symmetric 8-bit float"),
    (compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True},
                        kv_cache_scheme={**KV_CACHE_SCHEME, "strategy": "attn_head"}),
     "kv_cache_scheme with {'strategy': 'attn_head'} is not supported"),
    (compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True},
                        kv_cache_scheme={**KV_CACHE_SCHEME, "dynamic": True}),
     "kv_cache_scheme with {'dynamic': True} is not supported"),
    (compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True},
                        kv_cache_scheme={**KV_CACHE_SCHEME, "num_bits": 4, "type": "int"}),
     "kv_cache_scheme with {'num_bits': 4, 'type': 'int'} is not supported"),
    ({**compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True}),
      "format": "pack-quantized"}, "format 'pack-quantized' is not supported"),
])
def test_unsupported_schemes_name_the_reason(quantization, reason):
    with pytest.raises(UnsupportedQuantization, match=re.escape(reason)):
        parse(quantization)


def test_kv_cache_scheme_declares_per_layer_scales():
    dynamic = compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True})
    assert parse({**dynamic, "kv_cache_scheme": KV_CACHE_SCHEME}).kv_cache_scales
    assert not parse(dynamic).kv_cache_scales


# gpt-oss-20b / 120b's quantization_config as published.
GPT_OSS_MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


@pytest.mark.parametrize("quantization", [
    GPT_OSS_MXFP4, {"quant_method": "mxfp4"}, {**GPT_OSS_MXFP4, "quant_method": "gpt_oss_mxfp4"},
], ids=["published", "keys-omitted", "as-vllm-renames-it"])
def test_mxfp4_quantizes_the_experts_only(quantization):
    config = parse(quantization)
    assert (config.scheme, config.experts_only) == (Mxfp4Scheme(32), True)
    assert config.method == quantization["quant_method"]
    assert config.scheme_for("model.layers.3.mlp.experts", experts=True) == Mxfp4Scheme()
    for layer in ("model.layers.3.self_attn.qkv_proj", "model.layers.3.mlp.router", "lm_head"):
        assert config.scheme_for(layer) is None


def test_mxfp4_modules_to_not_convert_match_as_hf_reads_them():
    """HF transformers reads each entry as a pattern from the start of the name up to a module
    boundary (``layers.1`` is not ``layers.11``), or as a suffix."""
    config = parse({**GPT_OSS_MXFP4, "modules_to_not_convert": ["model.layers.1.mlp.experts",
                                                                "model.layers.2.*.experts"]})
    assert config.scheme_for("model.layers.1.mlp.experts", experts=True) is None
    assert config.scheme_for("model.layers.2.mlp.experts", experts=True) is None
    assert config.scheme_for("model.layers.11.mlp.experts", experts=True) == Mxfp4Scheme()


def test_unquantized_modules_match_whole_dotted_names_and_patterns():
    config = parse(compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True},
                                      ignore=["lm_head", "re:.*mlp\\.gate$", "model.layers.1.mlp"]))
    assert config.scheme_for("lm_head") is None
    assert config.scheme_for("model.layers.3.mlp.gate") is None
    assert config.scheme_for("model.layers.1.mlp.down_proj") is None
    assert config.scheme_for("model.layers.11.mlp.down_proj") is not None  # not layer 1's
    assert config.scheme_for("model.layers.3.mlp.gate_up_proj") is not None


def test_a_fused_layer_is_quantized_only_if_all_its_parts_are():
    config = parse({**FP8, "modules_to_not_convert": ["model.layers.0.self_attn.k_proj"]})
    fused = WeightMap(stacked=STACKED_QKV_GATE_UP).checkpoint_modules
    assert config.scheme_for("model.layers.1.self_attn.qkv_proj", fused) is not None
    with pytest.raises(UnsupportedQuantization, match="quantizes only in part"):
        config.scheme_for("model.layers.0.self_attn.qkv_proj", fused)


def test_the_list_names_modules_as_the_checkpoint_spells_them():
    """ATOM's ``shared_experts`` is the checkpoint's ``shared_expert`` (Qwen3-Next, Qwen3.5-MoE)."""
    config = parse({**FP8, "modules_to_not_convert": ["model.layers.0.mlp.shared_expert"]})
    names = WeightMap(stacked=STACKED_QKV_GATE_UP, renamed={"shared_expert": "shared_experts"}).checkpoint_modules
    assert names("model.layers.0.mlp.shared_experts.gate_up_proj") == [
        "model.layers.0.mlp.shared_expert.gate_proj", "model.layers.0.mlp.shared_expert.up_proj"]
    assert config.scheme_for("model.layers.0.mlp.shared_experts.gate_up_proj", names) is None
    assert config.scheme_for("model.layers.0.mlp.shared_experts.down_proj", names) is None
    assert config.scheme_for("model.layers.1.mlp.shared_experts.down_proj", names) is not None


def hosted(quantization: dict | None, requested: str | None, **hf_keys) -> HostedModel:
    hf_config = SimpleNamespace(quantization_config=quantization, rope_parameters={"rope_type": "default"},
                                **hf_keys)
    return HostedModel(host="vLLM", architecture="Qwen3ForCausalLM", hf_config=hf_config,
                       dtype=torch.bfloat16, quantization=requested)


@pytest.mark.parametrize("quantization,requested,reasons", [
    ({**FP8, "weight_block_size": [128, 128]}, "fp8", ()),
    (compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True}),
     "compressed-tensors", ()),
    (None, "fp8", ("online quantization 'fp8' of an unquantized checkpoint is not supported",)),
    ({**FP8, "weight_block_size": [128, 128]}, "modelopt",
     ("quantization 'modelopt' differs from the checkpoint's 'fp8'",)),
    ({"quant_method": "gptq"}, "gptq", ("quantization 'gptq' is not supported",)),
    (GPT_OSS_MXFP4, "mxfp4", ("quantization 'mxfp4' is served for GPT-OSS only, not Qwen3ForCausalLM",)),
])
def test_decision(quantization, requested, reasons):
    assert decide_takeover(hosted(quantization, requested)).reasons == reasons


@pytest.mark.parametrize("method", ["mxfp4", "gpt_oss_mxfp4"])
@pytest.mark.parametrize("architecture,reasons", [
    ("GptOssForCausalLM", ()),
    ("MixtralForCausalLM", ("quantization 'mxfp4' is served for GPT-OSS only, not MixtralForCausalLM",)),
])
def test_mxfp4_is_served_for_gpt_oss_only(method, architecture, reasons, monkeypatch):
    monkeypatch.setenv("ATOM_SERVE_MXFP4", "1")
    model = hosted({**GPT_OSS_MXFP4, "quant_method": method}, method)
    assert decide_takeover(dataclasses.replace(model, architecture=architecture)).reasons == reasons


def test_mxfp4_is_served_only_when_asked(monkeypatch):
    """Off by default: on an H200 ATOM is level with vLLM alone on gpt-oss MXFP4 offline and slower
    serving 16 and 64 requests (atom_core.envs.serve_mxfp4, docs/performance.md)."""
    model = dataclasses.replace(hosted(GPT_OSS_MXFP4, "mxfp4"), architecture="GptOssForCausalLM")
    monkeypatch.delenv("ATOM_SERVE_MXFP4", raising=False)
    assert decide_takeover(model).reasons == (MXFP4_OPT_IN_REASON,)
    monkeypatch.setenv("ATOM_SERVE_MXFP4", "1")
    assert decide_takeover(model).atom_serves


def test_kv_cache_scales_of_mla_models_are_handed_back():
    quantization = {**compressed_tensors({"strategy": "channel"}, {"strategy": "token", "dynamic": True}),
                    "kv_cache_scheme": KV_CACHE_SCHEME}
    assert decide_takeover(hosted(quantization, "compressed-tensors")).atom_serves
    mla = dataclasses.replace(hosted(quantization, "compressed-tensors", kv_lora_rank=512),
                              architecture="DeepseekV3ForCausalLM")
    assert decide_takeover(mla).reasons == ("KV-cache scales of MLA models are not supported",)


def test_static_activation_scales_on_experts_are_handed_back():
    """Mixtral-8x7B-Instruct-v0.1-FP8 is published with static activation scales; a dense model's are
    served."""
    dense = hosted({**FP8, "activation_scheme": "static"}, "fp8")
    assert decide_takeover(dense).atom_serves
    moe = dataclasses.replace(dense, architecture="MixtralForCausalLM")
    assert decide_takeover(moe).reasons == ("static FP8 activation scales on MoE experts are not supported",)


def test_a_vision_language_checkpoint_lists_its_language_model_modules_by_their_checkpoint_names():
    """Qwen3.5 keeps its language model under ``model.language_model``, Kimi-K2.5 under
    ``language_model.model``; ATOM's language model is handed ``model.*`` and ``lm_head``."""
    listed = ["model.visual.blocks.0.attn.qkv", "model.language_model.layers.0.linear_attn.in_proj_b",
              "language_model.lm_head", r"re:model\.language_model\.layers\.1\..*", "re:.*visual.*"]
    text = SimpleNamespace(num_hidden_layers=2)
    vlm = SimpleNamespace(text_config=text, quantization_config={**FP8, "modules_to_not_convert": listed})
    config = language_model_config(vlm, text)
    assert config is not text and not hasattr(text, "quantization_config")
    assert config.quantization_config["modules_to_not_convert"] == [
        "model.visual.blocks.0.attn.qkv", "model.layers.0.linear_attn.in_proj_b", "lm_head",
        r"re:model\.layers\.1\..*", "re:.*visual.*"]
    assert vlm.quantization_config["modules_to_not_convert"] == listed
    assert language_model_config(text, text) is text


# AMD Quark MXFP4 (W4A4), as atom_core.testing.quark_checkpoints writes it (the published layout).
def quark(**changes) -> dict:
    from atom_core.testing.quark_checkpoints import quark_mxfp4_config

    config = quark_mxfp4_config()
    for key, value in changes.items():
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node[last] = value
    return config


def test_quark_mxfp4_is_w4a4_with_quarks_exclude_globs():
    config = parse(quark(exclude=["*self_attn*", "*mlp.gate", "lm_head", "re:.*layers\\.61\\..*",
                                  "model.layers.3.mlp.shared_experts.down_proj"]))
    assert config.method == "quark" and config.scheme == Mxfp4Scheme(32, quantized_inputs=True)
    names = WeightMap(stacked=STACKED_QKV_GATE_UP).checkpoint_modules
    unquantized = ["model.layers.0.self_attn.q_a_proj", "model.layers.5.self_attn.kv_b_proj",
                   "model.layers.3.mlp.gate", "lm_head", "model.layers.61.mlp.experts",
                   "model.layers.3.mlp.shared_experts.down_proj"]
    quantized = ["model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj",
                 "model.layers.3.mlp.shared_experts.gate_up_proj", "model.layers.4.mlp.shared_experts.down_proj"]
    assert all(config.scheme_for(name, names) is None for name in unquantized)
    assert all(config.scheme_for(name, names) is not None for name in quantized)
    assert config.scheme_for("model.layers.3.mlp.experts", experts=True) is not None


@pytest.mark.parametrize("changes,reason", [
    ({"global_quant_config.weight.dtype": "fp8_e4m3", "global_quant_config.input_tensors.dtype": "fp8_e4m3"},
     "quark global_quant_config.weight.dtype 'fp8_e4m3' is not supported"),
    ({"global_quant_config.weight.dtype": "int4"}, "quark global_quant_config.weight.dtype 'int4'"),
    ({"global_quant_config.weight.group_size": 16}, "quark global_quant_config.weight.group_size 16"),
    ({"global_quant_config.weight.scale_format": "float"}, "weight.scale_format 'float'"),
    ({"global_quant_config.input_tensors": None}, "quark global_quant_config.input_tensors None"),
    ({"global_quant_config.input_tensors.is_dynamic": False}, "input_tensors.is_dynamic False"),
    ({"global_quant_config.input_tensors.dtype": "fp8_e4m3"}, "input_tensors.dtype 'fp8_e4m3'"),
    ({"global_quant_config.weight.scale_calculation_mode": "ceil"}, "scale_calculation_mode 'ceil'"),
    ({"global_quant_config.output_tensors": {"dtype": "fp8_e4m3"}}, "global_quant_config.output_tensors"),
    ({"layer_quant_config": {"*down_proj": {}}}, "quark layer_quant_config (per-layer overrides"),
    ({"layer_type_quant_config": {"Linear": {}}}, "quark layer_type_quant_config"),
    ({"export.kv_cache_group": ["*k_proj", "*v_proj"]}, "quark export.kv_cache_group"),
])
def test_other_quark_variants_name_the_key(changes, reason):
    with pytest.raises(UnsupportedQuantization, match=re.escape(reason)):
        parse(quark(**changes))


def test_quark_mxfp4_is_served_for_deepseek_v3_only():
    model = dataclasses.replace(hosted(quark(), "quark", num_hidden_layers=2, q_lora_rank=None),
                                architecture="DeepseekV3ForCausalLM")
    assert decide_takeover(model).reasons == ()
    qwen3 = dataclasses.replace(model, architecture="Qwen3MoeForCausalLM")
    assert decide_takeover(qwen3).reasons == (
        "quantization 'quark' (MXFP4) is served for DeepSeek-V3 only, not Qwen3MoeForCausalLM",)
