"""The host-agnostic start-up warm-up (atom_core.hosting.warmup) that both host glues call.

The attention part runs in the glues' own tests (atom-vllm: test_attention_warmup.py on vLLM's
scratch cache; atom-sglang: test_sglang_attention_backend.py over SGLang's pool). Here: the fused
QKV layout the SGLang glue warms up on, and the fused MoE warm-up of a model's expert layers, which
must compile exactly the variants the layers' forward passes launch.
"""

import pytest
import torch
from torch import nn

import atom_kernels
from atom_core.hosting.warmup import WARM_UP_TOKENS, fused_qkv, run_prefill_attention_kernels, warm_up_fused_moe_layers
from atom_core.layers.moe import MoeSpec, SparseMoeBlock


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


def test_moe_warm_up_compiles_what_each_expert_layer_runs(monkeypatch):
    spec = MoeSpec(num_experts=4, top_k=2, intermediate_size=32, renormalize=True)
    model = nn.ModuleList([nn.Linear(64, 64)] + [SparseMoeBlock.from_spec(spec, 64, f"layers.{i}.mlp")
                                                 for i in range(2)])
    calls, forwards = [], []
    monkeypatch.setattr(atom_kernels, "warm_up_fused_moe", lambda *args, **kwargs: calls.append((args, kwargs)))
    assert warm_up_fused_moe_layers(model, torch.bfloat16) == 2
    monkeypatch.setattr(atom_kernels, "fused_moe", lambda *args, **kwargs: forwards.append(kwargs) or args[0])
    for block, ((w13, w2, top_k), options) in zip(model[1:], calls, strict=True):
        assert w13 is block.experts.w13_weight and w2 is block.experts.w2_weight and top_k == spec.top_k
        block.experts(torch.zeros(1, 64), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.int32))
        assert options == {**forwards[-1], "x_dtype": torch.bfloat16}
