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

from atom_core.testing.fp8_checkpoints import write_dequantized_checkpoint, write_tiny_fp8_checkpoint
from atom_core.testing.reference import hf_greedy, prompt_logprob_gaps, within_bfloat16_noise
from atom_core.testing.tiny_vision_language import (
    hf_image_greedy,
    hf_image_next_logits,
    image_prompts,
    write_test_images,
)
from atom_sglang.served_by import describe_served_model

pytestmark = pytest.mark.sglang

MAX_TOKENS = 8
# As for Qwen3-Next (test_sglang_qwen3_next): no_buffer radix caching of states, which needs overlap
# scheduling off, and fp32 conv states for the fp32 comparison with HF.
ENGINE_KWARGS = {"disable_overlap_schedule": True, "mamba_radix_cache_strategy": "no_buffer",
                 "max_mamba_cache_size": 16}
ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
TEXT_PROMPTS = [[5, 17, 99, 23, 7, 8, 9, 10, 11, 12, 40, 41, 42], [44, 45, 46]]
# How far bfloat16 rounding moves these tiny models' logits (HF's own bf16 run included).
BF16_LOGIT_ROUNDING = 0.1


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    return write_test_images(str(tmp_path_factory.mktemp("images")))


def model_of(tiny_model_dir, architecture: str, **sizes) -> str:
    # SGLang's config class of Qwen3.5 splits the layers by full_attention_interval and ignores
    # layer_types: the interval that gives the tiny checkpoint's layer types.
    return tiny_model_dir(architecture, random_norms=True, full_attention_interval=2, **sizes)


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


def test_block_fp8_moe_checkpoint(tiny_model_dir, images, tmp_path):
    """Qwen3.5-MoE in block FP8 as published (the language model's projections and experts FP8, its
    Gated DeltaNet's b / a projections and the vision tower bf16 and listed unquantized), in bfloat16
    (SGLang runs FP8 checkpoints in bf16 only). The text prompts' log-probabilities lie as close to
    ATOM's language model alone in fp32 as ATOM alone's bf16 ones do; the image prompts' first tokens
    are those of HF's own VLM on the dequantized weights with the same activation quantization
    (fp32), or within bf16 rounding of its top logit. Weights of std 0.05, as for DeepSeek-V3 in
    test_sglang_fp8: at the tiny models' usual 0.1, HF's own VLM in bf16 already picks a first token
    outside its fp32 top three for one image."""
    def smooth(architecture, **sizes):
        return model_of(tiny_model_dir, architecture, std=0.05, **sizes)

    model = write_tiny_fp8_checkpoint(smooth, "Qwen3_5MoeForConditionalGeneration", str(tmp_path / "fp8"),
                                      "fp8-block")
    with_images = image_prompts(model, images)
    run = {"model": model, "phases": [with_images + TEXT_PROMPTS], "max_tokens": 1, "prompt_logprobs": True,
           "engine_kwargs": {**ENGINE_KWARGS, "dtype": "bfloat16"}}
    [[result]] = run_sglang(([run], ENV))
    served_by = describe_served_model(result["log"], result)["atom_model"]
    assert served_by == "atom_core.models.qwen3_5.Qwen3_5MoeForCausalLM"
    outputs = result["phases"][0]
    served = [o["prompt_logprobs"] for o in outputs[len(with_images):]]
    assert within_bfloat16_noise(*prompt_logprob_gaps(model, TEXT_PROMPTS, served))
    dequantized = write_dequantized_checkpoint(model, str(tmp_path / "dequantized"))
    for output, logits in zip(outputs, hf_image_next_logits(dequantized, model, with_images)):
        assert logits[output["tokens"][0]] > logits.max() - BF16_LOGIT_ROUNDING


def test_weight_updates_reach_the_language_model_and_the_vision_tower(tiny_model_dir, images):
    """What RL frameworks call on a running engine (as test_sglang_rl_interfaces does for a text
    model): start on checkpoint A, load B with ``update_weights_from_disk``, then A's tensors by HF name
    with ``update_weights_from_tensor`` in two buckets. Each phase's image + text tokens equal HF's on
    the checkpoint then loaded. Each phase shows a new image: SGLang keeps the vision tower's output per
    image across weight updates (its multimodal embedding cache, which its cache flush leaves)."""
    architecture = "Qwen3_5MoeForConditionalGeneration"
    a, b = model_of(tiny_model_dir, architecture), model_of(tiny_model_dir, architecture, seed=1)
    phases = [[image_prompts(checkpoint, [image])[0], *TEXT_PROMPTS]
              for checkpoint, image in zip((a, b, a), images)]
    run = {"model": a, "phases": phases, "max_tokens": MAX_TOKENS, "engine_kwargs": ENGINE_KWARGS,
           "weight_updates": [None, {"from_disk": b}, {"from_tensors": a}]}
    [[result]] = run_sglang(([run], ENV))
    expected = [hf_image_greedy(checkpoint, phase[:1], MAX_TOKENS) + hf_greedy(checkpoint, TEXT_PROMPTS, MAX_TOKENS)
                for checkpoint, phase in zip((a, b, a), phases)]
    assert [[o["tokens"] for o in phase] for phase in result["phases"]] == expected
    assert expected[1][1:] != expected[0][1:]
