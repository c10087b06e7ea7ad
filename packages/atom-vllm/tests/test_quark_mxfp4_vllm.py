"""An AMD Quark MXFP4 (W4A4) DeepSeek-V3 checkpoint served by ATOM through real vLLM (CPU, bfloat16;
the tiny DeepSeek-V3 of atom_core.testing.quark_checkpoints, in amd/DeepSeek-R1-0528-MXFP4's layout).

vLLM alone cannot run it on CPU (its Quark MXFP4 emulation calls amd-quark's GPU kernels), and vLLM
takes Quark checkpoints in 16-bit dtypes only. The reference is ATOM's model alone in bfloat16 on the
same checkpoint (its float32 logits match HF's DeepSeek-V3 on the dequantized weights with the same
activation rounding, atom-core's test_quark_mxfp4_parity.py).

One engine, in 16-token steps (chunked prefill), with prefix caching, three phases:
- prompts of 5, 1, 23 and 70 tokens, with prompt log-probabilities (vLLM reads no prefix cache for
  such requests). vLLM's prefill runs ATOM's kernels on the same rows as ATOM alone: the
  log-probabilities were equal bit for bit (0.0 apart; tolerance LOGPROB_TOLERANCE), and so the
  first generated tokens are ATOM alone's greedy picks;
- two prompts sharing the 70-token prompt's first 48, which they read from the prefix cache: their
  first tokens, from a prefill over cached latents, are ATOM alone's greedy picks too;
- the six prompts again, the longer ones from the prefix cache.

Decoding runs MLA in its absorbed form (W_UK folded into the query), which rounds differently from
the prefill form ATOM alone runs; so does a prefill step with one token left after the cached ones
(the third phase's 65-token prompt). On this tiny random model a bfloat16 ulp that crosses an MXFP4
rounding boundary (e2m1 keeps one mantissa bit) or flips a routing choice moves the log-probabilities
by whole units: noise of one ulp on ATOM alone's embeddings moves them by up to 3.8. So the decoded
tokens part from ATOM alone's greedy sequences after a few tokens (the third phase's 65-token prompt
from its first token), and each is compared instead by how far its log-probability under ATOM alone,
given the tokens before it, lies below the greedy pick's: 0.14 on average and 1.54 at worst,
measured on vLLM 0.26 and 0.32 alike, against 3.6 for a token of median rank and 0.45 for the greedy
tokens of the same model without the activation rounding.

A second engine serves the checkpoint at TP=2 with expert parallelism
(test_tensor_parallel_2_with_expert_parallel).

On a GPU (``ATOM_SERVE_MXFP4=1``) vLLM runs ATOM's compiled Triton kernels while the reference runs
on the CPU, so the prefill no longer rounds as ATOM alone does: on an H100 the prompt
log-probabilities lay up to 1.24 from ATOM alone's bfloat16 ones and a first token 0.25 below its
greedy pick. There the prompt log-probabilities are held to ATOM alone's bfloat16 noise instead, and
the first tokens to twice its worst, as in the TP 2 cell: on the H100, 0.350 from ATOM alone's float32
on average (1.268 at worst) against 0.321 (1.683) for ATOM alone's bfloat16; decoded tokens 0.238
below ATOM alone's greedy pick on average.
"""

import pytest
import torch
from test_vllm_parity import make_prompts
from vllm_testing import (
    LOGPROB_TOLERANCE,
    assert_atom_served,
    assert_first_tokens_near_greedy,
    run_vllm,
    tensor_parallel_2,
    worst_prompt_logprob_diff,
)

from atom_core import envs
from atom_core.hosting.takeover import EXPERT_PARALLEL_NOTE
from atom_core.testing.quark_checkpoints import write_tiny_quark_checkpoints
from atom_core.testing.reference import atom_logits, prompt_logprob_gaps, within_bfloat16_noise

# vLLM serves on the GPU where one is present, and ATOM takes the checkpoint there only when asked.
SERVED_ON_GPU = torch.cuda.is_available()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(SERVED_ON_GPU and not envs.serve_mxfp4(),
                       reason="on GPUs ATOM serves Quark MXFP4 only with ATOM_SERVE_MXFP4=1"),
]

MAX_TOKENS = 12
MLA_IMPL = "atom_vllm.attention.mla.ATOMMLAImpl"
# The mean distance of the decoded tokens below ATOM alone's greedy pick (measured 0.14; above).
DECODE_GAP_TOLERANCE = 0.5


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory) -> str:
    return write_tiny_quark_checkpoints(tiny_model_dir, str(tmp_path_factory.mktemp("deepseek-v3-quark")))[0]


@pytest.fixture(scope="module")
def phases() -> list[list[list[int]]]:
    phase1, phase2 = make_prompts()
    return [phase1, phase2, phase1 + phase2]


@pytest.fixture(scope="module")
def served(checkpoint, phases) -> dict:
    return run_vllm(checkpoint, phases, MAX_TOKENS, prompt_logprobs=[True, False, False],
                    llm_kwargs={"dtype": "bfloat16", "max_num_batched_tokens": 16, "enable_chunked_prefill": True})


@pytest.fixture(scope="module")
def reference(checkpoint):
    return atom_logits(checkpoint, torch.bfloat16)


