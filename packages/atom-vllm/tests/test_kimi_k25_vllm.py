"""Kimi-K2.5 (``KimiK25ForConditionalGeneration``) through the real vLLM engine: vLLM's own class
builds its language model through vLLM's model registry as ``DeepseekV2ForCausalLM``, a DeepSeek-V3
config under V2's name, so ATOM's DeepSeek model and MLA backend serve it. Greedy tokens equal HF
transformers' DeepSeek-V3 on the same language-model weights (fp32, tiny random checkpoint), with
prefix-cache hits. The vision tower stays vLLM's and is off here (no tower tensors in the tiny
checkpoint); Qwen3.5's tests cover images through a VLM with ATOM's language model.
"""

import json
from pathlib import Path

import pytest
from test_vllm_parity import make_prompts, tokens_of
from vllm.engine.arg_utils import EngineArgs
from vllm_testing import hf_greedy, needs_torchvision, run_vllm

from atom_core.testing.tiny_vision_language import KIMI_K25_INT4_QUANTIZATION, build_tiny_kimi_k25_language_model
from atom_vllm.config_translation import takeover_decision

pytestmark = [pytest.mark.vllm, needs_torchvision]

MAX_TOKENS = 8
TOWER_OFF = {"limit_mm_per_prompt": {"image": 0, "video": 0, "vision_chunk": 0}}


def test_language_model_served_by_atom_matches_hf(tiny_model_dir, tmp_path):
    text = tiny_model_dir("DeepseekV3ForCausalLM")
    model = build_tiny_kimi_k25_language_model(str(tmp_path / "kimi-k25"), text)
    phases = list(make_prompts())
    result = run_vllm(model, phases, MAX_TOKENS, llm_kwargs=TOWER_OFF)
    served = result["served_by"]
    assert served["model_class"] == "vllm.model_executor.models.kimi_k25.KimiK25ForConditionalGeneration"
    assert served["inner_class"] == "atom_core.models.deepseek_v2.DeepseekV2ForCausalLM"
    assert served["attention_impls"] == ["atom_vllm.attention.mla.ATOMMLAImpl"]
    assert "vLLM's KimiK25ForConditionalGeneration builds its language model as DeepseekV2ForCausalLM" in result["log"]
    assert all(o["num_cached_tokens"] > 0 for o in result["phases"][1])
    assert tokens_of(result) == hf_greedy(text, phases[0] + phases[1], MAX_TOKENS)


@pytest.mark.parametrize("quantization, reasons", [
    (None, ()), (KIMI_K25_INT4_QUANTIZATION, ("compressed-tensors format 'pack-quantized' is not supported",))])
def test_language_model_decision_reads_the_text_config(quantization, reasons, tiny_model_dir, tmp_path):
    """The language model vLLM's class builds (hf_config: the text config, as
    ``init_vllm_registered_model`` passes it): ATOM serves bf16 and hands the int4 one back."""
    model = build_tiny_kimi_k25_language_model(str(tmp_path / "kimi-k25"), tiny_model_dir("DeepseekV3ForCausalLM"))
    config = json.loads((Path(model) / "config.json").read_text())
    config["text_config"]["quantization_config"] = quantization
    (Path(model) / "config.json").write_text(json.dumps(config))
    args = EngineArgs(model=model, max_model_len=256, skip_tokenizer_init=True, dtype="bfloat16")
    outer = args.create_engine_config()
    assert outer.model_config.quantization == ("compressed-tensors" if quantization else None)
    inner = outer.with_hf_config(outer.model_config.hf_config.text_config, architectures=["DeepseekV2ForCausalLM"])
    assert takeover_decision(inner).reasons == reasons
