"""SGLang ModelConfig -> atom_core Config: the translation table, and the CPU padding undone."""

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sglang_testing import ResolvedWith, decision_for
from transformers import Qwen3Config

from atom_core.config import CompilationLevel
from atom_core.hosting.takeover import EXPERT_PARALLEL_NOTE
from atom_core.testing.tiny_models import tiny_hf_config
from atom_sglang.config_translation import (
    CPU_GRAPHS_REASON,
    STATE_CHECKPOINTS_REASON,
    atom_config_from_sglang,
    takeover_decision,
    unpadded_hf_config,
)
from atom_sglang.resolved_args import in_effect, model_config_of


def hf_config(**overrides):
    settings = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
    return Qwen3Config(**{**settings, **overrides})


def model_config(hf, **fields):
    """What ATOM reads of SGLang's ModelConfig for a text model (its text config is the config)."""
    return SimpleNamespace(**{"model_path": "/models/tiny", "hf_config": hf, "hf_text_config": hf,
                              "dtype": torch.float16, "context_len": 4096, "model_impl": "auto", **fields})


# (ATOM field, expected value for model_config(hf_config()))
TABLE = [
    ("model", "/models/tiny"),
    ("torch_dtype", torch.float16),
    ("max_model_len", 4096),
    ("compilation_config.level", CompilationLevel.NO_COMPILATION),
]


@pytest.mark.parametrize("name, expected", TABLE, ids=[row[0] for row in TABLE])
def test_translation_table(name, expected):
    hf = hf_config()
    config = atom_config_from_sglang(model_config(hf), hf)
    value = config
    for part in name.split("."):
        value = getattr(value, part)
    assert value == expected


def test_unpadded_hf_config_is_sglangs_own():
    hf = hf_config()
    assert atom_config_from_sglang(model_config(hf), hf).hf_config is hf


def test_cpu_padding_is_undone_on_a_copy():
    padded = hf_config(intermediate_size=128, original_intermediate_size=96, original_num_attention_heads=4)
    config = atom_config_from_sglang(model_config(padded), padded)
    assert config.hf_config.intermediate_size == 96
    assert padded.intermediate_size == 128  # SGLang's own config is left alone


def test_padded_heads_are_refused():
    with pytest.raises(NotImplementedError, match="padded 3 attention heads to 4"):
        unpadded_hf_config(hf_config(original_num_attention_heads=3))


@pytest.mark.parametrize("heads, kv_heads, atom_serves", [(6, 3, False), (4, 1, False), (8, 2, True)])
def test_heads_sglang_pads_on_cpu_are_handed_back(tmp_path, heads, kv_heads, atom_serves):
    """TP 2 on CPU: where it does not divide the heads, SGLang pads them when its model runner starts.
    ATOM hands such a model back both before (the attention default) and after (the model class)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp
    from sglang.srt.server_args import ServerArgs

    hf_config(num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16,
              architectures=["Qwen3ForCausalLM"]).save_pretrained(tmp_path)
    server_args = ResolvedWith(in_effect(ServerArgs(model_path=str(tmp_path), device="cpu", skip_tokenizer_init=True)),
                               tp_size=2)
    model_config = model_config_of(server_args)
    before = takeover_decision(server_args, model_config)
    adjust_config_with_unaligned_cpu_tp(model_config, LoadConfig(), 2)
    assert (model_config.num_attention_heads != heads) == (not atom_serves)
    after = takeover_decision(server_args, model_config)
    reason = (f"SGLang pads {heads} query and {kv_heads} KV heads on CPU for TP size 2, which does not divide "
              "them; ATOM's models take unpadded heads only")
    assert before.reasons == after.reasons == (() if atom_serves else (reason,))


def plain_server_args() -> SimpleNamespace:
    """The server arguments the decision reads, as SGLang's defaults on a CPU set them."""
    return SimpleNamespace(enable_lora=False, lora_paths=None, tp_size=1, pp_size=1, kv_cache_dtype="auto",
                           is_embedding=False, device="cpu", enable_dp_attention=False, ep_size=1, enable_eplb=False,
                           dcp_size=1, attn_cp_size=1, speculative_algorithm=None, disable_radix_cache=False,
                           mamba_radix_cache_strategy="auto", disable_overlap_schedule=False, page_size=None,
                           encoder_only=False)


