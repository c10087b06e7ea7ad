"""Greedy parity through the real SGLang engine (CPU): SGLang+ATOM == SGLang alone == HF transformers.

Tiny random fp32 models; 32 new tokens per prompt. Phase 1 fills the radix cache; phase 2 batches
prompts that share 40 and 24 tokens with a phase-1 prompt (radix-cache hits, so ATOM's attention
reads cached K/V from SGLang's pool) with unrelated ones. 16-token chunked prefill with mixed chunks:
the 49-token prompt is prefilled in chunks while other requests decode in the same batch.

SGLang processes, all at once: ATOM active and no attention flag (ATOM's model classes and, by
default, ATOM's attention backend; then Qwen3 once more on SGLang's torch_native backend under
ATOM's model); the same for further families, checked against HF only, and an architecture only
SGLang implements; ATOM_DISABLE_SGLANG_PLUGIN=1 for the parity families. Their logs show which
classes served.
"""

import random

import pytest
from conftest import TINY_OVERRIDES, atom_only_architectures, parity_architectures
from sglang_testing import run_sglang

from atom_core.testing.reference import hf_greedy
from atom_sglang.served_by import describe_served_model

pytestmark = pytest.mark.sglang

ARCHITECTURES = parity_architectures()
ATOM_ONLY = atom_only_architectures()
# SGLang implements it, ATOM does not.
HOST_ONLY = "Qwen2ForCausalLM"
MLA = "DeepseekV3ForCausalLM"
MAX_TOKENS = 32
ENGINE_KWARGS = {"chunked_prefill_size": 16, "enable_mixed_chunk": True}


def make_phases() -> list[list[list[int]]]:
    rng = random.Random(0)
    tokens = lambda n: [rng.randrange(4, 499) for _ in range(n)]  # noqa: E731
    shared = tokens(40)
    phase1 = [shared + tokens(9), tokens(5)]
    phase2 = [shared + tokens(3), shared[:24] + tokens(14), tokens(23), tokens(1)]
    return [phase1, phase2]


def run_spec(model: str, **engine_kwargs) -> dict:
    return {"model": model, "phases": make_phases(), "max_tokens": MAX_TOKENS,
            "engine_kwargs": {**ENGINE_KWARGS, **engine_kwargs}}


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return lambda arch: tiny_model_dir(arch, **TINY_OVERRIDES.get(arch, {}))


@pytest.fixture(scope="module")
def expected(tiny_model) -> dict[str, list[list[int]]]:
    prompts = [p for phase in make_phases() for p in phase]
    return {arch: hf_greedy(tiny_model(arch), prompts, MAX_TOKENS) for arch in ARCHITECTURES + ATOM_ONLY + [HOST_ONLY]}


@pytest.fixture(scope="module")
def runs(tiny_model) -> dict[str, dict[str, dict]]:
    """``atom``: ATOM active, each architecture with SGLang's defaults, and Qwen3 on SGLang's
    torch_native attention. ``native``: ATOM_DISABLE_SGLANG_PLUGIN=1."""
    atom_runs = [run_spec(tiny_model(arch)) for arch in ARCHITECTURES]
    atom_runs.append(run_spec(tiny_model("Qwen3ForCausalLM"), attention_backend="torch_native"))
    more_runs = [run_spec(tiny_model(arch)) for arch in ATOM_ONLY + [HOST_ONLY]]
    more_runs.append(run_spec(tiny_model(MLA), attention_backend="atom"))
    native_runs = [run_spec(tiny_model(arch)) for arch in ARCHITECTURES]
    atom, more, native = run_sglang((atom_runs, {}), (more_runs, {}),
                                    (native_runs, {"ATOM_DISABLE_SGLANG_PLUGIN": "1"}))
    return {
        "atom": {**dict(zip(ARCHITECTURES + ATOM_ONLY + [HOST_ONLY], atom[:-1] + more[:-1])),
                 "Qwen3ForCausalLM+torch_native": atom[-1], f"{MLA}+atom": more[-1]},
        "native": dict(zip(ARCHITECTURES, native)),
    }


def tokens_of(result: dict) -> list[list[int]]:
    return [o["tokens"] for phase in result["phases"] for o in phase]


def served_by(result: dict) -> dict:
    """What the benchmarks record (sglang_run.py); the runner's result carries the attention backend."""
    return describe_served_model(result["log"], result)


