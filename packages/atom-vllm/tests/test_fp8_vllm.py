"""FP8 checkpoints served by ATOM through real vLLM (CPU, tiny models written in the published layouts,
atom_core.testing.fp8_checkpoints). vLLM runs FP8 checkpoints in bfloat16 only. The reference is
ATOM's model alone in bfloat16 on the same checkpoint (atom_core.testing.reference.atom_logits; its
float32 logits match HF transformers within FP8 rounding, see atom-core's test_fp8_parity.py):
prompt log-probabilities within bfloat16 rounding (within the tolerance between two kernels where
vLLM's CPU attention serves a hybrid's full-attention layers: vllm_testing.bf16_logprob_tolerance),
and the first greedy tokens (or a near tie, within that tolerance). vLLM alone runs each cell beside
it; where it serves the format on this machine, its prompt log-probabilities must be those of the
same model, else its error is recorded. (In bfloat16 a rounding difference before an FP8 activation
quantization moves that value by a whole FP8 step, 6 %, about once in 16 values: two correct
implementations differ by up to ~0.3 in log-probability on these tiny random models, and their
greedy sequences part after a few tokens.) The cells and outcomes are printed as a table at the end
of the module.
"""

import pytest
import torch
from vllm_testing import (
    OTHER_KERNELS_TOLERANCE,
    VllmRunFailed,
    assert_atom_served,
    assert_first_tokens_near_greedy,
    bf16_logprob_tolerance,
    error_line,
    prompts,
    run_vllm,
    run_with_and_without_atom,
    tensor_parallel_2,
    tokens_of,
    worst_prompt_logprob_diff,
)

from atom_core.hosting.takeover import EXPERT_PARALLEL_NOTE
from atom_core.testing.fp8_checkpoints import (
    TINY_BLOCK,
    TINY_FP8_OVERRIDES,
    write_fp8_checkpoint,
    write_tiny_fp8_checkpoint,
)
from atom_core.testing.reference import atom_greedy, atom_logits, prompt_logprobs

pytestmark = pytest.mark.vllm

MAX_TOKENS = 12
# How far two correct FP8 implementations' log-probabilities may part on these tiny models (above).
FP8_NOISE = 0.3
TABLE: list[tuple[str, str, str]] = []

CELLS = {
    "Qwen3, block FP8": ("Qwen3ForCausalLM", "fp8-block"),
    "Llama, compressed-tensors FP8_DYNAMIC": ("LlamaForCausalLM", "ct-channel"),
    "Llama, per-tensor FP8, static activations": ("LlamaForCausalLM", "fp8-tensor-static"),
    "Qwen3-MoE, block FP8": ("Qwen3MoeForCausalLM", "fp8-block"),
    "DeepSeek-V3 (MLA), block FP8": ("DeepseekV3ForCausalLM", "fp8-block"),
    "Qwen3-Next (hybrid), block FP8": ("Qwen3NextForCausalLM", "fp8-block"),
}
# Engine settings beside bfloat16: the hybrids' recurrent state in float32, as ATOM's reference keeps it.
CELL_SETTINGS = {"Qwen3NextForCausalLM": {"mamba_ssm_cache_dtype": "float32"}}


@pytest.fixture(scope="module", autouse=True)
def print_table():
    yield
    print("\n| cell | vLLM + ATOM | vLLM alone |\n|---|---|---|")
    for row in TABLE:
        print("| " + " | ".join(row) + " |")


@pytest.mark.parametrize("cell", CELLS)
def test_fp8_checkpoint_served_by_atom(cell, tiny_model_dir, tmp_path):
    architecture, form = CELLS[cell]
    model = write_tiny_fp8_checkpoint(tiny_model_dir, architecture, str(tmp_path / "fp8"), form)
    phase = prompts(5, 19, seed=4)
    settings = {"dtype": "bfloat16", **CELL_SETTINGS.get(architecture, {})}
    with_atom, alone = run_with_and_without_atom(model, [phase], MAX_TOKENS, settings, prompt_logprobs=True)
    if isinstance(with_atom, VllmRunFailed):
        raise with_atom
    assert_atom_served(with_atom)
    reference = atom_logits(model, torch.bfloat16)
    worst = worst_prompt_logprob_diff(with_atom["phases"][0], phase, reference)
    tolerance = bf16_logprob_tolerance(with_atom)
    assert worst < tolerance, f"prompt logprob differs by {worst:.3f}"
    assert_first_tokens_near_greedy(with_atom["phases"][0], phase, reference, tolerance)
    expected_tokens = atom_greedy(model, phase, MAX_TOKENS, torch.bfloat16)
    got = tokens_of(with_atom)
    same = sum(a == b for a, b in zip(got, expected_tokens))
    outcome = f"prompt logprobs within {tolerance}; {same}/{len(got)} greedy sequences equal ATOM alone's"
    if isinstance(alone, VllmRunFailed):
        TABLE.append((cell, outcome, f"stops: {error_line(alone)[:70]}"))
        return
    worst = max(abs(a - b) for ours, theirs in zip(with_atom["phases"][0], alone["phases"][0])
                for a, b in zip(ours["prompt_logprobs"], theirs["prompt_logprobs"]))
    assert worst < OTHER_KERNELS_TOLERANCE
    first = sum(a[0] == b[0] for a, b in zip(got, tokens_of(alone)))
    TABLE.append((cell, outcome, f"prompt logprobs within {worst:.2f} of vLLM + ATOM's; first token "
                                 f"equal {first}/{len(got)}"))


def test_block_fp8_mla_tensor_parallel_2_with_expert_parallel(tiny_model_dir, tmp_path):
    """Block-FP8 DeepSeek-V3 at TP=2 with --enable-expert-parallel (the flagship's setting, at TP 2):
    each rank's shares of the FP8 projections and of every expert, with their block scales, give the
    prompt log-probabilities of ATOM alone at TP 1. Rope dims of 16 make each rank's q_b / kv_b /
    o_proj shares whole blocks of 32, as the real model's are of 128. In float16 (vLLM runs FP8 in
    16 bits only): the two ranks' partial sums round differently from one GEMM's, and an FP8
    activation quantization turns that into whole FP8 steps now and then, so single positions may
    differ by the FP8 noise of the module docstring while the mean stays small; a wrong shard or
    scale moves every position."""
    architecture = "DeepseekV3ForCausalLM"
    source = tiny_model_dir(architecture, **TINY_FP8_OVERRIDES[architecture], qk_rope_head_dim=16, head_dim=16)
    model = write_fp8_checkpoint(source, str(tmp_path / "fp8"), "fp8-block", TINY_BLOCK)
    phase = prompts(5, 19, seed=4)
    tp2 = tensor_parallel_2(enable_expert_parallel=True, dtype="float16")
    result = run_vllm(model, [phase], MAX_TOKENS, prompt_logprobs=True, **tp2)
    assert_atom_served(result)
    assert f"ATOM serves DeepseekV3ForCausalLM on vLLM: {EXPERT_PARALLEL_NOTE}" in result["log"]
    reference = atom_logits(model, torch.float16)
    diffs = [abs(a - b) for output, prompt in zip(result["phases"][0], phase)
             for a, b in zip(output["prompt_logprobs"], prompt_logprobs(reference(prompt), prompt))]
    assert max(diffs) < FP8_NOISE and sum(diffs) / len(diffs) < FP8_NOISE / 4, diffs
    assert_first_tokens_near_greedy(result["phases"][0], phase, reference, FP8_NOISE)
