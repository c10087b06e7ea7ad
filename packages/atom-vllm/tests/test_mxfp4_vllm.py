"""A gpt-oss MXFP4 checkpoint served by ATOM through real vLLM (CPU, bfloat16; a tiny GPT-OSS written
in the published layout, atom_core.testing.mxfp4_checkpoints).

vLLM 0.26 renames the checkpoint's ``mxfp4`` to ``gpt_oss_mxfp4`` before ATOM sees the config; ATOM
must still take the model over. The reference is ATOM's model alone in bfloat16 on the same
checkpoint (its float32 logits match HF transformers', atom-core's test_mxfp4_parity.py). MXFP4 is
weight-only, so nothing is requantized between the two: prompt log-probabilities within bfloat16
rounding, and the same greedy tokens. ATOM serves MXFP4 only when asked (``ATOM_SERVE_MXFP4=1``:
its MXFP4 MoE is not yet measurably faster than vLLM's on a GPU).
"""

import pytest
import torch
from vllm_testing import (
    LOGPROB_TOLERANCE,
    assert_atom_served,
    prompts,
    run_vllm,
    tokens_of,
    worst_prompt_logprob_diff,
)

from atom_core.testing.mxfp4_checkpoints import TINY_MXFP4_OVERRIDES, write_mxfp4_checkpoint
from atom_core.testing.reference import atom_greedy, atom_logits

pytestmark = pytest.mark.vllm

MAX_TOKENS = 8


def test_gpt_oss_mxfp4_served_by_atom(tiny_model_dir, tmp_path):
    source = tiny_model_dir("GptOssForCausalLM", **TINY_MXFP4_OVERRIDES)
    model = write_mxfp4_checkpoint(source, str(tmp_path / "mxfp4"))
    phase = prompts(5, 19, seed=4)
    result = run_vllm(model, [phase], MAX_TOKENS, env={"ATOM_SERVE_MXFP4": "1"}, llm_kwargs={"dtype": "bfloat16"},
                      prompt_logprobs=True)
    assert_atom_served(result)
    worst = worst_prompt_logprob_diff(result["phases"][0], phase, atom_logits(model, torch.bfloat16))
    assert worst < LOGPROB_TOLERANCE, f"prompt logprob differs by {worst:.3f}"
    assert tokens_of(result) == atom_greedy(model, phase, MAX_TOKENS, torch.bfloat16)
