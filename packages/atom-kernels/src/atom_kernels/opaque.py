"""Ops that models call inside torch.compile'd code, as opaque ``torch.ops.atom.*`` custom ops.

Dynamo cannot trace through data-dependent reference kernels (MoE loops over experts) and must not
re-trace our Triton launchers on every compile; as custom ops with fake (shape-only) impls they are
single graph nodes that run the selected backend at run time. Attention and KV-cache ops are not
listed: they run inside ATOM's attention op, which is opaque already.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from atom_kernels import mxfp4_gemm  # noqa: F401  (defines mxfp4_linear; the aiter adapters import the other op modules)
from atom_kernels.quant import new_scales
from atom_kernels.registry import OPS, set_inductor_ops

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


def _quantized(x, *args, dtype=torch.float8_e4m3fn, scale_columns=None, columns=None, **kwargs):
    """fp8 codes shaped like ``x`` (with ``columns`` in the last dim) and fp32 scales [rows, *], laid
    out as the kernels lay them out (``new_scales``)."""
    columns = x.shape[-1] if columns is None else columns
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.new_empty((*x.shape[:-1], columns), dtype=dtype), new_scales(rows, scale_columns, x.device)


def _fused_quantized(x, group_size, dtype, columns=None):
    """The output of an op that quantises its own result per ``group_size`` group or per token."""
    columns = x.shape[-1] if columns is None else columns
    scale_columns = 1 if group_size is None else columns // group_size
    return _quantized(x, dtype=dtype, scale_columns=scale_columns, columns=columns)


def _norm_quantized(x, weight, eps, group_size=128, *, dtype=torch.float8_e4m3fn):
    return _fused_quantized(x, group_size, dtype)


def _add_norm_quantized(x, residual, weight, eps, group_size=128, *, dtype=torch.float8_e4m3fn):
    return *_fused_quantized(x, group_size, dtype), torch.empty_like(x)


def _gated_quantized(x, group_size=128, *, dtype=torch.float8_e4m3fn):
    return _fused_quantized(x, group_size, dtype, columns=x.shape[-1] // 2)


def _per_tensor_quantized(x, scale=None, *, dtype=torch.float8_e4m3fn):
    return x.new_empty(x.shape, dtype=dtype), x.new_empty((1,), dtype=torch.float32)


def _per_token_quantized(x, *, dtype=torch.float8_e4m3fn):
    return _quantized(x, dtype=dtype, scale_columns=1)


def _per_group_quantized(x, group_size=128, *, dtype=torch.float8_e4m3fn):
    return _quantized(x, dtype=dtype, scale_columns=x.shape[-1] // group_size)


def _fp8_gemm(a, b, a_scale, b_scale, out_dtype=torch.bfloat16, *args, **kwargs):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def _mxfp4_linear(x, weight, weight_scale, bias=None):
    return x.new_empty(x.shape[0], weight.shape[0])


def _router_logits(x, weight, bias=None):
    return x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32)


# The ops wrapped, each with its fake impl; the schema comes from the op's stub.
FAKES: dict[str, Callable] = {
    "rms_norm": _same_as_first,
    "fused_add_rms_norm": _pair_like,
    "rotary_embedding": _rope,
    "qk_norm_rope": _rope,
    "silu_and_mul": _gated,
    "gelu_and_mul": _gated,
    "clamped_swiglu": _gated,
    "topk_softmax": _routing,
    "grouped_topk": _routing,
    "router_logits": _router_logits,
    "fused_moe": _same_as_first,
    "mxfp4_quant_dequant": _same_as_first,
    "mxfp4_linear": _mxfp4_linear,
    "per_tensor_quant_fp8": _per_tensor_quantized,
    "per_token_quant_fp8": _per_token_quantized,
    "per_group_quant_fp8": _per_group_quantized,
    "rms_norm_quant_fp8": _norm_quantized,
    "fused_add_rms_norm_quant_fp8": _add_norm_quantized,
    "silu_and_mul_quant_fp8": _gated_quantized,
    "fp8_scaled_mm": _fp8_gemm,
    "fp8_block_scaled_mm": _fp8_gemm,
}


def define_custom_op(name: str, signature: Callable, impl: Callable, fake: Callable, mutates_args=()):
    """``torch.ops.atom.<name>`` with ``signature``'s schema, running ``impl`` on every device, ``fake``
    under tracing. Through ``torch.library.Library``: the ``@torch.library.custom_op`` decorator's
    Python dispatch took 10.4 us a call against 1.6 (one CPU core, torch 2.11)."""
    _library.define(name + torch.library.infer_schema(signature, mutates_args=mutates_args))
    _library.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"atom::{name}", fake, lib=_library)
    return getattr(torch.ops.atom, name)


def _register(name: str, fake: Callable) -> None:
    op = OPS[name]

    def run(*args, **kwargs):
        return op.dispatch(*args, **kwargs)

    op.custom_op = define_custom_op(name, op.stub, run, fake)


for _name, _fake in FAKES.items():
    _register(_name, _fake)
# The ops torch.compile traces instead (ATOM_INDUCTOR_OPS), read once the ops are defined.
set_inductor_ops()
