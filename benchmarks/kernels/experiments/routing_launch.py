"""Sweep rows-per-program and warps of the routing kernels against vLLM's ops (CUDA-graph replays)."""
import json
import os

import torch
import triton
from triton.testing import do_bench_cudagraph
from vllm import _custom_ops as ops

import atom_kernels.routing as m
from atom_kernels.triton_utils import next_pow2

torch.manual_seed(0)
out = {}
def t(fn):
    return do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3

def softmax_launch(logits, top_k, bt, w):
    n, e = logits.shape
    wts = torch.empty(n, top_k, device="cuda"); ids = torch.empty(n, top_k, device="cuda", dtype=torch.int32)
    def f():
        m._topk_softmax_kernel[(triton.cdiv(n, bt),)](logits, wts, ids, n, e, logits.stride(0),
            TOP_K=top_k, RENORMALIZE=True, BLOCK_T=bt, E_P2=next_pow2(e), K_P2=next_pow2(top_k), num_warps=w)
    return f, (wts, ids)

def grouped_launch(logits, bias, bt, w):
    n, e = logits.shape
    wts = torch.empty(n, 6, device="cuda"); ids = torch.empty(n, 6, device="cuda", dtype=torch.int32)
    def f():
        m._grouped_topk_kernel[(triton.cdiv(n, bt),)](logits, bias, wts, ids, n, e, logits.stride(0), 2.5,
            TOP_K=6, NUM_GROUPS=8, TOPK_GROUP=4, RENORMALIZE=True, SIGMOID=True, HAS_BIAS=True,
            BLOCK_T=bt, E_P2=next_pow2(e), G_P2=8, S_P2=next_pow2(e // 8), K_P2=8, num_warps=w)
    return f, (wts, ids)

for name, e, k in (("topk_softmax qwen3-30b", 128, 8), ("topk_softmax dsv2-lite", 64, 6), ("grouped_topk dsv2-lite", 64, 6)):
    for n in (1, 16, 64, 128, 256, 1024, 8192):
        logits = torch.randn(n, e, device="cuda")
        bias = torch.randn(e, device="cuda") * 0.01
        if name.startswith("grouped"):
            vo = lambda: ops.grouped_topk(logits, 8, 4, 6, True, 2.5, bias, 1)
            ref = m.grouped_topk_torch(logits, 6, 8, 4, True, "sigmoid", bias, 2.5)
        else:
            w_, i_, tk = (torch.empty(n, k, device="cuda"), torch.empty(n, k, device="cuda", dtype=torch.int32),
                          torch.empty(n, k, device="cuda", dtype=torch.int32))
            vo = lambda: ops.topk_softmax(w_, i_, tk, logits, True)
            ref = m.topk_softmax_torch(logits, k, True)
        row = {"vllm_us": t(vo), "configs": {}}
        for bt in (1, 2, 4, 8, 16):
            for w in (1, 2, 4):
                f, (wts, ids) = (grouped_launch(logits, bias, bt, w) if name.startswith("grouped")
                                 else softmax_launch(logits, k, bt, w))
                f(); torch.cuda.synchronize()
                ok = torch.allclose(wts.sort(-1).values, ref[0].float().sort(-1).values, atol=1e-5)
                row["configs"][f"{bt}x{w}"] = (t(f), ok)
        best = min(row["configs"].items(), key=lambda kv: kv[1][0])
        print(f"{name:24s} n={n:5d} vllm {row['vllm_us']:6.2f}  best {best[0]:5s} {best[1][0]:6.2f} "
              f"ratio {best[1][0]/row['vllm_us']:.2f}  16x4 {row['configs']['16x4'][0]:6.2f} "
              f"bad={[c for c,(_,o) in row['configs'].items() if not o]}", flush=True)
        out[f"{name} {n}"] = row
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "routing-launch.json"), "w"), indent=1)
