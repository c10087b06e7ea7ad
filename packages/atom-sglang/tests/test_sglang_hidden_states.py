"""SGLang's ``return_hidden_states`` (used by RL frameworks) with ATOM's model: the final hidden
states SGLang returns per request (the prompt's, then one per generated token) equal SGLang alone's
through the real CPU engine (tiny fp32 Qwen3, a batch of two prompts)."""

import pytest
import torch
from sglang_testing import run_sglang

pytestmark = pytest.mark.sglang

PROMPTS = [[5, 17, 42, 9, 300, 12, 7], [88, 3]]
MAX_TOKENS = 4


def test_hidden_states_equal_sglang_alone(tiny_model_dir):
    run = {"model": tiny_model_dir("Qwen3ForCausalLM"), "phases": [PROMPTS], "max_tokens": MAX_TOKENS,
           "return_hidden_states": True, "engine_kwargs": {"enable_return_hidden_states": True}}
    (atom,), (native,) = run_sglang(([run], {}), ([run], {"ATOM_DISABLE_SGLANG_PLUGIN": "1"}))
    assert "Use ATOM model atom_core.models.qwen3.Qwen3ForCausalLM" in atom["log"]
    for ours, theirs, prompt in zip(atom["phases"][0], native["phases"][0], PROMPTS):
        assert ours["tokens"] == theirs["tokens"]
        # The prompt's states as one [tokens, hidden] block, then one [hidden] row per new token but
        # the last (SGLang returns the states that produced each sampled token).
        assert torch.tensor(ours["hidden_states"][0]).shape[0] == len(prompt)
        assert len(ours["hidden_states"]) == len(theirs["hidden_states"]) == MAX_TOKENS
        for a, b in zip(ours["hidden_states"], theirs["hidden_states"]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-4)
