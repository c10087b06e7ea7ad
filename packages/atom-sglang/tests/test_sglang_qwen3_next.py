"""Qwen3-Next through the real SGLang engine (CPU) with ATOM's model: its Gated DeltaNet layers keep
their conv and recurrent states in SGLang's state pool (atom_sglang.attention.gated_delta). Greedy
tokens equal HF transformers' (fp32, tiny random checkpoint); SGLang alone runs no Qwen3-Next on CPU
(its GDN kernels are ``sgl_kernel`` CPU ops), so HF is the only reference.

16-token chunked prefill with mixed chunks: phase 1's 49-token prompt is prefilled over four steps,
extending the state it left in its slot, while the others decode beside it. Phase 2 continues
phase 1's last conversation (its prompt, HF's answer and a new turn) and shares 40 tokens with its
first prompt: SGLang's radix cache of hybrid models (its ``no_buffer`` strategy, which needs overlap
scheduling off) keeps the state at the end of each finished request and of each prefill chunk, and
hands a request the state of its longest cached prefix that has one, which ATOM's layers continue.

Two engines serve the same requests: one on the torch references of ATOM's ops, one with the ops that
read and write the state pool on their Triton kernels (TRITON_STATE_OPS), as GPUs run them.
"""

import random

import pytest
from sglang_testing import run_sglang

from atom_core.testing.reference import hf_greedy
from atom_sglang.served_by import describe_served_model

pytestmark = pytest.mark.sglang

ARCHITECTURE = "Qwen3NextForCausalLM"
MAX_TOKENS = 12
ENGINE_KWARGS = {"chunked_prefill_size": 16, "enable_mixed_chunk": True, "disable_overlap_schedule": True,
                 "max_mamba_cache_size": 16}
# SGLang keeps conv states in bfloat16 unless told otherwise; the fp32 comparison with HF needs fp32.
ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# The ops that read and write SGLang's state pool, on their Triton kernels (through Triton's
# interpreter here), every other op on its torch one: the kernels GPUs run, on the pool's real
# layouts (recurrent states stored [V, K]). The torch references take any strides, so only the
# kernels show a layout they cannot read.
STATE_OPS = ("GATED_DELTA_RULE", "GATED_DELTA_RULE_DECODE", "CAUSAL_CONV1D", "CAUSAL_CONV1D_DECODE")
TRITON_STATE_OPS = {"TRITON_INTERPRET": "1", "ATOM_KERNEL_BACKEND": "torch",
                    **{f"ATOM_KERNEL_BACKEND_{op}": "triton" for op in STATE_OPS}}


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    # SGLang's config class of Qwen3-Next splits the layers by full_attention_interval and ignores
    # layer_types: the interval that gives the tiny checkpoint's layer types.
    return tiny_model_dir(ARCHITECTURE, random_norms=True, full_attention_interval=2)


@pytest.fixture(scope="module")
def phases_and_expected(model) -> tuple[list[list[list[int]]], list[list[int]]]:
    rng = random.Random(0)
    tokens = lambda n: [rng.randrange(4, 499) for _ in range(n)]  # noqa: E731
    shared = tokens(40)
    phase1 = [shared + tokens(9), tokens(5), tokens(30)]
    expected1 = hf_greedy(model, phase1, MAX_TOKENS)
    phase2 = [phase1[2] + expected1[2] + tokens(4), shared + tokens(3), tokens(7)]
    return [phase1, phase2], expected1 + hf_greedy(model, phase2, MAX_TOKENS)


@pytest.fixture(scope="module")
def results(model, phases_and_expected) -> dict[str, dict]:
    """One engine per kernel set, started at once."""
    phases, _ = phases_and_expected
    run = {"model": model, "phases": phases, "max_tokens": MAX_TOKENS, "engine_kwargs": ENGINE_KWARGS}
    [[torch_ops], [triton_state_ops]] = run_sglang(([run], ENV), ([run], {**ENV, **TRITON_STATE_OPS}))
    return {"torch": torch_ops, "triton": triton_state_ops}


@pytest.fixture(params=["torch", "triton"])
def kernels(request) -> str:
    return request.param


@pytest.fixture
def result(kernels, results) -> dict:
    return results[kernels]


def test_atom_serves_qwen3_next_with_sglangs_state_pool(result, kernels):
    served = describe_served_model(result["log"], result)
    assert served["architecture"] == ARCHITECTURE
    assert served["atom_model"] == "atom_core.models.qwen3_next.Qwen3NextForCausalLM"
    assert served["handed_back"] is None
    # Full-attention layers on ATOM's attention backend inside SGLang's hybrid wrapper.
    assert result["attention_backend"] == "atom"
    # The tiny model's two Gated DeltaNet layers are alike.
    assert "Warm-up before serving: Gated DeltaNet prefill kernels of 1 layer shape(s) in" in (
        result["startup_log"])
    assert "Warm-up before serving" not in result["serving_log"]
    report = next(line for line in result["startup_log"].splitlines() if "atom kernels: " in line)
    assert all(f"{op.lower()}={kernels}" in report for op in STATE_OPS), report


def test_chunked_prefill_and_radix_cache_match_hf(result, phases_and_expected):
    phases, expected = phases_and_expected
    assert [o["tokens"] for phase in result["phases"] for o in phase] == expected
    # Served from cached states: the continued conversation from its whole first turn (SGLang caches
    # a finished request's tokens but its last answer token), the shared prefix from a chunk's end.
    cached = [o["cached_tokens"] for o in result["phases"][1]]
    assert cached[0] >= len(phases[0][2]) + MAX_TOKENS - 1 and cached[1] > 0, cached
