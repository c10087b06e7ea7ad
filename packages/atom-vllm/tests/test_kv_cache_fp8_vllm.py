"""``--kv-cache-dtype fp8`` served by ATOM's attention through real vLLM (CPU, tiny Qwen3 for MHA,
tiny DeepSeek-V3 for MLA).

What the FP8 cache changes is exact to state. MHA with 16-token chunked prefill: the first chunk of a
prompt attends over its fresh K/V, every later chunk and every decode step over the whole cache, where
K and V were stored as e4m3 (scale 1.0, vLLM's default without checkpoint scales). MLA: every step
reads the e4m3 latent cache. The reference is ATOM's model alone with attention doing exactly that
(atom_core.testing.reference.fp8_kv_cache_semantics). vLLM+ATOM's prompt log-probabilities and greedy
tokens must match it, and the log-probabilities must differ from the plain model's by far more: the
cache really holds FP8.

Checkpoints with per-layer KV-cache scales (atom_core.quantization.kv_cache) run the same way: the
reference divides K/V by the layer's scales before the e4m3 rounding and multiplies them back, and
vLLM+ATOM must match it, far from the same cache at scale 1.0. vLLM decides what the scales do, as
for its own models: a compressed-tensors ``kv_cache_scheme`` turns ``--kv-cache-dtype auto`` into an
FP8 cache; scales of an ``fp8`` checkpoint under ``auto`` are not used.
"""

import pytest
import torch
from vllm_testing import assert_atom_served, prompts, run_vllm, worst_prompt_logprob_diff

from atom_core.testing.fp8_checkpoints import add_kv_cache_scales, write_tiny_fp8_checkpoint
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
    if architecture.startswith("Qwen3"):  # no FlashAttention-3 on a CPU: ATOM's kernels read the cache
        assert "FP8 KV cache: the attention layers run ATOM's attention kernels" in result["log"]
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


def test_fp8_kv_attention_switch_names_what_it_accepts(monkeypatch):
    from atom_vllm import envs

    monkeypatch.setenv(envs.FP8_KV_ATTENTION_VARIABLE, "fa2")
    with pytest.raises(ValueError, match="ATOM_VLLM_FP8_KV_ATTENTION='fa2': expected 'host' or 'atom'"):
        envs.fp8_kv_attention()
    monkeypatch.setenv(envs.FP8_KV_ATTENTION_VARIABLE, "atom")
    assert envs.fp8_kv_attention() == envs.ATOM


# Per layer (K, V) of the tiny FP8 Qwen3: near the amax / 448 of its K and V (3.3-4.3), so the cache
# uses e4m3's whole range; the result moves by ~0.3 in log-probability from scale 1.0.
KV_SCALES = [(0.0081, 0.0094), (0.0085, 0.0102), (0.0079, 0.0097)]


def served_kv_scales(result: dict) -> list[tuple[float, float]]:
    scales = result["served_by"]["kv_cache_scales"]
    return [tuple(scales[f"model.layers.{i}.self_attn.attn"]) for i in range(len(scales))]


def test_compressed_tensors_kv_cache_scheme(tiny_model_dir, tmp_path):
    """A compressed-tensors checkpoint with ``kv_cache_scheme`` under ``--kv-cache-dtype auto``:
    vLLM keeps an FP8 cache, as for its own models, at the checkpoint's scales. Prompt
    log-probabilities (chunked prefill) and greedy tokens equal the reference's at those scales,
    far from the same cache at scale 1.0. (compressed-tensors runs in float32; ``fp8`` checkpoints,
    below, in bfloat16 only.)"""
    model = add_kv_cache_scales(
        write_tiny_fp8_checkpoint(tiny_model_dir, "Qwen3ForCausalLM", str(tmp_path / "ct"), "ct-channel"),
        KV_SCALES, "compressed-tensors")
    phases = [[prompt] for prompt in prompts(40, 57, seed=11)]
    kwargs = {"dtype": "float32", "kv_cache_dtype": "auto", **CHUNKED}
    result = run_vllm(model, phases, MAX_TOKENS, llm_kwargs=kwargs, prompt_logprobs=True)
    assert_atom_served(result)
    assert served_kv_scales(result) == [pytest.approx(pair) for pair in KV_SCALES]
    with fp8_kv_cache_semantics(CHUNK):
        unscaled_reference = atom_logits(model)
    with fp8_kv_cache_semantics(CHUNK, KV_SCALES):
        scaled_reference = atom_logits(model)
        expected_tokens = atom_greedy(model, [phase[0] for phase in phases], MAX_TOKENS)
    outputs, prompts_run = [phase[0] for phase in result["phases"]], [phase[0] for phase in phases]
    error = worst_prompt_logprob_diff(outputs, prompts_run, scaled_reference)
    unscaled_error = worst_prompt_logprob_diff(outputs, prompts_run, unscaled_reference)
    print(f"off the scaled FP8-cache reference by {error:.2e}, off scale 1.0 by {unscaled_error:.2e}")
    assert error < TOLERANCE
    assert unscaled_error > 20 * TOLERANCE
    assert [output["tokens"] for output in outputs] == expected_tokens


