import pytest
import torch
from kernel_testing import DEVICE, backends, float_dtypes, impl, rand


def nan_cache(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def expected_cache(cache: torch.Tensor, rows: torch.Tensor, slots: list[int]) -> torch.Tensor:
    """The cache after writing ``rows[t]`` into slot ``slots[t]`` one token at a time."""
    expected = cache.clone()
    block_size = cache.shape[1]
    for token, slot in enumerate(slots):
        if slot >= 0:
            expected[slot // block_size, slot % block_size] = rows[token].to(cache.dtype)
    return expected


def assert_same_cache(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bit for bit, NaN (never written) where expected is NaN."""
    assert torch.equal(actual.isnan(), expected.isnan()), "written slots differ"
    assert torch.equal(actual.nan_to_num(0.0), expected.nan_to_num(0.0))


@backends
@float_dtypes
@pytest.mark.parametrize(
    "num_kv_heads, head_size, block_size", [(1, 64, 16), (4, 128, 1), (2, 80, 5)]
)
def test_reshape_and_cache(backend, dtype, num_kv_heads, head_size, block_size):
    num_tokens, num_blocks = 13, 7
    # k and v are views into a fused qkv output; two padding tokens carry slot -1.
    qkv = rand(num_tokens + 2, (2 + 2 * num_kv_heads) * head_size, dtype=dtype)
    k = qkv[:, 2 * head_size : (2 + num_kv_heads) * head_size].view(-1, num_kv_heads, head_size)
    v = qkv[:, (2 + num_kv_heads) * head_size :].view(-1, num_kv_heads, head_size)
    slots = torch.randperm(num_blocks * block_size)[: num_tokens + 2].tolist()
    slots[3] = slots[-1] = -1
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    key_cache = nan_cache(num_blocks, block_size, num_kv_heads, head_size, dtype=dtype)
    value_cache = nan_cache(num_blocks, block_size, num_kv_heads, head_size, dtype=dtype)
    want_k, want_v = expected_cache(key_cache, k, slots), expected_cache(value_cache, v, slots)
    impl("reshape_and_cache", backend)(k, v, key_cache, value_cache, slot_mapping)
    assert_same_cache(key_cache, want_k)
    assert_same_cache(value_cache, want_v)


@backends
def test_reshape_and_cache_into_halves_of_one_allocation(backend):
    """vLLM allocates [2, num_blocks, block_size, heads, dim] and passes kv_cache.unbind(0)."""
    kv_cache = nan_cache(2, 4, 8, 2, 32, dtype=torch.bfloat16)
    k, v = rand(5, 2, 32, dtype=torch.bfloat16), rand(5, 2, 32, dtype=torch.bfloat16)
    slots = [0, 9, 31, 17, 4]
    key_cache, value_cache = kv_cache.unbind(0)
    want_k, want_v = expected_cache(key_cache, k, slots), expected_cache(value_cache, v, slots)
    impl("reshape_and_cache", backend)(
        k, v, key_cache, value_cache, torch.tensor(slots, device=DEVICE)
    )
    assert_same_cache(kv_cache[0], want_k)
    assert_same_cache(kv_cache[1], want_v)


@backends
def test_reshape_and_cache_into_halves_of_each_token_row(backend):
    """vLLM 0.29+ lays a block out as [block_size, heads, K | V]; K and V are the halves of the last
    dimension (strided views, atom_vllm.attention.cache_layout)."""
    kv_cache = nan_cache(4, 8, 2, 2 * 32, dtype=torch.bfloat16)
    k, v = rand(5, 2, 32, dtype=torch.bfloat16), rand(5, 2, 32, dtype=torch.bfloat16)
    slots = [0, 9, 31, 17, 4]
    key_cache, value_cache = kv_cache[..., :32], kv_cache[..., 32:]
    want_k, want_v = expected_cache(key_cache, k, slots), expected_cache(value_cache, v, slots)
    impl("reshape_and_cache", backend)(
        k, v, key_cache, value_cache, torch.tensor(slots, device=DEVICE)
    )
    assert_same_cache(kv_cache[..., :32], want_k)
    assert_same_cache(kv_cache[..., 32:], want_v)


@backends
@float_dtypes
@pytest.mark.parametrize(
    "kv_lora_rank, rope_dim, block_size", [(512, 64, 16), (64, 16, 1), (96, 32, 3)]
)
def test_concat_and_cache_mla(backend, dtype, kv_lora_rank, rope_dim, block_size):
    num_tokens, num_blocks = 9, 6
    kv_c, k_pe = (
        rand(num_tokens, kv_lora_rank, dtype=dtype),
        rand(num_tokens, 1, rope_dim, dtype=dtype),
    )
    slots = torch.randperm(num_blocks * block_size)[:num_tokens].tolist()
    slots[0] = -1
    cache = nan_cache(num_blocks, block_size, kv_lora_rank + rope_dim, dtype=dtype)
    want = expected_cache(cache, torch.cat([kv_c, k_pe.squeeze(1)], dim=-1), slots)
    impl("concat_and_cache_mla", backend)(kv_c, k_pe, cache, torch.tensor(slots, device=DEVICE))
    assert_same_cache(cache, want)


FP8 = torch.float8_e4m3fn


@backends
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reshape_and_cache_fp8(backend, dtype):
    """An FP8 cache holds x / scale rounded to nearest e4m3, saturated at +-448; the scales are
    one-element fp32 tensors (vLLM's layer._k_scale / _v_scale)."""
    num_tokens, heads, head_size, block_size, num_blocks = 9, 2, 64, 4, 5
    k = rand(num_tokens, heads, head_size, dtype=dtype, scale=3.0)
    v = rand(num_tokens, heads, head_size, dtype=dtype, scale=3.0)
    k[0, 0, :4] = torch.tensor([1e4, -1e4, 0.0, 2.5], dtype=dtype)  # saturated, zero, exact
    slots = torch.randperm(num_blocks * block_size)[:num_tokens].tolist()
    slots[2] = -1
    k_scale = torch.tensor([0.5], device=DEVICE)
    v_scale = torch.tensor(2.0, device=DEVICE)
    key_cache = torch.zeros(num_blocks, block_size, heads, head_size, dtype=FP8, device=DEVICE)
    value_cache = torch.zeros_like(key_cache)
    impl("reshape_and_cache", backend)(
        k, v, key_cache, value_cache, torch.tensor(slots, device=DEVICE), k_scale=k_scale, v_scale=v_scale
    )
    zeros = torch.zeros(num_blocks, block_size, heads, head_size, device=DEVICE)
    want_k = expected_cache(zeros, (k.float() / 0.5).clamp(-448, 448), slots).to(FP8)
    want_v = expected_cache(zeros, (v.float() / 2.0).clamp(-448, 448), slots).to(FP8)
    assert torch.equal(key_cache.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), want_v.view(torch.uint8))
    first = key_cache[slots[0] // block_size, slots[0] % block_size, 0, :4].float()
    assert first.tolist() == [448.0, -448.0, 0.0, 5.0]


@backends
def test_cache_scales_go_with_fp8_caches_only(backend):
    k = rand(2, 1, 16)
    cache = torch.zeros(2, 4, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale.*FP8 caches only"):
        impl("reshape_and_cache", backend)(
            k, k, cache, cache.clone(), torch.tensor([0, 1], device=DEVICE), k_scale=torch.ones(1, device=DEVICE)
        )
    fp8_cache = cache.to(FP8)
    with pytest.raises(ValueError, match="v_scale.*one fp32 value"):
        impl("reshape_and_cache", backend)(
            k, k, fp8_cache, fp8_cache.clone(), torch.tensor([0, 1], device=DEVICE),
            v_scale=torch.ones(2, device=DEVICE),
        )


@backends
def test_concat_and_cache_mla_fp8(backend):
    kv_c, k_pe = rand(5, 32, scale=4.0), rand(5, 1, 16, scale=4.0)
    slots = [3, 0, -1, 7, 5]
    cache = torch.zeros(2, 4, 48, dtype=FP8, device=DEVICE)
    scale = torch.tensor([0.25], device=DEVICE)
    impl("concat_and_cache_mla", backend)(kv_c, k_pe, cache, torch.tensor(slots, device=DEVICE), scale=scale)
    entries = torch.cat([kv_c, k_pe.flatten(1)], dim=-1) / 0.25
    want = expected_cache(torch.zeros(2, 4, 48, device=DEVICE), entries.clamp(-448, 448), slots).to(FP8)
    assert torch.equal(cache.view(torch.uint8), want.view(torch.uint8))
