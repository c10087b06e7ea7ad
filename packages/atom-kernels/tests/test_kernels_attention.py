import pytest
import torch
from kernel_testing import (
    DEVICE,
    ON_GPU,
    assert_close,
    backends,
    compiled_variants,
    cu_seqlens,
    float_dtypes,
    gather_paged,
    impl,
    paged_layout,
    rand,
    reference_attention,
)

VARLEN_CASES = [
    # heads, kv_heads, head_size, q_lens, k_lens, causal, window, sinks
    (4, 4, 64, [1, 17, 130], [1, 17, 130], True, None, False),
    (8, 2, 128, [5, 30], [9, 200], True, None, True),
    (6, 1, 80, [12, 3], [12, 3], False, None, False),
    (4, 2, 64, [40, 7], [40, 60], True, 16, True),
    (2, 2, 32, [65], [65], False, 20, False),
]


@backends
@float_dtypes
@pytest.mark.parametrize(
    "heads, kv_heads, head_size, q_lens, k_lens, causal, window, sinks", VARLEN_CASES
)
def test_varlen_attention(
    backend, dtype, heads, kv_heads, head_size, q_lens, k_lens, causal, window, sinks
):
    q = rand(sum(q_lens), heads, head_size, dtype=dtype)
    k, v = (
        rand(sum(k_lens), kv_heads, head_size, dtype=dtype),
        rand(sum(k_lens), kv_heads, head_size, dtype=dtype),
    )
    sink_logits = rand(heads) if sinks else None
    cu_q, cu_k = cu_seqlens(q_lens), cu_seqlens(k_lens)
    scale = head_size**-0.5
    out = impl("varlen_attention", backend)(q, k, v, cu_q, cu_k, scale, causal, window, sink_logits)
    expected = torch.cat(
        [
            reference_attention(q[qs:qe], k[ks:ke], v[ks:ke], scale, causal, window, sink_logits)
            for qs, qe, ks, ke in zip(
                cu_q[:-1].tolist(),
                cu_q[1:].tolist(),
                cu_k[:-1].tolist(),
                cu_k[1:].tolist(),
                strict=True,
            )
        ]
    )
    assert_close(out, expected, dtype, "accumulated")


