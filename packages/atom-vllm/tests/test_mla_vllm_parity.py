"""DeepSeek MLA models through the real vLLM engine with ATOM's MLA backend: greedy tokens equal
HF transformers', with prefix caching and with forced chunked prefill.

vLLM alone cannot serve MLA on CPU (its CPU platform has no MLA backend), so there is no
vLLM-without-ATOM comparison here: on CPU the last test checks that refusal instead of assuming it.
Prompts, lengths and the shared-prefix second phase are test_vllm_parity's. DeepSeek-V3 also runs at
TP=2 with expert parallelism (two CPU workers over gloo, or two GPUs over NCCL).
"""

import pytest
import torch
from test_vllm_parity import MAX_TOKENS, make_prompts, parity_case, tokens_of
from vllm_testing import hf_greedy, run_vllm, tensor_parallel_2

from atom_core.hosting.takeover import EXPERT_PARALLEL_NOTE
from atom_vllm.version import vllm_release

pytestmark = pytest.mark.vllm

ARCHITECTURES = ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"]
MLA_IMPL = "atom_vllm.attention.mla.ATOMMLAImpl"


@pytest.fixture(scope="module", params=ARCHITECTURES)
def case(request, tiny_model_dir):
    return parity_case(tiny_model_dir, request.param)[1:]


def assert_served_by_atom_mla(result) -> None:
    assert result["served_by"]["model_class"] == "atom_vllm.model_wrapper.ATOMMoEForCausalLM"
    assert result["served_by"]["inner_class"].startswith("atom_core.models.deepseek_v2.")
    assert result["served_by"]["attention_impls"] == [MLA_IMPL]
    assert "INFO atom: Use atom MLA attention backend" in result["log"]


def test_atom_mla_matches_hf_with_prefix_cache(case):
    model, phases, expected = case
    result = run_vllm(model, phases, MAX_TOKENS)
    assert_served_by_atom_mla(result)
    assert tokens_of(result) == expected
    # Phase 2 prompts share a 48-token prefix with phase 1: their prefill extends cached latents.
    assert all(o["num_cached_tokens"] >= 32 for o in result["phases"][1])


def test_atom_mla_with_forced_chunked_prefill(case):
    model, phases, expected = case
    # 16-token steps: the 70-token prompt is prefilled in 5 chunks while others decode alongside.
    result = run_vllm(model, phases, MAX_TOKENS,
                      llm_kwargs={"max_num_batched_tokens": 16, "enable_chunked_prefill": True})
    assert_served_by_atom_mla(result)
    if "forcing chunked prefill and prefix caching to be disabled" in result["log"]:
        # vLLM's CPU platform turns chunked prefill off for MLA models (0.32: on CPUs without AMX, whose
        # MLA kernels run it); ATOMPlatform restores it.
        assert "keeping chunked prefill as configured" in result["log"]
    assert result["scheduler"] == {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}
    assert tokens_of(result) == expected


def test_atom_mla_under_atom_piecewise_compile(tiny_model_dir, tmp_path):
    """ATOM's torch.compile (level 3) splits at each latent attention (atom::unified_latent_attention),
    which then runs ATOM's MLA layer eagerly inside vLLM's forward context."""
    model = tiny_model_dir("DeepseekV3ForCausalLM")
    phase1, phase2 = make_prompts()
    result = run_vllm(model, [phase1, phase2], MAX_TOKENS, env={"ATOM_CACHE_DIR": str(tmp_path)},
                      llm_kwargs={"enforce_eager": False, "additional_config": {"atom_compilation_level": 3}})
    assert_served_by_atom_mla(result)
    assert "INFO atom: torch.compile: 3 attention split points, 4 compiled pieces" in result["log"]
    assert tokens_of(result) == hf_greedy(model, phase1 + phase2, MAX_TOKENS)


def test_atom_mla_tensor_parallel_2_with_expert_parallel(tiny_model_dir):
    """Each rank holds half the heads (its share of q_b / kv_b / o_proj, the latent cache whole) and
    half of every expert, as ATOM serves --enable-expert-parallel; the tokens stay HF's. The setting
    behind the GPU runs at TP 4 (docs/performance.md)."""
    model = tiny_model_dir("DeepseekV3ForCausalLM")
    phase1, phase2 = make_prompts()
    result = run_vllm(model, [phase1, phase2], MAX_TOKENS, **tensor_parallel_2(enable_expert_parallel=True))
    assert_served_by_atom_mla(result)
    assert f"ATOM serves DeepseekV3ForCausalLM on vLLM: {EXPERT_PARALLEL_NOTE}" in result["log"]
    assert all(f"DeepseekV3ForCausalLM: TP rank {rank} of 2 holds" in result["log"] for rank in (0, 1))
    assert tokens_of(result) == hf_greedy(model, phase1 + phase2, MAX_TOKENS)


@pytest.mark.skipif(torch.cuda.is_available() or vllm_release() >= (0, 28),
                    reason="vLLM's CUDA platform, and its CPU platform from 0.28, have MLA backends of their own")
def test_native_vllm_cannot_serve_mla_on_cpu(tiny_model_dir):
    phase1, _ = make_prompts()
    with pytest.raises(AssertionError, match="MLA is not supported on CPU"):
        run_vllm(tiny_model_dir("DeepseekV2ForCausalLM"), [phase1], MAX_TOKENS,
                 env={"ATOM_DISABLE_VLLM_PLUGIN": "1"})
