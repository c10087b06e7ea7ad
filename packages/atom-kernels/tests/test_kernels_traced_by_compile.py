"""ATOM_INDUCTOR_OPS=name:triton on a GPU (set_inductor_ops): under torch.compile the op's Triton
implementation is traced, so Inductor launches ATOM's kernel from its own code, not the opaque op.
Results must be eager's bit for bit (same kernel source) at row counts the graph did not specialise
on, for the layouts a model passes (q and k as column slices of one QKV output)."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import atom_kernels
from atom_kernels.registry import OPS, set_inductor_ops
from atom_kernels.rope import compute_cos_sin_cache, default_inv_freq

pytestmark = pytest.mark.gpu

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 1024, 8, 2, 128, 1536


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.bfloat16, device="cuda")


def norm_inputs(rows: int) -> dict:
    return {"x": randn(rows, HIDDEN), "residual": randn(rows, HIDDEN), "weight": randn(HIDDEN)}


def rope_inputs(rows: int) -> dict:
    q, k, _ = randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM).split(
        [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    cache = compute_cos_sin_cache(default_inv_freq(HEAD_DIM, 1e6), 4096).to("cuda")
    positions = torch.randint(0, 4096, (rows,), device="cuda")
    return {"positions": positions, "q": q, "k": k, "weights": [randn(HEAD_DIM), randn(HEAD_DIM)], "cache": cache}


KERNELS = {"rms_norm": "_rms_norm_kernel", "fused_add_rms_norm": "_rms_norm_kernel",
           "rms_norm_quant_fp8": "_rms_norm_kernel", "fused_add_rms_norm_quant_fp8": "_rms_norm_kernel",
           "per_group_quant_fp8": "_quant_fp8_kernel", "silu_and_mul": "_gated_activation_kernel",
           "silu_and_mul_quant_fp8": "_gated_activation_kernel", "qk_norm_rope": "_rotary_embedding_kernel"}
# op name -> (inputs of a row count, call(inputs, op))
CASES = {
    "rms_norm": (norm_inputs, lambda i, op: op(i["x"], i["weight"], 1e-6)),
    "fused_add_rms_norm": (norm_inputs, lambda i, op: op(i["x"], i["residual"], i["weight"], 1e-6)),
    "rms_norm_quant_fp8": (norm_inputs, lambda i, op: op(i["x"], i["weight"], 1e-6)),
    "fused_add_rms_norm_quant_fp8": (norm_inputs, lambda i, op: op(i["x"], i["residual"], i["weight"], 1e-6)),
    "per_group_quant_fp8": (norm_inputs, lambda i, op: op(i["x"])),
    "silu_and_mul": (lambda rows: randn(rows, 2 * INTERMEDIATE), lambda x, op: op(x)),
    "silu_and_mul_quant_fp8": (lambda rows: randn(rows, 2 * INTERMEDIATE), lambda x, op: op(x)),
    "qk_norm_rope": (rope_inputs, lambda i, op: op(i["positions"], i["q"], i["k"], *i["weights"], 1e-6, i["cache"],
                                                  HEAD_DIM, True)),
}


def as_tuple(result) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_op_launches_atom_kernel_and_matches_eager(name):
    make_inputs, call = CASES[name]
    op = getattr(atom_kernels, name)
    torch._dynamo.reset()
    set_inductor_ops(f"{name}:triton")
    try:
        compiled = torch.compile(lambda inputs: call(inputs, op), fullgraph=True, dynamic=True)
        for rows in (5, 300, 1031):
            inputs = make_inputs(rows)
            expected = as_tuple(call(inputs, OPS[name].dispatch))
            calls = OPS[name].calls
            got, codes = run_and_get_code(compiled, inputs)
            assert OPS[name].calls == calls, "the compiled graph dispatched the op instead of tracing it"
            if rows == 5:  # compiled here, for any row count (dynamic): Inductor's code launches the kernel
                code = "".join(codes)
                assert KERNELS[name] in code and f"torch.ops.atom.{name}" not in code
            for g, e in zip(as_tuple(got), expected, strict=True):
                assert g.shape == e.shape and g.dtype == e.dtype and g.stride() == e.stride()
                assert torch.equal(g.float(), e.float()), f"{name} at {rows} rows differs from eager"
    finally:
        set_inductor_ops()
        torch._dynamo.reset()
