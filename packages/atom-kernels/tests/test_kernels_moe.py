import math

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from kernel_testing import DEVICE, LIBRARY, assert_close, backends, compiled_variants, float_dtypes, impl, rand

import atom_kernels
from atom_kernels.moe_gemv import e2m1_to_float_scaled


def distinct_logits(num_tokens: int, num_experts: int, dtype: torch.dtype) -> torch.Tensor:
    """Router logits without ties (distinct multiples of 1/16, exact in bf16), so top-k is unique."""
    rows = [torch.randperm(num_experts) for _ in range(num_tokens)]
    logits = (torch.stack(rows).float() - num_experts / 2) / 16
    return logits.to(device=DEVICE, dtype=dtype)


def sort_by_expert(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids, order = ids.long().sort(dim=1)
    return weights.gather(1, order), ids


@backends
@float_dtypes
@pytest.mark.parametrize(
    "num_tokens, num_experts, top_k", [(1, 8, 2), (37, 128, 8), (5, 60, 4), (300, 64, 6)]
)
@pytest.mark.parametrize("renormalize", [True, False])
def test_topk_softmax(backend, dtype, num_tokens, num_experts, top_k, renormalize):
    logits = distinct_logits(num_tokens, num_experts, dtype)
    weights, ids = impl("topk_softmax", backend)(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    probs = torch.softmax(logits.double(), dim=-1)
    want_weights, want_ids = probs.topk(top_k, dim=-1)
    if renormalize:
        want_weights = want_weights / want_weights.sum(-1, keepdim=True)
    got_w, got_ids = sort_by_expert(weights, ids)
    want_w, want_ids = sort_by_expert(want_weights, want_ids)
    assert torch.equal(got_ids, want_ids)
    assert_close(got_w, want_w, torch.float32)


def hf_deepseek_v3_router(logits, bias, top_k, n_group, topk_group, norm, scaling):
    """HF transformers' DeepSeek-V3 routing with an identity gate, so its logits are ours. Recent
    transformers pick the experts in ``DeepseekV3TopkRouter``; earlier 5.x releases (SGLang 0.5.17 pins
    5.12) in ``DeepseekV3MoE.route_tokens_to_experts``, from the router's logits."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    num_experts = logits.shape[1]
    config = transformers.DeepseekV3Config(
        hidden_size=num_experts,
        n_routed_experts=num_experts,
        num_experts_per_tok=top_k,
        n_group=n_group,
        topk_group=topk_group,
        norm_topk_prob=norm,
        routed_scaling_factor=scaling,
        moe_intermediate_size=1,  # the experts are not run
    )
    moe = DeepseekV3MoE(config).to(DEVICE)
    with torch.no_grad():
        moe.gate.weight.copy_(torch.eye(num_experts))
        moe.gate.e_score_correction_bias.copy_(bias)
        routed = moe.gate(logits.float())
        if isinstance(routed, tuple):
            _, weights, ids = routed
        else:
            ids, weights = moe.route_tokens_to_experts(routed)
    return weights, ids


@pytest.mark.parametrize("backend", ["torch", *LIBRARY])
@float_dtypes
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("num_tokens, hidden, num_experts", [(1, 64, 8), (37, 7168, 256)],
                         ids=["tiny", "deepseek-v3"])
def test_router_logits_are_fp32_sums_of_the_inputs(backend, dtype, with_bias, num_tokens, hidden, num_experts):
    x, weight = rand(num_tokens, hidden, dtype=dtype), rand(num_experts, hidden, dtype=dtype, scale=0.02)
    bias = rand(num_experts, dtype=dtype) if with_bias else None
    logits = impl("router_logits", backend)(x, weight, bias)
    want = x.double() @ weight.double().t() + (0 if bias is None else bias.double())
    assert logits.dtype == torch.float32 and logits.shape == (num_tokens, num_experts)
    # fp32 accumulation whatever the input dtype: the fp32 tolerance, not bf16's.
    assert_close(logits, want, torch.float32, "accumulated")


@backends
@float_dtypes
@pytest.mark.parametrize(
    "num_tokens, num_experts, top_k, n_group, topk_group, renormalize, scaling",
    [
        (7, 256, 8, 8, 4, True, 2.5),
        (33, 64, 6, 1, 1, True, 1.0),
        (4, 96, 8, 4, 2, False, 1.5),
        (1027, 64, 6, 8, 4, True, 2.5),  # past 1024 tokens the Triton launch packs 8 rows a program
    ],
    ids=["deepseek-v3", "one-group", "no-renorm", "many-tokens"],
)
def test_grouped_topk_noaux_tc_matches_hf(
    backend, dtype, num_tokens, num_experts, top_k, n_group, topk_group, renormalize, scaling
):
    logits = distinct_logits(num_tokens, num_experts, dtype)
    bias = (torch.randperm(num_experts).float() / (4 * num_experts)).to(DEVICE)
    weights, ids = impl("grouped_topk", backend)(
        logits, top_k, n_group, topk_group, renormalize, "sigmoid", bias, scaling
    )
    want_weights, want_ids = hf_deepseek_v3_router(
        logits, bias, top_k, n_group, topk_group, renormalize, scaling
    )
    got_w, got_ids = sort_by_expert(weights, ids)
    want_w, want_ids = sort_by_expert(want_weights, want_ids)
    assert torch.equal(got_ids, want_ids)
    assert_close(got_w, want_w, torch.float32)


@backends
def test_grouped_topk_without_bias_uses_group_max(backend):
    """DeepSeek-V2 group-limited greedy: softmax scores, a group scores its best expert."""
    logits = distinct_logits(9, 64, torch.float32)
    weights, ids = impl("grouped_topk", backend)(logits, 6, 8, 3, False, "softmax", None, 1.0)
    probs = torch.softmax(logits.double(), -1)
    best_groups = probs.view(9, 8, 8).amax(-1).topk(3, dim=-1).indices
    allowed = torch.zeros(9, 8, dtype=torch.bool, device=DEVICE).scatter_(1, best_groups, True)
    masked = probs.masked_fill(~allowed.repeat_interleave(8, dim=1), 0.0)
    want_w, want_ids = sort_by_expert(*masked.topk(6, dim=-1))
    got_w, got_ids = sort_by_expert(weights, ids)
    assert torch.equal(got_ids, want_ids)
    assert_close(got_w, want_w, torch.float32)


@pytest.mark.gpu
def test_routing_warm_up_token_counts_compile_what_any_batch_size_runs():
    """Routing each count of ROUTING_WARM_UP_TOKENS compiles every variant of the routing kernels:
    no later token count compiles another (the glues' start-up warm-up routes those counts)."""
    from atom_kernels import routing

    bias = torch.zeros(64, device=DEVICE)

    def route(num_tokens: int) -> None:
        logits = distinct_logits(num_tokens, 64, torch.float32)
        impl("grouped_topk", "triton")(logits, 6, 1, 1, True, "sigmoid", bias, 2.5)
        impl("topk_softmax", "triton")(logits, 6, True)

    def variants() -> int:
        return compiled_variants(routing._grouped_topk_kernel, routing._topk_softmax_kernel)

    for num_tokens in atom_kernels.ROUTING_WARM_UP_TOKENS:
        route(num_tokens)
    compiled = variants()
    for num_tokens in (1, 3, 64, 256, 1024, 1025, 2048, 8192, 16385):
        route(num_tokens)
    assert variants() == compiled


def reference_moe(
    x, w13, w2, weights, ids, activation="silu", w13_bias=None, w2_bias=None, fake_quant=None
):
    """Token by token in float64: sum_k w_k * (act(x @ w13[e].T) @ w2[e].T), [gate | up] halves.
    ``fake_quant`` rounds the inputs of both products (the hidden row after rounding it to x's dtype,
    where the op stores it)."""
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    inter = w13.shape[1] // 2
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            x_t = x[t] if fake_quant is None else fake_quant(x[t])
            h = w13[e].double() @ x_t.double()
            if w13_bias is not None:
                h = h + w13_bias[e].double()
            gate, up = h[:inter], h[inter:]
            act = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
            hidden = act * up if fake_quant is None else fake_quant((act * up).to(x.dtype))
            y = w2[e].double() @ hidden.double()
            if w2_bias is not None:
                y = y + w2_bias[e].double()
            out[t] += weights[t, k].double() * y
    return out


def routing(num_tokens: int, num_experts: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(num_tokens)])
    weights = torch.rand(num_tokens, top_k).softmax(-1)
    return weights.to(DEVICE), ids.to(device=DEVICE, dtype=torch.int32)


MOE_SHAPES = [
    # num_tokens, hidden, intermediate, num_experts, top_k
    (1, 64, 32, 8, 2),
    (23, 128, 96, 8, 3),
    (70, 64, 48, 4, 2),  # more than 16 rows per expert: the larger tile config
    (5, 96, 40, 16, 4),  # sizes that are not multiples of the tiles
]


@backends
@float_dtypes
@pytest.mark.parametrize("num_tokens, hidden, inter, num_experts, top_k", MOE_SHAPES)
def test_fused_moe(backend, dtype, num_tokens, hidden, inter, num_experts, top_k):
    x = rand(num_tokens, hidden, dtype=dtype)
    w13 = rand(num_experts, 2 * inter, hidden, dtype=dtype, scale=hidden**-0.5)
    w2 = rand(num_experts, hidden, inter, dtype=dtype, scale=inter**-0.5)
    weights, ids = routing(num_tokens, num_experts, top_k)
    out = impl("fused_moe", backend)(x, w13, w2, weights, ids)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close(out, reference_moe(x, w13, w2, weights, ids), dtype, "accumulated")


@pytest.mark.gpu
def test_warm_up_compiles_what_any_batch_size_runs():
    """After warm_up_fused_moe no batch size compiles another variant of the fused MoE or of the
    align that sorts its entries (tile configs change with the token count, the align's chunking with
    the entry count: up to 16384 entries and above)."""
    from atom_kernels import moe, moe_align, moe_reduce

    hidden, inter, num_experts, top_k = 256, 128, 64, 10
    w13 = rand(num_experts, 2 * inter, hidden, dtype=torch.bfloat16, scale=hidden**-0.5)
    w2 = rand(num_experts, hidden, inter, dtype=torch.bfloat16, scale=inter**-0.5)

    def variants() -> int:
        return compiled_variants(*[value for module in (moe, moe_align, moe_reduce)
                                   for value in vars(module).values()
                                   if hasattr(value, "device_caches")])

    atom_kernels.warm_up_fused_moe(w13, w2, top_k)
    compiled = variants()
    for num_tokens in (1, 7, 64, 300, 1000, 1700, 4096, 8192):
        weights, ids = routing(num_tokens, num_experts, top_k)
        impl("fused_moe", "triton")(rand(num_tokens, hidden, dtype=torch.bfloat16), w13, w2, weights, ids)
    assert variants() == compiled


@backends
def test_fused_moe_gelu_with_biases(backend):
    x, w13, w2 = rand(6, 64), rand(4, 64, 64, scale=0.125), rand(4, 64, 32, scale=0.18)
    b13, b2 = rand(4, 64), rand(4, 64)
    weights, ids = routing(6, 4, 2)
    out = impl("fused_moe", backend)(
        x, w13, w2, weights, ids, activation="gelu_tanh", w13_bias=b13, w2_bias=b2
    )
    want = reference_moe(x, w13, w2, weights, ids, "gelu_tanh", b13, b2)
    assert_close(out, want, torch.float32, "accumulated")


@backends
@float_dtypes
def test_fused_moe_gpt_oss_matches_hf(backend, dtype):
    """GPT-OSS experts: interleaved gate/up rows, biases, clamped SwiGLU, against HF's GptOssExperts."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    num_tokens, hidden, inter, num_experts, top_k = 11, 64, 48, 8, 4
    config = transformers.GptOssConfig(
        hidden_size=hidden, intermediate_size=inter, num_local_experts=num_experts
    )
    experts = GptOssExperts(config).to(DEVICE)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    x = rand(num_tokens, hidden, dtype=dtype)
    weights, ids = routing(num_tokens, num_experts, top_k)
    with torch.no_grad():
        expected = experts(x.double().float(), router_indices=ids.long(), routing_weights=weights)
    # HF keeps gate_up_proj as [E, D, 2I] with gate/up interleaved along 2I; ours is [E, 2I, D].
    w13 = experts.gate_up_proj.detach().transpose(1, 2).contiguous().to(dtype)
    w2 = experts.down_proj.detach().transpose(1, 2).contiguous().to(dtype)
    out = impl("fused_moe", backend)(
        x,
        w13,
        w2,
        weights,
        ids,
        activation="clamped_swiglu",
        interleaved=True,
        w13_bias=experts.gate_up_proj_bias.detach().to(dtype),
        w2_bias=experts.down_proj_bias.detach().to(dtype),
        swiglu_alpha=experts.alpha,
        swiglu_limit=experts.limit,
    )
    if dtype == torch.float32:
        assert_close(out, expected, dtype, "accumulated")
    else:
        # HF ran in fp32 on unrounded weights; ours saw bf16 weights: compare loosely.
        torch.testing.assert_close(
            out.float(), expected, rtol=5e-2, atol=5e-2 * expected.abs().max().item()
        )


FP8 = torch.float8_e4m3fn


def quantize_weights_fp8(w: torch.Tensor, block_size: int):
    """(fp8 w, fp32 scales, dequantized fp32 w), scale = amax / 448 per block_size x block_size block
    of each expert's weight (partial blocks at the edges), or per row with block_size 0 ([E, rows, 1])."""
    experts, rows, cols = w.shape
    block_rows, block_cols = (block_size, block_size) if block_size else (1, cols)
    blocks = F.pad(w, (0, -cols % block_cols, 0, -rows % block_rows))
    blocks = blocks.unflatten(2, (-1, block_cols)).unflatten(1, (-1, block_rows))
    scale = blocks.abs().amax(dim=(2, 4)) / 448
    expanded = scale.repeat_interleave(block_rows, 1).repeat_interleave(block_cols, 2)
    expanded = expanded[:, :rows, :cols]
    q = (w / expanded).clamp(-448, 448).to(FP8)
    return q, scale, q.float() * expanded


def fake_quant_fp8(v: torch.Tensor, block_size: int) -> torch.Tensor:
    """fp32 ``v`` rounded through fp8 with scale = amax / 448 per group of block_size channels (the
    last one partial), or per row with block_size 0."""
    width = v.shape[-1]
    group = block_size or width
    groups = F.pad(v.float(), (0, -width % group)).unflatten(-1, (-1, group))
    # The correctly rounded quotient, as the op computes it (CUDA divides by a scalar through its
    # reciprocal).
    scale = (groups.abs().amax(-1, keepdim=True).double() / 448).float()
    return ((groups / scale).clamp(-448, 448).to(FP8).float() * scale).flatten(-2)[..., :width]


def fp8_experts(num_experts: int, hidden: int, inter: int, block_size: int):
    """Random FP8 w13 [E, 2I, D] and w2 [E, D, I]: (w13, w13_scale, w13 dequantized, w2, ...)."""
    w13 = rand(num_experts, 2 * inter, hidden, scale=hidden**-0.5)
    w2 = rand(num_experts, hidden, inter, scale=inter**-0.5)
    return (*quantize_weights_fp8(w13, block_size), *quantize_weights_fp8(w2, block_size))


@pytest.mark.parametrize("block_size", [0, 32, 128], ids=["per-channel", "block32", "block128"])
def test_fused_moe_fp8_torch_reference(block_size):
    num_tokens, hidden, inter, num_experts, top_k = 9, 256, 160, 4, 2  # I: 1.25 blocks of 128
    x = rand(num_tokens, hidden, dtype=torch.bfloat16)
    w13, w13_scale, w13_deq, w2, w2_scale, w2_deq = fp8_experts(num_experts, hidden, inter, block_size)
    weights, ids = routing(num_tokens, num_experts, top_k)
    out = impl("fused_moe", "torch")(
        x, w13, w2, weights, ids, w13_scale=w13_scale, w2_scale=w2_scale, block_size=block_size
    )
    assert out.dtype == torch.bfloat16
    want = reference_moe(
        x, w13_deq, w2_deq, weights, ids, fake_quant=lambda v: fake_quant_fp8(v, block_size)
    )
    assert_close(out, want, torch.bfloat16, "accumulated")
    # Against the bf16 op on the dequantized weights: e4m3 keeps 3 mantissa bits, so quantizing an
    # activation moves it by up to 2^-4 of its value (about 2.5% rms); with both GEMMs' inputs
    # quantized the output is off by about 4% in norm: allow 8%.
    unquantized = impl("fused_moe", "torch")(
        x, w13_deq.to(torch.bfloat16), w2_deq.to(torch.bfloat16), weights, ids
    )
    error = (out.float() - unquantized.float()).norm() / unquantized.float().norm()
    assert error < 0.08


FP8_MOE_CASES = [
    # num_tokens, hidden, inter, num_experts, top_k, block_size, interleaved, biases, activation
    (1, 128, 64, 4, 1, 128, False, False, "silu"),  # I < B: gate and up rows share a scale block
    (19, 256, 128, 4, 2, 128, True, True, "clamped_swiglu"),  # GPT-OSS-style, 19 rows: padding
    (5, 96, 48, 8, 2, 32, False, True, "gelu_tanh"),  # I = 1.5 blocks: one spans gate and up
    (37, 80, 64, 4, 2, 32, True, False, "silu"),  # D = 2.5 blocks; >16 rows per expert: BLOCK_M 32
    (1, 64, 32, 4, 1, 0, False, False, "silu"),
    (19, 96, 40, 4, 2, 0, True, True, "clamped_swiglu"),
    (6, 64, 48, 8, 2, 0, False, True, "gelu"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "num_tokens, hidden, inter, num_experts, top_k, block_size, interleaved, biases, activation",
    FP8_MOE_CASES,
)
def test_fused_moe_fp8_triton_matches_torch(
    dtype, num_tokens, hidden, inter, num_experts, top_k, block_size, interleaved, biases, activation
):
    x = rand(num_tokens, hidden, dtype=dtype)
    w13, w13_scale, _, w2, w2_scale, _ = fp8_experts(num_experts, hidden, inter, block_size)
    if block_size == 0:
        w13_scale = w13_scale.squeeze(-1)  # per-row scales as [E, rows] (w2's as [E, rows, 1])
    weights, ids = routing(num_tokens, num_experts, top_k)
    options = {"activation": activation, "interleaved": interleaved, "block_size": block_size}
    options.update(w13_scale=w13_scale, w2_scale=w2_scale)
    if biases:
        options.update(
            w13_bias=rand(num_experts, 2 * inter, dtype=dtype),
            w2_bias=rand(num_experts, hidden, dtype=dtype),
        )
    out = impl("fused_moe", "triton")(x, w13, w2, weights, ids, **options)
    assert out.shape == x.shape and out.dtype == dtype
    want = impl("fused_moe", "torch")(x, w13, w2, weights, ids, **options)
    assert_close(out, want, dtype, "accumulated")


def test_fused_moe_fp8_aiter_adapter_runs_triton():
    """AITER's quantized MoE is not wired up: FP8 experts run the Triton kernel (no AITER here)."""
    x = rand(3, 64, dtype=torch.bfloat16)
    w13, w13_scale, _, w2, w2_scale, _ = fp8_experts(4, 64, 32, 32)
    weights, ids = routing(3, 4, 2)
    args = (x, w13, w2, weights, ids)
    options = {"w13_scale": w13_scale, "w2_scale": w2_scale, "block_size": 32}
    out = impl("fused_moe", "aiter")(*args, **options)
    assert torch.equal(out, impl("fused_moe", "triton")(*args, **options))


@backends
def test_fused_moe_fp8_errors_name_the_tensor(backend):
    x = rand(3, 64, dtype=torch.bfloat16)
    w13, w13_scale, w13_deq, w2, w2_scale, _ = fp8_experts(4, 64, 32, 32)
    weights, ids = routing(3, 4, 2)
    block = {"w13_scale": w13_scale, "w2_scale": w2_scale, "block_size": 32}
    wrong = [
        (w13, block | {"w2_scale": w2_scale[:, :1]},
         r"w2_scale is torch.float32 \(4, 1, 1\), expected float32 \(4, 2, 1\)"),
        (w13, block | {"block_size": 0}, r"w13_scale .* \(one scale per row\)"),
        (w13, block | {"w13_scale": w13_scale.double()}, "w13_scale is torch.float64"),
        (w13, block | {"w2_scale": None}, "w2 is torch.float8_e4m3fn and needs w2_scale"),
        (w13, {}, "w13 is torch.float8_e4m3fn and needs w13_scale"),
        (w13, block | {"block_size": 48}, "block_size 48 must be 0 or a multiple of 32"),
        (w13_deq.to(torch.bfloat16), block, "w13 is torch.bfloat16; with scales it must be"),
    ]
    for w13_arg, options, message in wrong:
        with pytest.raises(ValueError, match=message):
            impl("fused_moe", backend)(x, w13_arg, w2, weights, ids, **options)


E2M1_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def decode_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 [..., N, K] of MXFP4 ``blocks`` [..., N, K / 2] and e8m0 ``scales`` [..., N, K / 32],
    written from the format's definition: value 2j in the low nibble of byte j, 2j + 1 in the high
    one; a nibble is sign and e2m1 magnitude; each 32 values of a row times 2 ** (scale - 127)."""
    magnitudes = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64, device=blocks.device)

    def value(code: torch.Tensor) -> torch.Tensor:
        return torch.where(code >= 8, -magnitudes[code & 7], magnitudes[code & 7])

    codes = blocks.long()
    values = torch.stack([value(codes & 15), value(codes >> 4)], dim=-1).flatten(-2)
    powers = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)
    return (values * powers).float()


def mxfp4_weight(num_experts: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 [E, rows, cols]: any byte is two valid e2m1 codes; scales around 1 / sqrt(cols)
    of the typical code magnitude (about 2), one octave either way."""
    blocks = torch.randint(0, 256, (num_experts, rows, cols // 2), dtype=torch.uint8)
    center = 127 - round(math.log2(2 * cols**0.5))
    scales = torch.randint(center - 1, center + 2, (num_experts, rows, cols // 32), dtype=torch.uint8)
    return blocks.to(DEVICE), scales.to(DEVICE)


def test_dequantize_mxfp4_follows_the_format():
    blocks, scales = mxfp4_weight(3, 5, 64)
    blocks[0, 0, :8] = torch.tensor([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE], dtype=torch.uint8)
    scales[0, 0, 0] = 127
    got = atom_kernels.dequantize_mxfp4(blocks, scales, torch.float32)
    assert got[0, 0, :16].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                      -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert torch.equal(got, decode_mxfp4(blocks, scales))
    assert torch.equal(atom_kernels.dequantize_mxfp4(blocks, scales, torch.bfloat16).float(), got)


MXFP4_MOE_CASES = [
    # num_tokens, hidden, inter, num_experts, top_k, gpt_oss (interleaved, biases, clamped SwiGLU)
    (1, 64, 32, 4, 1, True),
    (19, 128, 64, 8, 2, True),  # 19 rows: padding in the sorted blocks
    (37, 96, 64, 4, 2, False),  # D = 3 scale blocks, not a multiple of BLOCK_K; > 16 rows per expert
]


@backends
@float_dtypes
@pytest.mark.parametrize("num_tokens, hidden, inter, num_experts, top_k, gpt_oss", MXFP4_MOE_CASES)
def test_fused_moe_mxfp4_matches_the_dequantized_weights(
    backend, dtype, num_tokens, hidden, inter, num_experts, top_k, gpt_oss
):
    """MXFP4 experts against the op on the same weights dequantized to x's dtype (exact there):
    weight-only, so both compute the same products."""
    x = rand(num_tokens, hidden, dtype=dtype)
    w13, w13_scale = mxfp4_weight(num_experts, 2 * inter, hidden)
    w2, w2_scale = mxfp4_weight(num_experts, hidden, inter)
    weights, ids = routing(num_tokens, num_experts, top_k)
    options = {}
    if gpt_oss:
        options = {"activation": "clamped_swiglu", "interleaved": True, "swiglu_limit": 1.0,
                   "w13_bias": rand(num_experts, 2 * inter, dtype=dtype),
                   "w2_bias": rand(num_experts, hidden, dtype=dtype)}
    out = impl("fused_moe", backend)(x, w13, w2, weights, ids, w13_scale=w13_scale,
                                     w2_scale=w2_scale, weight_format="mxfp4", **options)
    assert out.shape == x.shape and out.dtype == dtype
    w13_deq, w2_deq = decode_mxfp4(w13, w13_scale), decode_mxfp4(w2, w2_scale)
    want = impl("fused_moe", "torch")(x, w13_deq.to(dtype), w2_deq.to(dtype), weights, ids, **options)
    assert_close(out, want, dtype, "accumulated")
    if not gpt_oss:
        assert_close(out, reference_moe(x, w13_deq, w2_deq, weights, ids), dtype, "accumulated")


def test_register_decoding_takes_scales_whose_codes_it_covers():
    """The MXFP4 GEMMs decode in registers only for scale tensors whose every e8m0 code lies within
    REGISTER_DECODE_CODES; the check is kept per tensor until it changes, a view is judged by its
    base, and an alias of a checked tensor (another object at its address) gets its answer."""
    low, high = atom_kernels.mxfp4.REGISTER_DECODE_CODES
    scales = torch.full((2, 8, 4), low, dtype=torch.uint8, device=DEVICE)
    scales[1] = high
    assert atom_kernels.moe._codes_in_register_range(scales)
    assert atom_kernels.moe._codes_in_register_range(scales.unsqueeze(0))
    scales[0, 0, 0] = high + 1  # in place: a new version of the tensor, checked again
    assert not atom_kernels.moe._codes_in_register_range(scales)
    scales[0, 0, 0] = low - 1
    assert not atom_kernels.moe._codes_in_register_range(scales[1:])  # its base has the code
    assert atom_kernels.moe._codes_in_register_range(scales[1:].clone())
    assert not atom_kernels.moe._codes_in_register_range(scales.detach())  # an alias: the same answer


needs_sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.version.hip is not None
                                or torch.cuda.get_device_capability() < (9, 0),
                                reason="register decoding needs an NVIDIA GPU with sm_90's bf16x2 multiply")


@needs_sm90
@pytest.mark.parametrize("code", [28, 154, 155], ids=["lowest code", "highest code", "one code above"])
def test_mxfp4_register_decoding_is_exact_over_its_code_range(code):
    """A weight whose every block has scale code ``code`` (the MXFP4 linear: the MoE's GEMM kernel,
    linear in the scale): at both ends of REGISTER_DECODE_CODES it decodes in registers, above them
    it takes the microscaled dot; either way the result equals the dequantized weight's. Compared
    after scaling by 2 ** (127 - code), exact for powers of two, so the tolerance is the usual one at
    both ends (the outputs are about 2 ** -92 at code 28)."""
    low, high = atom_kernels.mxfp4.REGISTER_DECODE_CODES
    x = rand(5, 64, dtype=torch.bfloat16)
    weight, scale = (t[0] for t in mxfp4_weight(1, 96, 64))
    scale.fill_(code)
    assert atom_kernels.moe.mx_register_decode(x, scale, 16) == (low <= code <= high)
    got = impl("mxfp4_linear", "triton")(x, weight, scale)
    want = impl("mxfp4_linear", "torch")(x, weight, scale)
    unit = 2.0 ** (127 - code)
    assert want.abs().max().item() * unit > 1  # nonzero, normal: the comparison has something to see
    assert_close(got.float() * unit, want.float() * unit, torch.bfloat16, "accumulated")


def test_fused_moe_mxfp4_aiter_adapter_runs_triton():
    x = rand(3, 64, dtype=torch.bfloat16)
    (w13, w13_scale), (w2, w2_scale) = mxfp4_weight(4, 64, 64), mxfp4_weight(4, 64, 32)
    weights, ids = routing(3, 4, 2)
    args = (x, w13, w2, weights, ids)
    options = {"w13_scale": w13_scale, "w2_scale": w2_scale, "weight_format": "mxfp4"}
    out = impl("fused_moe", "aiter")(*args, **options)
    assert torch.equal(out, impl("fused_moe", "triton")(*args, **options))


@backends
def test_fused_moe_mxfp4_errors_name_the_tensor(backend):
    x = rand(3, 64, dtype=torch.bfloat16)
    (w13, w13_scale), (w2, w2_scale) = mxfp4_weight(4, 64, 64), mxfp4_weight(4, 64, 32)
    weights, ids = routing(3, 4, 2)
    mxfp4 = {"w13_scale": w13_scale, "w2_scale": w2_scale, "weight_format": "mxfp4"}
    wrong = [
        (w13, mxfp4 | {"w2_scale": w2_scale[:, :, :0]},
         r"w2_scale is torch.uint8 \(4, 64, 0\), expected uint8 \(4, 64, 1\)"),
        (w13, mxfp4 | {"w13_scale": w13_scale.float()}, "w13_scale is torch.float32"),
        (w13, mxfp4 | {"w2_scale": None}, "MXFP4 w2 needs w2_scale"),
        (w13, mxfp4 | {"block_size": 32}, "block_size 32 is FP8's"),
        (w13, mxfp4 | {"weight_format": "nvfp4"}, "weight_format 'nvfp4'"),
        (w13, {"w13_scale": w13_scale, "w2_scale": w2_scale}, "uint8 weights are MXFP4 only"),
        (w13[:, :, :16], mxfp4, r"two values per byte along K"),
    ]
    for w13_arg, options, message in wrong:
        with pytest.raises(ValueError, match=message):
            impl("fused_moe", backend)(x, w13_arg, w2, weights, ids, **options)
    x48 = rand(3, 48, dtype=torch.bfloat16)
    (w13, w13_scale), (w2, w2_scale) = mxfp4_weight(4, 64, 48), mxfp4_weight(4, 48, 32)
    with pytest.raises(ValueError, match="MXFP4 needs D 48 and I 32 to be multiples of 32"):
        impl("fused_moe", backend)(x48, w13, w2, weights, ids, w13_scale=w13_scale,
                                   w2_scale=w2_scale, weight_format="mxfp4")


@pytest.mark.parametrize("weight_format", ["bf16", "fp8-block32", "mxfp4"])
@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_sums_what_one_program_computes(weight_format, split_k):
    """SPLIT_K cuts K among programs; partial sums meet in fp32 (the gate/up partials in
    reduce_gated_partials, the down ones with the top-k rows), so the output matches the unsplit
    config up to summation order. K = 128 in steps of 32: with 3 splits of 2 steps the last split
    gets none. GPT-OSS options: biases added once, interleaved rows, clamped SwiGLU after the sum."""
    from atom_kernels.moe import run_fused_moe

    num_tokens, hidden, inter, num_experts, top_k = 5, 128, 128, 4, 2
    dtype = torch.bfloat16
    x = rand(num_tokens, hidden, dtype=dtype)
    weights, ids = routing(num_tokens, num_experts, top_k)
    options = {"act": 3, "interleaved": True, "alpha": 1.702, "limit": 1.0,
               "w13_bias": rand(num_experts, 2 * inter, dtype=dtype),
               "w2_bias": rand(num_experts, hidden, dtype=dtype)}
    if weight_format == "mxfp4":
        (w13, w13_scale), (w2, w2_scale) = (mxfp4_weight(num_experts, 2 * inter, hidden),
                                            mxfp4_weight(num_experts, hidden, inter))
        options.update(w13_scale=w13_scale, w2_scale=w2_scale, weight_format="mxfp4")
    elif weight_format == "fp8-block32":
        w13, w13_scale, _, w2, w2_scale, _ = fp8_experts(num_experts, hidden, inter, 32)
        options.update(w13_scale=w13_scale, w2_scale=w2_scale, block_size=32)
    else:
        w13 = rand(num_experts, 2 * inter, hidden, dtype=dtype, scale=hidden**-0.5)
        w2 = rand(num_experts, hidden, inter, dtype=dtype, scale=inter**-0.5)

    def config(split: int) -> dict:
        tiles = {"BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2,
                 "SPLIT_K": split}
        return {"BLOCK_M": 16, "gate_up": tiles, "down": tiles}

    unsplit = run_fused_moe(x, w13, w2, weights, ids, config(1), **options)
    split = run_fused_moe(x, w13, w2, weights, ids, config(split_k), **options)
    assert split.dtype == dtype
    assert_close(split, unsplit, dtype, "accumulated")


def bf16_or_fp8_experts(weight_format: str, num_experts: int, hidden: int, inter: int):
    """(w13, w2, fused_moe's scale arguments) of bf16, per-channel FP8 or 32-block FP8 experts."""
    if weight_format == "bf16":
        return (rand(num_experts, 2 * inter, hidden, dtype=torch.bfloat16, scale=hidden**-0.5),
                rand(num_experts, hidden, inter, dtype=torch.bfloat16, scale=inter**-0.5), {})
    block_size = 32 if weight_format == "fp8-block32" else 0
    w13, w13_scale, _, w2, w2_scale, _ = fp8_experts(num_experts, hidden, inter, block_size)
    return w13, w2, {"w13_scale": w13_scale, "w2_scale": w2_scale, "block_size": block_size}


@pytest.mark.parametrize("weight_format", ["bf16", "fp8-channel", "fp8-block32"])
@pytest.mark.parametrize("split_k", [1, 2])
def test_swapped_tiles_compute_what_the_unswapped_do(weight_format, split_k):
    """SWAP_AB tiles (the weight tile times the rows, _dense_step) give the unswapped output up to
    summation order: gated and plain GEMMs, biases, interleaved rows, split K; padding rows of a
    16-row block (7 tokens x top 2 over 4 experts) are dropped. MXFP4 tiles have no swapped form."""
    from atom_kernels.moe import run_fused_moe

    num_tokens, hidden, inter, num_experts, top_k = 7, 128, 96, 4, 2
    dtype = torch.bfloat16
    x = rand(num_tokens, hidden, dtype=dtype)
    weights, ids = routing(num_tokens, num_experts, top_k)
    options = {"act": 3, "interleaved": True, "alpha": 1.702, "limit": 1.0,
               "w13_bias": rand(num_experts, 2 * inter, dtype=dtype), "w2_bias": rand(num_experts, hidden, dtype=dtype)}
    w13, w2, scales = bf16_or_fp8_experts(weight_format, num_experts, hidden, inter)
    options.update(scales)

    def config(swap: bool) -> dict:
        tiles = {"BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "SPLIT_K": split_k,
                 "SWAP_AB": swap}
        return {"BLOCK_M": 16, "gate_up": tiles, "down": tiles}

    swapped = run_fused_moe(x, w13, w2, weights, ids, config(True), **options)
    assert_close(swapped, run_fused_moe(x, w13, w2, weights, ids, config(False), **options), dtype, "accumulated")
    (w13, w13_scale), (w2, w2_scale) = mxfp4_weight(num_experts, 2 * inter, hidden), mxfp4_weight(num_experts, hidden,
                                                                                                  inter)
    with pytest.raises(ValueError, match="SWAP_AB is for bf16 and fp8 weights"):
        run_fused_moe(x, w13, w2, weights, ids, config(True), w13_scale=w13_scale, w2_scale=w2_scale,
                      weight_format="mxfp4")


@pytest.mark.parametrize("weight_format", ["bf16", "fp8-channel", "fp8-block32"])
def test_plain_gate_up_computes_what_the_gated_does(weight_format):
    """PLAIN gate/up tiles (one GEMM over the 2I stacked rows, then SiLU * mul, quantized for the down
    GEMM with FP8 experts: plain_gate_up) match the gated kernel up to the bf16 rounding of gate and up
    before the activation; they refuse what the activation launch does not do."""
    from atom_kernels.moe import run_fused_moe, servable_config

    num_tokens, hidden, inter, num_experts, top_k = 7, 128, 96, 4, 2
    dtype = torch.bfloat16
    x = rand(num_tokens, hidden, dtype=dtype)
    weights, ids = routing(num_tokens, num_experts, top_k)
    options = {}
    w13, w2, scales = bf16_or_fp8_experts(weight_format, num_experts, hidden, inter)
    options.update(scales)

    def config(plain: bool, **extra) -> dict:
        tiles = {"BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
        return {"BLOCK_M": 16, "gate_up": {**tiles, "PLAIN": plain, **extra}, "down": tiles}

    plain = run_fused_moe(x, w13, w2, weights, ids, config(True), **options)
    assert plain.dtype == dtype
    assert_close(plain, run_fused_moe(x, w13, w2, weights, ids, config(False), **options), dtype, "accumulated")
    for unsupported in ({"act": 3}, {"interleaved": True}, {"w13_bias": rand(num_experts, 2 * inter, dtype=dtype)}):
        with pytest.raises(ValueError, match="PLAIN gate/up tiles are for SiLU"):
            run_fused_moe(x, w13, w2, weights, ids, config(True), **options, **unsupported)
    with pytest.raises(ValueError, match="PLAIN gate/up tiles take no SPLIT_K"):
        run_fused_moe(x, w13, w2, weights, ids, config(True, SPLIT_K=2), **options)
    # A table's PLAIN entry reaches a layer it does not suit (same shape key) in the gated form.
    assert servable_config(config(True), True) == config(True)
    served = servable_config(config(True), False)
    assert served["gate_up"] == {k: v for k, v in config(True)["gate_up"].items() if k != "PLAIN"}
    assert served["down"] == config(True)["down"]


@triton.jit
def _decode_e2m1_kernel(codes_ptr, out_ptr):
    i = tl.arange(0, 16)
    tl.store(out_ptr + i, e2m1_to_float_scaled(tl.load(codes_ptr + i).to(tl.uint16)))


def test_e2m1_fp16_decoding_is_exact():
    """Each code's bits moved into an fp16 read 2 ** -14 times its value (exponent 0 as fp16's
    subnormal)."""
    from atom_kernels.mxfp4 import E2M1_VALUES

    codes = torch.arange(16, dtype=torch.int16, device=DEVICE)
    out = torch.empty(16, dtype=torch.float32, device=DEVICE)
    _decode_e2m1_kernel[(1,)](codes, out)
    assert (out * 2.0**14).tolist() == list(E2M1_VALUES)


@pytest.mark.parametrize("num_tokens, hidden, inter, gpt_oss", [(1, 64, 32, True), (3, 96, 64, False),
                                                               (2, 128, 96, True)])
def test_mxfp4_gemv_matches_the_dequantized_weights(num_tokens, hidden, inter, gpt_oss):
    """The matrix-vector path for a few tokens (a ``"GEMV"`` config): every e2m1 code and scale decoded
    exactly, K (96) not a multiple of BLOCK_K (64), N not a multiple of BLOCK_N (I = 96 of 64)."""
    from atom_kernels.moe import run_fused_moe

    num_experts, top_k, dtype = 4, 2, torch.bfloat16
    x = rand(num_tokens, hidden, dtype=dtype)
    (w13, w13_scale), (w2, w2_scale) = (mxfp4_weight(num_experts, 2 * inter, hidden),
                                        mxfp4_weight(num_experts, hidden, inter))
    weights, ids = routing(num_tokens, num_experts, top_k)
    act = {"act": 3, "interleaved": True, "alpha": 1.702, "limit": 1.0} if gpt_oss else {"act": 0}
    biases = {}
    if gpt_oss:
        biases = {"w13_bias": rand(num_experts, 2 * inter, dtype=dtype),
                  "w2_bias": rand(num_experts, hidden, dtype=dtype)}
    tiles = {"BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4}
    out = run_fused_moe(x, w13, w2, weights, ids, {"GEMV": True, "gate_up": tiles, "down": tiles},
                        w13_scale=w13_scale, w2_scale=w2_scale, weight_format="mxfp4", **act, **biases)
    assert out.dtype == dtype
    w13_deq, w2_deq = decode_mxfp4(w13, w13_scale), decode_mxfp4(w2, w2_scale)
    options = {"activation": "clamped_swiglu", "interleaved": True, "swiglu_limit": 1.0} if gpt_oss else {}
    want = impl("fused_moe", "torch")(x, w13_deq.to(dtype), w2_deq.to(dtype), weights, ids, **options,
                                      **biases)
    assert_close(out, want, dtype, "accumulated")


def test_gemv_configs_are_for_mxfp4_only():
    from atom_kernels.moe import run_fused_moe

    x, w13, w2 = rand(1, 64, dtype=torch.bfloat16), rand(4, 64, 64), rand(4, 64, 32)
    weights, ids = routing(1, 4, 2)
    tiles = {"BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4}
    with pytest.raises(ValueError, match="GEMV configs are for MXFP4 experts only"):
        run_fused_moe(x, w13, w2, weights, ids, {"GEMV": True, "gate_up": tiles, "down": tiles})


@backends
def test_moe_align_block_size(backend):
    ids = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 3]], device=DEVICE, dtype=torch.int32)
    sorted_ids, block_expert = impl("moe_align_block_size", backend)(ids, num_experts=5, block_m=4)
    pad = ids.numel()
    # The order within an expert's run is backend-defined: compare each block as a set.
    blocks = [sorted(row) for row in sorted_ids.view(-1, 4).tolist()]
    # expert 0: entries 1, 4; expert 1: 3; expert 2: 0, 2, 5, 6; expert 3: 7; expert 4: none.
    assert blocks[:4] == [[1, 4, pad, pad], [3, pad, pad, pad], [0, 2, 5, 6], [7, pad, pad, pad]]
    assert block_expert.tolist()[:4] == [0, 1, 2, 3]
    assert all(e == -1 for e in block_expert.tolist()[4:])
    assert all(row == [pad] * 4 for row in blocks[4:])


@backends
@pytest.mark.parametrize("num_tokens, num_experts, top_k, block_m, skewed", [
    (1, 8, 2, 16, False),  # one chunk: the one-program sort
    (128, 128, 8, 16, False),  # one full chunk of 1024 entries
    (200, 60, 4, 32, True),  # one chunk; most entries on two experts, many experts empty
    (300, 64, 6, 16, False),  # two chunks: the two-launch sort
    (512, 128, 8, 16, False),  # four full chunks
    (1500, 60, 4, 32, True),  # six chunks, skewed
    (2000, 128, 8, 64, False),  # 16 chunks of 1024 entries: two tiles of histogram rows
    (2100, 128, 8, 128, False),  # past 16384 entries: chunks of 4096
])
def test_moe_align_block_size_random(backend, num_tokens, num_experts, top_k, block_m, skewed):
    """Every entry lands once, in a block of its own expert; blocks past the runs are all padding."""
    _, ids = routing(num_tokens, num_experts, top_k)
    if skewed:
        ids = torch.where(torch.rand(ids.shape, device=DEVICE) < 0.9, ids % 2 + 7, ids)
    sorted_ids, block_expert = impl("moe_align_block_size", backend)(ids, num_experts, block_m)
    flat = ids.reshape(-1).long().cpu()
    rows, owners = sorted_ids.cpu().long(), block_expert.cpu().long()
    real = rows < flat.numel()
    assert sorted(rows[real].tolist()) == list(range(flat.numel()))
    row_owner = owners.repeat_interleave(block_m)
    assert torch.equal(row_owner[real], flat[rows[real]])
    counts = torch.bincount(flat, minlength=num_experts)
    used_blocks = (-(-counts // block_m)).sum().item()
    assert (owners[:used_blocks] >= 0).all() and (owners[used_blocks:] == -1).all()
