"""VllmConfig -> atom_core Config: one row per translated field, on real VllmConfig objects."""

import pytest
import torch
from vllm.engine.arg_utils import EngineArgs

from atom_core.config import CompilationLevel
from atom_vllm.config_translation import atom_config_from_vllm, takeover_decision

ENGINE_ARGS = [
    dict(dtype="float32", max_model_len=300, enforce_eager=True),
    dict(dtype="bfloat16", max_model_len=512, compilation_config={"mode": 2}),
    dict(dtype="float32", max_model_len=256, additional_config={"atom_compilation_level": 3}),
]

# (ATOM field, function of (vllm_config, engine kwargs) giving the expected value)
TABLE = [
    ("model", lambda v, kw: v.model_config.model),
    ("hf_config", lambda v, kw: v.model_config.hf_config),
    ("torch_dtype", lambda v, kw: getattr(torch, kw["dtype"])),
    ("max_model_len", lambda v, kw: kw["max_model_len"]),
    ("compilation_config.level",
     lambda v, kw: CompilationLevel(kw.get("additional_config", {}).get(
         "atom_compilation_level", kw.get("compilation_config", {}).get("mode", 0)))),
]


def field(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.fixture(scope="module", params=range(len(ENGINE_ARGS)))
def translated(request, tiny_model_dir):
    kwargs = ENGINE_ARGS[request.param]
    vllm_config = EngineArgs(model=tiny_model_dir("Qwen3ForCausalLM"), **kwargs).create_engine_config()
    return vllm_config, kwargs, atom_config_from_vllm(vllm_config)


@pytest.mark.parametrize("name,expected", TABLE, ids=[row[0] for row in TABLE])
def test_field(translated, name, expected):
    vllm_config, kwargs, atom_config = translated
    assert field(atom_config, name) == expected(vllm_config, kwargs)



def test_speculative_decoding_reaches_the_takeover_decision(tiny_model_dir):
    """vLLM's draft-token count is what hands Qwen3-Next's recurrent state back to vLLM."""
    vllm_config = EngineArgs(
        model=tiny_model_dir("Qwen3NextForCausalLM"), dtype="float32", max_model_len=256,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
    ).create_engine_config()
    assert takeover_decision(vllm_config).reasons == (
        "speculative decoding of Qwen3NextForCausalLM's recurrent state is not supported",)
