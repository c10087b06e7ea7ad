"""The takeover decision (atom_core.hosting.takeover) on published HF configs, read by the installed
transformers, and HF's defaults for the keys published configs omit (atom_core.hosting.hf_config).

ci/test.sh runs it under the lock's transformers (5.23), the oldest vLLM 0.26 accepts (5.5.3) and the
SGLang environment's (5.12); the older two have no ``GptOssConfig.swiglu_alpha`` at all: the case the
defaults exist for.
"""

import dataclasses
import gzip
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from test_hf_parity import assert_logits_match_hf
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

from atom_core.hosting.hf_config import complete_hf_config, language_model_config
from atom_core.hosting.takeover import (
    EXPERT_PARALLEL_NOTE,
    HYBRID_GPU_OPT_IN_REASON,
    MXFP4_OPT_IN_REASON,
    SLOWER_ON_GPU,
    HostedModel,
    TakeoverRefused,
    decide_takeover,
    enforce_strict,
    report_hand_back,
)
from atom_core.models import SUPPORTED_ARCHITECTURES, get_model_class
from atom_core.testing.quark_checkpoints import TINY_QUARK_OVERRIDES, quark_mxfp4_config
from atom_core.testing.tiny_models import tiny_hf_config

# Hub checkpoints' config files as published, name -> {file name: content} (config.json, and
# hf_quant_config.json where a checkpoint keeps its quantization there; sources:
# data/published_configs_sources.md). Gzipped: 53 KB of JSON.
PUBLISHED = json.loads(gzip.decompress((Path(__file__).parent / "data" / "published_checkpoints.json.gz").read_bytes()))

# What each published checkpoint gets, served as its Hub repository ships it.
EXPECTED_REASONS = {
    "qwen3-8b": (),
    "qwen3-30b-a3b": (),
    "llama-3.1-8b-instruct": (),  # llama3 rope
    "mixtral-8x7b-instruct-v0.1": (),
    "deepseek-v2-lite": (),  # yarn rope
    "gpt-oss-20b": (MXFP4_OPT_IN_REASON,),  # MXFP4 experts: served with ATOM_SERVE_MXFP4=1
    "gpt-oss-120b": (MXFP4_OPT_IN_REASON,),
    "deepseek-v3": (),  # block FP8
    "qwen3-30b-a3b-fp8": (),  # block FP8; routers and norms listed as unquantized
    "qwen3-next-80b-a3b-instruct": (),  # hybrid: on GPUs opt-in (test_hybrid_models_on_a_gpu_are_opt_in)
    "qwen3.5-35b-a3b": (),  # vision-language: ATOM serves its language model
    "qwen3.5-27b": (),  # dense vision-language
    "qwen3-32b-fp8": (),  # dense block FP8
    "qwen3-235b-a22b-fp8": (),  # block FP8; 283 unquantized modules listed (routers, norms)
    "qwen3-coder-480b-a35b-instruct": (),
    "llama-3.1-70b": (),
    "mixtral-8x22b-v0.1": (),
    "qwen3-vl-8b-instruct": ("ATOM has no implementation of Qwen3VLForConditionalGeneration",),
}
# Read by the hosts' own config readers only (test_takeover_vllm.py, test_sglang_config_translation.py):
# kimi-k2-instruct (model_type kimi_k2, remote code for transformers), deepseek-v3.2 (unknown to
# transformers 5.5.3), and the ModelOpt checkpoints, whose quantization sits in hf_quant_config.json.


def published_config(name: str, tmp_path: Path):
    """The published config.json as the installed transformers reads it from a checkpoint dir."""
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED[name]["config.json"]))
    return AutoConfig.from_pretrained(tmp_path)


def hosted(hf_config, **fields) -> HostedModel:
    """What a host asks for a checkpoint served as shipped: its architecture, its language model's
    config (as the glues pass it), bf16, and the quantization method its config declares."""
    quantization = (getattr(hf_config, "quantization_config", None) or {}).get("quant_method")
    settings = dict(host="vLLM", architecture=hf_config.architectures[0], dtype=torch.bfloat16,
                    hf_config=language_model_config(hf_config, hf_config.get_text_config()),
                    quantization=quantization)
    return HostedModel(**{**settings, **fields})


@pytest.mark.parametrize("name", sorted(EXPECTED_REASONS))
def test_published_checkpoints(name, tmp_path):
    decision = decide_takeover(hosted(published_config(name, tmp_path)))
    assert decision.reasons == EXPECTED_REASONS[name]


@pytest.mark.parametrize("name", sorted(name for name, config in PUBLISHED.items() if name in EXPECTED_REASONS
                                         and config["config.json"]["architectures"][0] in SUPPORTED_ARCHITECTURES))