PREFILL_CASES = [
    # heads, kv_heads, head_size, lengths: blocks that end mid-sequence, one-token and tile-sized ones
    (4, 4, 64, [1, 17, 130]),
    (8, 2, 128, [70, 3, 64, 1]),
    (6, 3, 64, [200]),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("heads, kv_heads, head_size, lengths", PREFILL_CASES)
def test_tma_prefill_attention(dtype, heads, kv_heads, head_size, lengths):
    """The TMA prefill kernel (the triton backend's choice for causal self-attention of fresh
    sequences on sm_90+ and under the interpreter), on q/k/v views of one fused qkv as vLLM passes."""
    from atom_kernels import prefill_attention

    qkv = rand(sum(lengths), heads + 2 * kv_heads, head_size, dtype=dtype)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    cu = cu_seqlens(lengths)
    scale = head_size**-0.5
    if not prefill_attention.supports(q, k, v, cu, cu, True, None, None):
        pytest.skip("no TMA on this device")
    out = impl("varlen_attention", "triton")(q, k, v, cu, cu, scale, True, None, None)
    starts = cu.tolist()
    expected = torch.cat([
        reference_attention(q[s:e], k[s:e], v[s:e], scale, True, None, None)
        for s, e in zip(starts[:-1], starts[1:], strict=True)
    ])
    assert_close(out, expected, dtype, "accumulated")


def test_tma_prefill_attention_takes_only_its_cases():
    from atom_kernels import prefill_attention

    q = rand(8, 4, 64, dtype=torch.bfloat16)
    k = v = rand(8, 2, 64, dtype=torch.bfloat16)
    cu = cu_seqlens([8])
    supported = prefill_attention.supports(q, k, v, cu, cu, True, None, None)
    assert supported == (not ON_GPU or torch.cuda.get_device_capability()[0] >= 9)
    assert not prefill_attention.supports(q, k, v, cu, cu_seqlens([8]), True, None, None)
    assert not prefill_attention.supports(q, k, v, cu, cu, False, None, None)
    assert not prefill_attention.supports(q, k, v, cu, cu, True, 4, None)
    assert not prefill_attention.supports(q, k, v, cu, cu, True, None, rand(4))
    assert not prefill_attention.supports(q.float(), k.float(), v.float(), cu, cu, True, None, None)
    q80 = rand(8, 4, 80, dtype=torch.bfloat16)
    k80 = rand(8, 2, 80, dtype=torch.bfloat16)
    assert not prefill_attention.supports(q80, k80, k80, cu, cu, True, None, None)


PAGED_CASES = [
    # heads, kv_heads, head_size, block_size, q_lens, seq_lens, window, sinks, num_splits
    (8, 2, 64, 16, [1, 1, 1], [100, 7, 300], None, False, None),
    (8, 2, 64, 16, [1, 1, 1], [100, 7, 300], None, True, 1),
    (4, 4, 128, 32, [1, 1], [33, 64], 20, True, 3),
    (4, 1, 96, 5, [20, 1, 7], [100, 7, 300], None, False, None),
    (16, 2, 64, 1, [3, 2], [40, 3], 9, False, None),
    (2, 2, 256, 16, [1, 1], [50, 129], None, True, None),
    (4, 2, 64, 8, [1, 1], [700, 90], None, True, 37),  # more splits than one merge chunk
]


@backends
@float_dtypes
@pytest.mark.parametrize(
    "heads, kv_heads, head_size, block_size, q_lens, seq_lens, window, sinks, num_splits",
    PAGED_CASES,
)
def test_paged_attention(
    backend,
    dtype,
    heads,
    kv_heads,
    head_size,
    block_size,
    q_lens,
    seq_lens,
    window,
    sinks,
    num_splits,
):
    block_table, num_blocks = paged_layout(seq_lens, block_size)
    key_cache = rand(num_blocks, block_size, kv_heads, head_size, dtype=dtype)
    value_cache = rand(num_blocks, block_size, kv_heads, head_size, dtype=dtype)
    q = rand(sum(q_lens), heads, head_size, dtype=dtype)
    sink_logits = rand(heads) if sinks else None
    cu_q = cu_seqlens(q_lens)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    out_buffer = torch.full_like(q, float("nan"))
    scale = head_size**-0.5
    out = impl("paged_attention", backend)(
        q,
        key_cache,
        value_cache,
        cu_q,
        seq_lens_t,
        block_table,
        scale,
        window,
        sink_logits,
        out=out_buffer,
        num_splits=num_splits,
    )
    assert out.data_ptr() == out_buffer.data_ptr()
    expected = []
    for i, (qs, qe) in enumerate(zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True)):
        k = gather_paged(key_cache, block_table[i], seq_lens[i])
        v = gather_paged(value_cache, block_table[i], seq_lens[i])
        expected.append(reference_attention(q[qs:qe], k, v, scale, True, window, sink_logits))
    assert_close(out, torch.cat(expected), dtype, "accumulated")


@backends
@pytest.mark.parametrize("num_splits", [None, 3])
def test_paged_attention_over_halves_of_each_token_row(backend, num_splits):
    """The same attention over a cache laid out as vLLM 0.29+ lays it out ([blocks, block_size,
    heads, K | V]: K and V strided views) as over separate K and V caches."""
    heads, kv_heads, head_size, block_size, q_lens, seq_lens = 8, 2, 64, 16, [1, 4], [70, 33]
    block_table, num_blocks = paged_layout(seq_lens, block_size)
    kv_cache = rand(num_blocks, block_size, kv_heads, 2 * head_size, dtype=torch.bfloat16)
    key_view, value_view = kv_cache[..., :head_size], kv_cache[..., head_size:]
    q = rand(sum(q_lens), heads, head_size, dtype=torch.bfloat16)
    args = (cu_seqlens(q_lens), torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE), block_table,
            head_size**-0.5)
    attention = impl("paged_attention", backend)
    out = attention(q, key_view, value_view, *args, num_splits=num_splits)
    expected = attention(q, key_view.contiguous(), value_view.contiguous(), *args, num_splits=num_splits)
    assert torch.equal(out, expected)


@backends
def test_paged_attention_max_seq_len_hint(backend):
    """The split-K hint changes the work split, not the result."""
    seq_lens = [300, 5]
    block_table, num_blocks = paged_layout(seq_lens, 16)
    key_cache, value_cache = rand(num_blocks, 16, 2, 64), rand(num_blocks, 16, 2, 64)
    q = rand(2, 4, 64)
    args = (
        q,
        key_cache,
        value_cache,
        cu_seqlens([1, 1]),
        torch.tensor(seq_lens, device=DEVICE),
        block_table,
        0.125,
    )
    fn = impl("paged_attention", backend)
    assert_close(fn(*args, max_seq_len=300), fn(*args, num_splits=1), torch.float32, "accumulated")