FP8_KV_SCALE_CELLS = {
    # cell: (scale layout, --kv-cache-dtype, the (K, V) scales vLLM's layers apply)
    "k_proj.k_scale / v_proj.v_scale, fp8": ("fp8-proj", "fp8", KV_SCALES),
    "legacy kv_scale, fp8": ("legacy", "fp8", [(k, k) for k, _ in KV_SCALES]),
    "k_proj.k_scale / v_proj.v_scale, auto": ("fp8-proj", "auto", [(1.0, 1.0)] * len(KV_SCALES)),
}


def in_bf16(value: float) -> float:
    return torch.tensor(value).to(torch.bfloat16).item()


@pytest.mark.parametrize("cell", FP8_KV_SCALE_CELLS)
def test_fp8_checkpoint_kv_scales(tiny_model_dir, tmp_path, cell):
    """``quant_method: fp8`` checkpoints with KV scales, in bfloat16: the scales vLLM's attention
    layers apply are the checkpoint's (the legacy ``kv_scale`` for K and V) rounded to bfloat16, as
    vLLM rounds them for its own models (its scale parameters take the model dtype), and none
    without an FP8 cache, whose output then is the model's own. (In bfloat16, rounding differences before the
    e4m3 rounding of K/V move log-probabilities by ~0.3 either way, too much to tell the scales
    apart by output: the float32 compressed-tensors test above checks the arithmetic.)"""
    layout, kv_cache_dtype, applied = FP8_KV_SCALE_CELLS[cell]
    model = add_kv_cache_scales(
        write_tiny_fp8_checkpoint(tiny_model_dir, "Qwen3ForCausalLM", str(tmp_path / "fp8"), "fp8-tensor"),
        KV_SCALES, layout)
    phase = prompts(40, 57, seed=11)
    kwargs = {"dtype": "bfloat16", "kv_cache_dtype": kv_cache_dtype}
    result = run_vllm(model, [phase], MAX_TOKENS, llm_kwargs=kwargs, prompt_logprobs=kv_cache_dtype == "auto")
    assert_atom_served(result)
    assert served_kv_scales(result) == [(in_bf16(k), in_bf16(v)) for k, v in applied]
    if kv_cache_dtype == "auto":
        error = worst_prompt_logprob_diff(result["phases"][0], phase, atom_logits(model, torch.bfloat16))
        assert error < TOLERANCE


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "auto"])
def test_fp8_mla_checkpoint_kv_scales(tiny_model_dir, tmp_path, kv_cache_dtype):
    """A block-FP8 MLA checkpoint carrying KV-cache scales (``self_attn.k_scale`` / ``v_scale``: MLA
    has no k_proj) loads, and ATOM's MLA layers apply what vLLM's KV-cache method applies to its own
    MLA layers: with an FP8 cache the checkpoint's K scale, rounded to bfloat16, for the whole
    latent entry; with a 16-bit cache none (1.0), and the output is the model's own."""
    k_scales = [0.011, 0.009, 0.013]
    model = add_kv_cache_scales(
        write_tiny_fp8_checkpoint(tiny_model_dir, "DeepseekV3ForCausalLM", str(tmp_path / "fp8"), "fp8-block"),
        [(k, 2 * k) for k in k_scales], "fp8-attn")
    phase = prompts(40, 57, seed=11)
    kwargs = {"dtype": "bfloat16", "kv_cache_dtype": kv_cache_dtype}
    result = run_vllm(model, [phase], MAX_TOKENS, llm_kwargs=kwargs, prompt_logprobs=kv_cache_dtype == "auto")
    assert_atom_served(result)
    assert "Use atom MLA attention backend" in result["log"]
    applied = [in_bf16(k) for k in k_scales] if kv_cache_dtype == "fp8" else [1.0] * len(k_scales)
    assert served_kv_scales(result) == [(k,) for k in applied]
    if kv_cache_dtype == "auto":
        error = worst_prompt_logprob_diff(result["phases"][0], phase, atom_logits(model, torch.bfloat16))
        assert error < TOLERANCE
