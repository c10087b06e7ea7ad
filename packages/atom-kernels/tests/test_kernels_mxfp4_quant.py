"""``mxfp4_quant_dequant``: activations rounded to MXFP4 and back as AMD Quark's W4A4 checkpoints
prescribe (its ``qdq_mxfp4`` with scale mode ``even``), the fused MoE with both GEMMs' inputs so
rounded (``input_format="mxfp4"``), and ``mxfp4_linear``, the GEMM of those checkpoints' MXFP4 linear
layers."""

import itertools

import pytest
import torch
from kernel_testing import DEVICE, assert_close, backends, float_dtypes, impl, rand
from test_kernels_moe import mxfp4_weight, routing

import atom_kernels

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def spec_quant_dequant(x: torch.Tensor) -> torch.Tensor:
    """The definition, value by value in float64: the block's amax rounded to a power of two
    (``2 ** floor(log2(amax))``, doubled from 1.75 times that up), the scale that power over 4 (e2m1's
    largest exponent is 2), each scaled value to the nearest e2m1 magnitude (ties: the even code, the
    one whose mantissa bit is 0), at most 6."""
    out = torch.empty(x.shape, dtype=torch.float64)
    flat, result = x.double().reshape(-1, 32), out.view(-1, 32)
    for row in range(flat.shape[0]):
        block = flat[row]
        amax = block.abs().max().item()
        if amax == 0:
            result[row] = 0
            continue
        power = 2.0 ** torch.floor(torch.log2(torch.tensor(amax, dtype=torch.float64))).item()
        scale = (2 * power if amax >= 1.75 * power else power) / 4
        for i, value in enumerate(block.tolist()):
            magnitude = abs(value) / scale
            distances = [abs(magnitude - m) for m in E2M1_MAGNITUDES]
            best = min(distances)
            codes = [c for c, d in enumerate(distances) if d == best]
            code = next((c for c in codes if c % 2 == 0), codes[0])
            result[row, i] = (-1 if value < 0 else 1) * E2M1_MAGNITUDES[code] * scale
    return out.to(x.dtype)


@backends
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 32), (5, 96), (3, 2, 320)])
def test_mxfp4_quant_dequant_follows_the_definition(backend, dtype, shape):
    # Values over six octaves, an all-zero block, and blocks whose amax sits at the scale boundaries.
    x = rand(*shape, dtype=torch.float32) * torch.logspace(-3, 3, shape[-1], device=DEVICE)
    flat = x.view(-1, shape[-1])
    flat[0, :32] = 0
    if flat.shape[0] > 1:
        flat[1, :3] = torch.tensor([1.75, 1.7499, -7.0])  # amax 7.0: 1.75 * 4, rounds the scale up
    x = x.to(dtype)
    got = impl("mxfp4_quant_dequant", backend)(x)
    assert got.shape == x.shape and got.dtype == dtype
    assert torch.equal(got.cpu(), spec_quant_dequant(x.cpu()))


@backends
def test_mxfp4_quant_dequant_rounds_ties_to_even_and_saturates(backend):
    """The cases of Quark's kernel: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
    5 -> 4; a block of amax 6 keeps scale 1, one of amax 7 takes scale 2 (7 / 2 = 3.5 -> 4: 8; 2.9 / 2 -> 1.5: 3)."""
    x = torch.zeros(2, 32, device=DEVICE)
    x[0, :9] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 6.0])
    x[1, :2] = torch.tensor([7.0, 2.9])
    got = impl("mxfp4_quant_dequant", backend)(x).cpu()
    assert got[0, :9].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0]
    assert got[1, :2].tolist() == [8.0, 3.0]


def test_mxfp4_quant_dequant_needs_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 32"):
        atom_kernels.mxfp4_quant_dequant(torch.ones(2, 48))