def test_served_by_atom(served):
    assert_atom_served(served)
    assert served["served_by"]["model_class"] == "atom_vllm.model_wrapper.ATOMMoEForCausalLM"
    assert served["served_by"]["inner_class"] == "atom_core.models.deepseek_v2.DeepseekV3ForCausalLM"
    assert served["served_by"]["attention_impls"] == [MLA_IMPL]
    assert served["scheduler"] == {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}


@pytest.fixture(scope="module")
def gpu_gaps(checkpoint, phases, served) -> tuple[torch.Tensor, torch.Tensor]:
    """On a GPU: the served and ATOM alone's bfloat16 prompt log-probabilities' distances from ATOM
    alone's float32 ones (prompt_logprob_gaps)."""
    served_logprobs = [o["prompt_logprobs"] for o in served["phases"][0]]
    return prompt_logprob_gaps(checkpoint, phases[0], served_logprobs)


def test_prompt_logprobs_match_atom_alone(served, phases, reference, request):
    if not SERVED_ON_GPU:
        worst = worst_prompt_logprob_diff(served["phases"][0], phases[0], reference)
        assert worst < LOGPROB_TOLERANCE, f"prompt logprob differs by {worst:.3f}"
        return
    gaps, alone = request.getfixturevalue("gpu_gaps")
    print(f"from ATOM alone's float32: vLLM + ATOM on the GPU {gaps.mean():.3f} on average, "
          f"{gaps.max():.3f} at worst; ATOM alone in bfloat16 {alone.mean():.3f}, {alone.max():.3f}")
    assert within_bfloat16_noise(gaps, alone), (gaps, alone)


def test_first_tokens_are_atom_alones_greedy_picks(served, phases, reference, checkpoint, request):
    assert all(o["num_cached_tokens"] >= 32 for o in served["phases"][1])
    outputs, prompts = served["phases"][0] + served["phases"][1], phases[0] + phases[1]
    if not SERVED_ON_GPU:
        assert_first_tokens_near_greedy(outputs, prompts, reference, LOGPROB_TOLERANCE)
        return
    _, alone = request.getfixturevalue("gpu_gaps")
    assert_first_tokens_near_greedy(outputs, prompts, atom_logits(checkpoint, torch.float32), 2 * alone.max())


def test_decoded_tokens_near_atom_alones_greedy_picks(served, phases, reference):
    again = served["phases"][2]
    assert all(o["num_cached_tokens"] >= 32 for o, prompt in zip(again, phases[2], strict=True) if len(prompt) >= 48)
    gaps = []
    for prompts, outputs in zip(phases, served["phases"], strict=True):
        for prompt, output in zip(prompts, outputs, strict=True):
            tokens = output["tokens"]
            logprobs = reference(prompt + tokens)[len(prompt) - 1:-1].log_softmax(-1)
            gaps += (logprobs.max(-1).values - logprobs[torch.arange(len(tokens)), tokens]).tolist()
    mean = sum(gaps) / len(gaps)
    print(f"decoded tokens below ATOM alone's greedy pick: {mean:.3f} on average, {max(gaps):.3f} at worst")
    assert mean < DECODE_GAP_TOLERANCE, gaps


def test_tensor_parallel_2_with_expert_parallel(tiny_model_dir, tmp_path):
    """TP=2 with --enable-expert-parallel (ATOM splits every expert across the ranks either way): each
    rank holds half of each dense MLP, shared expert and routed expert, packed weights and e8m0
    scales cut at whole 32-value blocks (MLP 128, experts 64: 64 and 32 rows a rank). The two ranks'
    partial sums round differently in bfloat16 from one GEMM's, and the next MXFP4 activation
    rounding turns those ulps into whole steps, as SGLang's absorbed MLA does (test_sglang_quark_mxfp4.py).
    So, as there, on weights of std 0.05 the prompt log-probabilities are held to ATOM alone's float32
    ones at TP 1, as close as ATOM alone's bfloat16 ones: measured 0.103 on average (0.344 at worst)
    against 0.110 (0.373); 0.087 (0.345) from ATOM alone's bfloat16 ones; the same without expert
    parallelism. Each rank reading the other's half of the routed experts' down_proj scales gives
    0.191 on average, outside the 1.5 times allowed."""
    def smooth(architecture, **overrides):
        return tiny_model_dir(architecture, std=0.05, **overrides)

    model = write_tiny_quark_checkpoints(smooth, str(tmp_path))[0]
    phase, _ = make_prompts()
    result = run_vllm(model, [phase], 4, prompt_logprobs=True,
                      **tensor_parallel_2(enable_expert_parallel=True, dtype="bfloat16"))
    assert_atom_served(result)
    assert f"ATOM serves DeepseekV3ForCausalLM on vLLM: {EXPERT_PARALLEL_NOTE}" in result["log"]
    assert all(f"DeepseekV3ForCausalLM: TP rank {rank} of 2 holds" in result["log"] for rank in (0, 1))
    tp2, tp1 = prompt_logprob_gaps(model, phase, [o["prompt_logprobs"] for o in result["phases"][0]])
    print(f"from ATOM alone's float32: vLLM + ATOM at TP 2 {tp2.mean():.3f} on average, {tp2.max():.3f} at "
          f"worst; ATOM alone in bfloat16 {tp1.mean():.3f}, {tp1.max():.3f}")
    assert within_bfloat16_noise(tp2, tp1), (tp2, tp1)
    assert_first_tokens_near_greedy(result["phases"][0], phase, atom_logits(model, torch.float32), 2 * tp1.max())
