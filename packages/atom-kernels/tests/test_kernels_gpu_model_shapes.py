"""Real model dimensions and CUDA-graph capture, on the GPU only (too large for the interpreter).

The torch backend is the reference here: the CPU tests check it against independent float64
references at small shapes.
"""

import pytest
import torch
from kernel_testing import LIBRARY, assert_close, cu_seqlens, impl, paged_layout, rand

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def both(op_name, *args, **kwargs):
    return impl(op_name, "triton")(*args, **kwargs), impl(op_name, "torch")(*args, **kwargs)


@pytest.mark.parametrize("num_tokens", [1, 256, 4096])
def test_qwen3_8b_norm_rope_activation(num_tokens):
    hidden, heads, kv_heads, head_dim, inter = 4096, 32, 8, 128, 12288
    x, residual = rand(num_tokens, hidden, dtype=BF16), rand(num_tokens, hidden, dtype=BF16)
    weight = rand(hidden, dtype=BF16)
    for got, want in zip(*both("fused_add_rms_norm", x, residual, weight, 1e-6), strict=True):
        assert_close(got, want, BF16)
    from atom_kernels.rope import compute_cos_sin_cache, default_inv_freq

    cache = compute_cos_sin_cache(default_inv_freq(head_dim, 1e6), 40960).cuda()
    qkv = rand(num_tokens, (heads + 2 * kv_heads) * head_dim, dtype=BF16)
    q, k = qkv[:, : heads * head_dim], qkv[:, heads * head_dim : (heads + kv_heads) * head_dim]
    positions = torch.randint(0, 40960, (num_tokens,), device="cuda")
    for got, want in zip(*both("rotary_embedding", positions, q, k, cache, head_dim, True), strict=True):
        assert_close(got, want, BF16)
    gate_up = rand(num_tokens, 2 * inter, dtype=BF16)
    assert_close(*both("silu_and_mul", gate_up), BF16)


@pytest.mark.parametrize(
    "seq_lens, q_lens",
    [([8192] * 2, [1] * 2), ([500, 3000, 17] * 20, [1] * 60), ([2048, 700], [512, 64])],
)
@pytest.mark.parametrize("sliding_window, sinks", [(None, False), (128, True)])
def test_paged_attention_long_contexts(seq_lens, q_lens, sliding_window, sinks):
    heads, kv_heads, head_dim, block_size = 32, 8, 128, 16
    block_table, num_blocks = paged_layout(seq_lens, block_size)
    key_cache = rand(num_blocks, block_size, kv_heads, head_dim, dtype=BF16)
    value_cache = rand(num_blocks, block_size, kv_heads, head_dim, dtype=BF16)
    q = rand(sum(q_lens), heads, head_dim, dtype=BF16)
    args = (
        q,
        key_cache,
        value_cache,
        cu_seqlens(q_lens),
        torch.tensor(seq_lens, device="cuda", dtype=torch.int32),
        block_table,
        head_dim**-0.5,
        sliding_window,
        rand(heads) if sinks else None,
    )
    assert_close(*both("paged_attention", *args), BF16, "accumulated")


def test_varlen_prefill_qwen3_30b():
    lengths = [1024, 3000, 77]
    q = rand(sum(lengths), 32, 128, dtype=BF16)
    k, v = rand(sum(lengths), 4, 128, dtype=BF16), rand(sum(lengths), 4, 128, dtype=BF16)
    cu = cu_seqlens(lengths)
    assert_close(*both("varlen_attention", q, k, v, cu, cu, 128**-0.5, True, None, None), BF16, "accumulated")


@pytest.mark.parametrize("num_seqs, seq_len", [(1, 16384), (64, 2048)])
def test_mla_decode_deepseek_v2_lite(num_seqs, seq_len):
    block_table, num_blocks = paged_layout([seq_len] * num_seqs, 64)
    kv_cache = rand(num_blocks, 64, 576, dtype=BF16)
    q = rand(num_seqs, 16, 576, dtype=BF16)
    args = (
        q,
        kv_cache,
        cu_seqlens([1] * num_seqs),
        torch.full((num_seqs,), seq_len, device="cuda", dtype=torch.int32),
        block_table,
        192**-0.5,
        512,
    )
    assert_close(*both("mla_decode", *args), BF16, "accumulated")


@pytest.mark.parametrize("num_tokens", [1, 64, 2048])
def test_fused_moe_qwen3_30b(num_tokens):
    num_experts, top_k, hidden, inter = 128, 8, 2048, 768
    x = rand(num_tokens, hidden, dtype=BF16)
    w13 = rand(num_experts, 2 * inter, hidden, dtype=BF16, scale=hidden**-0.5)
    w2 = rand(num_experts, hidden, inter, dtype=BF16, scale=inter**-0.5)
    weights, ids = impl("topk_softmax", "torch")(rand(num_tokens, num_experts), top_k, True)
    assert_close(*both("fused_moe", x, w13, w2, weights, ids), BF16, "accumulated")


