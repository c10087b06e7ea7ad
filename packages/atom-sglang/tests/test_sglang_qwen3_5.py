"""Qwen3.5 (``Qwen3_5ForConditionalGeneration`` and ``Qwen3_5MoeForConditionalGeneration``) through
the real SGLang engine (CPU): SGLang's vision tower, processor and M-RoPE positions, ATOM's language
model (atom_sglang.vision_language), its Gated DeltaNet states in SGLang's state pool. Greedy tokens
equal HF transformers' own vision-language model's (fp32, tiny random checkpoint with a trained
tokenizer and HF's processor), for image + text and token-id prompts in one batch. SGLang alone runs
no Qwen3.5 on CPU (its Gated DeltaNet kernels are ``sgl_kernel`` CPU ops), so HF is the reference.

Phase 2 sends the first image prompt again beside a continued text conversation: SGLang's radix
cache keys image tokens by the image, and hands a request the state of its longest cached prefix that
has one (a finished request's end, a prefill chunk's end), which ATOM's layers continue.
"""

import pytest
from sglang_testing import run_sglang

from atom_core.testing.reference import hf_greedy
from atom_core.testing.tiny_vision_language import hf_image_greedy, image_prompts, write_test_images
from atom_sglang.served_by import describe_served_model

pytestmark = pytest.mark.sglang

MAX_TOKENS = 8
# As for Qwen3-Next (test_sglang_qwen3_next): no_buffer radix caching of states, which needs overlap
# scheduling off, and fp32 conv states for the fp32 comparison with HF.
ENGINE_KWARGS = {"disable_overlap_schedule": True, "mamba_radix_cache_strategy": "no_buffer",
                 "max_mamba_cache_size": 16}
ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
TEXT_PROMPTS = [[5, 17, 99, 23, 7, 8, 9, 10, 11, 12, 40, 41, 42], [44, 45, 46]]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    return write_test_images(str(tmp_path_factory.mktemp("images")))


def model_of(tiny_model_dir, architecture: str) -> str:
    # SGLang's config class of Qwen3.5 splits the layers by full_attention_interval and ignores
    # layer_types: the interval that gives the tiny checkpoint's layer types.
    return tiny_model_dir(architecture, random_norms=True, full_attention_interval=2)


def run_and_check(model: str, images: list[str], engine_kwargs: dict) -> dict:
    with_images = image_prompts(model, images)
    expected_images = hf_image_greedy(model, with_images, MAX_TOKENS)
    expected_text = hf_greedy(model, TEXT_PROMPTS, MAX_TOKENS)
    continued = TEXT_PROMPTS[0] + expected_text[0] + [60, 61, 62]
    phases = [with_images + TEXT_PROMPTS, [with_images[0], continued]]
    [[result]] = run_sglang(([{"model": model, "phases": phases, "max_tokens": MAX_TOKENS,
                               "engine_kwargs": {**ENGINE_KWARGS, **engine_kwargs}}], ENV))
    served = describe_served_model(result["log"], result)
    assert served["handed_back"] is None
    assert served["atom_model"].startswith("atom_core.models.qwen3_5.")
    assert result["attention_backend"] == "atom"
    tokens = [[o["tokens"] for o in phase] for phase in result["phases"]]
    assert tokens[0] == expected_images + expected_text
    assert tokens[1] == [expected_images[0], hf_greedy(model, [continued], MAX_TOKENS)[0]]
    # The image matters: the first question with the other image continues differently.
    assert hf_image_greedy(model, [{**with_images[0], "image": images[1]}], MAX_TOKENS)[0] != expected_images[0]
    # The continued conversation is served from the state at the end of its whole first turn (SGLang
    # caches a finished request's tokens but its last answer token).
    assert result["phases"][1][1]["cached_tokens"] >= len(TEXT_PROMPTS[0]) + MAX_TOKENS - 1, result["phases"][1]
    return result


def test_dense_with_chunked_prefill(tiny_model_dir, images):
    """16-token chunked prefill with mixed chunks: the image prompts' prefills span chunks (their
    image embeddings placed chunk by chunk) beside other requests' decodes."""
    result = run_and_check(model_of(tiny_model_dir, "Qwen3_5ForConditionalGeneration"), images,
                           {"chunked_prefill_size": 16, "enable_mixed_chunk": True})
    # The repeated image prompt starts from the state SGLang kept at one of its chunk ends, past the
    # image: a cache hit keyed by the image's tokens.
    assert result["phases"][1][0]["cached_tokens"] >= 16, result["phases"][1]


def test_moe_matches_hf(tiny_model_dir, images):
    """Qwen3.5-MoE, SGLang's default chunking."""
    run_and_check(model_of(tiny_model_dir, "Qwen3_5MoeForConditionalGeneration"), images, {})
