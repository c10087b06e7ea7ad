"""fused_qk_rope_concat_and_cache_mla: q = [q_nope | rope(q_pe)], cache slot = [kv_c | rope(k_pe)]."""

import sys
import types

import pytest
import torch
from kernel_testing import DEVICE, assert_close, backends, float_dtypes, impl, rand


def rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """float64 rotation of the last dim of x [..., R] by per-pair angles (cos, sin [..., R/2])."""
    x = x.double()
    half = x.shape[-1] // 2
    if is_neox:
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], half, 2).contiguous())
    return torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2)


def make_case(num_heads, nope_dim, rank, rope_dim, block_size, dtype, slots):
    num_tokens, num_blocks, max_position = len(slots), 8, 64
    q = rand(num_tokens, num_heads, nope_dim + rope_dim, dtype=dtype)  # rope part last, as the model's q
    kv_a = rand(num_tokens, rank + rope_dim, dtype=dtype)  # kv_c and k_pe as strided views of one output
    angles = torch.rand(max_position, rope_dim // 2, dtype=torch.float64) * 6.0
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).float().to(DEVICE)
    positions = torch.randint(0, max_position, (num_tokens,), device=DEVICE)
    cache = torch.full((num_blocks, block_size, rank + rope_dim), float("nan"), dtype=dtype, device=DEVICE)
    return q, kv_a, cos_sin, positions, cache, torch.tensor(slots, device=DEVICE)


