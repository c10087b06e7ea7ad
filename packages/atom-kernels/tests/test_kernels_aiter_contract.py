"""The aiter adapters' calls against AITER's documented signatures (no AMD GPU: nothing runs AITER).

``AITER`` records, for each AITER function an adapter calls, its signature as written in ROCm/aiter's
sources (main, commit e4048607a535, 2026-08-22; the file is given per entry) and the tensor dtypes
and layouts its code or docstring asks for (``fused_moe`` and ``mla_decode_fwd`` are cut after
the parameters an adapter could reach; all that follow have defaults). A stand-in ``aiter`` package is built from those
signatures: each function binds its arguments with ``inspect.Signature.bind`` (a wrong name, order or
count fails), checks the tensors, records the call and returns outputs of the documented shapes.
This says the adapters call AITER as documented; it says nothing about AITER's numerics.
"""

import inspect
import sys
import types

import pytest
import torch
from kernel_testing import cu_seqlens, impl, paged_layout

CPU = torch.device("cpu")
FP8 = torch.float8_e4m3fn
I32, F32, BF16 = torch.int32, torch.float32, torch.bfloat16

# AITER's enums come from its compiled core; the stand-in needs their member names only.
ActivationType = types.SimpleNamespace(Silu="Silu", Gelu="Gelu")
QuantType = types.SimpleNamespace(No="No", per_Tensor="per_Tensor", per_Token="per_Token",
                                  per_1x128="per_1x128")
dtypes = types.SimpleNamespace(i8=torch.int8, bf16=BF16, fp32=F32)


def check(condition: bool, what: str) -> None:
    assert condition, what


def same_dtype(a, *names):
    for name in names[1:]:
        check(a[name].dtype == a[names[0]].dtype, f"{name} dtype {a[name].dtype} != {names[0]}'s")


def _rmsnorm2d_fwd(a):
    check(a["input"].dim() == 2 and a["input"].is_contiguous(), "input [M, N] contiguous")
    check(a["weight"].shape == a["input"].shape[-1:], "weight [N]")
    same_dtype(a, "input", "weight")
    return torch.zeros_like(a["input"])


def _rmsnorm2d_fwd_with_add(a):
    for name in ("out", "input", "residual_in", "residual_out"):
        check(a[name].dim() == 2 and a[name].shape == a["input"].shape, f"{name} [M, N]")
    same_dtype(a, "input", "out", "residual_in", "residual_out", "weight")
    a["out"].zero_()
    a["residual_out"].zero_()


def _gated(a):
    check(a["input"].shape[:-1] == a["out"].shape[:-1], "out [..., d], input [..., 2d]")
    check(a["input"].shape[-1] == 2 * a["out"].shape[-1], "input [..., 2d]")
    same_dtype(a, "input", "out")
    a["out"].zero_()


def _rope_cached_positions_2c_fwd_inplace(a):
    # aiter/ops/rope.py: inputs "sbhd", positions [s, b], cos/sin [max_pos, 1, 1, d // 2] when
    # reuse_freqs_front_part; rotate_style 0 = NEOX, 1 = GPT-J.
    x, y = a["input_x"], a["input_y"]
    check(x.dim() == 4 and y.dim() == 4 and x.shape[:2] == y.shape[:2], "input_x/input_y sbhd")
    check(a["positions"].shape == x.shape[:2], "positions [s, b]")
    for name in ("cos", "sin"):
        t = a[name]
        check(t.dim() == 4 and t.shape[1:3] == (1, 1) and t.dtype == x.dtype, f"{name} [s, 1, 1, r]")
        check(2 * t.shape[-1] <= x.shape[-1], f"{name}: rotary dim within head dim")
    check(a["rotate_style"] in (0, 1) and a["reuse_freqs_front_part"] is True, "rotate_style 0/1")
    check(a["nope_first"] is False, "rotary dims first")
    return x


def _reshape_and_cache_flash(a):
    key, cache = a["key"], a["key_cache"]
    check(key.dim() == 3 and a["value"].shape == key.shape, "key/value [T, H, D]")
    check(cache.dim() == 4 and cache.shape[2:] == key.shape[1:], "key_cache [blocks, block, H, D]")
    check(a["value_cache"].shape == cache.shape, "value_cache as key_cache")
    check(a["slot_mapping"].shape == key.shape[:1], "slot_mapping [T]")
    check(a["kv_cache_dtype"] == "auto", "kv_cache_dtype 'auto' (no fp8 cache)")
    check(a["k_scale"].dtype == F32 and a["v_scale"].dtype == F32, "fp32 scales")


