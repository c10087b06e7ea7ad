"""The host-agnostic start-up warm-up (atom_core.hosting.warmup) that both host glues call.

The attention part runs in the glues' own tests (atom-vllm: test_attention_warmup.py on vLLM's
scratch cache; atom-sglang: test_sglang_attention_backend.py over SGLang's pool). Here: the fused
QKV layout the SGLang glue warms up on, the routing and fused MoE warm-up of a model's expert
layers, which must compile exactly the variants the layers' forward passes launch, and the Gated
DeltaNet prefill warm-up, which must launch on states laid out as the host's cache rows without
writing the cache.
"""

import pytest
import torch
from torch import nn

import atom_kernels
from atom_core.hosting.warmup import (
    WARM_UP_TOKENS,
    fused_qkv,
    run_gated_delta_prefill_kernels,
    run_prefill_attention_kernels,
    warm_up_moe_layers,
)
from atom_core.layers.gated_delta_core import GatedDeltaCoreSpec
from atom_core.layers.moe import MoeSpec, SparseMoeBlock
from atom_core.layers.short_conv import ShortConvolution


def test_fused_qkv_is_laid_out_as_a_qkv_projection():
    q, k, v = fused_qkv(8, 2, 64, torch.bfloat16, torch.device("cpu"))
    assert (q.shape, k.shape, v.shape) == ((16, 8, 64), (16, 2, 64), (16, 2, 64))
    assert q.stride() == k.stride() == v.stride() == ((8 + 2 + 2) * 64, 64, 1)
    assert k.data_ptr() - q.data_ptr() == 8 * 64 * 2 and v.data_ptr() - k.data_ptr() == 2 * 64 * 2


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_extend_request_covers_its_pages_at_any_block_size(block_size):
    q, k, v = fused_qkv(4, 2, 32, torch.float32, torch.device("cpu"))
    q.normal_(), k.normal_(), v.normal_()
    caches = torch.randn(2, 3, block_size, 2, 32)
    out = torch.full((WARM_UP_TOKENS, 4, 32), float("nan"))
    assert run_prefill_attention_kernels(q, k, v, caches[0], caches[1], 0.2, out=out)
    assert torch.isfinite(out).all()  # the last kernel run (paged extend) wrote every row


@pytest.mark.parametrize("routing", ["topk_softmax", "grouped_topk"])
def test_moe_warm_up_compiles_what_each_expert_layer_runs(monkeypatch, routing):
    grouped = {"scoring": "sigmoid", "num_expert_group": 2, "topk_group": 1, "correction_bias": True}
    spec = MoeSpec(num_experts=4, top_k=2, intermediate_size=32, renormalize=True,
                   **(grouped if routing == "grouped_topk" else {}))
    model = nn.ModuleList([nn.Linear(64, 64)] + [SparseMoeBlock.from_spec(spec, 64, f"layers.{i}.mlp")
                                                 for i in range(2)])
    for block in model[1:]:
        block.gate.weight.data = torch.randn(4, 64, dtype=torch.bfloat16)
        if block.gate.e_score_correction_bias is not None:
            block.gate.e_score_correction_bias.data.zero_()
    calls, forwards, routed = [], [], []
    original_routing = getattr(atom_kernels, routing)
    monkeypatch.setattr(atom_kernels, routing,
                        lambda logits, *args: routed.append(logits.shape) or original_routing(logits, *args))
    monkeypatch.setattr(atom_kernels, "warm_up_fused_moe", lambda *args, **kwargs: calls.append((args, kwargs)))
    assert warm_up_moe_layers(model, torch.bfloat16) == 2
    # Each router at every launch config of the routing kernels, as serving would route.
    assert routed == [(n, 4) for _ in range(2) for n in atom_kernels.ROUTING_WARM_UP_TOKENS]
    assert len(set(atom_kernels.ROUTING_WARM_UP_TOKENS)) > 1
    monkeypatch.setattr(atom_kernels, "fused_moe", lambda *args, **kwargs: forwards.append(kwargs) or args[0])
    for block, ((w13, w2, top_k), options) in zip(model[1:], calls, strict=True):
        assert w13 is block.experts.w13_weight and w2 is block.experts.w2_weight and top_k == spec.top_k
        block.experts(torch.zeros(1, 64), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.int32))
        assert options == {**forwards[-1], "x_dtype": torch.bfloat16}


def test_gated_delta_warm_up_runs_on_rows_laid_out_as_the_cache(monkeypatch):
    hk, hv, k, v = 2, 4, 16, 8
    spec = GatedDeltaCoreSpec(hk, hv, k, v, ShortConvolution((hk * k, hk * k, hv * v), 4), "layers.0.core", 0)
    conv_shape, state_shape = spec.state_shapes()
    # vLLM's pages hold both states and a padding tail: rows lie further apart than one state.
    pages = torch.randn(3, 2000)
    conv_size, state_size = conv_shape[0] * conv_shape[1], hv * k * v
    conv_cache = pages[:, :conv_size].unflatten(1, conv_shape)
    state_cache = pages[:, conv_size + 8:conv_size + 8 + state_size].unflatten(1, state_shape)
    before = pages.clone()
    calls = []
    original_rule, original_conv = atom_kernels.gated_delta_rule, atom_kernels.causal_conv1d
    monkeypatch.setattr(atom_kernels, "gated_delta_rule", lambda *a, **kw: calls.append(("rule", a))
                        or original_rule(*a, **kw))
    monkeypatch.setattr(atom_kernels, "causal_conv1d", lambda *a, **kw: calls.append(("conv", a))
                        or original_conv(*a, **kw))
    mixed_qkv = torch.randn(40, conv_shape[0])
    g, beta = -torch.rand(40, hv), torch.rand(40, hv)
    assert run_gated_delta_prefill_kernels(spec, mixed_qkv, g, beta, conv_cache, state_cache)
    assert torch.equal(pages, before)
    conv_call, rule_call = calls
    assert conv_call[0] == "conv" and rule_call[0] == "rule"
    assert conv_call[1][0].shape[0] == WARM_UP_TOKENS
    assert conv_call[1][4].stride() == conv_cache.stride() and rule_call[1][6].stride() == state_cache.stride()
    assert not run_gated_delta_prefill_kernels(spec, mixed_qkv[:0], g[:0], beta[:0], conv_cache, state_cache)
