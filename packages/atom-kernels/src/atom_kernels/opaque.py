"""Ops that models call inside torch.compile'd code, as opaque ``torch.ops.atom.*`` custom ops.

Dynamo cannot trace through data-dependent reference kernels (MoE loops over experts) and must not
re-trace our Triton launchers on every compile; as custom ops with fake (shape-only) impls they are
single graph nodes that run the selected backend at run time. Attention and KV-cache ops are not
listed: they run inside ATOM's attention op, which is opaque already.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from atom_kernels.registry import OPS

_library = torch.library.Library("atom", "FRAGMENT")


def _same_as_first(x, *args, **kwargs):
    return torch.empty_like(x)


def _gated(x, *args, **kwargs):
    return x.new_empty(*x.shape[:-1], x.shape[-1] // 2)


def _pair_like(a, b, *args, **kwargs):
    return torch.empty_like(a), torch.empty_like(b)


def _rope(positions, q, k, *args, **kwargs):
    return torch.empty_like(q), torch.empty_like(k)


def _routing(router_logits, top_k, *args, **kwargs):
    shape = (router_logits.shape[0], top_k)
    return (router_logits.new_empty(shape, dtype=torch.float32),
            router_logits.new_empty(shape, dtype=torch.int32))


# op name -> (schema after the name, fake impl)
SCHEMAS: dict[str, tuple[str, Callable]] = {
    "rms_norm": ("(Tensor x, Tensor weight, float eps) -> Tensor", _same_as_first),
    "fused_add_rms_norm": (
        "(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)", _pair_like),
    "rotary_embedding": (
        "(Tensor positions, Tensor q, Tensor k, Tensor cos_sin_cache, int head_size, bool is_neox)"
        " -> (Tensor, Tensor)", _rope),
    "qk_norm_rope": (
        "(Tensor positions, Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps,"
        " Tensor cos_sin_cache, int head_size, bool is_neox) -> (Tensor, Tensor)", _rope),
    "silu_and_mul": ("(Tensor x) -> Tensor", _gated),
    "gelu_and_mul": ("(Tensor x, str approximate='none') -> Tensor", _gated),
    "clamped_swiglu": (
        "(Tensor x, float alpha=1.702, float limit=7.0, bool interleaved=True) -> Tensor", _gated),
    "topk_softmax": ("(Tensor router_logits, int top_k, bool renormalize) -> (Tensor, Tensor)",
                     _routing),
    "grouped_topk": (
        "(Tensor router_logits, int top_k, int num_expert_group, int topk_group, bool renormalize,"
        " str scoring_func='sigmoid', Tensor? e_score_correction_bias=None,"
        " float routed_scaling_factor=1.0) -> (Tensor, Tensor)", _routing),
    "fused_moe": (
        "(Tensor x, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, *,"
        " str activation='silu', bool interleaved=False, Tensor? w13_bias=None,"
        " Tensor? w2_bias=None, float swiglu_alpha=1.702, float swiglu_limit=7.0) -> Tensor",
        _same_as_first),
}


def _register(name: str, schema: str, fake: Callable) -> None:
    op = OPS[name]
    _library.define(name + schema)

    def run(*args, **kwargs):
        return op.dispatch(*args, **kwargs)

    _library.impl(name, run, "CompositeExplicitAutograd")
    torch.library.register_fake(f"atom::{name}", fake, lib=_library)
    op.custom_op = getattr(torch.ops.atom, name)


for _name, (_schema, _fake) in SCHEMAS.items():
    if _name in OPS:
        _register(_name, _schema, _fake)
