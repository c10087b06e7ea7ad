"""Qwen3.5 (``Qwen3_5ForConditionalGeneration`` and ``Qwen3_5MoeForConditionalGeneration``) through
the real vLLM engine: vLLM's vision tower, processor and M-RoPE positions, ATOM's language model
(atom_vllm.vision_language), its Gated DeltaNet states in vLLM's state cache. Greedy tokens equal
HF transformers' own vision-language model's (fp32, tiny random checkpoint with a trained tokenizer
and HF's processor), for image + text and text-only prompts in one batch.

vLLM alone serves Qwen3.5 on CPU only in bfloat16 with heads of a multiple of 32 (its CPU Gated
DeltaNet kernels: see test_qwen3_next_vllm), so HF is the reference here.
"""

import pytest
import torch
from test_vllm_parity import make_prompts, tokens_of
from vllm_testing import (
    bf16_logprob_tolerance,
    hf_greedy,
    needs_torchvision,
    run_vllm,
    worst_prompt_logprob_diff,
)

from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_core.testing.fp8_checkpoints import (
    write_dequantized_checkpoint,
    write_tiny_fp8_checkpoint,
)
from atom_core.testing.reference import atom_logits
from atom_core.testing.tiny_vision_language import (
    hf_image_greedy,
    hf_image_next_logits,
    image_prompts,
    write_test_images,
)

pytestmark = [pytest.mark.vllm, needs_torchvision]

MAX_TOKENS = 10
# vLLM 0.26's multimodal processor cache runs the HF processor on prompt text alone, which transformers
# 5.23 refuses ("Found 1 <|image_pad|> tokens in the text but no images were passed"), with or
# without ATOM: the tests run without that cache.
IMAGES_ONLY = {"limit_mm_per_prompt": {"image": 1, "video": 0}, "mm_processor_cache_gb": 0}
# How far bfloat16 rounding moves these tiny models' logits (HF's own bf16 run included).
BF16_LOGIT_ROUNDING = 0.1


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    return write_test_images(str(tmp_path_factory.mktemp("images")))


def assert_atom_serves_the_language_model(result, model: str) -> None:
    from transformers import AutoConfig

    architecture = AutoConfig.from_pretrained(model).architectures[0]
    served = result["served_by"]
    assert served["model_class"] == f"atom_vllm.vision_language.ATOM{architecture}"
    entry = SUPPORTED_ARCHITECTURES[architecture]
    assert served["inner_class"] == f"{entry.module}.{entry.class_name}"
    assert "ATOM hands" not in result["log"]


def run_and_check(model: str, images: list[str], llm_kwargs: dict, env: dict | None = None) -> dict:
    """Two image + text prompts beside the four text prompts of phase 1, then phase 2's, which share
    phase 1's 48-token prefix: vLLM's processor and vision tower give the image embeddings and the
    M-RoPE positions (an image's tokens walk its rows and columns), ATOM's model the tokens, equal to
    HF's for every prompt."""
    phase1, phase2 = make_prompts()
    with_images = image_prompts(model, images)
    result = run_vllm(model, [with_images + phase1, phase2], MAX_TOKENS, env=env,
                      llm_kwargs={**IMAGES_ONLY, **llm_kwargs})
    assert_atom_serves_the_language_model(result, model)
    expected = hf_image_greedy(model, with_images, MAX_TOKENS) + hf_greedy(model, phase1 + phase2, MAX_TOKENS)
    assert tokens_of(result) == expected
    # The image matters: the first question with the other image continues differently.
    swapped = hf_image_greedy(model, [{**with_images[0], "image": images[1]}], MAX_TOKENS)
    assert swapped[0] != expected[0]
    return result


def test_dense_compiled_with_chunked_prefill_and_prefix_cache(tiny_model_dir, images, tmp_path):
    """Qwen3.5 under ATOM's piecewise compile (level 3), in 32-token steps (the image prompts'
    prefills span steps beside other requests' decodes), with prefix caching on (vLLM's 'align' mode
    for hybrid models). The M-RoPE positions' token dimension is the compiled graph's dynamic one:
    one compile for all batch sizes and one more for single tokens, none per batch size."""
    model = tiny_model_dir("Qwen3_5ForConditionalGeneration", random_norms=True)
    result = run_and_check(model, images, {
        "max_num_batched_tokens": 32, "enable_chunked_prefill": True, "enable_prefix_caching": True,
        "enforce_eager": False, "additional_config": {"atom_compilation_level": 3},
    }, env={"ATOM_CACHE_DIR": str(tmp_path)})
    assert result["log"].count("INFO atom: torch.compile: 4 attention split points, 5 compiled pieces") == 2
    assert all(o["num_cached_tokens"] > 0 for o in result["phases"][1])


def test_moe_matches_hf(tiny_model_dir, images):
    """Qwen3.5-MoE, eager, vLLM's default scheduling."""
    run_and_check(tiny_model_dir("Qwen3_5MoeForConditionalGeneration", random_norms=True), images, {})


def test_language_model_only(tiny_model_dir):
    """vLLM's text-only mode (``language_model_only``: no vision tower built, as ``vllm serve
    --language-model-only``): ATOM's language model serves, tokens equal HF's."""
    model = tiny_model_dir("Qwen3_5MoeForConditionalGeneration", random_norms=True)
    phase1, _ = make_prompts()
    result = run_vllm(model, [phase1], MAX_TOKENS,
                      llm_kwargs={"language_model_only": True, "mm_processor_cache_gb": 0})
    assert_atom_serves_the_language_model(result, model)
    assert tokens_of(result) == hf_greedy(model, phase1, MAX_TOKENS)


def test_block_fp8_moe_checkpoint(tiny_model_dir, images, tmp_path):
    """Qwen3.5-MoE in block FP8 as published: the language model's projections and experts FP8, its Gated
    DeltaNet's b / a projections and the vision tower bf16 and listed unquantized. ATOM serves the
    language model, in bfloat16 (vLLM runs FP8 checkpoints in bf16 only). The text prompts'
    log-probabilities are ATOM's language model's alone on the same checkpoint, within bf16 rounding
    (vllm_testing.bf16_logprob_tolerance). The image prompts' first tokens are those of HF's own VLM
    on the dequantized weights with the same activation quantization (fp32), or, where that
    reference's top logits lie within bf16 rounding of each other (0.06 apart for one image here),
    one of those."""
    model = write_tiny_fp8_checkpoint(tiny_model_dir, "Qwen3_5MoeForConditionalGeneration", str(tmp_path / "fp8"),
                                      "fp8-block")
    phase1, _ = make_prompts()
    with_images = image_prompts(model, images)
    result = run_vllm(model, [with_images + phase1], MAX_TOKENS, prompt_logprobs=True, llm_kwargs={
        **IMAGES_ONLY, "dtype": "bfloat16", "mamba_ssm_cache_dtype": "float32"})
    assert_atom_serves_the_language_model(result, model)
    outputs = result["phases"][0]
    text_outputs = outputs[len(with_images):]
    worst = worst_prompt_logprob_diff(text_outputs, phase1, atom_logits(model, torch.bfloat16))
    assert worst < bf16_logprob_tolerance(result), f"prompt logprob differs by {worst:.3f}"
    dequantized = write_dequantized_checkpoint(model, str(tmp_path / "dequantized"))
    for output, logits in zip(outputs, hf_image_next_logits(dequantized, model, with_images)):
        assert logits[output["tokens"][0]] > logits.max() - BF16_LOGIT_ROUNDING
