import math
from types import SimpleNamespace

import pytest
import torch
from kernel_testing import assert_close, backends, float_dtypes, impl, rand

SHAPES = [(1, 2 * 64), (9, 2 * 100), (3, 4, 2 * 1536)]


def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1] // 2
    return x[..., :d].double(), x[..., d:].double()


@backends
@float_dtypes
@pytest.mark.parametrize("shape", SHAPES)
def test_silu_and_mul(backend, dtype, shape):
    x = rand(*shape, dtype=dtype, scale=3.0)
    gate, up = split(x)
    out = impl("silu_and_mul", backend)(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    assert_close(out, gate / (1 + torch.exp(-gate)) * up, dtype)


@backends
@float_dtypes
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_mul(backend, dtype, shape, approximate):
    x = rand(*shape, dtype=dtype, scale=3.0)
    gate, up = split(x)
    if approximate == "tanh":
        gelu = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
    else:
        gelu = 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2)))
    assert_close(impl("gelu_and_mul", backend)(x, approximate), gelu * up, dtype)


@backends
@float_dtypes
@pytest.mark.parametrize("shape", [(5, 2 * 64), (2, 3, 2 * 720)])
def test_clamped_swiglu_matches_hf_gpt_oss(backend, dtype, shape):
    """Against HF transformers' GptOssExperts._apply_gate: interleaved gate/up, clamp, (up + 1)."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    x = rand(*shape, dtype=dtype, scale=6.0)  # wide enough that both clamps bite
    hf = gpt_oss.GptOssExperts._apply_gate(SimpleNamespace(alpha=1.702, limit=7.0), x.double())
    assert_close(impl("clamped_swiglu", backend)(x, 1.702, 7.0), hf, dtype)


@backends
def test_clamped_swiglu_halves_layout(backend):
    x = rand(4, 2 * 32, scale=6.0)
    interleaved = torch.stack(x.chunk(2, dim=-1), dim=-1).flatten(-2)
    expected = impl("clamped_swiglu", "torch")(interleaved, 1.0, 5.0)
    assert_close(
        impl("clamped_swiglu", backend)(x, 1.0, 5.0, interleaved=False), expected, torch.float32
    )


def test_odd_width_rejected():
    with pytest.raises(ValueError, match="not even"):
        impl("silu_and_mul", "triton")(rand(2, 7))