def _concat_and_cache_mla(a):
    kv_c, k_pe, cache = a["kv_c"], a["k_pe"], a["kv_cache"]
    check(kv_c.dim() == 2 and k_pe.dim() == 2 and k_pe.shape[0] == kv_c.shape[0], "[T, r], [T, pe]")
    check(cache.dim() == 3 and cache.shape[2] == kv_c.shape[1] + k_pe.shape[1], "cache [b, s, r+pe]")
    check(a["kv_cache_dtype"] == "auto" and a["scale"].dtype == F32, "'auto', fp32 scale")


def _fused_qk_rope_concat_and_cache_mla(a):
    q_nope, q_pe, q_out = a["q_nope"], a["q_pe"], a["q_out"]
    check(q_nope.dim() == 3 and q_pe.dim() == 3 and q_out.dim() == 3, "q_* [T, H, d]")
    check(q_out.shape[2] == q_nope.shape[2] + q_pe.shape[2], "q_out [T, H, nope + pe]")
    check(a["kv_c"].dim() == 2 and a["k_pe"].dim() == 2, "kv_c [T, r], k_pe [T, pe]")
    check(a["kv_cache"].shape[2] == a["kv_c"].shape[1] + a["k_pe"].shape[1], "cache [b, s, r+pe]")
    for name in ("cos_cache", "sin_cache"):
        t = a[name]
        check(t.dim() == 2 and 2 * t.shape[1] == q_pe.shape[2], f"{name} [max_pos, pe // 2]")
        check(t.is_contiguous() and t.dtype == q_nope.dtype, f"{name} contiguous, q's dtype")
    check(a["k_scale"].dtype == F32 and a["q_scale"].dtype == F32, "fp32 scales")
    check(isinstance(a["is_neox"], bool) and a["is_nope_first"] is True, "[nope | rope] order")
    q_out.zero_()


def _flash_attn_varlen_func(a):
    q, k = a["q"], a["k"]
    check(q.dim() == 3 and k.dim() == 3 and a["v"].shape == k.shape, "q [T, H, D], k/v [S, KH, D]")
    check(isinstance(a["max_seqlen_q"], int) and isinstance(a["max_seqlen_k"], int), "int maxima")
    check(len(a["window_size"]) == 3, "window_size (left, right, sink)")
    return torch.zeros_like(q) if a["out"] is None else a["out"]


def _unified_attention(a):
    q, k = a["q"], a["k"]
    check(q.dim() == 3 and k.dim() == 4 and a["v"].shape == k.shape, "k/v [blocks, block, KH, D]")
    check(a["out"].shape == q.shape, "out like q")
    check(a["seqused_k"].shape[0] + 1 == a["cu_seqlens_q"].shape[0], "seqused_k [B]")
    check(a["block_table"].dim() == 2, "block_table [B, max_blocks]")
    check(a["causal"] is True and len(a["window_size"]) == 2, "causal, (left, right)")
    check(isinstance(a["max_seqlen_q"], int) and isinstance(a["max_seqlen_k"], int), "int maxima")
    a["out"].zero_()


def _mla_decode_fwd(a):
    q, kv, o = a["q"], a["kv_buffer"], a["o"]
    check(q.dim() == 3 and o.shape == (*q.shape[:2], o.shape[2]), "q [T, H, D], o [T, H, rank]")
    check(kv.dim() == 4 and kv.shape[1] == a["page_size"] and kv.shape[2] == a["nhead_kv"] == 1,
          "kv_buffer [pages, page_size, 1, D]")
    for name in ("kv_indptr", "kv_indices", "kv_last_page_lens"):
        check(a[name].dtype == I32 and a[name].dim() == 1, f"{name} int32 [n]")
    check(a["kv_indptr"].shape[0] == a["qo_indptr"].shape[0], "kv_indptr [B + 1]")
    check(int(a["kv_indptr"][-1]) == a["kv_indices"].shape[0], "kv_indices: all pages")
    lens = a["kv_last_page_lens"]
    check(bool(((lens >= 1) & (lens <= a["page_size"])).all()), "last page fill in 1..page_size")
    o.zero_()


