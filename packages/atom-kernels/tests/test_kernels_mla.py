import pytest
import torch
from kernel_testing import (
    DEVICE,
    assert_close,
    backends,
    cu_seqlens,
    float_dtypes,
    gather_paged,
    impl,
    paged_layout,
    rand,
    reference_attention,
)


@backends
@float_dtypes
@pytest.mark.parametrize(
    "heads, kv_lora_rank, rope_dim, block_size, q_lens, seq_lens, num_splits",
    [
        (16, 64, 16, 16, [1, 1, 1], [50, 3, 130], None),
        (16, 64, 16, 16, [1, 1, 1], [50, 3, 130], 1),
        (8, 128, 32, 1, [2, 1, 3], [20, 9, 33], None),
        (20, 512, 64, 64, [1, 1], [70, 200], None),
    ],
    ids=["decode", "decode-no-split", "multi-token", "deepseek-dims"],
)
def test_mla_decode(
    backend, dtype, heads, kv_lora_rank, rope_dim, block_size, q_lens, seq_lens, num_splits
):
    block_table, num_blocks = paged_layout(seq_lens, block_size)
    kv_cache = rand(num_blocks, block_size, kv_lora_rank + rope_dim, dtype=dtype)
    q = rand(sum(q_lens), heads, kv_lora_rank + rope_dim, dtype=dtype)
    cu_q = cu_seqlens(q_lens)
    out_buffer = torch.full(
        (q.shape[0], heads, kv_lora_rank), float("nan"), dtype=dtype, device=DEVICE
    )
    scale = (128 + rope_dim) ** -0.5
    out = impl("mla_decode", backend)(
        q,
        kv_cache,
        cu_q,
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_table,
        scale,
        kv_lora_rank,
        out=out_buffer,
        num_splits=num_splits,
    )
    assert out.data_ptr() == out_buffer.data_ptr()
    expected = []
    for i, (qs, qe) in enumerate(zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True)):
        latent = gather_paged(kv_cache, block_table[i], seq_lens[i]).unsqueeze(1)
        expected.append(
            reference_attention(
                q[qs:qe], latent, latent[..., :kv_lora_rank], scale, True, None, None
            )
        )
    assert_close(out, torch.cat(expected), dtype, "accumulated")


@backends
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("q_lens, seq_lens, num_splits", [([1, 1, 1], [50, 3, 130], None), ([2, 1], [20, 9], 1)])
def test_mla_decode_fp8_cache(backend, dtype, q_lens, seq_lens, num_splits):
    """An FP8 latent cache with one scale: attention over the dequantized entries."""
    heads, kv_lora_rank, rope_dim, block_size = 16, 64, 16, 16
    block_table, num_blocks = paged_layout(seq_lens, block_size)
    kv_scale = torch.tensor([0.03], device=DEVICE)
    kv_cache = (rand(num_blocks, block_size, kv_lora_rank + rope_dim) / 0.03).to(torch.float8_e4m3fn)
    q = rand(sum(q_lens), heads, kv_lora_rank + rope_dim, dtype=dtype)
    cu_q = cu_seqlens(q_lens)
    scale = (128 + rope_dim) ** -0.5
    out = impl("mla_decode", backend)(
        q, kv_cache, cu_q, torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE), block_table, scale,
        kv_lora_rank, num_splits=num_splits, kv_scale=kv_scale,
    )
    expected = []
    for i, (qs, qe) in enumerate(zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True)):
        latent = (gather_paged(kv_cache, block_table[i], seq_lens[i]).float() * 0.03).unsqueeze(1)
        expected.append(reference_attention(q[qs:qe], latent, latent[..., :kv_lora_rank], scale, True, None, None))
    assert_close(out, torch.cat(expected), dtype, "accumulated")
