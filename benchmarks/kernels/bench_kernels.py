"""GPU benchmark: ATOM's Triton kernels against vLLM 0.26.0's kernels for the same op.

    python benchmarks/kernels/bench_kernels.py --out results.json [--ops rms_norm,fused_moe] [--quick]

For each op and shape (decode- and prefill-sized, dims of Qwen3-8B, Qwen3-30B-A3B, DeepSeek-V2-Lite and,
for GPT-OSS's activation and sinks, gpt-oss-20b) it times ``atom_kernels``' Triton implementation and
vLLM's kernel (``vllm._custom_ops``, vLLM's Triton fused MoE and MLA decode, FlashAttention 3 through
``vllm.vllm_flash_attn``) with ``triton.testing.do_bench`` (CUDA events, L2 flushed between runs,
median). It measures the HBM bandwidth ceiling with a device-to-device copy and reports each timing's
share of it, from the bytes the op must move at least, and the time of a kernel that stores one value
(the floor under every decode-sized op). One output comparison per case guards against
timing a wrong path. Prints a table and writes JSON: device, versions, bandwidth, and per case the
times, the ratio ours / vLLM (< 1: ours is faster), bandwidth shares, TFLOP/s where compute matters.

Each kernel is timed twice: replayed from a CUDA graph (the headline numbers: no Python launch
overhead, as vLLM runs decode; replays run back to back, so decode-sized working sets can sit in L2 and
show more than 100% of HBM bandwidth) and eagerly (L2 flushed, launch overhead included: Triton's
Python launcher costs more than a C++ op's, which dominates the smallest kernels). ``host`` is the
host's time to issue one call (back-to-back calls, no synchronization): what a step pays per op where
it runs outside CUDA graphs and the host is slower than the GPU (a lone prefill).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench, do_bench_cudagraph

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn

# From the models' published Hugging Face configs (config.json of Qwen3-8B, Qwen3-30B-A3B,
# DeepSeek-V2-Lite, gpt-oss-20b), as in benchmarks/models/; --models-dir checks them against the files
# found there.
MODELS = {
    "qwen3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
    },
    "qwen3-30b-a3b": {
        "hidden_size": 2048,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
    },
    "deepseek-v2-lite": {
        "hidden_size": 2048,
        "moe_intermediate_size": 1408,
        "n_routed_experts": 64,
        "num_experts_per_tok": 6,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
    },
    "gpt-oss-20b": {
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "sliding_window": 128,
    },
}

DECODE_TOKENS, PREFILL_TOKENS = 128, 8192


@dataclass
class Case:
    op: str
    model: str
    label: str
    ours: Callable[[], object]
    theirs: Callable[[], object] | None
    theirs_name: str
    bytes_moved: float
    flops: float = 0.0
    # Returns (ours, theirs) outputs to compare once, or None where vLLM works in place on other layouts.
    compare: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    shape: dict = field(default_factory=dict)


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def rand(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def paged(seq_lens: list[int], block_size: int):
    blocks = max(-(-n // block_size) for n in seq_lens)
    num_blocks = len(seq_lens) * blocks
    table = torch.randperm(num_blocks, device="cuda").view(len(seq_lens), blocks).to(torch.int32)
    return table, num_blocks


def cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor(
        [0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda"
    )


def hbm_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, counting reads and writes."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


@triton.jit
def _one_store_kernel(ptr):
    tl.store(ptr, 1)


def launch_floor_us() -> float:
    """Graph-replay time of a kernel that stores one value: what a decode-sized op pays before it
    moves any data. The %BW of a 1-2 MB op is bounded by bytes / (floor + bytes / bandwidth)."""
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    return do_bench_cudagraph(lambda: _one_store_kernel[(1,)](flag), rep=100, return_mode="median") * 1e3


# --- cases ----------------------------------------------------------------------------------------


def norm_cases(ak, ops):
    m = MODELS["qwen3-8b"]
    d, eps = m["hidden_size"], m["rms_norm_eps"]
    w = rand(d)
    for label, t in (("decode", DECODE_TOKENS), ("prefill", PREFILL_TOKENS)):
        x, res = rand(t, d), rand(t, d)
        out = torch.empty_like(x)

        def vllm_rms(x=x, out=out):
            ops.rms_norm(out, x, w, eps)
            return out

        yield Case(
            "rms_norm",
            "qwen3-8b",
            label,
            lambda x=x: ak.rms_norm(x, w, eps),
            vllm_rms,
            "_custom_ops.rms_norm",
            2 * nbytes(x),
            compare=lambda x=x, f=vllm_rms: (ak.rms_norm(x, w, eps), f()),
            shape={"tokens": t, "hidden": d},
        )
        x2, res2 = x.clone(), res.clone()
        yield Case(
            "fused_add_rms_norm",
            "qwen3-8b",
            label,
            lambda x=x, r=res: ak.fused_add_rms_norm(x, r, w, eps),
            lambda x=x2, r=res2: ops.fused_add_rms_norm(x, r, w, eps),
            "_custom_ops.fused_add_rms_norm (in place)",
            4 * nbytes(x),
            shape={"tokens": t, "hidden": d},
        )
    heads, hd = m["num_attention_heads"], m["head_dim"]
    qkv = rand(PREFILL_TOKENS, (heads + 2 * m["num_key_value_heads"]) * hd)
    q = qkv[:, : heads * hd].view(PREFILL_TOKENS, heads, hd)
    yield Case(
        "rms_norm (qk-norm, strided view)",
        "qwen3-8b",
        "prefill",
        lambda: ak.rms_norm(q, w[:hd], eps),
        lambda: ops.rms_norm(torch.empty_like(q), q, w[:hd], eps),
        "_custom_ops.rms_norm",
        2 * nbytes(q),
        shape={"tokens": PREFILL_TOKENS, "heads": heads, "head_dim": hd},
    )


def activation_cases(ak, ops):
    inter = MODELS["qwen3-8b"]["intermediate_size"]
    for label, t in (("decode", DECODE_TOKENS), ("prefill", PREFILL_TOKENS)):
        x = rand(t, 2 * inter)
        out = torch.empty(t, inter, device="cuda", dtype=BF16)

        def vllm_silu(x=x, out=out):
            torch.ops._C.silu_and_mul(out, x)
            return out

        def vllm_gelu(x=x, out=out):
            torch.ops._C.gelu_tanh_and_mul(out, x)
            return out

        yield Case(
            "silu_and_mul",
            "qwen3-8b",
            label,
            lambda x=x: ak.silu_and_mul(x),
            vllm_silu,
            "torch.ops._C.silu_and_mul",
            1.5 * nbytes(x),
            compare=lambda x=x, f=vllm_silu: (ak.silu_and_mul(x), f()),
            shape={"tokens": t, "intermediate": inter},
        )
        yield Case(
            "gelu_and_mul (tanh)",
            "qwen3-8b",
            label,
            lambda x=x: ak.gelu_and_mul(x, "tanh"),
            vllm_gelu,
            "torch.ops._C.gelu_tanh_and_mul",
            1.5 * nbytes(x),
            compare=lambda x=x, f=vllm_gelu: (ak.gelu_and_mul(x, "tanh"), f()),
            shape={"tokens": t},
        )
    inter = MODELS["gpt-oss-20b"]["intermediate_size"]
    x = rand(PREFILL_TOKENS, 2 * inter, scale=4.0)
    out = torch.empty(PREFILL_TOKENS, inter, device="cuda", dtype=BF16)

    def vllm_swiglu():
        torch.ops._C.swigluoai_and_mul(out, x, 1.702, 7.0)
        return out

    yield Case(
        "clamped_swiglu",
        "gpt-oss-20b",
        "prefill",
        lambda: ak.clamped_swiglu(x),
        vllm_swiglu,
        "torch.ops._C.swigluoai_and_mul",
        1.5 * nbytes(x),
        compare=lambda: (ak.clamped_swiglu(x), vllm_swiglu()),
        shape={"tokens": PREFILL_TOKENS, "intermediate": inter},
    )


def rope_cases(ak, ops):
    m = MODELS["qwen3-8b"]
    heads, kv_heads, hd = m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"]
    cache = ak.compute_cos_sin_cache(ak.default_inv_freq(hd, m["rope_theta"]), 40960).cuda()
    cache_bf16 = cache.to(BF16)
    for label, t in (("decode", DECODE_TOKENS), ("prefill", PREFILL_TOKENS)):
        positions = torch.randint(0, 40960, (t,), device="cuda")
        q, k = rand(t, heads * hd), rand(t, kv_heads * hd)
        q2, k2 = q.clone(), k.clone()
        yield Case(
            "rotary_embedding",
            "qwen3-8b",
            label,
            lambda p=positions, q=q, k=k: ak.rotary_embedding(p, q, k, cache, hd, True),
            lambda p=positions, q=q2, k=k2: ops.rotary_embedding(p, q, k, hd, cache_bf16, True),
            "_custom_ops.rotary_embedding (in place)",
            2 * nbytes(q, k),
            shape={"tokens": t},
        )


def cache_cases(ak, ops):
    m = MODELS["qwen3-8b"]
    kv_heads, hd, block = m["num_key_value_heads"], m["head_dim"], 16
    one = torch.ones(1, device="cuda")
    for label, t in (("decode", DECODE_TOKENS), ("prefill", PREFILL_TOKENS)):
        k, v = rand(t, kv_heads, hd), rand(t, kv_heads, hd)
        num_blocks = 2 * t // block + 1
        kc, vc = rand(num_blocks, block, kv_heads, hd), rand(num_blocks, block, kv_heads, hd)
        slots = torch.randperm(num_blocks * block, device="cuda")[:t]
        yield Case(
            "reshape_and_cache",
            "qwen3-8b",
            label,
            lambda k=k, v=v, kc=kc, vc=vc, s=slots: ak.reshape_and_cache(k, v, kc, vc, s),
            lambda k=k, v=v, kc=kc, vc=vc, s=slots: ops.reshape_and_cache_flash(
                k, v, kc, vc, s, "auto", one, one
            ),
            "_custom_ops.reshape_and_cache_flash",
            2 * nbytes(k, v),
            shape={"tokens": t},
        )
    m = MODELS["deepseek-v2-lite"]
    rank, rope = m["kv_lora_rank"], m["qk_rope_head_dim"]
    t = PREFILL_TOKENS
    kv_c, k_pe = rand(t, rank), rand(t, rope)
    cache = rand(t // 64 + 1, 64, rank + rope)
    slots = torch.randperm(cache.shape[0] * 64, device="cuda")[:t]
    yield Case(
        "concat_and_cache_mla",
        "deepseek-v2-lite",
        "prefill",
        lambda: ak.concat_and_cache_mla(kv_c, k_pe, cache, slots),
        lambda: ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", one),
        "_custom_ops.concat_and_cache_mla",
        2 * nbytes(kv_c, k_pe),
        shape={"tokens": t},
    )


def flash_attn():
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func


def attention_cases(ak, ops):
    fa = flash_attn()
    for model, seq_lens, q_len, window, sinks in (
        ("qwen3-8b", [4096] * 64, 1, None, False),
        ("qwen3-8b", [32768] * 4, 1, None, False),
        ("qwen3-30b-a3b", [2048] * 256, 1, None, False),
        ("gpt-oss-20b", [4096] * 64, 1, 128, True),
        ("qwen3-8b", [4096] * 8, 512, None, False),
    ):
        m = MODELS[model]
        heads, kv_heads, hd, block = (
            m["num_attention_heads"],
            m["num_key_value_heads"],
            m["head_dim"],
            16,
        )
        table, num_blocks = paged(seq_lens, block)
        kc, vc = rand(num_blocks, block, kv_heads, hd), rand(num_blocks, block, kv_heads, hd)
        n = len(seq_lens)
        q = rand(n * q_len, heads, hd)
        cu_q, lens = cu([q_len] * n), torch.tensor(seq_lens, device="cuda", dtype=torch.int32)
        sink = rand(heads) if sinks else None  # FA3 takes bf16 sinks only
        scale = hd**-0.5
        left = -1 if window is None else window - 1
        label = "decode" if q_len == 1 else f"extend {q_len}"

        def ours(
            q=q,
            kc=kc,
            vc=vc,
            cu_q=cu_q,
            lens=lens,
            table=table,
            scale=scale,
            window=window,
            sink=sink,
            ms=max(seq_lens),
        ):
            return ak.paged_attention(
                q, kc, vc, cu_q, lens, table, scale, window, sink, max_seq_len=ms
            )

        def theirs(
            q=q,
            kc=kc,
            vc=vc,
            cu_q=cu_q,
            lens=lens,
            table=table,
            scale=scale,
            left=left,
            sink=sink,
            ql=q_len,
            ms=max(seq_lens),
        ):
            return fa(
                q,
                kc,
                vc,
                ql,
                cu_q,
                ms,
                seqused_k=lens,
                block_table=table,
                softmax_scale=scale,
                causal=True,
                window_size=[left, 0 if left >= 0 else -1],
                s_aux=sink,
                fa_version=3,
            )

        kv_read = sum(min(s, window or s) for s in seq_lens) * kv_heads * hd * 2 * 2
        yield Case(
            "paged_attention",
            model,
            f"{label}, {n} x {seq_lens[0]}",
            ours,
            theirs,
            "vllm_flash_attn (FA3, paged)",
            kv_read + 2 * nbytes(q),
            flops=4 * sum(q_len * min(s, window or s) for s in seq_lens) * heads * hd,
            compare=lambda o=ours, t=theirs: (o(), t()),
            shape={
                "seqs": n,
                "seq_len": seq_lens[0],
                "q_len": q_len,
                "heads": heads,
                "kv_heads": kv_heads,
                "head_dim": hd,
                "sliding_window": window,
                "sinks": sinks,
            },
        )
    # Prefill as the engines run it: 8 x 1024 tokens is one 8192-token Qwen3-8B engine step.
    for model, lengths in (("qwen3-8b", [1024] * 8), ("qwen3-30b-a3b", [2048] * 4)):
        yield prefill_case(ak, fa, model, lengths)


def prefill_case(ak, fa, model, lengths):
    m = MODELS[model]
    heads, kv_heads, hd = m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"]
    total, max_len, scale = sum(lengths), max(lengths), hd**-0.5
    q, k, v = rand(total, heads, hd), rand(total, kv_heads, hd), rand(total, kv_heads, hd)
    cu_k = cu(lengths)

    def ours():
        return ak.varlen_attention(q, k, v, cu_k, cu_k, scale, True)

    def theirs():
        return fa(q, k, v, max_len, cu_k, max_len, cu_seqlens_k=cu_k, softmax_scale=scale,
                  causal=True, fa_version=3)

    return Case(
        "varlen_attention",
        model,
        f"prefill {len(lengths)} x {lengths[0]}",
        ours,
        theirs,
        "vllm_flash_attn (FA3, varlen)",
        nbytes(q, k, v) + nbytes(q),
        flops=2 * sum(n * n for n in lengths) * heads * hd,
        compare=lambda: (ours(), theirs()),
        shape={"seqs": len(lengths), "seq_len": max_len, "heads": heads, "kv_heads": kv_heads},
    )


def mixed_cases(ak, ops):
    """A mixed engine step: 255 decodes and one chunked-prefill extend (512 new tokens), each over a
    2048-token context, as one paged launch (what ATOM's vLLM backend did before d15ed70) and as a
    decode launch plus an extend launch (what it does now), both against FA3 on the whole batch."""
    fa = flash_attn()
    m = MODELS["qwen3-8b"]
    heads, kv_heads, hd, block = m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"], 16
    decodes, new, context = 255, 512, 2048
    seq_lens = [context] * (decodes + 1)
    q_lens = [1] * decodes + [new]
    table, num_blocks = paged(seq_lens, block)
    kc, vc = rand(num_blocks, block, kv_heads, hd), rand(num_blocks, block, kv_heads, hd)
    q = rand(sum(q_lens), heads, hd)
    cu_q, lens = cu(q_lens), torch.tensor(seq_lens, device="cuda", dtype=torch.int32)
    extend_cu = cu_q[decodes:] - decodes
    out = torch.empty_like(q)
    scale = hd**-0.5

    def one_launch():
        return ak.paged_attention(q, kc, vc, cu_q, lens, table, scale, out=out)

    def two_launches():
        ak.paged_attention(
            q[:decodes], kc, vc, cu_q[: decodes + 1], lens[:decodes], table[:decodes], scale,
            out=out[:decodes],
        )
        ak.paged_attention(
            q[decodes:], kc, vc, extend_cu, lens[decodes:], table[decodes:], scale, out=out[decodes:]
        )
        return out

    def theirs():
        return fa(
            q, kc, vc, new, cu_q, context, seqused_k=lens, block_table=table, softmax_scale=scale,
            causal=True, fa_version=3,
        )

    kv_read = len(seq_lens) * context * kv_heads * hd * 2 * 2
    flops = 4 * (decodes * context + new * (context - new / 2)) * heads * hd
    for label, ours in (("one launch", one_launch), ("decode + extend launches", two_launches)):
        yield Case(
            "paged_attention (mixed batch)",
            "qwen3-8b",
            f"{decodes} decodes + {new} extend, {label}",
            ours,
            theirs,
            "vllm_flash_attn (FA3, paged)",
            kv_read + 2 * nbytes(q),
            flops=flops,
            compare=lambda o=ours: (o().clone(), theirs()),
            shape={"decodes": decodes, "extend_tokens": new, "context": context, "launches": label},
        )


def mla_cases(ak, ops):
    from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

    m = MODELS["deepseek-v2-lite"]
    heads, rank, rope = m["num_attention_heads"], m["kv_lora_rank"], m["qk_rope_head_dim"]
    scale = (m["qk_nope_head_dim"] + rope) ** -0.5
    block = 64
    for n, seq_len in ((64, 4096), (4, 32768)):
        table, num_blocks = paged([seq_len] * n, block)
        cache = rand(num_blocks, block, rank + rope)
        q = rand(n, heads, rank + rope)
        lens = torch.full((n,), seq_len, device="cuda", dtype=torch.int32)
        cu_q = cu([1] * n)
        splits = min(
            triton.next_power_of_2(max(1, seq_len // 256)),
            4 * torch.cuda.get_device_properties(0).multi_processor_count,
        )
        logits = torch.empty(n, heads, splits, rank + 1, device="cuda", dtype=torch.float32)
        out = torch.empty(n, heads, rank, device="cuda", dtype=BF16)
        lse = torch.empty(n, heads, device="cuda", dtype=BF16)
        latent = cache.unsqueeze(2)
        # Given explicitly: the kernel's default creates them from host values, which a graph cannot capture.
        one = torch.ones((), device="cuda")

        def theirs(
            q=q,
            latent=latent,
            out=out,
            lse=lse,
            table=table,
            lens=lens,
            logits=logits,
            splits=splits,
            one=one,
        ):
            decode_attention_fwd(
                q,
                latent,
                latent[..., :rank],
                out,
                lse,
                table,
                lens,
                logits,
                splits,
                scale,
                block,
                k_scale=one,
                v_scale=one,
                is_mla=True,
            )
            return out

        def ours(q=q, cache=cache, cu_q=cu_q, lens=lens, table=table, seq_len=seq_len):
            return ak.mla_decode(q, cache, cu_q, lens, table, scale, rank, max_seq_len=seq_len)

        yield Case(
            "mla_decode",
            "deepseek-v2-lite",
            f"decode, {n} x {seq_len}",
            ours,
            theirs,
            "vllm triton decode_attention_fwd (MLA)",
            n * seq_len * (rank + rope) * 2 + 2 * nbytes(q),
            flops=2 * n * seq_len * heads * (2 * rank + rope),
            compare=lambda o=ours, t=theirs: (o(), t()),
            shape={
                "seqs": n,
                "seq_len": seq_len,
                "heads": heads,
                "kv_lora_rank": rank,
                "rope_dim": rope,
            },
        )


def moe_cases(ak, ops):
    from vllm.model_executor.layers.fused_moe import fused_experts

    for model, e_key, i_key in (
        ("qwen3-30b-a3b", "num_experts", "moe_intermediate_size"),
        ("deepseek-v2-lite", "n_routed_experts", "moe_intermediate_size"),
    ):
        m = MODELS[model]
        experts, top_k, d, inter = m[e_key], m["num_experts_per_tok"], m["hidden_size"], m[i_key]
        w13, w2 = (
            rand(experts, 2 * inter, d, scale=d**-0.5),
            rand(experts, d, inter, scale=inter**-0.5),
        )
        for label, t in (("decode", DECODE_TOKENS), ("prefill", PREFILL_TOKENS)):
            x = rand(t, d)
            logits = rand(t, experts, dtype=torch.float32)
            weights, ids = ak.topk_softmax(logits, top_k, True)
            w_out = torch.empty_like(weights)
            i_out = torch.empty_like(ids)
            tok_idx = torch.empty_like(ids)
            # Every loop variable a lambda uses is bound as a default: the cases run after the loop.
            if label == "decode":
                yield Case(
                    "topk_softmax",
                    model,
                    label,
                    lambda lg=logits, k=top_k: ak.topk_softmax(lg, k, True),
                    lambda lg=logits, w=w_out, i=i_out, t=tok_idx: ops.topk_softmax(
                        w, i, t, lg, True
                    ),
                    "_custom_ops.topk_softmax",
                    nbytes(logits, weights, ids),
                    shape={"tokens": t, "experts": experts, "top_k": top_k},
                )
            touched = min(experts, t * top_k)
            moe_args = (x, w13, w2, weights, ids)
            yield Case(
                "fused_moe",
                model,
                label,
                lambda a=moe_args: ak.fused_moe(*a),
                lambda a=moe_args: fused_experts(*a),
                "vllm fused_experts (Triton)",
                touched * 3 * inter * d * 2 + 2 * nbytes(x),
                flops=2 * t * top_k * 3 * inter * d,
                compare=lambda a=moe_args: (ak.fused_moe(*a), fused_experts(*a)),
                shape={
                    "tokens": t,
                    "experts": experts,
                    "top_k": top_k,
                    "hidden": d,
                    "intermediate": inter,
                },
            )
    m = MODELS["deepseek-v2-lite"]
    experts = m["n_routed_experts"]
    logits = rand(DECODE_TOKENS, experts, dtype=torch.float32)
    bias = rand(experts, dtype=torch.float32, scale=0.01)
    yield Case(
        "grouped_topk (sigmoid + bias)",
        "deepseek-v2-lite",
        "decode",
        lambda: ak.grouped_topk(logits, 6, 8, 4, True, "sigmoid", bias, 2.5),
        lambda: ops.grouped_topk(logits, 8, 4, 6, True, 2.5, bias, 1),
        "_custom_ops.grouped_topk",
        nbytes(logits),
        shape={"tokens": DECODE_TOKENS, "experts": experts, "groups": 8, "topk_group": 4},
    )


def fp8_cases(ak, ops):
    from vllm.model_executor.layers.quantization.utils.fp8_utils import (
        per_token_group_quant_fp8,
        w8a8_triton_block_scaled_mm,
    )

    m = MODELS["qwen3-8b"]
    d, inter = m["hidden_size"], m["intermediate_size"]
    w = rand(2 * inter, d).to(FP8)
    w_scale = torch.rand(2 * inter, 1, device="cuda") / 100
    wb_scale = torch.rand(2 * inter // 128, d // 128, device="cuda") / 100
    for label, t in (("decode", DECODE_TOKENS), ("prefill", PREFILL_TOKENS)):
        x = rand(t, d)
        yield Case(
            "per_token_quant_fp8",
            "qwen3-8b",
            label,
            lambda x=x: ak.per_token_quant_fp8(x),
            lambda x=x: ops.scaled_fp8_quant(x, use_per_token_if_dynamic=True),
            "_custom_ops.scaled_fp8_quant (per token)",
            1.5 * nbytes(x),
            shape={"tokens": t, "hidden": d},
        )
        yield Case(
            "per_group_quant_fp8",
            "qwen3-8b",
            label,
            lambda x=x: ak.per_group_quant_fp8(x),
            lambda x=x: per_token_group_quant_fp8(x, 128),
            "fp8_utils.per_token_group_quant_fp8",
            1.5 * nbytes(x),
            shape={"tokens": t, "hidden": d},
        )
        a_q, a_scale = ak.per_token_quant_fp8(x)
        yield Case(
            "fp8_scaled_mm (token x channel)",
            "qwen3-8b",
            label,
            lambda a=a_q, s=a_scale: ak.fp8_scaled_mm(a, w, s, w_scale, BF16),
            lambda a=a_q, s=a_scale: ops.cutlass_scaled_mm(a, w.t(), s, w_scale.view(1, -1), BF16),
            "_custom_ops.cutlass_scaled_mm",
            nbytes(a_q, w) + t * 2 * inter * 2,
            flops=2 * t * 2 * inter * d,
            compare=lambda a=a_q, s=a_scale: (
                ak.fp8_scaled_mm(a, w, s, w_scale, BF16),
                ops.cutlass_scaled_mm(a, w.t(), s, w_scale.view(1, -1), BF16),
            ),
            shape={"m": t, "n": 2 * inter, "k": d},
        )
        g_q, g_scale = ak.per_group_quant_fp8(x)
        yield Case(
            "fp8_block_scaled_mm",
            "qwen3-8b",
            label,
            lambda a=g_q, s=g_scale: ak.fp8_block_scaled_mm(a, w, s, wb_scale, BF16),
            lambda a=g_q, s=g_scale: w8a8_triton_block_scaled_mm(
                a, w, s, wb_scale, [128, 128], BF16
            ),
            "fp8_utils.w8a8_triton_block_scaled_mm",
            nbytes(g_q, w) + t * 2 * inter * 2,
            flops=2 * t * 2 * inter * d,
            compare=lambda a=g_q, s=g_scale: (
                ak.fp8_block_scaled_mm(a, w, s, wb_scale, BF16),
                w8a8_triton_block_scaled_mm(a, w, s, wb_scale, [128, 128], BF16),
            ),
            shape={"m": t, "n": 2 * inter, "k": d},
        )


GROUPS = {
    "norm": norm_cases,
    "activation": activation_cases,
    "rope": rope_cases,
    "cache": cache_cases,
    "attention": attention_cases,
    "mixed": mixed_cases,
    "mla": mla_cases,
    "moe": moe_cases,
    "fp8": fp8_cases,
}


# --- running --------------------------------------------------------------------------------------


def max_rel_diff(ours, theirs) -> float:
    ours = ours[0] if isinstance(ours, tuple) else ours
    theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    diff = (ours.float() - theirs.float()).abs().max().item()
    return diff / max(theirs.float().abs().max().item(), 1e-6)


def time_kernel(fn: Callable[[], object], rep: int) -> dict[str, float]:
    """Median microseconds, eager (L2 flushed, launch overhead included) and replayed from a CUDA
    graph (no launch overhead, as a serving engine runs decode; back to back, so small working sets
    stay in L2)."""
    times = {"eager_us": do_bench(fn, warmup=10, rep=rep, return_mode="median") * 1e3}
    times["graph_us"] = do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3
    times["host_us"] = host_us(fn)
    return times


def host_us(fn: Callable[[], object], calls: int = 100) -> float:
    """Microseconds the host takes to issue one call: ``calls`` back to back after a synchronize,
    without waiting for the GPU (few enough not to fill the launch queue)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / calls * 1e6


def add_timing(row: dict, who: str, times: dict[str, float], case: Case, bandwidth: float) -> None:
    us = times["graph_us"]
    row[f"{who}_us"] = us
    row[f"{who}_eager_us"] = times["eager_us"]
    row[f"{who}_host_us"] = times["host_us"]
    row[f"{who}_pct_bw"] = 100 * case.bytes_moved / (us * 1e-6) / bandwidth
    if case.flops:
        row[f"{who}_tflops"] = case.flops / (us * 1e-6) / 1e12


def run_case(case: Case, bandwidth: float, rep: int) -> dict:
    row = {
        "op": case.op,
        "model": case.model,
        "case": case.label,
        "shape": case.shape,
        "vllm_kernel": case.theirs_name,
    }
    add_timing(row, "ours", time_kernel(case.ours, rep), case, bandwidth)
    if case.theirs is not None:
        try:
            theirs = time_kernel(case.theirs, rep)
        except Exception as error:  # noqa: BLE001  (a missing vLLM kernel is a row, not the end of the run)
            row["vllm_error"] = f"{type(error).__name__}: {error}"
        else:
            add_timing(row, "vllm", theirs, case, bandwidth)
            row["ratio_ours_over_vllm"] = row["ours_us"] / row["vllm_us"]
            row["ratio_eager"] = row["ours_eager_us"] / row["vllm_eager_us"]
            row["ratio_host"] = row["ours_host_us"] / row["vllm_host_us"]
    if case.compare is not None and "vllm_us" in row:
        row["max_rel_diff_vs_vllm"] = max_rel_diff(*case.compare())
    return row


def check_models(models_dir: Path) -> None:
    for name, dims in MODELS.items():
        path = models_dir / f"{name}.json"
        if not path.exists():
            continue
        config = json.loads(path.read_text())
        wrong = {k: (v, config.get(k)) for k, v in dims.items() if config.get(k) != v}
        if wrong:
            print(f"warning: {path} differs from the embedded dims: {wrong}", file=sys.stderr)


def format_row(row: dict) -> str:
    theirs = f"{row['vllm_us']:9.1f}" if "vllm_us" in row else f"{'n/a':>9}"
    ratio = f"{row['ratio_ours_over_vllm']:6.2f}" if "ratio_ours_over_vllm" in row else f"{'':>6}"
    eager = f"{row['ratio_eager']:6.2f}" if "ratio_eager" in row else f"{'':>6}"
    host = f"{row['ours_host_us']:6.1f} {row.get('vllm_host_us', float('nan')):6.1f}"
    diff = f"{row['max_rel_diff_vs_vllm']:.1e}" if "max_rel_diff_vs_vllm" in row else ""
    extra = (
        f"{row['ours_tflops']:7.1f} TF/s"
        if "ours_tflops" in row
        else f"{row['ours_pct_bw']:7.1f} %BW"
    )
    return (
        f"{row['op'][:34]:34} {row['model'][:16]:16} {row['case'][:22]:22} {row['ours_us']:9.1f} {theirs} "
        f"{ratio} {eager} {host} {extra} {diff}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results.json"))
    parser.add_argument(
        "--ops", default=",".join(GROUPS), help=f"comma-separated groups of {sorted(GROUPS)}"
    )
    parser.add_argument(
        "--rep", type=int, default=100, help="milliseconds of timed repetitions per kernel"
    )
    parser.add_argument(
        "--models-dir", type=Path, default=Path(__file__).resolve().parents[1] / "models"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels needs a CUDA GPU")
    check_models(args.models_dir)

    import vllm
    from vllm import _custom_ops as ops
    from vllm.config import VllmConfig, set_current_vllm_config

    import atom_kernels as ak

    torch.manual_seed(0)
    bandwidth = hbm_bandwidth()
    props = torch.cuda.get_device_properties(0)
    report = {
        "device": torch.cuda.get_device_name(),
        "sm_count": props.multi_processor_count,
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton.__version__,
            "vllm": vllm.__version__,
        },
        "hbm_bandwidth_GBps": bandwidth / 1e9,
        "launch_floor_us": launch_floor_us(),
        "backends": ak.backend_report("cuda"),
        "results": [],
    }
    print(
        f"{report['device']}: copy bandwidth {bandwidth / 1e9:.0f} GB/s; one-store kernel "
        f"{report['launch_floor_us']:.2f} us per graph replay; {report['versions']}"
    )
    print(
        f"{'op':34} {'model':16} {'case':22} {'ours us':>9} {'vllm us':>9} {'ratio':>6} {'eager':>6} "
        f"{'host us':>13} {'roofline':>12} rel diff   (graph-replay times; eager = ratio of eager times; "
        f"host: to issue one call, ours and vLLM's)"
    )
    with set_current_vllm_config(VllmConfig()):
        for group in args.ops.split(","):
            try:
                cases = list(GROUPS[group](ak, ops))
            except Exception as error:  # noqa: BLE001  (report the group, keep benchmarking the others)
                report["results"].append(
                    {"group": group, "error": f"{type(error).__name__}: {error}"}
                )
                traceback.print_exc()
                continue
            for case in cases:
                try:
                    row = run_case(case, bandwidth, args.rep)
                except Exception as error:  # noqa: BLE001
                    row = {
                        "op": case.op,
                        "model": case.model,
                        "case": case.label,
                        "error": f"{type(error).__name__}: {error}",
                    }
                    traceback.print_exc()
                report["results"].append(row)
                print(
                    format_row(row)
                    if "error" not in row
                    else f"{case.op} {case.label}: {row['error']}",
                    flush=True,
                )
                torch.cuda.empty_cache()
    args.out.write_text(json.dumps(report, indent=1, default=str))
    ratios = [r["ratio_ours_over_vllm"] for r in report["results"] if "ratio_ours_over_vllm" in r]
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"geometric mean of ours / vLLM over {len(ratios)} cases: {geomean:.2f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
