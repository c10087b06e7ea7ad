import math

import pytest
import torch
from kernel_testing import DEVICE, assert_close, backends, float_dtypes, impl, rand

from atom_kernels.rope import (
    compute_cos_sin_cache,
    deepseek_yarn_mscale,
    default_inv_freq,
    yarn_inv_freq,
    yarn_mscale,
)


def reference_rope(x, positions, inv_freq, head_size, rotary_dim, is_neox):
    """Rotate each pair (i, i + rotary_dim/2) (neox) or (2i, 2i + 1) (gptj) by position * inv_freq[i]."""
    heads = x.double().reshape(x.shape[0], -1, head_size).clone()
    angle = positions.double()[:, None, None] * inv_freq.double().to(x.device)[None, None, :]
    half = rotary_dim // 2
    pairs = torch.arange(half, device=x.device)
    first, second = (pairs, pairs + half) if is_neox else (2 * pairs, 2 * pairs + 1)
    a, b = heads[..., first], heads[..., second]
    heads[..., first] = a * torch.cos(angle) - b * torch.sin(angle)
    heads[..., second] = b * torch.cos(angle) + a * torch.sin(angle)
    return heads.reshape(x.shape)


def reference_head_rms_norm(x, weight, head_size, eps):
    heads = x.double().reshape(x.shape[0], -1, head_size)
    rms = torch.sqrt(heads.pow(2).mean(-1, keepdim=True) + eps)
    return (heads / rms * weight.double()).reshape(x.shape)


def rope_inputs(num_tokens, rotary_dim, max_position=4096):
    """inv_freq, its cos/sin cache and random positions."""
    inv_freq = default_inv_freq(rotary_dim, 10000.0)
    cache = compute_cos_sin_cache(inv_freq, max_position).to(DEVICE)
    positions = torch.randint(0, max_position, (num_tokens,), device=DEVICE)
    return inv_freq, cache, positions


def qk_views(num_tokens, heads, kv_heads, head_size, dtype, scale=1.0):
    """q [T, H * D] and k [T, KH, D] as views into one fused qkv row, as attention layers make them."""
    qkv = rand(num_tokens, (heads + 2 * kv_heads) * head_size, dtype=dtype, scale=scale)
    q = qkv[:, : heads * head_size]
    k = qkv[:, heads * head_size : (heads + kv_heads) * head_size].view(
        num_tokens, kv_heads, head_size
    )
    return q, k


neox_or_gptj = pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
rope_shapes = pytest.mark.parametrize(
    "heads, kv_heads, head_size, rotary_dim",
    [(4, 2, 64, 64), (3, 1, 128, 64), (2, 2, 80, 32)],
    ids=["full", "partial-half", "partial-odd-head"],
)


@backends
@float_dtypes
@neox_or_gptj
@rope_shapes
def test_rotary_embedding(backend, dtype, is_neox, heads, kv_heads, head_size, rotary_dim):
    num_tokens = 11
    inv_freq, cache, positions = rope_inputs(num_tokens, rotary_dim)
    q, k = qk_views(num_tokens, heads, kv_heads, head_size, dtype)
    q_before, k_before = q.clone(), k.clone()
    q_out, k_out = impl("rotary_embedding", backend)(positions, q, k, cache, head_size, is_neox)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert torch.equal(q, q_before) and torch.equal(k, k_before), "inputs must not be modified"
    assert_close(
        q_out, reference_rope(q, positions, inv_freq, head_size, rotary_dim, is_neox), dtype
    )
    assert_close(
        k_out, reference_rope(k, positions, inv_freq, head_size, rotary_dim, is_neox), dtype
    )


@backends
@float_dtypes
@neox_or_gptj
@rope_shapes
@pytest.mark.parametrize("num_tokens", [1, 7])
def test_qk_norm_rope(backend, dtype, is_neox, heads, kv_heads, head_size, rotary_dim, num_tokens):
    eps = 1e-6
    inv_freq, cache, positions = rope_inputs(num_tokens, rotary_dim)
    q, k = qk_views(num_tokens, heads, kv_heads, head_size, dtype, scale=3.0)
    q_weight, k_weight = rand(head_size, dtype=dtype), rand(head_size, dtype=dtype)
    q_before, k_before = q.clone(), k.clone()
    q_out, k_out = impl("qk_norm_rope", backend)(
        positions, q, k, q_weight, k_weight, eps, cache, head_size, is_neox
    )
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == dtype
    assert torch.equal(q, q_before) and torch.equal(k, k_before), "inputs must not be modified"
    for out, x, weight in ((q_out, q, q_weight), (k_out, k, k_weight)):
        normed = reference_head_rms_norm(x, weight, head_size, eps)
        expected = reference_rope(normed, positions, inv_freq, head_size, rotary_dim, is_neox)
        # Two roundings, as in the unfused path: the normalised head, then the rotated one.
        assert_close(out, expected, dtype, "accumulated")


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_qk_norm_rope_reference_is_rms_norm_then_rotary_embedding(is_neox):
    num_tokens, heads, kv_heads, head_size, rotary_dim, eps = 5, 4, 2, 80, 32, 1e-5
    _, cache, positions = rope_inputs(num_tokens, rotary_dim)
    q, k = qk_views(num_tokens, heads, kv_heads, head_size, torch.bfloat16, scale=3.0)
    q_weight, k_weight = rand(head_size, dtype=torch.bfloat16), rand(head_size, dtype=torch.bfloat16)
    q_normed = impl("rms_norm", "torch")(q.view(num_tokens, heads, head_size), q_weight, eps)
    k_normed = impl("rms_norm", "torch")(k, k_weight, eps)
    expected = impl("rotary_embedding", "torch")(
        positions, q_normed.view(q.shape), k_normed, cache, head_size, is_neox
    )
    got = impl("qk_norm_rope", "torch")(
        positions, q, k, q_weight, k_weight, eps, cache, head_size, is_neox
    )
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