def test_published_configs_complete_to_what_the_model_reads(name, tmp_path):
    """Every optional key an ATOM family reads is present after completion, whichever
    transformers read the config; the host's config object is left as it was."""
    hf_config = published_config(name, tmp_path)
    before = hf_config.to_dict()
    defaults = get_model_class(hf_config.architectures[0]).hf_defaults
    completed = complete_hf_config(hf_config.get_text_config(), defaults)
    assert all(hasattr(completed, key) for key in defaults)
    assert completed.num_key_value_heads is not None
    assert hf_config.to_dict() == before


def test_gpt_oss_without_swiglu_alpha_gets_hf_default(tmp_path):
    hf_config = published_config("gpt-oss-20b", tmp_path)
    completed = complete_hf_config(hf_config, get_model_class("GptOssForCausalLM").hf_defaults)
    assert completed.swiglu_alpha == 1.702
    assert completed.swiglu_limit == 7.0  # the published value


# Vision-language architectures are the image-text-to-text mapping's; ATOM reads their text config.
FAMILY_MODEL_TYPES = {arch: model_type for mapping in (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                       MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
                      for model_type, arch in mapping.items() if arch in SUPPORTED_ARCHITECTURES}


@pytest.mark.parametrize("architecture", sorted(FAMILY_MODEL_TYPES))
def test_hf_defaults_are_those_of_transformers(architecture):
    """ATOM's defaults equal the installed transformers' for every key its config class has (a
    release that lacks a key is what the default is for)."""
    hf_default = CONFIG_MAPPING[FAMILY_MODEL_TYPES[architecture]]().get_text_config()
    defaults = get_model_class(architecture).hf_defaults
    # transformers 5 keeps rope keys (partial_rotary_factor) in rope_parameters.
    rope = getattr(hf_default, "rope_parameters", None) or {}
    known = {key: getattr(hf_default, key) if hasattr(hf_default, key) else rope[key]
             for key in defaults if hasattr(hf_default, key) or key in rope}
    assert known == {key: defaults[key] for key in known}
    if Version(transformers.__version__) >= Version("5.23"):
        assert known.keys() == defaults.keys()


def test_gpt_oss_published_layout_matches_hf(tiny_model_dir, tmp_path):
    """A tiny GPT-OSS checkpoint whose config omits ``swiglu_alpha`` as the published one does
    (its ``swiglu_limit`` is the published 7.0): ATOM's logits equal HF's."""
    model_dir = tmp_path / "gpt-oss"
    shutil.copytree(tiny_model_dir("GptOssForCausalLM", swiglu_limit=7.0), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("swiglu_alpha", None)  # older transformers do not write it at all
    (model_dir / "config.json").write_text(json.dumps(config))
    assert_logits_match_hf(str(model_dir))


@pytest.fixture
def qwen3(tmp_path):
    return hosted(published_config("qwen3-8b", tmp_path))


@pytest.mark.parametrize("fields,reason", [
    ({"architecture": "Qwen2ForCausalLM"}, "ATOM has no implementation of Qwen2ForCausalLM"),
    ({"generates": False}, "ATOM serves text generation, not embedding or pooling"),
    ({"quantization": "fp8"}, "online quantization 'fp8' of an unquantized checkpoint is not supported"),
    ({"lora": True}, "LoRA is not supported"),
    ({"pipeline_parallel_size": 2}, "pipeline parallelism (size 2) is not supported"),
    ({"context_parallel_size": 2}, "context parallelism (size 2) is not supported"),
    ({"data_parallel_attention": True}, "data-parallel attention is not supported"),
    ({"expert_load_balancing": True}, "expert-parallel load balancing (EPLB) is not supported"),
    ({"kv_cache_dtype": "fp8_e5m2"}, "KV-cache dtype 'fp8_e5m2' is not supported"),
    ({"kv_cache_dtype": "float16"}, "KV-cache dtype 'float16' is not supported"),
    ({"dtype": torch.float64}, "dtype torch.float64 is not supported"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_reason(qwen3, fields, reason):
    assert decide_takeover(dataclasses.replace(qwen3, **fields)).reasons == (reason,)


def test_data_parallel_replicas_of_a_moe_model_are_handed_back(qwen3, tmp_path):
    """vLLM shards a MoE model's experts across its data-parallel replicas; ATOM's replicas would each
    hold the whole of them. A dense model's replicas are independent: ATOM serves them."""
    moe = hosted(published_config("qwen3-30b-a3b", tmp_path), data_parallel_size=2)
    assert decide_takeover(moe).reasons == (
        "experts sharded across 2 data-parallel replicas are not supported "
        "(ATOM shards experts across the tensor-parallel ranks of one replica)",)
    assert decide_takeover(dataclasses.replace(qwen3, data_parallel_size=2)).atom_serves


def test_expert_parallelism_is_served_with_a_note(qwen3, tmp_path):
    """One replica with expert parallelism: ATOM serves the MoE model, splitting each expert across
    the TP ranks, and notes it; a dense model has nothing to note."""
    moe = decide_takeover(hosted(published_config("qwen3-30b-a3b", tmp_path), expert_parallel=True))
    assert moe.atom_serves and moe.notes == (EXPERT_PARALLEL_NOTE,)
    dense = decide_takeover(dataclasses.replace(qwen3, expert_parallel=True))
    assert dense.atom_serves and dense.notes == ()


def test_experts_that_do_not_split_into_whole_blocks_are_handed_back(tmp_path, monkeypatch):
    """ATOM gives every TP rank its share of each expert. Qwen3-30B-A3B-FP8's 768 rows give 192 a rank
    at TP 4, not whole 128-row scale blocks: the host, with expert parallelism, keeps experts whole
    and serves it; ATOM hands it back, with or without expert parallelism. TP 2 (384 rows) and bf16
    at TP 4 split fine; so does the tiny Quark MXFP4 DeepSeek-V3's 64 rows at TP 2 (atom-vllm's TP 2
    cell), not at TP 4 (16 a rank). gpt-oss's 2880 MXFP4 rows are served at any TP: at TP 4 and 8
    (720 and 360 a rank, inside 32-value blocks) ATOM pads each rank's share to whole blocks."""
    fp8 = hosted(published_config("qwen3-30b-a3b-fp8", tmp_path), tensor_parallel_size=4)
    reason = ("experts of 768 intermediate rows do not split across 4 tensor-parallel ranks in whole 128-row "
              "blocks of the checkpoint's scales")
    assert decide_takeover(fp8).reasons == (reason,)
    assert decide_takeover(dataclasses.replace(fp8, expert_parallel=True)).reasons == (reason,)
    assert decide_takeover(dataclasses.replace(fp8, tensor_parallel_size=2)).atom_serves
    bf16 = hosted(published_config("qwen3-30b-a3b", tmp_path), tensor_parallel_size=4)
    assert decide_takeover(bf16).atom_serves
    assert decide_takeover(dataclasses.replace(bf16, tensor_parallel_size=5)).reasons == (
        "experts of 768 intermediate rows do not split across 5 tensor-parallel ranks in equal parts",)
    monkeypatch.setenv("ATOM_SERVE_MXFP4", "1")
    gpt_oss = hosted(published_config("gpt-oss-20b", tmp_path), tensor_parallel_size=2)
    assert all(decide_takeover(dataclasses.replace(gpt_oss, tensor_parallel_size=tp, expert_parallel=ep)).atom_serves
               for tp in (2, 4, 8) for ep in (False, True))
    quark = tiny_hf_config("DeepseekV3ForCausalLM", **TINY_QUARK_OVERRIDES,
                           quantization_config=quark_mxfp4_config())
    assert decide_takeover(hosted(quark, tensor_parallel_size=2, expert_parallel=True)).atom_serves
    assert decide_takeover(hosted(quark, tensor_parallel_size=4, expert_parallel=True)).reasons == (
        "experts of 64 intermediate rows do not split across 4 tensor-parallel ranks in whole 32-row "
        "blocks of the checkpoint's scales",)


def test_speculative_decoding_of_recurrent_state_is_handed_back(qwen3):
    """Qwen3-Next's Gated DeltaNet state is cached once per sequence, with no room for draft tokens;
    a model without recurrent state keeps serving under vLLM's n-gram speculation."""
    qwen3_next = hosted(tiny_hf_config("Qwen3NextForCausalLM"), speculative_method="ngram")
    assert decide_takeover(qwen3_next).reasons == (
        "speculative decoding of Qwen3NextForCausalLM's recurrent state is not supported",)
    assert decide_takeover(dataclasses.replace(qwen3_next, speculative_method=None)).atom_serves
    assert decide_takeover(dataclasses.replace(qwen3, speculative_method="ngram")).atom_serves


@pytest.mark.parametrize("host,method", [("vLLM", "eagle"), ("vLLM", "eagle3"), ("vLLM", "mtp"),
                                         ("vLLM", "draft_model"), ("SGLang", "EAGLE3"), ("SGLang", "NGRAM")])
def test_speculative_decoding_with_a_draft_model_is_handed_back(qwen3, host, method):
    model = dataclasses.replace(qwen3, host=host, speculative_method=method)
    assert decide_takeover(model).reasons == (
        f"speculative decoding by '{method}' is not supported (ATOM serves vLLM's n-gram proposer only)",)


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b-instruct", "qwen3.5-35b-a3b"])
def test_hybrid_models_on_a_gpu_are_opt_in(qwen3, name, tmp_path, monkeypatch):
    """Hybrid models (Qwen3-Next, Qwen3.5), as published: on a GPU the host serves them unless
    ATOM_SERVE_HYBRID_ON_GPU=1; models without recurrent state are served on GPUs as before."""
    monkeypatch.delenv("ATOM_SERVE_HYBRID_ON_GPU", raising=False)
    hybrid = hosted(published_config(name, tmp_path), device="cuda")
    assert decide_takeover(hybrid).reasons == (HYBRID_GPU_OPT_IN_REASON,)
    assert decide_takeover(dataclasses.replace(hybrid, device="cpu")).atom_serves
    assert decide_takeover(dataclasses.replace(qwen3, device="cuda")).atom_serves
    monkeypatch.setenv("ATOM_SERVE_HYBRID_ON_GPU", "1")
    assert decide_takeover(hybrid).atom_serves


def test_models_measured_slower_on_a_gpu_stay_with_that_host(monkeypatch):
    """gpt-oss ran slower on SGLang with ATOM than alone on an H200: on SGLang's GPUs SGLang serves it,
    saying so with the measurement, unless ATOM_SERVE_WHERE_SLOWER=1; on CPU and in vLLM ATOM does."""
    monkeypatch.delenv("ATOM_SERVE_WHERE_SLOWER", raising=False)
    gpt_oss = hosted(tiny_hf_config("GptOssForCausalLM"), host="SGLang", device="cuda")
    (reason,) = decide_takeover(gpt_oss).reasons
    assert SLOWER_ON_GPU[("SGLang", "GptOssForCausalLM")] in reason
    assert "ATOM_SERVE_WHERE_SLOWER=1" in reason
    assert decide_takeover(dataclasses.replace(gpt_oss, device="cpu")).atom_serves
    assert decide_takeover(dataclasses.replace(gpt_oss, host="vLLM")).atom_serves
    monkeypatch.setenv("ATOM_SERVE_WHERE_SLOWER", "1")
    assert decide_takeover(gpt_oss).atom_serves


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "bf16", "fp8", "fp8_e4m3"])
def test_kv_cache_in_the_model_dtype_or_e4m3_is_served(qwen3, kv_cache_dtype):
    assert decide_takeover(dataclasses.replace(qwen3, kv_cache_dtype=kv_cache_dtype)).atom_serves


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3"])
def test_fp8_kv_cache_of_mla_models_is_served(tmp_path, kv_cache_dtype):
    mla = hosted(published_config("deepseek-v2-lite", tmp_path), kv_cache_dtype=kv_cache_dtype)
    assert decide_takeover(mla).atom_serves


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_unsupported_rope_types_are_handed_back(qwen3, rope_type):
    hf_config = qwen3.hf_config
    hf_config.rope_parameters = {**hf_config.rope_parameters, "rope_type": rope_type, "factor": 2.0}
    assert decide_takeover(qwen3).reasons == (f"rope type {rope_type!r} is not supported",)


def test_all_reasons_are_named_in_one_line(qwen3):
    decision = decide_takeover(dataclasses.replace(qwen3, host="SGLang", quantization="awq", lora=True))
    assert decision.hand_back_line() == ("ATOM hands Qwen3ForCausalLM back to SGLang: "
                                         "online quantization 'awq' of an unquantized checkpoint is not "
                                         "supported; LoRA is not supported")


def test_strict_takeover_refuses_a_hand_back_naming_the_reason(qwen3, monkeypatch, caplog):
    decision = decide_takeover(dataclasses.replace(qwen3, lora=True))
    monkeypatch.delenv("ATOM_STRICT_TAKEOVER", raising=False)
    atom_logger = logging.getLogger("atom")  # does not propagate to the root logger caplog watches
    atom_logger.addHandler(caplog.handler)
    try:
        report_hand_back(decision)
    finally:
        atom_logger.removeHandler(caplog.handler)
    assert "ATOM hands Qwen3ForCausalLM back to vLLM: LoRA is not supported" in caplog.text
    monkeypatch.setenv("ATOM_STRICT_TAKEOVER", "1")
    with pytest.raises(TakeoverRefused, match="LoRA is not supported. ATOM_STRICT_TAKEOVER=1 forbids"):
        report_hand_back(decision)
    enforce_strict(decide_takeover(qwen3))  # a model ATOM serves passes
