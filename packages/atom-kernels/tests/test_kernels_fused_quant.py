"""The ops that quantise their own output to fp8 (RMSNorm, fused add + RMSNorm, SiLU * mul) against
the unfused pair (the op, then atom_kernels.quant) of the same backend: the same math, so the same
fp8 codes and scales, bit for bit in Triton's interpreter and the torch backend; on a GPU the fused
kernel's own reduction order and FMA contraction move an fp32 scale by a few ulps (seen on an H200)
and so, rarely, a value on an e4m3 rounding boundary by one code. And, dequantised, against a
float64 reference within fp8's precision."""

import pytest
import torch
from kernel_testing import ON_GPU, backends, float_dtypes, impl, rand, tolerance
from torch._subclasses.fake_tensor import FakeTensorMode

FP8 = torch.float8_e4m3fn
# e4m3 keeps 3 mantissa bits: a normal value rounds within 2^-4 of itself; below 2^-6 (subnormals)
# the step is 2^-9, so a value rounds within 2^-10 of the scale.
FP8_RELATIVE_STEP = 2.0**-4
FP8_SUBNORMAL_STEP = 2.0**-10
GROUPS = [128, 64, None]
group_sizes = pytest.mark.parametrize("group", GROUPS, ids=["group128", "group64", "token"])


def unfused_quant(y: torch.Tensor, group: int | None, backend: str):
    if group is None:
        return impl("per_token_quant_fp8", backend)(y)
    return impl("per_group_quant_fp8", backend)(y, group)


def assert_same_quantization(got, want) -> None:
    (q, scale), (want_q, want_scale) = got, want
    assert q.dtype == FP8 and q.shape == want_q.shape
    assert scale.dtype == torch.float32 and scale.shape == want_scale.shape
    if not ON_GPU:
        assert torch.equal(scale, want_scale)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
        return
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0)
    # e4m3 is sign-magnitude: neighbouring codes of one sign differ by 1 as integers.
    codes, want_codes = q.view(torch.uint8).int(), want_q.view(torch.uint8).int()
    moved = codes != want_codes
    assert ((codes - want_codes).abs()[moved] == 1).all()
    assert moved.float().mean() < 1e-2


def assert_dequantizes_to(q, scale, expected: torch.Tensor, group: int | None, dtype) -> None:
    """``q * scale`` within one fp8 rounding of ``expected`` (float64), plus ``dtype``'s own rounding
    of the value before it was quantised."""
    rows = expected.reshape(-1, expected.shape[-1])
    group = rows.shape[-1] if group is None else group
    per_value_scale = scale.double().repeat_interleave(group, dim=1)
    deq = q.reshape(rows.shape).double() * per_value_scale
    rtol, atol = tolerance(dtype)
    bound = (FP8_RELATIVE_STEP + rtol) * rows.abs() + FP8_SUBNORMAL_STEP * per_value_scale + atol
    assert ((deq - rows).abs() <= bound).all(), (deq - rows).abs().max()


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def with_zero_row_and_outliers(x: torch.Tensor) -> torch.Tensor:
    rows = x.view(-1, x.shape[-1])
    rows[0] = 0  # an all-zero row still gets a finite scale
    rows[-1, :8] *= 100
    return x


NORM_SHAPES = [(1, 128), (7, 384), (33, 1024), (3, 5, 256)]


@backends
@float_dtypes
@group_sizes
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_rms_norm_quant_fp8(backend, dtype, group, shape):
    x = with_zero_row_and_outliers(rand(*shape, dtype=dtype, scale=3.0))
    weight = rand(shape[-1], dtype=dtype)
    got = impl("rms_norm_quant_fp8", backend)(x, weight, 1e-6, group)
    assert_same_quantization(got, unfused_quant(impl("rms_norm", backend)(x, weight, 1e-6), group, backend))
    assert_dequantizes_to(*got, reference_rms_norm(x, weight, 1e-6), group, dtype)


@backends
@float_dtypes
@group_sizes
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_fused_add_rms_norm_quant_fp8(backend, dtype, group, shape):
    x, residual = rand(*shape, dtype=dtype), with_zero_row_and_outliers(rand(*shape, dtype=dtype))
    x.view(-1, shape[-1])[0] = 0
    weight = rand(shape[-1], dtype=dtype)
    q, scale, summed = impl("fused_add_rms_norm_quant_fp8", backend)(x, residual, weight, 1e-6, group)
    y, want_summed = impl("fused_add_rms_norm", backend)(x, residual, weight, 1e-6)
    assert torch.equal(summed, want_summed)
    assert_same_quantization((q, scale), unfused_quant(y, group, backend))
    assert_dequantizes_to(q, scale, reference_rms_norm(want_summed, weight, 1e-6), group, dtype)


