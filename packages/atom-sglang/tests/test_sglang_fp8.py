"""FP8 checkpoints served by ATOM through real SGLang 0.5.17 (CPU engine; SGLang runs FP8 in
bfloat16 only; tiny models written in the published layouts by atom_core.testing.fp8_checkpoints):
greedy tokens equal ATOM's model alone in bfloat16 on the same checkpoint
(atom_core.testing.reference.atom_greedy; in float32 its logits match HF transformers within FP8
rounding, see atom-core's test_fp8_parity.py). MLA models run ATOM's model on SGLang's latent
attention, and with an FP8 KV cache on ATOM's (on GPUs: test_sglang_gpu_mla.py)."""

import pytest
import torch
from sglang_testing import run_sglang

from atom_core.testing.fp8_checkpoints import add_kv_cache_scales, write_tiny_fp8_checkpoint
from atom_core.testing.reference import (
    atom_greedy,
    atom_logits,
    fp8_kv_cache_semantics,
    prompt_logprob_gaps,
    prompt_logprobs,
    within_bfloat16_noise,
)

pytestmark = pytest.mark.sglang

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40))]
MAX_TOKENS = 12

CELLS = {
    "Qwen3, block FP8": ("Qwen3ForCausalLM", "fp8-block"),
    "Llama, compressed-tensors FP8_DYNAMIC": ("LlamaForCausalLM", "ct-channel"),
    "Qwen3-MoE, block FP8": ("Qwen3MoeForCausalLM", "fp8-block"),
}


@pytest.mark.parametrize("cell", CELLS)
def test_fp8_checkpoint_served_by_atom(cell, tiny_model_dir, tmp_path):
    architecture, form = CELLS[cell]
    model = write_tiny_fp8_checkpoint(tiny_model_dir, architecture, str(tmp_path / "fp8"), form)
    run = {"model": model, "phases": [PROMPTS], "max_tokens": MAX_TOKENS,
           "engine_kwargs": {"dtype": "bfloat16"}}
    [[result]] = run_sglang(([run], {}))
    assert "Use ATOM model" in result["log"] and "ATOM hands" not in result["log"]
    tokens = [o["tokens"] for o in result["phases"][0]]
    assert tokens == atom_greedy(model, PROMPTS, MAX_TOKENS, torch.bfloat16)


def test_fp8_mla_served_by_atom_on_sglang_latent_attention(tiny_model_dir, tmp_path):
    """A block-FP8 DeepSeek-V3 in bf16 (SGLang's only dtype for FP8): ATOM's model on SGLang's
    latent attention gives prompt log-probabilities as close to ATOM's model alone in fp32 as ATOM
    alone in bf16 is. The weights have std 0.05, under which bf16 rounding ahead of the FP8
    activation quantization moves log-probabilities by hundredths (at the tiny models' usual 0.1, by
    up to 2, too much to tell a wrong pairing from rounding); the prompts' log-probabilities spread
    over about 2.4, so a wrong pairing shows at that scale."""
    def smooth(architecture, **overrides):
        return tiny_model_dir(architecture, std=0.05, **overrides)

    model = write_tiny_fp8_checkpoint(smooth, "DeepseekV3ForCausalLM", str(tmp_path / "fp8"), "fp8-block")
    run = {"model": model, "phases": [PROMPTS], "max_tokens": 1, "prompt_logprobs": True,
           "engine_kwargs": {"dtype": "bfloat16"}}
    [[result]] = run_sglang(([run], {}))
    assert "Use ATOM model" in result["log"] and "ATOM hands" not in result["log"]
    sglang, atom_bf16 = prompt_logprob_gaps(model, PROMPTS, [o["prompt_logprobs"] for o in result["phases"][0]])
    assert within_bfloat16_noise(sglang, atom_bf16), (sglang, atom_bf16)


