"""Greedy parity in vLLM (CPU): vLLM+ATOM == vLLM alone == HF transformers, on tiny
random fp32 models (odd sizes, GQA), prompts of 1-70 tokens, 32 new tokens each, with the classes that
served each."""

import random

import pytest
from vllm_testing import hf_greedy, run_vllm, skip_moe_alone_on_new_cpu_vllm

pytestmark = pytest.mark.vllm

ARCHITECTURES = ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]
MAX_TOKENS = 32
ATOM_WRAPPERS = {"Qwen3ForCausalLM": "atom_vllm.model_wrapper.ATOMForCausalLM",
                 "Qwen3MoeForCausalLM": "atom_vllm.model_wrapper.ATOMMoEForCausalLM"}
ATOM_IMPL = "atom_vllm.attention.mha.ATOMAttentionImpl"
VLLM_CPU_IMPL = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl"


def make_prompts() -> tuple[list[list[int]], list[list[int]]]:
    """Phase 1: prompts of varied length; phase 2: prompts with phase 1's 48-token prefix."""
    rng = random.Random(0)
    tokens = lambda n: [rng.randrange(4, 499) for _ in range(n)]  # noqa: E731
    shared = tokens(48)
    return [tokens(5), tokens(1), tokens(23), shared + tokens(22)], [shared + tokens(3), shared + tokens(17)]


def parity_case(tiny_model_dir, architecture: str):
    """(architecture, model dir, the two prompt phases, HF's greedy tokens for all their prompts)."""
    model = tiny_model_dir(architecture)
    phase1, phase2 = make_prompts()
    return architecture, model, [phase1, phase2], hf_greedy(model, phase1 + phase2, MAX_TOKENS)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def case(request, tiny_model_dir):
    return parity_case(tiny_model_dir, request.param)


def tokens_of(result) -> list[list[int]]:
    return [o["tokens"] for p in result["phases"] for o in p]


def test_atom_matches_hf_with_prefix_cache(case):
    architecture, model, phases, expected = case
    result = run_vllm(model, phases, MAX_TOKENS)
    assert result["served_by"]["model_class"] == ATOM_WRAPPERS[architecture]
    assert result["served_by"]["inner_class"].startswith("atom_core.models.")
    assert result["served_by"]["attention_impls"] == [ATOM_IMPL]
    assert "INFO atom: Use atom attention backend" in result["log"]
    assert tokens_of(result) == expected
    # Phase 2 shares phase 1's 48-token prefix: served from vLLM's prefix cache.
    assert all(o["num_cached_tokens"] >= 32 for o in result["phases"][1])


def test_native_vllm_matches_hf(case):
    architecture, model, phases, expected = case
    skip_moe_alone_on_new_cpu_vllm(architecture == "Qwen3MoeForCausalLM")
    result = run_vllm(model, phases, MAX_TOKENS, env={"ATOM_DISABLE_VLLM_PLUGIN": "1"})
    assert not result["served_by"]["model_class"].startswith("atom_vllm")
    assert result["served_by"]["attention_impls"] == [VLLM_CPU_IMPL]
    assert "INFO atom:" not in result["log"]
    assert tokens_of(result) == expected


def test_atom_model_on_vllm_attention(case):
    architecture, model, phases, expected = case
    result = run_vllm(model, phases, MAX_TOKENS, env={"ATOM_DISABLE_VLLM_PLUGIN_ATTENTION": "1"})
    assert result["served_by"]["model_class"] == ATOM_WRAPPERS[architecture]
    assert result["served_by"]["attention_impls"] == [VLLM_CPU_IMPL]
    assert tokens_of(result) == expected


def test_atom_with_forced_chunked_prefill(case):
    architecture, model, phases, expected = case
    # 16-token steps: the 70-token prompt prefills in 5 chunks, others decoding.
    result = run_vllm(model, phases, MAX_TOKENS,
                      llm_kwargs={"max_num_batched_tokens": 16, "enable_chunked_prefill": True})
    assert result["served_by"]["attention_impls"] == [ATOM_IMPL]
    assert tokens_of(result) == expected


def test_unsupported_architecture_falls_back_to_vllm(tiny_model_dir):
    model = tiny_model_dir("Qwen2ForCausalLM")
    phase1 = make_prompts()[0]
    result = run_vllm(model, [phase1], MAX_TOKENS)
    assert result["served_by"]["model_class"].endswith("models.qwen2.Qwen2ForCausalLM")
    assert "Qwen2ForCausalLM is not implemented by ATOM; vLLM's own model serves it" in result["log"]
    assert tokens_of(result) == hf_greedy(model, phase1, MAX_TOKENS)