def assert_atom_model_served(result: dict, architecture: str) -> None:
    served = served_by(result)
    assert served["architecture"] == architecture
    assert served["atom_model"].startswith("atom_core.models.")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_atom_matches_hf_with_radix_cache(runs, expected, architecture):
    result = runs["atom"][architecture]
    assert_atom_model_served(result, architecture)
    assert result["attention_backend"] == "atom"
    assert "INFO atom: Use atom attention backend for SGLang" in result["log"]
    assert tokens_of(result) == expected[architecture]
    # Phase 2's first two prompts share 40 and 24 tokens with phase 1: served from the radix cache.
    cached = [o["cached_tokens"] for o in result["phases"][1]]
    assert cached[0] >= 40 and cached[1] >= 24, cached


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_atom_kernels_warm_up_before_the_first_request(runs, architecture):
    """ATOM's start-up warm-up ran in SGLang's scheduler before the engine took requests: the prefill
    and extend attention kernels once per layer geometry (the tiny models' layers are alike), and for
    MoE models the routing and the fused MoE. (Which kernels and tensors: test_sglang_attention_backend.py
    and atom-core's test_warmup.py.)"""
    result = runs["atom"][architecture]
    assert "Warm-up before serving: prefill and extend attention kernels of 1 layer shape(s) in" in (
        result["startup_log"])
    # Three expert layers: all of the tiny model's (TINY_OVERRIDES drops its dense layer).
    moe_warm_up = "Warm-up before serving: routing and fused MoE of 3 expert layer(s) in" in result["startup_log"]
    assert moe_warm_up == (architecture == "Qwen3MoeForCausalLM")
    assert "Warm-up before serving" not in result["serving_log"]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_native_sglang_matches_hf(runs, expected, architecture):
    result = runs["native"][architecture]
    assert "INFO atom:" not in result["log"]
    assert served_by(result)["atom_model"] is None
    assert result["attention_backend"] == "torch_native"
    assert tokens_of(result) == expected[architecture]
    cached = [o["cached_tokens"] for o in result["phases"][1]]
    assert cached[0] >= 40 and cached[1] >= 24, cached


@pytest.mark.parametrize("architecture", ATOM_ONLY)
def test_more_families_match_hf(runs, expected, architecture):
    """Mixtral: sliding window through ATOM's backend. DeepSeek-V3: ATOM's MLA in the absorbed form
    over SGLang's latent KV pool, on SGLang's attention (the default with a 16-bit pool; on ATOM's:
    test_mla_on_atoms_latent_attention_matches_hf)."""
    result = runs["atom"][architecture]
    assert_atom_model_served(result, architecture)
    mla = architecture.startswith("Deepseek")
    assert result["attention_backend"] == ("torch_native" if mla else "atom")
    assert tokens_of(result) == expected[architecture]
    cached = [o["cached_tokens"] for o in result["phases"][1]]
    assert cached[0] >= 40 and cached[1] >= 24, cached


def test_mla_on_atoms_latent_attention_matches_hf(runs, expected):
    """``--attention-backend atom`` on an MLA model: ATOM's latent attention over SGLang's latent pool
    (atom_sglang.attention.latent), absorbed decode and expanded extend, with radix-cache hits and
    chunks mixed with decodes."""
    result = runs["atom"][f"{MLA}+atom"]
    assert_atom_model_served(result, MLA)
    assert result["attention_backend"] == "atom"
    assert "Warm-up before serving: prefill and extend attention kernels of 1 layer shape(s) in" in (
        result["startup_log"])
    assert tokens_of(result) == expected[MLA]
    cached = [o["cached_tokens"] for o in result["phases"][1]]
    assert cached[0] >= 40 and cached[1] >= 24, cached


def test_atom_model_on_sglang_attention(runs, expected):
    result = runs["atom"]["Qwen3ForCausalLM+torch_native"]
    assert_atom_model_served(result, "Qwen3ForCausalLM")
    assert result["attention_backend"] == "torch_native"
    assert "Use atom attention backend" not in result["log"]
    assert "prefill and extend attention kernels" not in result["log"]
    assert tokens_of(result) == expected["Qwen3ForCausalLM"]


def test_architecture_atom_does_not_implement_is_served_by_sglang(runs, expected):
    result = runs["atom"][HOST_ONLY]
    assert served_by(result)["atom_model"] is None
    assert f"INFO atom: Architecture {HOST_ONLY} is not implemented by ATOM; SGLang's own model serves it" in (
        result["log"])
    assert tokens_of(result) == expected[HOST_ONLY]