def test_fp8_mla_cache_served_by_atom(tiny_model_dir):
    """``--kv-cache-dtype fp8_e4m3`` on a bf16 DeepSeek-V3 (std 0.05, as above): ATOM's model over an
    e4m3 latent pool, on ATOM's latent attention (the default with an FP8 pool) and on SGLang's
    torch_native. SGLang alone cannot be the yardstick (its CPU MLA prefill on torch_native reads K
    from the latent pool and fails), so it is ATOM alone attending over the latent entries rounded
    through e4m3 (fp8_kv_cache_semantics), to bf16 noise; the plain cache's logprobs lie outside it."""
    from atom_sglang.version import cpu_fp8_kv_cache_needs_intel_amx

    if cpu_fp8_kv_cache_needs_intel_amx():
        pytest.skip("SGLang 0.5.20 and later serve an FP8 KV cache on CPU with intel_amx only; 0.5.23 refuses one "
                    "for MLA there ('CPU FP8 KV cache is only supported for MHA'), with or without ATOM")
    model = tiny_model_dir("DeepseekV3ForCausalLM", std=0.05)
    run = {"model": model, "phases": [PROMPTS], "max_tokens": 1, "prompt_logprobs": True,
           "engine_kwargs": {"dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3"}}
    torch_native = {**run, "engine_kwargs": {**run["engine_kwargs"], "attention_backend": "torch_native"}}
    [results] = run_sglang(([run, torch_native], {}))
    for result, backend in zip(results, ("atom", "torch_native"), strict=True):
        assert "Use ATOM model" in result["log"] and "ATOM hands" not in result["log"]
        assert result["attention_backend"] == backend
        served = [o["prompt_logprobs"] for o in result["phases"][0]]
        with fp8_kv_cache_semantics(0):
            assert within_bfloat16_noise(*prompt_logprob_gaps(model, PROMPTS, served)), backend
        assert not within_bfloat16_noise(*prompt_logprob_gaps(model, PROMPTS, served)), backend


def test_fp8_kv_cache_served_by_atom(tiny_model_dir):
    """``--kv-cache-dtype fp8_e4m3`` on a float32 Qwen3: the prompt attends over its fresh K/V, every
    decode step over the e4m3 cache (scale 1.0), as atom_core.testing.reference.fp8_kv_cache_semantics
    states; the greedy tokens of that reference, prompt by prompt."""
    from atom_sglang.version import cpu_fp8_kv_cache_needs_intel_amx

    if cpu_fp8_kv_cache_needs_intel_amx():
        pytest.skip("SGLang 0.5.20 and later serve an FP8 KV cache on CPU with their intel_amx attention only "
                    "(on CPUs with AMX), with or without ATOM")
    model = tiny_model_dir("Qwen3ForCausalLM")
    run = {"model": model, "phases": [PROMPTS], "max_tokens": MAX_TOKENS,
           "engine_kwargs": {"dtype": "float32", "kv_cache_dtype": "fp8_e4m3"}}
    [[result]] = run_sglang(([run], {}))
    assert "Use ATOM model" in result["log"] and "ATOM hands" not in result["log"]
    assert "Use atom attention backend" in result["log"]
    expected = []
    for prompt in PROMPTS:
        with fp8_kv_cache_semantics(len(prompt)):
            expected += atom_greedy(model, [prompt], MAX_TOKENS)
    assert [o["tokens"] for o in result["phases"][0]] == expected
    assert expected != atom_greedy(model, PROMPTS, MAX_TOKENS), "the FP8 cache changed no token"


KV_SCALES = [(0.0081, 0.0094), (0.0085, 0.0102), (0.0079, 0.0097)]