@pytest.mark.parametrize("m", [1, 128, 2048])
def test_fp8_gemms_deepseek_dims(m):
    n, k = 7168, 2048
    a = rand(m, k, dtype=BF16)
    a_q, a_scale = impl("per_token_quant_fp8", "triton")(a)
    b_q, b_scale = impl("per_token_quant_fp8", "triton")(rand(n, k, dtype=BF16))
    assert_close(*both("fp8_scaled_mm", a_q, b_q, a_scale, b_scale, BF16), BF16, "accumulated")
    a_q, a_scale = impl("per_group_quant_fp8", "triton")(a)
    b_scale = torch.rand(n // 128, k // 128, device="cuda") / 100
    assert_close(*both("fp8_block_scaled_mm", a_q, b_q, a_scale, b_scale, BF16), BF16, "accumulated")


@pytest.mark.skipif(not LIBRARY, reason="torch's FP8 library GEMMs need sm90 or newer")
@pytest.mark.parametrize("m", [256, 1024])
@pytest.mark.parametrize("n, k", [(2112, 7168), (576, 7168), (7168, 2304), (7168, 256)])
def test_fp8_block_library_at_deepseek_dims(m, n, k):
    """The torchlib backend at DeepSeek-V3's q_a + kv_a and kv_a widths, and at its down_proj K under
    TP 8 (2304 dense, 256 shared experts), where torch's library misread the weight scales
    (gemm._block_library_fits sends those to the Triton kernel)."""
    a_q, a_scale = impl("per_group_quant_fp8", "triton")(rand(m, k, dtype=BF16))
    b_q = impl("per_token_quant_fp8", "triton")(rand(n, k, dtype=BF16))[0]
    b_scale = torch.rand(-(-n // 128), k // 128, device="cuda") / 100
    args = (a_q, b_q, a_scale, b_scale, BF16)
    out = impl("fp8_block_scaled_mm", "torchlib")(*args)
    assert_close(out, impl("fp8_block_scaled_mm", "torch")(*args), BF16, "accumulated")


def test_decode_step_captures_in_a_cuda_graph():
    """The decode path reads nothing back to the host, so it can be captured and replayed."""
    seq_lens = [300, 1000, 45, 2048]
    block_table, num_blocks = paged_layout(seq_lens, 16)
    key_cache = rand(num_blocks, 16, 8, 128, dtype=BF16)
    value_cache = rand(num_blocks, 16, 8, 128, dtype=BF16)
    x, weight = rand(4, 2048, dtype=BF16), rand(2048, dtype=BF16)
    q = rand(4, 32, 128, dtype=BF16)
    w13, w2 = rand(16, 512, 2048, dtype=BF16, scale=0.02), rand(16, 2048, 256, dtype=BF16, scale=0.06)
    logits = rand(4, 16)
    lens = torch.tensor(seq_lens, device="cuda", dtype=torch.int32)
    cu = cu_seqlens([1] * 4)

    def step():
        h = impl("rms_norm", "triton")(x, weight, 1e-6)
        weights, ids = impl("topk_softmax", "triton")(logits, 4, True)
        moe = impl("fused_moe", "triton")(h, w13, w2, weights, ids)
        attn = impl("paged_attention", "triton")(q, key_cache, value_cache, cu, lens, block_table, 0.088)
        return moe, attn

    eager = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager, strict=True):
        assert_close(got, want, BF16, "accumulated")


@pytest.mark.parametrize("lengths", [[1, 70, 1030], [4096]])
def test_gated_delta_and_conv_qwen3_next_widths(lengths):
    """Qwen3-Next's widths (heads of 128, 8192 conv channels), where the launch settings are tuned."""
    import test_kernels_gated_delta as delta
    import test_kernels_short_conv as conv

    has_initial = [i % 2 == 0 for i in range(len(lengths))]
    initial, cu = torch.tensor(has_initial, device="cuda"), cu_seqlens(lengths)
    cases = (("gated_delta_rule", delta.gdn_inputs(lengths, 2, 4, 128, 128, BF16),
              delta.initial_state(has_initial, 4, 128, 128)),
             ("causal_conv1d", conv.conv_inputs(lengths, BF16, True, 4, 8192),
              conv.initial_state(has_initial, BF16, 4, 8192)))
    for op_name, inputs, state in cases:
        expected_state = state.clone()
        expected = impl(op_name, "torch")(*inputs, cu, expected_state, initial)
        assert_close(impl(op_name, "triton")(*inputs, cu, state, initial), expected, BF16, "accumulated")
        assert_close(state, expected_state, BF16, "accumulated")
