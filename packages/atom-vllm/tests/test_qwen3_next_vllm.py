"""Qwen3-Next through the real vLLM engine with ATOM's model: its Gated DeltaNet layers keep their
conv and recurrent states in vLLM's state cache (atom_vllm.attention.gated_delta). Greedy tokens
equal HF transformers' and prompt log-probabilities HF's (fp32, tiny random checkpoint), with
16-token steps so that prefills span several steps while other requests decode in the same batch,
and with prefix caching, which vLLM 0.26 leaves off by default for hybrid models, turned on.

vLLM alone serves Qwen3-Next on CPU only in bfloat16, with key and value heads of a multiple of 32
and an fp32 recurrent-state cache (its CPU Gated DeltaNet kernels); the last tests check its refusal
in fp32 and compare with it in bf16.
"""

import pytest
import torch
from test_vllm_parity import make_prompts, tokens_of
from vllm_testing import (
    ALONE,
    CPU_HYBRID_ATTENTION,
    hf_greedy,
    run_vllm,
    run_with_and_without_atom,
    worst_prompt_logprob_diff,
)

from atom_core.testing.hf_classes import hf_reference_model
from atom_vllm.version import vllm_release

pytestmark = pytest.mark.vllm

ARCHITECTURE = "Qwen3NextForCausalLM"
MAX_TOKENS = 12
CHUNKED = {"max_num_batched_tokens": 16, "enable_chunked_prefill": True}
# vLLM's CPU Gated DeltaNet: bfloat16 only, head sizes a multiple of 32, fp32 recurrent state.
VLLM_CPU_GDN = {"linear_key_head_dim": 32, "linear_value_head_dim": 32}
BF16 = {"dtype": "bfloat16", "mamba_ssm_cache_dtype": "float32"}
# Two engines side by side on one GPU share its memory; vLLM alone's default SM90 prefill (FlashInfer's
# CuTe-DSL Gated DeltaNet kernel) is missing from some installs, its Triton (FLA) prefill is not.
SIDE_BY_SIDE_ON_GPU = ({"gpu_memory_utilization": 0.4, "additional_config": {"gdn_prefill_backend": "triton"}}
                       if torch.cuda.is_available() else {})


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    return tiny_model_dir(ARCHITECTURE, random_norms=True)


@pytest.fixture(scope="module")
def prompts() -> tuple[list[list[int]], list[list[int]]]:
    return make_prompts()


def hf_logits(model_dir: str):
    hf = hf_reference_model(model_dir)

    def logits(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([tokens])).logits[0].float()

    return logits


def assert_atom_serves_the_state(result) -> None:
    assert result["served_by"]["model_class"] == "atom_vllm.model_wrapper.ATOMHybridForCausalLM"
    assert result["served_by"]["inner_class"] == "atom_core.models.qwen3_next.Qwen3NextForCausalLM"
    assert "ATOM hands" not in result["log"]
    if not torch.cuda.is_available():
        # vLLM's CPU runner zeroes reused attention blocks in its own backend's layout only.
        assert CPU_HYBRID_ATTENTION in result["log"]


def test_chunked_prefill_and_mixed_decode_match_hf(model, prompts):
    """Four requests at once in 16-token steps: the 70-token prompt is prefilled over five steps,
    extending the state it left in the cache, while the short ones decode beside it."""
    phase1, _ = prompts
    result = run_vllm(model, [phase1], MAX_TOKENS, llm_kwargs=CHUNKED, prompt_logprobs=True)
    assert_atom_serves_the_state(result)
    assert result["scheduler"] == {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}
    assert tokens_of(result) == hf_greedy(model, phase1, MAX_TOKENS)
    assert worst_prompt_logprob_diff(result["phases"][0], phase1, hf_logits(model)) < 1e-3


def test_prefix_caching_resumes_from_cached_state(model, prompts):
    """Prefix caching turned on (vLLM's 'align' mode for hybrid models): phase 2's prompts share
    phase 1's 48-token prefix, so their prefill starts from a state vLLM kept for a block of it.
    From vLLM 0.29 (blocks of 32 on CPU) only the 65-token prompt gets that hit; vLLM gives the
    51-token one none, sent alone as well (its align-mode rules; vLLM alone cannot serve this model
    on CPU to compare)."""
    phase1, phase2 = prompts
    result = run_vllm(model, [phase1, phase2], MAX_TOKENS,
                      llm_kwargs={**CHUNKED, "enable_prefix_caching": True})
    assert_atom_serves_the_state(result)
    assert "Mamba cache mode is set to 'align'" in result["log"]
    cached = [o["num_cached_tokens"] for o in result["phases"][1]]
    if vllm_release() >= (0, 29):
        assert cached == [0, 32], cached
    else:
        assert all(n > 0 for n in cached), cached
    assert tokens_of(result) == hf_greedy(model, phase1 + phase2, MAX_TOKENS)


