"""Kimi-K2.5 through the real SGLang engine (CPU): SGLang's class (tower, projector) with ATOM's
DeepSeek-V3 as its language model. Greedy tokens equal HF's DeepSeek-V3 on the same weights (fp32, tiny
random checkpoint, text only: no tower tensors), with radix-cache hits. SGLang alone runs no tiny MLA
model on CPU (its torch_native extend takes the value head size for the query's): HF is the reference,
as for DeepSeek-V3 in test_sglang_parity. The processor is atom_core.testing.kimi_k25_processor.
"""

import json
from pathlib import Path

import pytest
from sglang_testing import decision_for, run_sglang

from atom_core.testing.reference import hf_greedy
from atom_core.testing.tiny_vision_language import KIMI_K25_INT4_QUANTIZATION, build_tiny_kimi_k25_language_model
from atom_sglang.config_translation import ENCODER_ONLY_REASON
from atom_sglang.served_by import describe_served_model

pytestmark = pytest.mark.sglang

MAX_TOKENS = 8
SHARED = [5, 17, 99, 23, 7, 8, 9, 10, 11, 12, 40, 41, 42, 43, 44, 45, 46, 47]
PHASES = [[SHARED + [60, 61], [44, 45, 46]], [SHARED + [70], [3, 4, 5, 6]]]


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