@pytest.mark.parametrize("settings, reasons, notes", [
    ({"tp_size": 2, "ep_size": 2}, (), (EXPERT_PARALLEL_NOTE,)),
    ({"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}, ("data-parallel attention is not supported",), ()),
    ({"tp_size": 2, "ep_size": 2, "enable_eplb": True},
     ("expert-parallel load balancing (EPLB) is not supported",), ()),
    ({"tp_size": 2, "dcp_size": 2}, ("context parallelism (size 2) is not supported",), ()),
    ({"speculative_algorithm": "NGRAM"},
     ("speculative decoding by 'NGRAM' is not supported (ATOM serves vLLM's n-gram proposer only)",), ()),
], ids=["expert parallel", "DP attention", "EPLB", "decode context parallel", "n-gram speculation"])
def test_parallel_layouts_read_from_server_args(tiny_model_dir, settings, reasons, notes):
    """SGLang's parallel settings, read from its own resolved ServerArgs (no engine start): expert
    parallelism is served with its note, data-parallel attention, EPLB and context parallelism are
    handed back; so is speculative decoding (SGLang's n-gram verifies a token tree with its own mask)."""
    decision = decision_for(tiny_model_dir("Qwen3MoeForCausalLM"), **settings)
    assert (decision.reasons, decision.notes) == (reasons, notes)


@pytest.mark.parametrize("enable_torch_compile", [False, True])
def test_cpu_graphs_are_handed_back(tiny_model_dir, enable_torch_compile):
    """On CPU, ``--enable-torch-compile`` makes SGLang capture CPU graphs, which need the attention
    backend's ``init_cpu_graph_state`` (ATOM's backend has none: the engine stopped at start-up with an
    AttributeError naming it), so SGLang serves the model with its own backend."""
    decision = decision_for(tiny_model_dir("Qwen3ForCausalLM"), enable_torch_compile=enable_torch_compile)
    assert decision.reasons == ((CPU_GRAPHS_REASON,) if enable_torch_compile else ())
    assert decision.atom_serves is not enable_torch_compile


@pytest.mark.parametrize("settings, served", [
    ({}, False),
    ({"disable_overlap_schedule": True}, True),
    ({"disable_overlap_schedule": True, "page_size": 16}, False),
    ({"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True}, True),
    ({"mamba_radix_cache_strategy": "extra_buffer", "disable_overlap_schedule": True}, False),
    ({"mamba_radix_cache_strategy": "extra_buffer_lazy"}, False),
    ({"disable_radix_cache": True}, True),
], ids=["auto with overlap", "auto without overlap", "auto with pages", "no_buffer", "extra_buffer",
        "extra_buffer_lazy", "no radix cache"])
def test_recurrent_state_models_need_no_state_checkpoints(settings, served):
    """Qwen3-Next's Gated DeltaNet states live in SGLang's state pool, but not with SGLang's
    extra_buffer radix cache (its intermediate states at chunk boundaries), which SGLang's ``auto``
    picks where overlap scheduling is on or pages hold several tokens. Other models do not care."""
    server_args = SimpleNamespace(**{**vars(plain_server_args()), **settings})
    qwen3_next = model_config(tiny_hf_config("Qwen3NextForCausalLM"), dtype=torch.bfloat16, quantization=None)
    assert takeover_decision(server_args, qwen3_next).reasons == (() if served else (STATE_CHECKPOINTS_REASON,))
    qwen3 = model_config(tiny_hf_config("Qwen3ForCausalLM"), dtype=torch.bfloat16, quantization=None)
    assert takeover_decision(server_args, qwen3).atom_serves


def test_published_qwen3_next_gets_hf_layer_types(tmp_path):
    """The published Qwen3-Next config through SGLang's own ModelConfig (its config class keeps no
    layer_types) with SGLang's no_buffer radix cache: ATOM serves it, and its model reads the layer
    types of HF's rule, which are the layer split of SGLang's state pool."""
    from sglang.srt.server_args import ServerArgs

    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["qwen3-next-80b-a3b-instruct"]["config.json"]))
    server_args = in_effect(ServerArgs(model_path=str(tmp_path), device="cpu", skip_tokenizer_init=True,
                                       disable_overlap_schedule=True))
    model_config = model_config_of(server_args)
    assert takeover_decision(server_args, model_config).atom_serves
    assert getattr(model_config.hf_config, "layer_types", None) is None
    layer_types = atom_config_from_sglang(model_config, model_config.hf_config).hf_config.layer_types
    assert [i for i, kind in enumerate(layer_types) if kind == "full_attention"] == (
        model_config.hf_config.full_attention_layer_ids)
    assert layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]


@pytest.mark.parametrize("name", ["qwen3.5-27b", "qwen3.5-35b-a3b"])
def test_published_qwen3_5_language_model_reads_sglangs_text_config(name, tmp_path):
    """The published Qwen3.5 configs through SGLang's own ModelConfig with SGLang's no_buffer radix
    cache: ATOM serves them, its language model built from the text config SGLang's VLM hands it
    (whose config class keeps no layer_types) with the layer types of HF's rule: the published ones,
    and the layer split of SGLang's state pool."""
    from sglang.srt.server_args import ServerArgs

    published = PUBLISHED[name]["config.json"]
    (tmp_path / "config.json").write_text(json.dumps(published))
    server_args = in_effect(ServerArgs(model_path=str(tmp_path), device="cpu", skip_tokenizer_init=True,
                                       disable_overlap_schedule=True, mamba_radix_cache_strategy="no_buffer"))
    model_config = model_config_of(server_args)
    assert takeover_decision(server_args, model_config).atom_serves
    # Decided on the language model's config: at TP 2 the experts' split is checked on its sizes.
    assert takeover_decision(ResolvedWith(server_args, tp_size=2), model_config).atom_serves
    text_config = model_config.hf_config.text_config
    assert getattr(text_config, "layer_types", None) is None
    layer_types = atom_config_from_sglang(model_config, text_config).hf_config.layer_types
    assert layer_types == published["text_config"]["layer_types"]
    assert [i for i, kind in enumerate(layer_types) if kind == "full_attention"] == text_config.full_attention_layer_ids


# Hub checkpoints' config files as published (atom-core's test data; sources beside it). Left out:
# what SGLang alone refuses on a CPU before ATOM is asked (gpt-oss: no mxfp4 method; DeepSeek-V3.2:
# wants an NVIDIA driver; the hybrids: its default state-cache strategy wants a GPU).
PUBLISHED = json.loads(gzip.decompress(
    (Path(__file__).parents[2] / "atom-core/tests/data/published_checkpoints.json.gz").read_bytes()))
SGLANG_REFUSES_ON_CPU = {"gpt-oss-20b", "gpt-oss-120b", "deepseek-v3.2", "qwen3-next-80b-a3b-instruct",
                         "qwen3.5-27b", "qwen3.5-35b-a3b"}
PUBLISHED_HANDED_BACK = {
    "qwen3-vl-8b-instruct": "ATOM has no implementation of Qwen3VLForConditionalGeneration",
    "llama-3.1-70b-instruct-fp8": "quantization 'modelopt_fp8' is not supported",
    "deepseek-v3.1-nvfp4": "quantization 'modelopt_fp4' is not supported"}


@pytest.mark.parametrize("name", sorted(PUBLISHED.keys() - SGLANG_REFUSES_ON_CPU))
def test_published_configs_decided_from_sglang_model_config(name, tmp_path):
    """Each published checkpoint's config files through SGLang's own ModelConfig (no weights): ATOM
    serves it, or hands it back with its reason. ModelOpt checkpoints keep their quantization in
    hf_quant_config.json, which SGLang reads and ATOM must not mistake for an unquantized checkpoint."""
    for file_name, content in PUBLISHED[name].items():
        (tmp_path / file_name).write_text(json.dumps(content))
    reason = PUBLISHED_HANDED_BACK.get(name)
    assert decision_for(str(tmp_path), skip_tokenizer_init=True).reasons == (() if reason is None else (reason,))
