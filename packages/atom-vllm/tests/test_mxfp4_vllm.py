"""A gpt-oss MXFP4 checkpoint served by ATOM through real vLLM (CPU, bfloat16; a tiny GPT-OSS written
in the published layout, atom_core.testing.mxfp4_checkpoints).

vLLM 0.26 renames the checkpoint's ``mxfp4`` to ``gpt_oss_mxfp4`` before ATOM sees the config; ATOM
must still take the model over. The reference is ATOM's model alone in bfloat16 on the same
checkpoint (its float32 logits match HF transformers', atom-core's test_mxfp4_parity.py). MXFP4 is
weight-only, so nothing is requantized between the two: prompt log-probabilities within bfloat16
rounding, and the same greedy tokens. ATOM serves MXFP4 only when asked (``ATOM_SERVE_MXFP4=1``:
its MXFP4 MoE is not yet measurably faster than vLLM's on a GPU).

At TP 2 the tiny model's intermediate size is five 32-value blocks, so each rank's share (80 values)
lies inside a block: ATOM gives each rank three blocks (96), the second rank's last one zeros, as it
pads gpt-oss's 2880 at TP 4 and 8.
The reference stays ATOM alone at TP 1: the two ranks' bfloat16 partial sums round differently from
one rank's sum, so a later decode step may break a near tie the other way (here one of the two
prompts' tokens part from ATOM alone's at the sixth of 8):
at TP 2 the first generated token is held to ATOM alone's greedy pick, or one within the
tolerance of it. With three blocks instead (48 values a rank, padded to 64) that rounding moved one
prompt position by 0.28 (the others under 0.13), past the tolerance, and ATOM alone at TP 2 (gloo)
gave the very same log-probabilities, position by position; in float32 TP 2 equals TP 1 within 1e-5
(atom-core's test_tensor_parallel.py, the same padded model).
"""

import pytest
import torch
from vllm_testing import (
    LOGPROB_TOLERANCE,
    assert_atom_served,
    assert_first_tokens_near_greedy,
    prompts,
    run_vllm,
    tensor_parallel_2,
    tokens_of,
    worst_prompt_logprob_diff,
)

from atom_core.testing.mxfp4_checkpoints import TINY_MXFP4_OVERRIDES, write_mxfp4_checkpoint
from atom_core.testing.reference import atom_greedy, atom_logits

pytestmark = pytest.mark.vllm

MAX_TOKENS = 8


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2-padded"])
def test_gpt_oss_mxfp4_served_by_atom(tp, tiny_model_dir, tmp_path):
    if tp == 1:
        source, parallel = tiny_model_dir("GptOssForCausalLM", **TINY_MXFP4_OVERRIDES), {"env": {}, "llm_kwargs": {}}
    else:
        source = tiny_model_dir("GptOssForCausalLM", **dict(TINY_MXFP4_OVERRIDES, intermediate_size=160))
        parallel = tensor_parallel_2()
    model = write_mxfp4_checkpoint(source, str(tmp_path / "mxfp4"))
    phase = prompts(5, 19, seed=4)
    result = run_vllm(model, [phase], MAX_TOKENS, env={"ATOM_SERVE_MXFP4": "1", **parallel["env"]},
                      llm_kwargs={"dtype": "bfloat16", **parallel["llm_kwargs"]}, prompt_logprobs=True)
    assert_atom_served(result)
    worst = worst_prompt_logprob_diff(result["phases"][0], phase, atom_logits(model, torch.bfloat16))
    assert worst < LOGPROB_TOLERANCE, f"prompt logprob differs by {worst:.3f}"
    if tp == 1:
        assert tokens_of(result) == atom_greedy(model, phase, MAX_TOKENS, torch.bfloat16)
    else:
        assert_first_tokens_near_greedy(result["phases"][0], phase, atom_logits(model, torch.bfloat16),
                                        LOGPROB_TOLERANCE)