@backends
@float_dtypes
@group_sizes
@pytest.mark.parametrize("shape", [(1, 2 * 128), (9, 2 * 384), (3, 4, 2 * 1536)])
def test_silu_and_mul_quant_fp8(backend, dtype, group, shape):
    x = with_zero_row_and_outliers(rand(*shape, dtype=dtype, scale=3.0))
    got = impl("silu_and_mul_quant_fp8", backend)(x, group)
    assert_same_quantization(got, unfused_quant(impl("silu_and_mul", backend)(x), group, backend))
    gate, up = x.double().chunk(2, dim=-1)
    assert_dequantizes_to(*got, gate / (1 + torch.exp(-gate)) * up, group, dtype)


@pytest.mark.parametrize("op, args", [
    ("rms_norm_quant_fp8", (rand(2, 384), rand(384), 1e-6, 96)),
    ("silu_and_mul_quant_fp8", (rand(2, 2 * 256), 48)),
])
def test_fused_quant_rejects_groups_the_kernel_cannot_tile(op, args):
    with pytest.raises(ValueError, match="power of two"):
        impl(op, "triton")(*args)


DYNAMIC_QUANTIZERS = [
    ("rms_norm_quant_fp8", (rand(5, 256), rand(256), 1e-6, 128)),
    ("fused_add_rms_norm_quant_fp8", (rand(2, 3, 256), rand(2, 3, 256), rand(256), 1e-6, None)),
    ("silu_and_mul_quant_fp8", (rand(4, 2 * 256), 64)),
    ("per_group_quant_fp8", (rand(6, 384), 128)),
    ("per_token_quant_fp8", (rand(3, 256),)),
]


@backends
@pytest.mark.parametrize("op, args", DYNAMIC_QUANTIZERS, ids=[op for op, _ in DYNAMIC_QUANTIZERS])
def test_dynamic_quantizers_store_scales_group_major(backend, op, args):
    """Scales [rows, groups] with each group's rows contiguous (atom_kernels.quant.new_scales): the
    layout torch's library GEMM reads without a copy."""
    scale = impl(op, backend)(*args)[1]
    assert scale.stride() == (1, scale.shape[0])


def test_row_major_scales_for_the_fused_moe_hold_the_same_values():
    """The quantizers the fused MoE runs (atom_kernels.moe.run_fused_moe) store their scales row-major,
    and quantize bit for bit as the group-major ops do."""
    from atom_kernels.activation import ACT_SILU, launch_gated_activation
    from atom_kernels.quant import FP8_DTYPE, per_group_quant_fp8_row_major

    x = with_zero_row_and_outliers(rand(7, 2 * 384, dtype=torch.bfloat16, scale=3.0))
    pairs = [
        (per_group_quant_fp8_row_major(x, 128), impl("per_group_quant_fp8", "triton")(x, 128)),
        (launch_gated_activation(x, ACT_SILU, fp8=FP8_DTYPE, group_size=128, row_major_scales=True),
         impl("silu_and_mul_quant_fp8", "triton")(x, 128)),
    ]
    x96 = rand(5, 288, dtype=torch.bfloat16)  # a block the fused MoE takes (a multiple of 32), not a power of two
    pairs.append((per_group_quant_fp8_row_major(x96, 96), impl("per_group_quant_fp8", "triton")(x96, 96)))
    for (q, scale), (q_ref, scale_ref) in pairs:
        assert scale.stride() == (scale.shape[1], 1)
        assert torch.equal(scale, scale_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("op, args", DYNAMIC_QUANTIZERS, ids=[op for op, _ in DYNAMIC_QUANTIZERS])
def test_opaque_op_fake_matches_the_kernel(op, args):
    """The torch.ops.atom.* wrapper's fake impl (what torch.compile traces) gives the shapes, dtypes
    and strides the kernel returns."""
    custom_op = getattr(torch.ops.atom, op).default
    torch.library.opcheck(custom_op, args, test_utils=("test_schema", "test_faketensor"))
    with FakeTensorMode() as mode:  # opcheck compares no strides
        fake = custom_op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert [t.stride() for t in fake] == [t.stride() for t in custom_op(*args)]