def _routing_outputs(a, weights, ids):
    check(a[weights].dtype == F32 and a[ids].dtype == I32, f"{weights} fp32, {ids} int32")
    check(a[weights].shape == a[ids].shape and a[ids].shape[0] == a["gating_output"].shape[0],
          "[T, top_k] outputs")
    a[weights].fill_(1.0)
    a[ids].zero_()


def _topk_softmax(a):
    check(a["token_expert_indices"].dtype == I32, "token_expert_indices int32")
    _routing_outputs(a, "topk_weights", "topk_indices")


def _grouped_topk(a):
    check(isinstance(a["is_softmax"], bool), "is_softmax bool")
    _routing_outputs(a, "topk_weights", "topk_ids")


def _biased_grouped_topk(a):
    check(a["correction_bias"].shape == a["gating_output"].shape[1:], "correction_bias [E]")
    same_dtype(a, "gating_output", "correction_bias")
    _routing_outputs(a, "topk_weights", "topk_ids")


def _fused_moe(a):
    x, w1, w2 = a["hidden_states"], a["w1"], a["w2"]
    check(w1.shape[2] == x.shape[1] and w2.shape[1] == x.shape[1], "w1 [E, 2I, D], w2 [E, D, I]")
    check(w1.shape[1] == 2 * w2.shape[2], "w1 [gate | up] rows")
    check(a["topk_weight"].dtype == F32 and a["topk_ids"].dtype == I32, "fp32 weights, int32 ids")
    check(a["activation"] in ("Silu", "Gelu"), "an ActivationType")
    return torch.zeros_like(x)


def _quant(scale_shape):
    def run(a):
        x = a["x"]
        check(a["quant_dtype"] == FP8, "fp8 output")
        return torch.zeros(x.shape, dtype=FP8), torch.ones(scale_shape(x), dtype=F32)

    return run


def _gemm_a8w8(a):
    xq, wq = a["XQ"], a["WQ"]
    check(xq.dtype == wq.dtype == FP8 and xq.shape[1] == wq.shape[1], "XQ [M, K], WQ [N, K] fp8")
    check(a["x_scale"].shape == (xq.shape[0], 1) and a["x_scale"].dtype == F32, "x_scale [M, 1]")
    check(a["w_scale"].shape == (1, wq.shape[0]) and a["w_scale"].dtype == F32, "w_scale [1, N]")
    return torch.zeros((xq.shape[0], wq.shape[0]), dtype=a["dtype"])


