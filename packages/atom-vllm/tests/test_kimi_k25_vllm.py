"""Kimi-K2.5 (``KimiK25ForConditionalGeneration``) through the real vLLM engine: vLLM's own class
builds its language model through vLLM's model registry as ``DeepseekV2ForCausalLM``, a DeepSeek-V3
config under V2's name, so ATOM's DeepSeek model and MLA backend serve it. Greedy tokens equal HF
transformers' DeepSeek-V3 on the same language-model weights (fp32, tiny random checkpoint), with
prefix-cache hits. The vision tower stays vLLM's: with the tower's tensors in the checkpoint, image
prompts give HF's DeepSeek-V3 tokens on the embeddings vLLM's own processor, tower and projector make
of the images outside the engine (``kimi_k25_vision_reference.py``), placed where vLLM places them.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_vllm_parity import make_prompts, tokens_of
from vllm.engine.arg_utils import EngineArgs
from vllm_testing import hf_greedy, needs_torchvision, run_vllm

from atom_core.testing.reference import hf_greedy_on_embeddings
from atom_core.testing.tiny_models import VOCAB_SIZE
from atom_core.testing.tiny_vision_language import (
    KIMI_K25_INT4_QUANTIZATION,
    add_tiny_kimi_k25_vision_tower,
    build_tiny_kimi_k25_language_model,
    write_test_images,
)
from atom_vllm.config_translation import takeover_decision

pytestmark = [pytest.mark.vllm, needs_torchvision]

MAX_TOKENS = 8
TOWER_OFF = {"limit_mm_per_prompt": {"image": 0, "video": 0, "vision_chunk": 0}}
MEDIA = VOCAB_SIZE - 1  # the tiny checkpoint's media_placeholder_token_id
TOWER_REFERENCE = str(Path(__file__).with_name("kimi_k25_vision_reference.py"))


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


def test_images_through_vllms_tower_match_hf_on_its_embeddings(tiny_model_dir, tmp_path):
    """Two images and a text prompt in one batch, then the first image prompt again (a prefix-cache
    hit): ATOM's language model gives HF's DeepSeek-V3 tokens on the image embeddings of vLLM's own
    image path, each image's placeholder expanded to its embedding rows."""
    text = tiny_model_dir("DeepseekV3ForCausalLM")
    model = build_tiny_kimi_k25_language_model(str(tmp_path / "kimi-k25"), text)
    add_tiny_kimi_k25_vision_tower(model)
    images = write_test_images(str(tmp_path))[:2]
    ids = [5, 6, 7, 8, MEDIA, 9, 10, 11]
    image_prompts = [{"ids": ids, "image": image} for image in images]
    phases = [[*image_prompts, ids[:4] + ids[5:]], image_prompts[:1]]
    result = run_vllm(model, phases, MAX_TOKENS, llm_kwargs={"limit_mm_per_prompt": {"vision_chunk": 1}})
    assert result["served_by"]["inner_class"] == "atom_core.models.deepseek_v2.DeepseekV2ForCausalLM"
    (first, second, text_only), (again,) = result["phases"]
    subprocess.run([sys.executable, TOWER_REFERENCE, model, str(tmp_path / "embeddings.pt"), *images], check=True)
    embeddings = torch.load(tmp_path / "embeddings.pt")
    assert [first["tokens"], second["tokens"]] == hf_greedy_on_embeddings(text, ids, MEDIA, embeddings, MAX_TOKENS)
    assert first["tokens"] != second["tokens"]  # the image matters
    assert text_only["tokens"] == hf_greedy(text, [ids[:4] + ids[5:]], MAX_TOKENS)[0]
    assert again["tokens"] == first["tokens"] and again["num_cached_tokens"] > 0


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