@pytest.mark.gpu
def test_metadata_slices_at_any_offset_reuse_one_compiled_kernel():
    """seq_lens[first:] is 16-byte aligned only when first % 4 == 0; Triton would specialize on that
    and compile another variant mid-serving. The metadata pointers are exempt, so it must not."""
    from atom_kernels import attention

    heads, kv_heads, dim, block = 8, 2, 64, 16
    q_lens, seq_lens = [3, 5, 2, 7, 4, 6], [20, 30, 9, 40, 17, 25]
    table, num_blocks = paged_layout(seq_lens, block)
    key_cache = rand(num_blocks, block, kv_heads, dim, dtype=torch.bfloat16)
    value_cache = rand(num_blocks, block, kv_heads, dim, dtype=torch.bfloat16)
    query_start = cu_seqlens(q_lens)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    q = rand(sum(q_lens), heads, dim, dtype=torch.bfloat16)

    def extend_from(first: int) -> None:
        start = int(query_start[first])
        impl("paged_attention", "triton")(
            q[start:], key_cache, value_cache, query_start[first:] - start, lens[first:],
            table[first:], dim**-0.5,
        )

    def variants() -> int:
        return compiled_variants(attention._attention_kernel)

    extend_from(0)
    compiled = variants()
    extend_from(1)
    extend_from(2)
    assert variants() == compiled


@pytest.mark.gpu
def test_tma_prefill_reuses_one_compiled_kernel_across_batches():
    """Token counts, sequence counts and the offset of q/k/v inside the qkv buffer change per batch;
    none of them may compile another variant of the prefill kernel mid-serving."""
    from atom_kernels import prefill_attention

    heads, kv_heads, dim = 8, 2, 128
    qkv = rand(2048, heads + 2 * kv_heads, dim, dtype=torch.bfloat16)

    def prefill(first: int, lengths: list[int]) -> None:
        rows = qkv[first : first + sum(lengths)]
        q, k, v = rows.split([heads, kv_heads, kv_heads], dim=1)
        cu = cu_seqlens(lengths)
        assert prefill_attention.supports(q, k, v, cu, cu, True, None, None)
        impl("varlen_attention", "triton")(q, k, v, cu, cu, dim**-0.5, True, None, None)

    def variants() -> int:
        return compiled_variants(prefill_attention._prefill_attention_kernel)

    prefill(0, [16])
    compiled = variants()
    for first, lengths in [(0, [1024]), (3, [1000, 17]), (5, [1]), (0, [300, 301, 302])]:
        prefill(first, lengths)
    assert variants() == compiled


@backends
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("q_lens, seq_lens, num_splits", [([1, 1, 1], [100, 7, 300], None),
                                                          ([1, 1], [70, 33], 3),
                                                          ([5, 1], [40, 9], None)])
def test_paged_attention_fp8_cache(backend, dtype, q_lens, seq_lens, num_splits):
    """FP8 caches with scales: the same as attention over the dequantized cache (x_fp8 * scale)."""
    heads, kv_heads, head_size, block_size = 8, 2, 64, 16
    block_table, num_blocks = paged_layout(seq_lens, block_size)
    k_scale = torch.tensor([0.05], device=DEVICE)
    v_scale = torch.tensor([0.02], device=DEVICE)
    fp8 = torch.float8_e4m3fn
    key_cache = (rand(num_blocks, block_size, kv_heads, head_size, scale=2.0) / 0.05).to(fp8)
    value_cache = (rand(num_blocks, block_size, kv_heads, head_size) / 0.02).to(fp8)
    q = rand(sum(q_lens), heads, head_size, dtype=dtype)
    cu_q = cu_seqlens(q_lens)
    scale = head_size**-0.5
    out = impl("paged_attention", backend)(
        q, key_cache, value_cache, cu_q, torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_table, scale, None, None, num_splits=num_splits, k_scale=k_scale, v_scale=v_scale,
    )
    expected = []
    for i, (qs, qe) in enumerate(zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True)):
        k = gather_paged(key_cache, block_table[i], seq_lens[i]).float() * 0.05
        v = gather_paged(value_cache, block_table[i], seq_lens[i]).float() * 0.02
        expected.append(reference_attention(q[qs:qe], k, v, scale, True, None, None))
    assert_close(out, torch.cat(expected), dtype, "accumulated")