def test_compressed_tensors_kv_scales_are_left_to_sglang(tiny_model_dir, tmp_path):
    """SGLang reads no compressed-tensors KV-cache scales (atom_sglang.config_translation)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    from atom_sglang.config_translation import CT_KV_SCALES_REASON, takeover_decision

    model = add_kv_cache_scales(
        write_tiny_fp8_checkpoint(tiny_model_dir, "Qwen3ForCausalLM", str(tmp_path / "ct"), "ct-channel"),
        KV_SCALES, "compressed-tensors")
    server_args = ServerArgs(model_path=model, device="cpu", dtype="bfloat16", kv_cache_dtype="fp8_e4m3")
    assert takeover_decision(server_args, ModelConfig.from_server_args(server_args)).reasons == (CT_KV_SCALES_REASON,)



# Prompts are prefilled in chunks of CHUNK tokens: the later chunks attend over the FP8 cache.
CHUNK = 16
# Per layer (K, V), powers of two: SGLang divides K/V by them in the model's dtype before the e4m3
# rounding, exactly for these (other scales add a bf16 rounding first, which moves bf16 results by
# ~0.1 in log-probability). Coarse, so that the cache rounds on e4m3's subnormal steps and its
# values depend on the scales.
POWER_OF_TWO_KV_SCALES = [(32.0, 16.0), (16.0, 64.0), (64.0, 32.0)]


def test_fp8_checkpoint_kv_scales_in_the_fp8_cache(tiny_model_dir, tmp_path):
    """``quant_method: fp8`` checkpoints with KV scales (``k_proj.k_scale`` / ``v_proj.v_scale``;
    the legacy ``kv_scale``, which serves V too) under ``--kv-cache-dtype fp8_e4m3``, in bf16
    (SGLang's only dtype for FP8 checkpoints), prompts prefilled in 16-token chunks: prompt
    log-probabilities are those of ATOM alone over an e4m3 cache at the checkpoint's scales
    (atom_core.testing.reference.fp8_kv_cache_semantics), and differ from the same cache at scale
    1.0 and from a 16-bit cache. The weights have std 0.05, as in the MLA test above."""
    from atom_sglang.version import cpu_fp8_kv_cache_needs_intel_amx

    if cpu_fp8_kv_cache_needs_intel_amx():
        pytest.skip("SGLang 0.5.20 and later serve an FP8 KV cache on CPU with their intel_amx attention only "
                    "(on CPUs with AMX), with or without ATOM")

    def smooth(architecture, **overrides):
        return tiny_model_dir(architecture, std=0.05, **overrides)

    prompts = [list(range(4, 44)), list(range(100, 157))]
    cells = {"fp8-proj": POWER_OF_TWO_KV_SCALES, "legacy": [(k, k) for k, _ in POWER_OF_TWO_KV_SCALES]}
    models = {layout: add_kv_cache_scales(
        write_tiny_fp8_checkpoint(smooth, "Qwen3ForCausalLM", str(tmp_path / layout), "fp8-tensor"),
        POWER_OF_TWO_KV_SCALES, layout) for layout in cells}
    engine_kwargs = {"dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3", "chunked_prefill_size": CHUNK}
    # One prompt a phase: each starts its own chunks, the first CHUNK tokens over fresh K/V.
    jobs = [([{"model": model, "phases": [[prompt] for prompt in prompts], "max_tokens": 1, "prompt_logprobs": True,
               "engine_kwargs": engine_kwargs}], {}) for model in models.values()]
    for (layout, scales), [result] in zip(cells.items(), run_sglang(*jobs)):
        assert "Use ATOM model" in result["log"] and "ATOM hands" not in result["log"]
        model = models[layout]

        def off_by(reference) -> float:
            return max(abs(a - b) for prompt, [output] in zip(prompts, result["phases"])
                       for a, b in zip(prompt_logprobs(reference(prompt), prompt), output["prompt_logprobs"]))

        with fp8_kv_cache_semantics(CHUNK, scales):
            error = off_by(atom_logits(model, torch.bfloat16))
        with fp8_kv_cache_semantics(CHUNK):
            unscaled_error = off_by(atom_logits(model, torch.bfloat16))
        sixteen_bit_error = off_by(atom_logits(model, torch.bfloat16))
        print(f"{layout}: off the scaled FP8-cache reference by {error:.2e}, off scale 1.0 by "
              f"{unscaled_error:.2e}, off a 16-bit cache by {sixteen_bit_error:.2e}")
        assert error < 0.01
        assert min(unscaled_error, sixteen_bit_error) > 0.05
