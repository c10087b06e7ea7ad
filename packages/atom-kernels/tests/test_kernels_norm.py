import pytest
import torch
from kernel_testing import DEVICE, assert_close, backends, float_dtypes, impl, rand


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@backends
@float_dtypes
@pytest.mark.parametrize("shape", [(1, 64), (7, 96), (33, 1000), (3, 5, 128)])
def test_rms_norm(backend, dtype, shape):
    x, weight = rand(*shape, dtype=dtype, scale=3.0), rand(shape[-1], dtype=dtype)
    y = impl("rms_norm", backend)(x, weight, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, reference_rms_norm(x, weight, 1e-6), dtype)


@backends
@float_dtypes
def test_rms_norm_on_strided_head_view(backend, dtype):
    """QK-norm: per-head RMSNorm on the q slice of a fused qkv output, read in place."""
    num_tokens, heads, kv_heads, head_dim = 9, 4, 2, 64
    qkv = rand(num_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q = qkv[:, : heads * head_dim].view(num_tokens, heads, head_dim)
    assert not q.is_contiguous()
    weight = rand(head_dim, dtype=dtype)
    y = impl("rms_norm", backend)(q, weight, 1e-5)
    assert_close(y, reference_rms_norm(q, weight, 1e-5), dtype)


@backends
@float_dtypes
@pytest.mark.parametrize("shape", [(1, 64), (17, 300), (4, 2, 256)])
def test_fused_add_rms_norm(backend, dtype, shape):
    x, residual = rand(*shape, dtype=dtype), rand(*shape, dtype=dtype)
    weight = rand(shape[-1], dtype=dtype)
    y, summed = impl("fused_add_rms_norm", backend)(x, residual, weight, 1e-6)
    expected_sum = (x.double() + residual.double()).to(dtype)
    assert_close(summed, expected_sum, dtype)
    assert_close(y, reference_rms_norm(expected_sum, weight, 1e-6), dtype)


def test_rms_norm_rejects_wrong_weight():
    with pytest.raises(ValueError, match="weight shape"):
        impl("rms_norm", "triton")(rand(2, 64), rand(32), 1e-6)


def test_public_op_dispatches_on_device():
    x, weight = rand(3, 64), rand(64)
    from atom_kernels import rms_norm

    assert_close(rms_norm(x, weight, 1e-6), reference_rms_norm(x, weight, 1e-6), torch.float32)
    assert rms_norm.select(DEVICE.type) == "triton"