def w4a4_reference(x, w13, w13_scale, w2, w2_scale, weights, ids):
    """Expert by expert in float64 on the decoded weights, each GEMM's input rounded by the
    definition (the intermediate first stored in x's dtype, as the op stores it)."""
    w13_deq = atom_kernels.dequantize_mxfp4(w13, w13_scale, torch.float64)
    w2_deq = atom_kernels.dequantize_mxfp4(w2, w2_scale, torch.float64)
    a = spec_quant_dequant(x.cpu()).double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for token, k in itertools.product(range(x.shape[0]), range(ids.shape[1])):
        e = int(ids[token, k])
        gate, up = (a[token] @ w13_deq[e].cpu().t()).chunk(2)
        hidden = spec_quant_dequant((torch.nn.functional.silu(gate) * up).to(x.dtype)[None]).double()[0]
        out[token] += float(weights[token, k]) * (hidden @ w2_deq[e].cpu().t())
    return out


@backends
@pytest.mark.parametrize("num_tokens, hidden, inter, num_experts, top_k", [(1, 64, 32, 4, 2), (19, 96, 64, 8, 3)])
def test_fused_moe_rounds_both_gemm_inputs_to_mxfp4(backend, num_tokens, hidden, inter, num_experts, top_k):
    """In fp32 (in bf16 the intermediate's own rounding moves some values across an MXFP4 rounding
    boundary, a whole e2m1 step, so no elementwise tolerance holds)."""
    dtype = torch.float32
    x = rand(num_tokens, hidden, dtype=dtype)
    (w13, w13_scale), (w2, w2_scale) = mxfp4_weight(num_experts, 2 * inter, hidden), mxfp4_weight(
        num_experts, hidden, inter)
    weights, ids = routing(num_tokens, num_experts, top_k)
    options = {"w13_scale": w13_scale, "w2_scale": w2_scale, "weight_format": "mxfp4"}
    got = impl("fused_moe", backend)(x, w13, w2, weights, ids, input_format="mxfp4", **options)
    want = w4a4_reference(x, w13, w13_scale, w2, w2_scale, weights, ids)
    assert_close(got.cpu(), want.to(dtype), dtype, "accumulated")
    weight_only = impl("fused_moe", backend)(x, w13, w2, weights, ids, **options)
    assert (weight_only.float() - got.float()).abs().max() > 0.01 * want.abs().max()


def test_fused_moe_mxfp4_inputs_need_mxfp4_weights():
    x = rand(2, 64, dtype=torch.float32)
    w13, w2 = rand(4, 64, 64, dtype=torch.float32), rand(4, 64, 32, dtype=torch.float32)
    weights, ids = routing(2, 4, 2)
    with pytest.raises(ValueError, match="input_format='mxfp4' needs weight_format='mxfp4'"):
        atom_kernels.fused_moe(x, w13, w2, weights, ids, input_format="mxfp4")


@backends
@float_dtypes
@pytest.mark.parametrize("rows, k, n", [(1, 64, 96), (17, 128, 72), (70, 96, 160)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_mxfp4_linear_matches_the_decoded_weight(backend, dtype, rows, k, n, with_bias):
    """Row counts in each of the GEMM's row-block sizes (16, 32, 64 rows), N not a multiple of its
    column tile; against float64 on the decoded weight."""
    x = rand(rows, k, dtype=dtype)
    weight, scale = (t[0] for t in mxfp4_weight(1, n, k))
    bias = rand(n, dtype=dtype) if with_bias else None
    got = impl("mxfp4_linear", backend)(x, weight, scale, bias)
    assert got.shape == (rows, n) and got.dtype == dtype
    want = x.cpu().double() @ atom_kernels.dequantize_mxfp4(weight, scale, torch.float64).cpu().t()
    if with_bias:
        want += bias.cpu().double()
    assert_close(got.cpu(), want, dtype, "accumulated")


def test_mxfp4_linear_names_the_shapes_it_needs():
    weight, scale = (t[0] for t in mxfp4_weight(1, 32, 64))
    with pytest.raises(ValueError, match=r"weight must be \[N, 48\] and weight_scale \[N, 3\]"):
        atom_kernels.mxfp4_linear(rand(2, 96, dtype=torch.float32), weight, scale)
    with pytest.raises(ValueError, match=r"bias must be \[32\]"):
        atom_kernels.mxfp4_linear(rand(2, 64, dtype=torch.float32), weight, scale, rand(31))
