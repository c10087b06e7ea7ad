"""``name:triton`` traced on a GPU: Inductor's code launches ATOM's kernel; results are eager's bit for
bit at row counts the graph did not specialise on, in a model's layouts (q, k: slices of one QKV)."""

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
        [HEADS * HEAD_DIM] + [KV_HEADS * HEAD_DIM] * 2, dim=-1)
    positions = torch.randint(0, 4096, (rows,), device="cuda")
    cache = compute_cos_sin_cache(default_inv_freq(HEAD_DIM, 1e6), 4096).to("cuda")
    return {"pqk": (positions, q, k), "weights": [randn(HEAD_DIM), randn(HEAD_DIM)], "cache": cache}


def router(experts: int):
    return lambda rows: {"x": torch.randn(rows, experts, device="cuda"), "bias": torch.randn(experts, device="cuda")}


def norm(*keys: str):
    return lambda i, op: op(*(i[key] for key in keys), 1e-6)


NORM, ACT, ROPE = "_rms_norm_kernel", "_gated_activation_kernel", "_rotary_embedding_kernel"
GATED = lambda rows: randn(rows, 2 * INTERMEDIATE)  # noqa: E731
# op -> (its kernel, inputs of a row count, call(inputs, op)); the last three are not in DEFAULT_INDUCTOR_OPS.
# Router logits as Qwen3-30B-A3B's (128 experts) and DeepSeek-V3's (256, 8 groups).
CASES = {
    "rms_norm": (NORM, norm_inputs, norm("x", "weight")),
    "fused_add_rms_norm": (NORM, norm_inputs, norm("x", "residual", "weight")),
    "rms_norm_quant_fp8": (NORM, norm_inputs, norm("x", "weight")),
    "fused_add_rms_norm_quant_fp8": (NORM, norm_inputs, norm("x", "residual", "weight")),
    "per_group_quant_fp8": ("_quant_fp8_kernel", norm_inputs, lambda i, op: op(i["x"])),
    "silu_and_mul": (ACT, GATED, lambda x, op: op(x)),
    "silu_and_mul_quant_fp8": (ACT, GATED, lambda x, op: op(x)),
    "qk_norm_rope": (ROPE, rope_inputs, lambda i, op: op(*i["pqk"], *i["weights"], 1e-6, i["cache"], HEAD_DIM, True)),
    "rotary_embedding": (ROPE, rope_inputs, lambda i, op: op(*i["pqk"], i["cache"], HEAD_DIM, True)),
    "topk_softmax": ("_topk_softmax_kernel", router(128), lambda i, op: op(i["x"], 8, True)),
    "grouped_topk": ("_grouped_topk_kernel", router(256), lambda i, op: op(i["x"], 8, 8, 4, True, "sigmoid", i["bias"],
                                                                          2.5)),
}


def as_tuple(result) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_op_launches_atom_kernel_and_matches_eager(name):
    kernel, make_inputs, call = CASES[name]
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
            assert OPS[name].calls == calls, "dispatched, not traced"
            if rows == 5:  # compiled here, for any row count (dynamic)
                code = "".join(codes)
                assert kernel in code and f"torch.ops.atom.{name}" not in code
            for g, e in zip(as_tuple(got), expected, strict=True):
                assert g.shape == e.shape and g.dtype == e.dtype and g.stride() == e.stride()
                assert torch.equal(g.float(), e.float()), f"{rows} rows"
    finally:
        set_inductor_ops()
        torch._dynamo.reset()
