"""Kimi-K2.5 through the real SGLang engine (CPU): SGLang's class (tower, projector) with ATOM's
DeepSeek-V3 as its language model. Greedy tokens equal HF's DeepSeek-V3 on the same weights (fp32, tiny
random checkpoint), with radix-cache hits: text prompts, and with the tower's tensors in the checkpoint
image prompts on the embeddings SGLang's own processor, tower and projector make of the images outside
the engine (``kimi_k25_vision_reference.py``), placed where SGLang places them. SGLang alone runs no
tiny MLA model on CPU (its torch_native extend takes the value head size for the query's): HF is the
reference, as for DeepSeek-V3 in test_sglang_parity. The processor is
atom_core.testing.kimi_k25_processor.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sglang_testing import TESTS_DIR, decision_for, run_sglang, sglang_env

from atom_core.testing.reference import hf_greedy, hf_greedy_on_embeddings
from atom_core.testing.tiny_models import VOCAB_SIZE
from atom_core.testing.tiny_vision_language import (
    KIMI_K25_INT4_QUANTIZATION,
    add_tiny_kimi_k25_vision_tower,
    build_tiny_kimi_k25_language_model,
    write_test_images,
)
from atom_sglang.config_translation import ENCODER_ONLY_REASON
from atom_sglang.served_by import describe_served_model

pytestmark = pytest.mark.sglang

MAX_TOKENS = 8
SHARED = [5, 17, 99, 23, 7, 8, 9, 10, 11, 12, 40, 41, 42, 43, 44, 45, 46, 47]
PHASES = [[SHARED + [60, 61], [44, 45, 46]], [SHARED + [70], [3, 4, 5, 6]]]
MEDIA = VOCAB_SIZE - 1  # the tiny checkpoint's media_placeholder_token_id
TOWER_REFERENCE = f"{TESTS_DIR}/kimi_k25_vision_reference.py"


@pytest.fixture(scope="module")
def text_model(tiny_model_dir) -> str:
    return tiny_model_dir("DeepseekV3ForCausalLM")


def kimi_model(text_model: str, out_dir: Path, quantization: dict | None = None) -> str:
    model = build_tiny_kimi_k25_language_model(str(out_dir), text_model, remote_code_processor=True)
    if quantization is not None:
        config = json.loads((out_dir / "config.json").read_text())
        config["text_config"]["quantization_config"] = quantization
        (out_dir / "config.json").write_text(json.dumps(config))
    return model


def test_language_model_served_by_atom_matches_hf(text_model, tmp_path):
    model = kimi_model(text_model, tmp_path / "kimi-k25")
    [[result]] = run_sglang(([{"model": model, "phases": PHASES, "max_tokens": MAX_TOKENS,
                               "engine_kwargs": {"trust_remote_code": True}}], {}))
    served = describe_served_model(result["log"], result)
    assert served["handed_back"] is None
    assert (served["atom_model"], served["architecture"]) == (
        "atom_core.models.deepseek_v2.DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM")
    # MLA: SGLang's own attention over its latent KV pool, as for DeepSeek-V3.
    assert result["attention_backend"] == "torch_native"
    tokens = [[o["tokens"] for o in phase] for phase in result["phases"]]
    assert tokens == [hf_greedy(text_model, phase, MAX_TOKENS) for phase in PHASES]
    assert result["phases"][1][0]["cached_tokens"] >= len(SHARED), result["phases"][1]


def test_images_through_sglangs_tower_match_hf_on_its_embeddings(text_model, tmp_path):
    """Two image prompts and a text prompt in one batch, then the first image prompt again (a
    radix-cache hit through the image, whose tokens SGLang keys by the image): ATOM's language model
    gives HF's DeepSeek-V3 tokens on the image embeddings of SGLang's own image path, each image's
    placeholder expanded to its embedding rows."""
    model = kimi_model(text_model, tmp_path / "kimi-k25")
    add_tiny_kimi_k25_vision_tower(model)
    images = write_test_images(str(tmp_path))[:2]
    ids = [5, 6, 7, 8, MEDIA, 9, 10, 11]
    image_prompts = [{"ids": ids, "image": image} for image in images]
    phases = [[*image_prompts, ids[:4] + ids[5:]], image_prompts[:1]]
    [[result]] = run_sglang(([{"model": model, "phases": phases, "max_tokens": MAX_TOKENS,
                               "engine_kwargs": {"trust_remote_code": True}}], {}))
    assert describe_served_model(result["log"], result)["atom_model"] == (
        "atom_core.models.deepseek_v2.DeepseekV3ForCausalLM")
    (first, second, text_only), (again,) = result["phases"]
    subprocess.run([sys.executable, TOWER_REFERENCE, model, str(tmp_path / "embeddings.pt"), *images], check=True,
                   env=sglang_env())
    embeddings = torch.load(tmp_path / "embeddings.pt")
    assert [first["tokens"], second["tokens"]] == hf_greedy_on_embeddings(text_model, ids, MEDIA, embeddings,
                                                                          MAX_TOKENS)
    assert first["tokens"] != second["tokens"]  # the image matters
    assert text_only["tokens"] == hf_greedy(text_model, [ids[:4] + ids[5:]], MAX_TOKENS)[0]
    assert again["tokens"] == first["tokens"] and again["cached_tokens"] >= 4 + len(embeddings[0]), again


@pytest.mark.parametrize("quantization, reasons", [
    (None, ()), (KIMI_K25_INT4_QUANTIZATION, ("compressed-tensors format 'pack-quantized' is not supported",))],
    ids=["bf16", "int4 experts"])
def test_decision_is_the_language_models(quantization, reasons, text_model, tmp_path):
    """Decided from SGLang's own ModelConfig of the checkpoint, on the language model SGLang's class
    would build (DeepSeek-V3, its text config): ATOM serves the unquantized one and hands the
    published int4 one back."""
    model = kimi_model(text_model, tmp_path / "kimi-k25", quantization)
    decision = decision_for(model, skip_tokenizer_init=True)
    assert (decision.architecture, decision.reasons) == ("DeepseekV3ForCausalLM", reasons)


def test_encoder_only_server_is_handed_back(text_model, tmp_path):
    """The vision half of SGLang's encoder/language split (``--encoder-only``) builds no language
    model; ATOM's class would build one (all of Kimi-K2.5's weights on the encoder's GPUs)."""
    decision = decision_for(kimi_model(text_model, tmp_path / "kimi-k25"), skip_tokenizer_init=True,
                            encoder_only=True)
    assert decision.reasons == (ENCODER_ONLY_REASON,)

