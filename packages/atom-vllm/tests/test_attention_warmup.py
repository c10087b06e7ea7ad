"""ATOM's MHA impl compiles its prefill and extend kernels during vLLM's batch-less warm-up runs.

vLLM's profiling and warm-up forward passes reach attention without metadata. ATOM's MHA impl uses
the first such pass to run its varlen (prefill) and paged non-decode (extend) kernels once on the
layer's own tensors, the MLA impl its prefill-form rope + cache write and expanded prefill, so that
Triton compiles them at start-up, not during the first long prompt (which vLLM's JIT monitor
reported on the H200). On this CPU machine the same calls run the torch backend.
"""

import pytest
import torch

import atom_kernels
from atom_core.layers.linear import ColumnParallelLinear
from atom_core.layers.mla import LatentAttentionSpec
from atom_core.layers.rotary import RotaryEmbedding
from atom_vllm.attention.mha import ATOMAttentionImpl
from atom_vllm.attention.mla import ATOMMLAImpl
from atom_vllm.attention.mla_fa3 import ATOM, FA3


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


@pytest.mark.parametrize("num_tokens", [1, 2])
def test_too_small_pass_skips_warmup(num_tokens):
    impl = make_impl()
    assert torch.isnan(dummy_pass(impl, num_tokens)).all()
    assert impl.prefill_kernels_compiled


@pytest.mark.parametrize("kernels, fp8_cache", [(ATOM, False), (ATOM, True), (FA3, False)])
def test_mla_first_batchless_pass_runs_the_prefill_paths_kernels(kernels, fp8_cache, monkeypatch):
    """The rope + cache write in its prefill form (expanded q_nope, into a cache of the layer's dtype)
    with either attention kernels, and the expanded attention where ATOM's kernels run it."""
    heads, nope, rope, v, rank = 4, 16, 8, 12, 32
    spec = LatentAttentionSpec(
        num_heads=heads, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v, kv_lora_rank=rank,
        scale=0.2, prefix="layer.attn", layer_id=0, kv_b_proj=ColumnParallelLinear(rank, heads * (nope + v)),
        rotary_emb=RotaryEmbedding(rope, rope, 64, {"rope_type": "default", "rope_theta": 10000.0}),
    )
    spec.kv_b_proj.weight.data.normal_()
    impl = ATOMMLAImpl(spec, kernels, fp8_cache)
    calls = []
    varlen, rope_cache = atom_kernels.varlen_attention, atom_kernels.fused_qk_rope_concat_and_cache_mla
    monkeypatch.setattr(atom_kernels, "varlen_attention",
                        lambda q, *args: calls.append(("attention", tuple(q.shape))) or varlen(q, *args))

    def record_rope_cache(q_nope, q_pe, kv_c, k_pe, kv_cache, *args, **kwargs):
        calls.append(("rope_cache", tuple(q_nope.shape), kv_cache.dtype, kwargs["kv_scale"] is not None))
        return rope_cache(q_nope, q_pe, kv_c, k_pe, kv_cache, *args, **kwargs)

    monkeypatch.setattr(atom_kernels, "fused_qk_rope_concat_and_cache_mla", record_rope_cache)

    def dummy_pass(num_tokens: int) -> torch.Tensor:
        output = torch.full((num_tokens, heads * v), float("nan"))
        return impl.forward(torch.arange(num_tokens), torch.randn(num_tokens, heads, nope + rope),
                            torch.randn(num_tokens, rank), torch.randn(num_tokens, rope), torch.empty(0), None,
                            output)

    cache_dtype = torch.float8_e4m3fn if fp8_cache else torch.float32
    expected = [("rope_cache", (16, heads, nope), cache_dtype, fp8_cache)]
    if kernels == ATOM:
        expected.append(("attention", (16, heads, nope + rope)))
    assert (dummy_pass(40) == 0).all()  # dummy passes still return zeros (data-parallel peers)
    assert calls == expected
    dummy_pass(40)
    assert calls == expected  # once per layer