def test_under_atom_piecewise_compile(model, prompts, tmp_path):
    """ATOM's torch.compile (level 3) splits at each attention and each Gated DeltaNet core
    (atom::gated_delta_core), which then runs eagerly on vLLM's state cache and metadata."""
    phase1, _ = prompts
    result = run_vllm(model, [phase1], MAX_TOKENS, env={"ATOM_CACHE_DIR": str(tmp_path)},
                      llm_kwargs={**CHUNKED, "enforce_eager": False,
                                  "additional_config": {"atom_compilation_level": 3}})
    assert_atom_serves_the_state(result)
    assert "INFO atom: torch.compile: 4 attention split points, 5 compiled pieces" in result["log"]
    assert tokens_of(result) == hf_greedy(model, phase1, MAX_TOKENS)


def test_state_cache_is_sized_for_whichever_model_serves(model):
    """vLLM sizes the state cache from the registered class before building a model: ATOM's layout
    where ATOM serves, vLLM's own class's (its speculative-decoding conv window included) where
    ATOM hands the model back."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM as VllmQwen3Next

    from atom_vllm.model_wrapper import ATOMHybridForCausalLM

    served = EngineArgs(model=model, dtype="float32", max_model_len=256).create_engine_config()
    # conv: (2 x 2 key heads x 16 + 4 value heads x 24) channels x (kernel 4 - 1); recurrent [HV, K, V]
    assert ATOMHybridForCausalLM.get_mamba_state_shape_from_config(served) == ((160, 3), (4, 16, 24))
    assert ATOMHybridForCausalLM.get_mamba_state_dtype_from_config(served) == (torch.float32,) * 2
    handed_back = EngineArgs(
        model=model, dtype="float32", max_model_len=256,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
    ).create_engine_config()
    assert (ATOMHybridForCausalLM.get_mamba_state_shape_from_config(handed_back)
            == VllmQwen3Next.get_mamba_state_shape_from_config(handed_back))


# vLLM 0.27 and later alone fail on CPU on this tiny model with other errors than 0.26's (not analysed):
# the tests of vLLM alone's behaviour below assert 0.26's.
ALONE_AS_ON_VLLM_0_26 = pytest.mark.skipif(not torch.cuda.is_available() and vllm_release() >= (0, 27),
                                           reason="vLLM 0.27+ alone fails otherwise on CPU")


@ALONE_AS_ON_VLLM_0_26
@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU Gated DeltaNet limits")
def test_vllm_alone_refuses_fp32_on_cpu(model, prompts):
    """Which of vLLM's CPU kernels refuses first depends on the CPU's instruction set: the GDN
    attention's dtype check, or the conv weight packing of its fp32 layers."""
    phase1, _ = prompts
    refusals = "CPU GDN attention requires BF16|\"causal_conv1d_fwd_kernel_impl\" not implemented for 'Float'"
    with pytest.raises(AssertionError, match=refusals):
        run_vllm(model, [phase1], MAX_TOKENS, env=ALONE)


@ALONE_AS_ON_VLLM_0_26
def test_bf16_as_close_to_hf_as_vllm_alone(tiny_model_dir, prompts):
    """Where vLLM alone serves Qwen3-Next on CPU (bfloat16, heads of 32), ATOM's prompt
    log-probabilities are no further from HF's fp32 ones than vLLM's own. (Greedy tokens are no
    test in bf16 here: the random model's near-ties, 7e-4 between the top two logits of one prompt,
    flip within bf16 rounding, for HF's own bf16 run as well.)"""
    model = tiny_model_dir(ARCHITECTURE, random_norms=True, **VLLM_CPU_GDN)
    phase1, _ = prompts
    with_atom, alone = run_with_and_without_atom(model, [phase1], 2, {**BF16, **CHUNKED, **SIDE_BY_SIDE_ON_GPU},
                                                 prompt_logprobs=True)
    assert_atom_serves_the_state(with_atom)
    assert alone["served_by"]["model_class"] == "vllm.model_executor.models.qwen3_next.Qwen3NextForCausalLM"
    reference = hf_logits(model)
    atom_error = worst_prompt_logprob_diff(with_atom["phases"][0], phase1, reference)
    alone_error = worst_prompt_logprob_diff(alone["phases"][0], phase1, reference)
    assert atom_error <= 1.5 * alone_error, (atom_error, alone_error)