@backends
@float_dtypes
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize(
    "num_heads, nope_dim, rank, rope_dim, block_size",
    [(4, 16, 32, 8, 16), (20, 128, 512, 64, 16), (3, 512, 512, 64, 1)],
    ids=["tiny", "deepseek-prefill", "deepseek-decode-absorbed"],
)
def test_fused_qk_rope_concat_and_cache_mla(backend, dtype, is_neox, num_heads, nope_dim, rank, rope_dim, block_size):
    slots = torch.randperm(8 * block_size)[:6].tolist()
    slots[2] = -1  # padding: no cache write
    q, kv_a, cos_sin, positions, cache, slot_mapping = make_case(
        num_heads, nope_dim, rank, rope_dim, block_size, dtype, slots
    )
    q_nope, q_pe = q[..., :nope_dim], q[..., nope_dim:]
    kv_c, k_pe = kv_a[:, :rank], kv_a[:, rank:]
    want_cache = cache.clone()
    out = impl("fused_qk_rope_concat_and_cache_mla", backend)(
        q_nope, q_pe, kv_c, k_pe, cache, slot_mapping, positions, cos_sin, is_neox
    )
    angles_cos, angles_sin = cos_sin[positions].double().chunk(2, dim=-1)
    want_q = torch.cat([q_nope.double(), rotate_reference(q_pe, angles_cos[:, None], angles_sin[:, None], is_neox)], -1)
    assert out.shape == (6, num_heads, nope_dim + rope_dim)
    assert_close(out, want_q, dtype)
    want_k_pe = rotate_reference(k_pe, angles_cos, angles_sin, is_neox)
    for t, slot in enumerate(slots):
        if slot >= 0:
            want_cache[slot // block_size, slot % block_size] = torch.cat([kv_c[t].double(), want_k_pe[t]]).to(dtype)
    written = ~torch.isnan(want_cache)
    assert torch.equal(written, ~torch.isnan(cache)), "wrote a slot it should not have (or missed one)"
    assert_close(cache[written], want_cache[written], dtype)


def test_fused_qk_rope_concat_and_cache_mla_writes_into_out():
    q, kv_a, cos_sin, positions, cache, slot_mapping = make_case(4, 16, 32, 8, 4, torch.float32, [0, 5, 9])
    out = torch.empty(3, 4, 24, device=DEVICE)
    got = impl("fused_qk_rope_concat_and_cache_mla", "torch")(
        q[..., :16], q[..., 16:], kv_a[:, :32], kv_a[:, 32:], cache, slot_mapping, positions, cos_sin, False, out=out
    )
    assert got.data_ptr() == out.data_ptr()


def test_aiter_adapter_wiring(monkeypatch):
    """The AITER adapter's argument order and cos/sin split, against a stand-in implementing AITER's
    documented semantics (is_nope_first=True) with our reference. Says nothing about AITER itself."""
    reference = impl("fused_qk_rope_concat_and_cache_mla", "torch")

    def fake(q_nope, q_pe, kv_c, k_pe, kv_cache, q_out, slot_mapping, k_scale, q_scale, positions, cos_cache,
             sin_cache, is_neox, is_nope_first):
        assert is_nope_first and cos_cache.shape == sin_cache.shape == (64, q_pe.shape[-1] // 2)
        reference(q_nope, q_pe, kv_c, k_pe, kv_cache, slot_mapping, positions,
                  torch.cat([cos_cache, sin_cache], dim=-1).float(), is_neox, out=q_out)

    aiter = types.ModuleType("aiter")
    aiter.fused_qk_rope_concat_and_cache_mla = fake
    monkeypatch.setitem(sys.modules, "aiter", aiter)
    q, kv_a, cos_sin, positions, cache, slot_mapping = make_case(4, 16, 32, 8, 4, torch.float32, [0, 5, 9])
    args = (q[..., :16], q[..., 16:], kv_a[:, :32], kv_a[:, 32:])
    want_cache = cache.clone()
    want = reference(*args, want_cache, slot_mapping, positions, cos_sin, True)
    got = impl("fused_qk_rope_concat_and_cache_mla", "aiter")(*args, cache, slot_mapping, positions, cos_sin, True)
    assert_close(got, want, torch.float32)
    assert torch.equal(cache.isnan(), want_cache.isnan())
    assert_close(cache.nan_to_num(), want_cache.nan_to_num(), torch.float32)


@backends
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
def test_fused_qk_rope_concat_and_cache_mla_fp8_cache(backend, is_neox):
    """An FP8 cache gets [kv_c | rope(k_pe)] / kv_scale, rotated in fp32, rounded once to e4m3."""
    fp8, block_size, rank, rope_dim = torch.float8_e4m3fn, 4, 32, 16
    slots = [3, -1, 17, 8]
    q, kv_a, cos_sin, positions, _, slot_mapping = make_case(2, 16, rank, rope_dim, block_size, torch.bfloat16, slots)
    kv_a = kv_a * 8.0  # some entries past 448 after the scale: saturated
    kv_scale = torch.tensor([0.05], device=DEVICE)
    cache = torch.zeros(8, block_size, rank + rope_dim, dtype=fp8, device=DEVICE)
    impl("fused_qk_rope_concat_and_cache_mla", backend)(
        q[..., :16], q[..., 16:], kv_a[:, :rank], kv_a[:, rank:], cache, slot_mapping, positions, cos_sin,
        is_neox, kv_scale=kv_scale,
    )
    angles_cos, angles_sin = cos_sin[positions].double().chunk(2, dim=-1)
    k_rot = rotate_reference(kv_a[:, rank:], angles_cos, angles_sin, is_neox)
    entries = torch.cat([kv_a[:, :rank].double(), k_rot], -1)
    quantized = (entries / 0.05).clamp(-448, 448)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        got = cache[slot // block_size, slot % block_size].double()
        # fp32 rotation then one rounding to e4m3: at most half an e4m3 step (2^-4 relative) off
        torch.testing.assert_close(got, quantized[t], rtol=2**-4, atol=2**-9)
    assert (cache.view(torch.uint8) != 0).sum(dim=(1, 2)).count_nonzero() == 3


@backends
@float_dtypes
@pytest.mark.parametrize("num_tokens, num_heads, nope_dim, v_dim, rope_dim",
                         [(5, 3, 16, 8, 8), (9, 20, 128, 128, 64), (3, 128, 128, 128, 64)],
                         ids=["tiny", "v2-lite", "v3-heads"])
def test_concat_mla_k_builds_the_expanded_keys(backend, dtype, num_tokens, num_heads, nope_dim, v_dim, rope_dim):
    """k_nope is a strided view of kv_b_proj's [S, H, P + V] output, k_pe one of the latent [S, L + R]."""
    kv = rand(num_tokens, num_heads, nope_dim + v_dim, dtype=dtype)
    latent = rand(num_tokens, 32 + rope_dim, dtype=dtype)
    k_nope, k_pe = kv[..., :nope_dim], latent[:, 32:]
    k = impl("concat_mla_k", backend)(k_nope, k_pe)
    assert k.shape == (num_tokens, num_heads, nope_dim + rope_dim) and k.is_contiguous()
    assert torch.equal(k[..., :nope_dim], k_nope)
    assert torch.equal(k[..., nope_dim:], k_pe[:, None].expand(-1, num_heads, -1))