def _gemm_a8w8_blockscale(a):
    xq, wq = a["XQ"], a["WQ"]
    check(xq.dtype == wq.dtype == FP8, "fp8 XQ, WQ")
    check(a["x_scale"].shape == (xq.shape[0], xq.shape[1] // 128), "x_scale [M, K / 128]")
    check(a["w_scale"].shape == (wq.shape[0] // 128, wq.shape[1] // 128), "w_scale [N/128, K/128]")
    check(a["dtype"] in (BF16, torch.float16), "bf16/fp16 output")
    return torch.zeros((xq.shape[0], wq.shape[0]), dtype=a["dtype"])


# module path -> function -> (file in ROCm/aiter, signature as written there, check and result)
AITER = {
    "aiter": {
        "rmsnorm2d_fwd": ("aiter/ops/rmsnorm.py",
                          "input, weight, epsilon, use_model_sensitive_rmsnorm=0", _rmsnorm2d_fwd),
        "rmsnorm2d_fwd_with_add": (
            "aiter/ops/rmsnorm.py",
            "out, input, residual_in, residual_out, weight, epsilon, gemma_norm=False,"
            " use_model_sensitive_rmsnorm=0", _rmsnorm2d_fwd_with_add),
        "silu_and_mul": ("aiter/ops/activation.py", "out, input, limit=0.0", _gated),
        "gelu_and_mul": ("aiter/ops/activation.py", "out, input", _gated),
        "gelu_tanh_and_mul": ("aiter/ops/activation.py", "out, input", _gated),
        "rope_cached_positions_2c_fwd_inplace": (
            "aiter/ops/rope.py",
            "input_x, input_y, cos, sin, positions, rotate_style, reuse_freqs_front_part, nope_first",
            _rope_cached_positions_2c_fwd_inplace),
        "reshape_and_cache_flash": (
            "aiter/ops/cache.py",
            "key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale",
            _reshape_and_cache_flash),
        "concat_and_cache_mla": ("aiter/ops/cache.py",
                                 "kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale",
                                 _concat_and_cache_mla),
        "fused_qk_rope_concat_and_cache_mla": (
            "aiter/ops/cache.py",
            "q_nope, q_pe, kv_c, k_pe, kv_cache, q_out, slot_mapping, k_scale, q_scale, positions,"
            " cos_cache, sin_cache, is_neox, is_nope_first, compute_all_q_rope=False",
            _fused_qk_rope_concat_and_cache_mla),
        "flash_attn_varlen_func": (
            "aiter/ops/mha.py",
            "q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, min_seqlen_q=0,"
            " dropout_p=0.0, softmax_scale=None, logits_soft_cap=0.0, causal=False,"
            " window_size=(-1, -1, 0), bias=None, alibi_slopes=None, deterministic=False,"
            " return_lse=False, return_attn_probs=False, how_v3_bf16_cvt=1, block_table=None,"
            " out=None, cu_seqlens_q_padded=None, cu_seqlens_k_padded=None, sink_ptr=None",
            _flash_attn_varlen_func),
        "topk_softmax": (
            "aiter/ops/moe_op.py",
            "topk_weights, topk_indices, token_expert_indices, gating_output, need_renorm,"
            " num_shared_experts=0, shared_expert_scoring_func=''", _topk_softmax),
        "grouped_topk": (
            "aiter/ops/topk.py",
            "gating_output, topk_weights, topk_ids, num_expert_group, topk_group, need_renorm,"
            " is_softmax=True, routed_scaling_factor=1.0", _grouped_topk),
        "biased_grouped_topk": (
            "aiter/ops/topk.py",
            "gating_output, correction_bias, topk_weights, topk_ids, num_expert_group, topk_group,"
            " need_renorm, routed_scaling_factor=1.0", _biased_grouped_topk),
        "gemm_a8w8": ("aiter/ops/gemm_op_a8w8.py",
                      "XQ, WQ, x_scale, w_scale, bias=None, dtype=dtypes.bf16, splitK=None",
                      _gemm_a8w8),
        "gemm_a8w8_blockscale": ("aiter/ops/gemm_op_a8w8.py",
                                 "XQ, WQ, x_scale, w_scale, dtype=dtypes.bf16, isBpreshuffled=False",
                                 _gemm_a8w8_blockscale),
    },
    "aiter.fused_moe": {
        "fused_moe": (
            "aiter/fused_moe.py",
            "hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None,"
            " activation=ActivationType.Silu, quant_type=QuantType.No, doweight_stage1=False,"
            " w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, block_size_M=None,"
            " num_local_tokens=None, moe_sorting_dispatch_policy=0, dtype=None, hidden_pad=0,"
            " intermediate_pad=0, bias1=None, bias2=None, splitk=0, swiglu_limit=None",
            _fused_moe),
    },
    "aiter.mla": {
        "mla_decode_fwd": (
            "aiter/mla.py",
            "q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,"
            " page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,"
            " num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,"
            " reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,"
            " kv_scale=None",
            _mla_decode_fwd),
    },
    "aiter.ops.triton.attention.unified_attention": {
        "unified_attention": (
            "aiter/ops/triton/attention/unified_attention.py",
            "q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale,"
            " causal, window_size, block_table, softcap, q_descale, k_descale, v_descale,"
            " q_scales=None, alibi_slopes=None, output_scale=None, qq_bias=None, sinks=None",
            _unified_attention),
    },
}
# aiter/ops/quant.py: get_hip_quant(QuantType) -> these (per_1x128 is per_group_quant_hip with
# group_size=128 bound).
HIP_QUANT = {
    "per_Tensor": ("x, scale=None, quant_dtype=dtypes.i8, num_rows=None, num_rows_factor=1",
                   _quant(lambda x: (1,))),
    "per_Token": ("x, scale=None, quant_dtype=dtypes.i8, num_rows=None, num_rows_factor=1",
                  _quant(lambda x: (*x.shape[:-1], 1))),
    "per_1x128": ("x, scale=None, quant_dtype=dtypes.i8, *, group_size=128, transpose_scale=False, num_rows=None,"
                  " num_rows_factor=1, scale_type=dtypes.fp32",
                  _quant(lambda x: (*x.shape[:-1], x.shape[-1] // 128))),
}


def _signature(params: str) -> inspect.Signature:
    namespace = {"ActivationType": ActivationType, "QuantType": QuantType, "dtypes": dtypes}
    return inspect.signature(eval(f"lambda {params}: None", namespace))


class Recorder:
    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def stand_in(self, name: str, params: str, run):
        signature = _signature(params)

        def fn(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)  # TypeError unless the call fits
            bound.apply_defaults()
            self.calls.append((name, dict(bound.arguments)))
            return run(bound.arguments)

        fn.__signature__ = signature
        return fn

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def aiter_stand_in(monkeypatch):
    recorder = Recorder()
    for module_name, functions in AITER.items():
        module = types.ModuleType(module_name)
        for name, (_, params, run) in functions.items():
            setattr(module, name, recorder.stand_in(name, params, run))
        monkeypatch.setitem(sys.modules, module_name, module)
    for parent in ("aiter.ops", "aiter.ops.triton", "aiter.ops.triton.attention"):
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    aiter = sys.modules["aiter"]
    aiter.ActivationType, aiter.QuantType = ActivationType, QuantType
    quant = {kind: recorder.stand_in(f"get_hip_quant({kind})", params, run)
             for kind, (params, run) in HIP_QUANT.items()}
    aiter.get_hip_quant = lambda kind: quant[kind]
    return recorder


def rand(*shape, dtype=BF16):
    return torch.randn(shape, dtype=dtype)


def test_norm_and_activation_adapters(aiter_stand_in):
    x, residual, weight = rand(3, 5, 64), rand(3, 5, 64), rand(64)
    assert impl("rms_norm", "aiter")(x, weight, 1e-6).shape == x.shape
    out, summed = impl("fused_add_rms_norm", "aiter")(x, residual, weight, 1e-6)
    assert out.shape == summed.shape == x.shape
    gate_up = rand(4, 128)
    impl("silu_and_mul", "aiter")(gate_up)
    impl("gelu_and_mul", "aiter")(gate_up, "none")
    impl("gelu_and_mul", "aiter")(gate_up, "tanh")
    assert aiter_stand_in.names() == [
        "rmsnorm2d_fwd", "rmsnorm2d_fwd_with_add", "silu_and_mul", "gelu_and_mul",
        "gelu_tanh_and_mul",
    ]


@pytest.mark.parametrize("is_neox, rotary_dim", [(True, 64), (False, 32)])
def test_rotary_embedding_adapter(aiter_stand_in, is_neox, rotary_dim):
    positions = torch.tensor([0, 5, 9])
    q, k, cache = rand(3, 4 * 64), rand(3, 2 * 64), rand(16, rotary_dim, dtype=F32)
    q_out, k_out = impl("rotary_embedding", "aiter")(positions, q, k, cache, 64, is_neox)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    [(name, args)] = aiter_stand_in.calls
    assert name == "rope_cached_positions_2c_fwd_inplace" and args["rotate_style"] == (not is_neox)


def test_cache_adapters(aiter_stand_in):
    key, value = rand(3, 2, 64), rand(3, 2, 64)
    impl("reshape_and_cache", "aiter")(key, value, rand(4, 16, 2, 64), rand(4, 16, 2, 64),
                                       torch.tensor([0, 17, -1]))
    impl("concat_and_cache_mla", "aiter")(rand(3, 64), rand(3, 1, 16), rand(4, 16, 80),
                                          torch.tensor([0, 17, -1]))
    out = impl("fused_qk_rope_concat_and_cache_mla", "aiter")(
        rand(3, 4, 64), rand(3, 4, 16), rand(3, 64), rand(3, 1, 16), rand(4, 16, 80),
        torch.tensor([0, 17, -1]), torch.tensor([0, 1, 2]), rand(32, 16, dtype=F32), True,
    )
    assert out.shape == (3, 4, 80)
    assert aiter_stand_in.names() == [
        "reshape_and_cache_flash", "concat_and_cache_mla", "fused_qk_rope_concat_and_cache_mla",
    ]


@pytest.mark.parametrize("sliding_window", [None, 8])
def test_attention_adapters(aiter_stand_in, sliding_window):
    q, k, v = rand(7, 4, 64), rand(7, 2, 64), rand(7, 2, 64)
    cu = cu_seqlens([3, 4]).to(CPU)
    impl("varlen_attention", "aiter")(q, k, v, cu, cu, 0.125, True, sliding_window, None)
    block_table, num_blocks = paged_layout([20, 5], 16)
    out = impl("paged_attention", "aiter")(
        rand(2, 4, 64), rand(num_blocks, 16, 2, 64), rand(num_blocks, 16, 2, 64),
        cu_seqlens([1, 1]).to(CPU), torch.tensor([20, 5], dtype=I32), block_table.to(CPU), 0.125,
        sliding_window, None,
    )
    assert out.shape == (2, 4, 64)
    (_, varlen), (_, paged) = aiter_stand_in.calls
    want = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
    assert varlen["window_size"][:2] == want and paged["window_size"] == want


def test_mla_decode_adapter_builds_page_lists(aiter_stand_in):
    seq_lens = [50, 3, 17]
    block_table, num_blocks = paged_layout(seq_lens, 16)
    block_table = block_table.to(CPU)
    impl("mla_decode", "aiter")(rand(3, 4, 80), rand(num_blocks, 16, 80), cu_seqlens([1, 1, 1]).to(CPU),
                                torch.tensor(seq_lens, dtype=I32), block_table, 0.1, 64)
    [(name, args)] = aiter_stand_in.calls
    pages = [block_table[i, : (n + 15) // 16] for i, n in enumerate(seq_lens)]
    assert args["kv_indptr"].tolist() == [0, 4, 5, 7]
    assert torch.equal(args["kv_indices"], torch.cat(pages).to(I32))
    assert args["kv_last_page_lens"].tolist() == [2, 3, 1]


def test_routing_adapters(aiter_stand_in):
    logits = rand(6, 16, dtype=F32)
    impl("topk_softmax", "aiter")(logits, 3, True)
    impl("grouped_topk", "aiter")(logits, 4, 4, 2, True, "sigmoid", None, 1.0)
    impl("grouped_topk", "aiter")(logits, 4, 4, 2, True, "softmax", None, 1.0)
    impl("grouped_topk", "aiter")(logits, 4, 4, 2, True, "sigmoid", rand(16), 2.5)
    names = aiter_stand_in.names()
    assert names == ["topk_softmax", "grouped_topk", "grouped_topk", "biased_grouped_topk"]
    assert [args["is_softmax"] for _, args in aiter_stand_in.calls[1:3]] == [False, True]


def test_fused_moe_adapter(aiter_stand_in):
    x, w13, w2 = rand(5, 64), rand(4, 2 * 32, 64), rand(4, 64, 32)
    weights, ids = torch.rand(5, 2), torch.randint(0, 4, (5, 2), dtype=I32)
    for activation in ("silu", "gelu"):
        impl("fused_moe", "aiter")(x, w13, w2, weights, ids, activation=activation)
    assert [args["activation"] for _, args in aiter_stand_in.calls] == ["Silu", "Gelu"]


def test_quant_and_gemm_adapters(aiter_stand_in):
    x = rand(4, 256)
    q, scale = impl("per_tensor_quant_fp8", "aiter")(x)
    assert scale.shape == (1,)
    q, scale = impl("per_token_quant_fp8", "aiter")(x)
    assert scale.shape == (4, 1)
    q, scale = impl("per_group_quant_fp8", "aiter")(x, 128)
    assert scale.shape == (4, 2)
    b = torch.zeros(256, 256, dtype=FP8)
    out = impl("fp8_scaled_mm", "aiter")(q, b, torch.ones(4, 1), torch.ones(256), BF16, None)
    assert out.shape == (4, 256) and out.dtype == BF16
    out = impl("fp8_block_scaled_mm", "aiter")(q, b, scale, torch.ones(2, 2), BF16, 128)
    assert out.shape == (4, 256)
    assert aiter_stand_in.names() == [
        "get_hip_quant(per_Tensor)", "get_hip_quant(per_Token)", "get_hip_quant(per_1x128)",
        "gemm_a8w8", "gemm_a8w8_blockscale",
    ]

