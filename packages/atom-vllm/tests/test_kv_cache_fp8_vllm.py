"""``--kv-cache-dtype fp8`` served by ATOM's attention through real vLLM (CPU, tiny Qwen3 for MHA,
tiny DeepSeek-V3 for MLA).

What the FP8 cache changes is exact to state. MHA with 16-token chunked prefill: the first chunk of a
prompt attends over its fresh K/V, every later chunk and every decode step over the whole cache, where
K and V were stored as e4m3 (scale 1.0, vLLM's default without checkpoint scales). MLA: every step
reads the e4m3 latent cache. The reference is ATOM's model alone with attention doing exactly that
(atom_core.testing.reference.fp8_kv_cache_semantics). vLLM+ATOM's prompt log-probabilities and greedy
tokens must match it, and the log-probabilities must differ from the plain model's by far more: the
cache really holds FP8.
"""

import pytest
from vllm_testing import assert_atom_served, prompts, run_vllm, worst_prompt_logprob_diff

from atom_core.testing.reference import atom_greedy, atom_logits, fp8_kv_cache_semantics

pytestmark = pytest.mark.vllm

CHUNK = 16
CHUNKED = {"max_num_batched_tokens": CHUNK, "enable_chunked_prefill": True}
MAX_TOKENS = 8
# fp32 model, FP8 cache: vLLM's paged attention and the reference differ by summation order only
# (1e-6 seen), unless that moves a K/V value across an e4m3 rounding boundary; the plain model is
# 0.14 away.
TOLERANCE = 2e-3


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "DeepseekV3ForCausalLM"], ids=["mha", "mla"])
def test_fp8_kv_cache_served_by_atom(tiny_model_dir, architecture):
    """Prompt log-probabilities (prefill chunks) and greedy tokens (decode) over the FP8 cache. vLLM
    alone has no comparison here: its CPU build keeps FP8 caches on x86 with AMX or AVX only."""
    model = tiny_model_dir(architecture)
    phases = [[prompt] for prompt in prompts(40, 57, seed=11)]  # one at a time: chunks start at 0
    kwargs = {"dtype": "float32", "kv_cache_dtype": "fp8", **CHUNKED}
    result = run_vllm(model, phases, MAX_TOKENS, llm_kwargs=kwargs, prompt_logprobs=True)
    assert_atom_served(result)
    backend = "Use atom MLA attention backend" if architecture.startswith("Deepseek") else "Use atom attention backend"
    assert backend in result["log"]
    plain_reference = atom_logits(model)
    with fp8_kv_cache_semantics(CHUNK):
        fp8_reference = atom_logits(model)
        expected_tokens = atom_greedy(model, [phase[0] for phase in phases], MAX_TOKENS)
    outputs, prompts_run = [phase[0] for phase in result["phases"]], [phase[0] for phase in phases]
    fp8_error = worst_prompt_logprob_diff(outputs, prompts_run, fp8_reference)
    plain_error = worst_prompt_logprob_diff(outputs, prompts_run, plain_reference)
    print(f"off the FP8-cache reference by {fp8_error:.2e}, off the plain model by {plain_error:.2e}")
    assert fp8_error < TOLERANCE
    assert plain_error > 20 * TOLERANCE
    assert [output["tokens"] for output in outputs] == expected_tokens
