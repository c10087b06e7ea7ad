"""ATOM's MHA impl compiles its prefill and extend kernels during vLLM's batch-less warm-up runs.

vLLM's profiling and warm-up forward passes reach attention without metadata. ATOM's impl uses the
first such pass to run its varlen (prefill) and paged non-decode (extend) kernels once on the layer's
own tensors, so that Triton compiles them at start-up, not during the first long prompt (which
vLLM's JIT monitor reported on the H200). On this CPU machine the same calls run the torch backend.
"""

import torch

from atom_vllm.attention.mha import ATOMAttentionImpl


def make_impl(sliding_window=None, sinks=None) -> ATOMAttentionImpl:
    return ATOMAttentionImpl(num_heads=4, head_size=32, scale=32**-0.5, num_kv_heads=2, alibi_slopes=None,
                             sliding_window=sliding_window, kv_cache_dtype="auto", sinks=sinks)


def dummy_pass(impl: ATOMAttentionImpl, num_tokens: int) -> torch.Tensor:
    qkv = torch.randn(num_tokens, 8, 32)  # one fused q|k|v buffer, as the model hands it over
    query, key, value = qkv.split([4, 2, 2], dim=1)
    output = torch.full((num_tokens, 4, 32), float("nan"))
    impl.forward(None, query, key, value, torch.empty(0), None, output)
    return output


def test_first_batchless_pass_runs_prefill_and_extend_kernels():
    impl = make_impl()
    output = dummy_pass(impl, 40)
    assert impl.prefill_kernels_compiled
    # The kernels wrote the first 16 rows (the warm-up's batch); the rest stays untouched.
    assert torch.isfinite(output[:16]).all()
    assert torch.isnan(output[16:]).all()


def test_later_passes_and_sliding_window_with_sinks():
    impl = make_impl(sliding_window=4, sinks=torch.zeros(4))
    assert torch.isfinite(dummy_pass(impl, 16)).all()
    assert torch.isnan(dummy_pass(impl, 16)).all()  # compiled once per layer: later passes skip it


def test_single_token_pass_skips_warmup():
    impl = make_impl()
    assert torch.isnan(dummy_pass(impl, 1)).all()
    assert impl.prefill_kernels_compiled
