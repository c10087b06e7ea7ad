"""vLLM + ATOM with ATOM's piecewise torch.compile (level 3) on CPU: same greedy tokens as HF/eager,
one attention split per layer, and a second engine start served from the compile cache; and a
block-FP8 model compiled with the fused activation quantization."""

import re

import pytest
import torch
from test_fp8_vllm import MAX_TOKENS as FP8_MAX_TOKENS
from test_vllm_parity import MAX_TOKENS, make_prompts
from vllm_testing import (
    LOGPROB_TOLERANCE,
    assert_atom_served,
    hf_greedy,
    prompts,
    run_vllm,
    tokens_of,
    worst_prompt_logprob_diff,
)

from atom_core.testing.fp8_checkpoints import write_tiny_fp8_checkpoint
from atom_core.testing.reference import atom_greedy, atom_logits

pytestmark = pytest.mark.vllm

SUMMARY = re.compile(r"INFO atom: torch\.compile: (\d+) attention split points, (\d+) compiled pieces "
                     r"in ([\d.]+) s \(inductor cache: (\d+) hits, (\d+) misses")


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"])
def test_piecewise_compile_in_vllm(tiny_model_dir, architecture, tmp_path):
    model = tiny_model_dir(architecture)
    phase1, phase2 = make_prompts()
    expected = hf_greedy(model, phase1 + phase2, MAX_TOKENS)
    kwargs = {"enforce_eager": False, "additional_config": {"atom_compilation_level": 3}}
    env = {"ATOM_CACHE_DIR": str(tmp_path)}
    runs = [run_vllm(model, [phase1, phase2], MAX_TOKENS, env=env, llm_kwargs=kwargs) for _ in range(2)]
    num_layers = 3
    compile_seconds = []
    for run in runs:
        assert [o["tokens"] for phase in run["phases"] for o in phase] == expected
        summaries = [tuple(map(float, m)) for m in SUMMARY.findall(run["log"])]
        assert summaries, run["log"][-3000:]
        assert all((s[0], s[1]) == (num_layers, num_layers + 1) for s in summaries)
        compile_seconds.append(sum(s[2] for s in summaries))
        run["hits"], run["misses"] = sum(s[3] for s in summaries), sum(s[4] for s in summaries)
    first, second = runs
    assert first["misses"] > 0
    detail = [SUMMARY.findall(r["log"]) for r in runs]
    assert second["misses"] == 0 and second["hits"] > 0, detail
    # Recorded, not asserted: wall-clock timings belong in benchmarks, not in pass/fail tests.
    print(f"{architecture}: compile {compile_seconds[0]:.1f} s cold, {compile_seconds[1]:.1f} s from cache")


def test_piecewise_compile_of_a_block_fp8_model_in_vllm(tiny_model_dir, tmp_path):
    """Block FP8: the norms and SiLU * mul hand the linears quantized activations through the fused
    ops, opaque nodes of the compiled graph; compiled in vLLM, prompt log-probabilities and first
    tokens are those of ATOM's eager model (test_fp8_vllm's reference and tolerance)."""
    model = write_tiny_fp8_checkpoint(tiny_model_dir, "Qwen3ForCausalLM", str(tmp_path / "fp8"), "fp8-block")
    phase = prompts(5, 19, seed=4)
    kwargs = {"dtype": "bfloat16", "enforce_eager": False, "additional_config": {"atom_compilation_level": 3}}
    run = run_vllm(model, [phase], FP8_MAX_TOKENS, env={"ATOM_CACHE_DIR": str(tmp_path / "cache")},
                   llm_kwargs=kwargs, prompt_logprobs=True)
    assert_atom_served(run)
    assert "rms_norm_quant_fp8=" in run["log"] and "before FP8 linears: on" in run["log"]
    summaries = SUMMARY.findall(run["log"])
    assert summaries and all((int(s[0]), int(s[1])) == (3, 4) for s in summaries), run["log"][-3000:]
    worst = worst_prompt_logprob_diff(run["phases"][0], phase, atom_logits(model, torch.bfloat16))
    assert worst < LOGPROB_TOLERANCE, f"prompt logprob differs by {worst:.3f}"
    expected = atom_greedy(model, phase, FP8_MAX_TOKENS, torch.bfloat16)
    assert [t[0] for t in tokens_of(run)] == [t[0] for t in expected]
