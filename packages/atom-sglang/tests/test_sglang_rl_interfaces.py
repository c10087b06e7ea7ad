"""What RL frameworks call on SGLang's engine, with ATOM's model, through the real CPU engine (tiny
fp32 Qwen3, a batch of two prompts), against SGLang alone:
- ``return_hidden_states``: the final hidden states SGLang returns per request (the prompt's, then
  one per generated token);
- weight updates of a running engine, from disk and as named tensors in two buckets (HF names,
  through ATOM's loader, which takes any subset once the checkpoint is in).
"""

import pytest
import torch
from sglang_testing import run_sglang

pytestmark = pytest.mark.sglang

PROMPTS = [[5, 17, 42, 9, 300, 12, 7], [88, 3]]
MAX_TOKENS = 4


def with_and_without_atom(run: dict) -> tuple[dict, dict]:
    (atom,), (native,) = run_sglang(([run], {}), ([run], {"ATOM_DISABLE_SGLANG_PLUGIN": "1"}))
    assert "Use ATOM model atom_core.models.qwen3.Qwen3ForCausalLM" in atom["log"]
    return atom, native


def test_hidden_states_equal_sglang_alone(tiny_model_dir):
    atom, native = with_and_without_atom(
        {"model": tiny_model_dir("Qwen3ForCausalLM"), "phases": [PROMPTS], "max_tokens": MAX_TOKENS,
         "return_hidden_states": True, "engine_kwargs": {"enable_return_hidden_states": True}})
    for ours, theirs, prompt in zip(atom["phases"][0], native["phases"][0], PROMPTS):
        assert ours["tokens"] == theirs["tokens"]
        # The prompt's states as one [tokens, hidden] block, then one [hidden] row per new token but
        # the last (SGLang returns the states that produced each sampled token).
        assert torch.tensor(ours["hidden_states"][0]).shape[0] == len(prompt)
        assert len(ours["hidden_states"]) == len(theirs["hidden_states"]) == MAX_TOKENS
        for a, b in zip(ours["hidden_states"], theirs["hidden_states"]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-4)


def test_weight_updates_equal_sglang_alone(tiny_model_dir):
    """Start on one checkpoint, then load another from disk, the first again, and the second as
    tensors: each phase's tokens equal SGLang alone's, and each checkpoint gives the same tokens
    however it was loaded."""
    first, second = tiny_model_dir("Qwen3ForCausalLM"), tiny_model_dir("Qwen3ForCausalLM", seed=1)
    atom, native = with_and_without_atom(
        {"model": first, "phases": [PROMPTS] * 4, "max_tokens": MAX_TOKENS,
         "weight_updates": [None, {"from_disk": second}, {"from_disk": first}, {"from_tensors": second}]})
    tokens = [[out["tokens"] for out in phase] for phase in atom["phases"]]
    assert tokens == [[out["tokens"] for out in phase] for phase in native["phases"]]
    on_first, on_second, on_first_again, on_second_as_tensors = tokens
    assert on_first == on_first_again and on_second == on_second_as_tensors and on_first != on_second