def test_qk_norm_rope_rejects_wrong_weight():
    _, cache, positions = rope_inputs(2, 64)
    q, k = qk_views(2, 2, 1, 64, torch.float32)
    with pytest.raises(ValueError, match="k_weight shape"):
        impl("qk_norm_rope", "triton")(positions, q, k, rand(64), rand(32), 1e-6, cache, 64, True)


def test_default_cache_matches_definition():
    inv_freq = default_inv_freq(64, 1e6)
    cache = compute_cos_sin_cache(inv_freq, 100, mscale=0.5)
    angle = torch.arange(100, dtype=torch.float64)[:, None] * (
        1e6 ** (-torch.arange(0, 64, 2) / 64.0)
    )
    torch.testing.assert_close(
        cache.double(), torch.cat([angle.cos(), angle.sin()], -1) * 0.5, rtol=0, atol=1e-6
    )


@pytest.fixture
def vllm_rope():
    """vLLM's rotary embedding classes, built inside a default vLLM config as its CustomOps require."""
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import deepseek_scaling_rope, yarn_scaling_rope

    with set_current_vllm_config(VllmConfig()):
        yield (
            yarn_scaling_rope.YaRNScalingRotaryEmbedding,
            deepseek_scaling_rope.DeepseekScalingRotaryEmbedding,
        )


YARN_CASES = [
    # rotary_dim, base, factor, original_max_position, beta_fast, beta_slow
    (128, 1e6, 4.0, 32768, 32, 1),  # Qwen3 long context
    (64, 10000.0, 40.0, 4096, 32, 1),  # DeepSeek-V2-Lite's rope dims
    (64, 150000.0, 32.0, 4096, 32, 1),  # GPT-OSS
]


@pytest.mark.parametrize("rotary_dim, base, factor, original, beta_fast, beta_slow", YARN_CASES)
def test_yarn_cache_matches_vllm(
    vllm_rope, rotary_dim, base, factor, original, beta_fast, beta_slow
):
    vllm_yarn = vllm_rope[0](
        rotary_dim,
        rotary_dim,
        original,
        base,
        True,
        factor,
        torch.float32,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
    )
    inv_freq = yarn_inv_freq(rotary_dim, base, factor, original, beta_fast, beta_slow)
    torch.testing.assert_close(
        inv_freq.float(), vllm_yarn._compute_inv_freq(factor), rtol=1e-6, atol=0
    )
    assert yarn_mscale(factor) == pytest.approx(vllm_yarn.mscale, rel=1e-12)
    # vLLM computes the angles in fp32; compare the first 2048 positions, where fp32 angles are exact
    # enough, against our float64 cache.
    ours = compute_cos_sin_cache(inv_freq, 2048, yarn_mscale(factor))
    torch.testing.assert_close(ours, vllm_yarn.cos_sin_cache[:2048].float(), rtol=0, atol=5e-4)


@pytest.mark.parametrize(
    "factor, mscale, mscale_all_dim", [(40.0, 0.707, 0.707), (40.0, 1.0, 0.0), (4.0, 1.0, 1.0)]
)
def test_deepseek_yarn_matches_vllm_and_hf(vllm_rope, factor, mscale, mscale_all_dim):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rotary_dim, base, original = 64, 10000.0, 4096
    vllm_deepseek = vllm_rope[1](
        rotary_dim,
        rotary_dim,
        original,
        base,
        False,
        factor,
        torch.float32,
        mscale=mscale,
        mscale_all_dim=mscale_all_dim,
    )
    ours = deepseek_yarn_mscale(factor, mscale, mscale_all_dim)
    assert ours == pytest.approx(vllm_deepseek.mscale, rel=1e-12)
    inv_freq = yarn_inv_freq(rotary_dim, base, factor, original)
    torch.testing.assert_close(
        inv_freq.float(), vllm_deepseek._compute_inv_freq(factor), rtol=1e-6, atol=0
    )

    config = transformers.DeepseekV3Config(
        qk_rope_head_dim=rotary_dim,
        max_position_embeddings=int(original * factor),
        rope_theta=base,
        rope_scaling={
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original,
            "mscale": mscale,
            "mscale_all_dim": mscale_all_dim,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    )
    hf_inv_freq, hf_attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    torch.testing.assert_close(inv_freq.float(), hf_inv_freq.float(), rtol=1e-6, atol=0)
    if mscale and mscale_all_dim:
        assert ours == pytest.approx(hf_attention_factor, rel=1e-12)


def test_yarn_mscale_formula():
    assert yarn_mscale(1.0) == 1.0
    assert yarn_mscale(4.0) == pytest.approx(0.1 * math.log(4.0) + 1.0)
