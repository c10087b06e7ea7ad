import functools

import pytest
import torch
from kernel_testing import DEVICE, assert_close, backends, float_dtypes, impl, library_backends, rand

from atom_kernels import gemm

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def reference_quant(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scale = amax / 448 (fp32); q = x / scale in fp32, clamped, rounded to nearest even in fp8."""
    scale = (amax.double().clamp(min=1e-10) / FP8_MAX).float()
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def assert_same_fp8(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == FP8
    assert torch.equal(actual.view(torch.uint8), expected.view(torch.uint8))


def quant_input(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    x = rand(rows, cols, dtype=dtype, scale=3.0)
    x[0] = 0  # an all-zero row still gets a finite scale
    x[-1, 8:12] = -0.0  # signed zeros keep their sign
    x[-1, :8] *= 100  # outliers
    return x


@backends
@float_dtypes
@pytest.mark.parametrize("rows, cols", [(1, 128), (37, 384), (5, 7168)])
def test_per_token_quant_fp8(backend, dtype, rows, cols):
    x = quant_input(rows, cols, dtype)
    q, scale = impl("per_token_quant_fp8", backend)(x)
    want_q, want_scale = reference_quant(x, x.float().abs().amax(-1, keepdim=True))
    assert scale.shape == (rows, 1) and scale.dtype == torch.float32
    torch.testing.assert_close(scale, want_scale, rtol=0, atol=0)
    assert_same_fp8(q, want_q)


@backends
@float_dtypes
@pytest.mark.parametrize("rows, cols, group", [(1, 128, 128), (37, 384, 128), (9, 256, 64)])
def test_per_group_quant_fp8(backend, dtype, rows, cols, group):
    x = quant_input(rows, cols, dtype)
    q, scale = impl("per_group_quant_fp8", backend)(x, group)
    groups = x.float().view(rows, cols // group, group)
    want_q, want_scale = reference_quant(groups, groups.abs().amax(-1, keepdim=True))
    assert scale.shape == (rows, cols // group)
    torch.testing.assert_close(scale, want_scale.squeeze(-1), rtol=0, atol=0)
    assert_same_fp8(q, want_q.view(rows, cols))


@backends
@float_dtypes
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_per_tensor_quant_fp8(backend, dtype, static):
    x = quant_input(33, 200, dtype)
    given = torch.tensor([0.05], device=DEVICE) if static else None
    q, scale = impl("per_tensor_quant_fp8", backend)(x, given)
    if static:
        want_scale = given
        want_q = (x.float() / given).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    else:
        want_q, want_scale = reference_quant(x, x.float().abs().amax().reshape(1))
    assert scale.shape == (1,)
    torch.testing.assert_close(scale, want_scale, rtol=0, atol=0)
    assert_same_fp8(q, want_q)


def quantized(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random fp8 values with per-row scales (GEMM inputs need not be our quantizer's)."""
    return rand(rows, cols, scale=40.0).to(FP8), (torch.rand(rows, 1) + 0.5).to(DEVICE) / 100


def reference_mm(a, a_scale, b, b_scale, bias=None):
    out = (a.double() * a_scale.double()) @ (b.double() * b_scale.double()).T
    return out if bias is None else out + bias.double()


@library_backends
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m, n, k", [(1, 64, 128), (37, 200, 384), (130, 256, 512)])
@pytest.mark.parametrize("a_kind", ["tensor", "token"])
@pytest.mark.parametrize("b_kind", ["tensor", "channel"])
def test_fp8_scaled_mm(backend, out_dtype, m, n, k, a_kind, b_kind):
    a, a_scale = quantized(m, k)
    b, b_scale = quantized(n, k)
    a_scale = a_scale[:1].reshape(1) if a_kind == "tensor" else a_scale
    b_scale = b_scale[:1].reshape(1) if b_kind == "tensor" else b_scale.reshape(n)
    bias = rand(n) if n == 200 else None
    out = impl("fp8_scaled_mm", backend)(a, b, a_scale, b_scale, out_dtype, bias)
    assert out.shape == (m, n) and out.dtype == out_dtype
    expected = reference_mm(a, a_scale.reshape(-1, 1), b, b_scale.reshape(-1, 1), bias)
    assert_close(out, expected, out_dtype, "accumulated")


@library_backends
@pytest.mark.parametrize("m, n, k", [(1, 128, 128), (20, 256, 384), (70, 320, 256), (130, 256, 512), (256, 256, 512),
                                     (1030, 592, 512), (1024, 640, 640)])
def test_fp8_block_scaled_mm(backend, m, n, k):
    a, _ = quantized(m, k)
    b, _ = quantized(n, k)
    a_scale = (torch.rand(m, -(-k // 128)) + 0.5).to(DEVICE) / 100
    b_scale = (torch.rand(-(-n // 128), -(-k // 128)) + 0.5).to(DEVICE) / 100
    out = impl("fp8_block_scaled_mm", backend)(a, b, a_scale, b_scale, torch.bfloat16)
    a_full = a_scale.repeat_interleave(128, dim=1)[:, :k]
    b_full = b_scale.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:n, :k]
    expected = (a.double() * a_full.double()) @ (b.double() * b_full.double()).T
    assert_close(out, expected, torch.bfloat16, "accumulated")


@pytest.mark.parametrize("m, n, k, takes", [
    (64, 36864, 7168, False), (65, 4096, 4096, True), (128, 2112, 7168, False), (256, 2112, 7168, True),
    (256, 576, 7168, False), (1024, 576, 7168, True), (128, 2048, 4096, False), (128, 2688, 4096, False),
    (128, 2816, 4096, True), (1030, 592, 512, True), (4096, 600, 512, False), (1024, 640, 640, False),
    (1024, 640, 256, False), (1024, 640, 1536, True)])
def test_block_library_takes_outputs_of_enough_tiles(m, n, k, takes):
    """torch's block GEMM from 65 rows, widths of whole 16 columns, K of whole 512 columns (it misread the
    scales of others), and at least one 128 x 128 output tile per six SMs (22 tiles of 132 on CPU)."""
    a, b = torch.empty(m, k, device="meta"), torch.empty(n, k, device="meta")
    assert gemm._block_library_fits(a, b, torch.bfloat16) == takes


def test_as_group_major_copies_only_what_is_laid_out_otherwise():
    from atom_kernels.quant import as_group_major

    per_token, row_major = torch.rand(5, 1), torch.rand(5, 3)
    for scale, shared in ((per_token, True), (row_major, False), (row_major.t().contiguous().t(), True)):
        out = as_group_major(scale)
        assert out.stride() == (1, 5) and torch.equal(out, scale)
        assert (out.data_ptr() == scale.data_ptr()) == shared


@library_backends
@pytest.mark.parametrize("m", [1, 70, 130])
def test_fp8_block_scaled_mm_reads_either_scale_layout(backend, m):
    """The quantizers' group-major activation scales (atom_kernels.quant.new_scales) and row-major
    ones give the same output bit for bit: the kernels read them through their strides."""
    n, k = 256, 512
    a, _ = quantized(m, k)
    b, _ = quantized(n, k)
    row_major = (torch.rand(m, k // 128) + 0.5).to(DEVICE) / 100
    group_major = row_major.t().contiguous().t()
    b_scale = (torch.rand(n // 128, k // 128) + 0.5).to(DEVICE) / 100
    gemm_op = impl("fp8_block_scaled_mm", backend)
    assert torch.equal(gemm_op(a, b, row_major, b_scale), gemm_op(a, b, group_major, b_scale))


@pytest.mark.parametrize("block_scaled", [True, False], ids=["block", "channel"])
@pytest.mark.parametrize("m, split_k", [(3, 2), (20, 3), (70, 5), (5, 9)])
def test_fp8_gemm_split_k(block_scaled, m, split_k):
    """K cut into ranges summed by a second kernel (5 K steps: uneven splits, and more splits asked
    than steps) gives the unsplit result, bias included."""
    n, k = 200, 640
    a, a_scale = quantized(m, k)
    b, b_scale = quantized(n, k)
    bias = None
    if block_scaled:
        a_scale = (torch.rand(m, k // 128) + 0.5).to(DEVICE) / 100
        b_scale = (torch.rand(-(-n // 128), k // 128) + 0.5).to(DEVICE) / 100
    else:
        b_scale, bias = b_scale.reshape(n), rand(n)
    whole, split = (
        gemm._launch_fp8_gemm(a, b, a_scale, b_scale, torch.float32, bias, block_scaled, 128, split_k=s)
        for s in (1, split_k)
    )
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", [(16, 128, 4, False), (32, 64, 4, False), (64, 256, 8, False), (16, 64, 4, True),
                                  (32, 128, 4, True)])
def test_fp8_block_gemm_with_other_tiles(tile):
    """Given tiles, swapped operands too, are used and give the same product (GPU: within 1e-3 of the
    largest value)."""
    (a, _), (b, _) = quantized(40, 640), quantized(320, 640)
    a_scale, b_scale = ((torch.rand(rows, 5) + 0.5).to(DEVICE) / 100 for rows in (40, 3))
    config = dict(BLOCK_M=tile[0], BLOCK_N=tile[1], BLOCK_K=128, GROUP_M=8, SWAP_AB=tile[3], num_warps=tile[2],
                  num_stages=3, split_min_steps=2)
    run = functools.partial(gemm._launch_fp8_gemm, a, b, a_scale, b_scale, torch.float32, None, True, 128)
    shipped = run()
    assert (run(config=config) - shipped).abs().max() <= 1e-3 * shipped.abs().max()
    with pytest.raises(ValueError, match="multiple of 128"):
        run(config={**config, "BLOCK_K": 96})


def test_fp8_gemm_over_no_columns_is_the_bias():
    a, b = torch.empty(3, 0, device=DEVICE).to(FP8), torch.empty(5, 0, device=DEVICE).to(FP8)
    bias = rand(5)
    out = gemm._launch_fp8_gemm(a, b, torch.ones(3, 1, device=DEVICE), torch.ones(5, device=DEVICE),
                                torch.float32, bias, False, 128)
    torch.testing.assert_close(out, bias.expand(3, 5), rtol=0, atol=0)


@pytest.mark.parametrize(
    "tiles, k_steps, min_steps, want",
    [(9, 56, 6, 9), (64, 96, 6, 5), (96, 32, 6, 3), (80, 16, 12, 1), (384, 32, 6, 1), (132, 128, 6, 1),
     (4, 6, 8, 1)],
)
def test_split_k_fills_the_gpu(tiles, k_steps, min_steps, want):
    """About two programs an SM (132 on CPU), each split at least ``min_steps`` K steps."""
    assert gemm._split_k(tiles, k_steps, min_steps, torch.device("cpu")) == want


@pytest.mark.parametrize("rows, tiles, k_steps, want", [(1, 96, 32, 4), (16, 64, 96, 9), (32, 64, 96, 5),
                                                        (32, 80, 16, 1), (32, 112, 128, 3), (8, 384, 32, 1),
                                                        (64, 96, 32, 2)])
def test_split_k_of_each_tile_config(rows, tiles, k_steps, want):
    """The rule as each row count's tiles set it: swapped tiles (up to 32 rows) 8 K steps a split, no
    split below 32 K steps, up to four programs an SM with 16 rows and two with 32; 64-row tiles 12
    steps a split."""
    config = gemm._gemm_config(rows)
    rule = gemm._split_rule(config)
    assert config["SWAP_AB"] == (rows <= 32)
    assert not any(key.startswith("split_") for key in config)
    assert gemm._split_k(tiles, k_steps, rule[0], torch.device("cpu"), *rule[1:]) == want


@backends
def test_quantise_then_gemm_approximates_bf16_matmul(backend):
    """Per-group activations x 128x128-block weights ~ the unquantized product."""
    x, w = rand(16, 512, dtype=torch.bfloat16), rand(256, 512, dtype=torch.bfloat16)
    x_q, x_scale = impl("per_group_quant_fp8", backend)(x)
    blocks = w.float().view(2, 128, 4, 128)
    w_scale = blocks.abs().amax(dim=(1, 3)) / FP8_MAX
    w_q = (blocks / w_scale[:, None, :, None]).view(256, 512).to(FP8)
    out = impl("fp8_block_scaled_mm", backend)(x_q, w_q, x_scale, w_scale, torch.bfloat16)
    exact = x.double() @ w.double().T
    assert (out.double() - exact).norm() / exact.norm() < 0.05
