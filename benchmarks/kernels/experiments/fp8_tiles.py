"""fp8 GEMM tiles (token x channel and 128x128 block-scaled) at Qwen3-8B gate_up shapes."""
import itertools
import json
import os

import torch
import triton
from triton.testing import do_bench_cudagraph
from vllm import _custom_ops as ops

from atom_kernels import gemm as g

torch.manual_seed(0)
t = lambda fn: do_bench_cudagraph(fn, rep=40, return_mode="median") * 1e3
N, K = 24576, 4096
b = (torch.randn(N, K, device="cuda") * 0.05).to(torch.float8_e4m3fn)
res = []
for m in (128, 8192):
    a = (torch.randn(m, K, device="cuda")).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(N, 1, device="cuda") + 0.5
    sab, sbb = torch.rand(m, K // 128, device="cuda") + 0.5, torch.rand(N // 128, K // 128, device="cuda") + 0.5
    out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
    cut = t(lambda: ops.cutlass_scaled_mm(a, b.t(), sa, sb.view(1, -1), torch.bfloat16))
    ref_tc = g.fp8_scaled_mm_triton(a, b, sa, sb)
    ref_bs = g.fp8_block_scaled_mm_triton(a, b, sab, sbb)
    for bs in (False, True):
        cur = t(lambda: g.fp8_block_scaled_mm_triton(a, b, sab, sbb) if bs else g.fp8_scaled_mm_triton(a, b, sa, sb))
        row = {"m": m, "block_scaled": bs, "current_us": cur, "cutlass_tc_us": cut, "configs": {}}
        for bm, bn, bk, w, st in itertools.product((64, 128), (128, 256), (128,), (4, 8), (3, 4, 5)):
            if (bm + bn) * bk * st > 220 * 1024 or (bm == 64 and w == 8 and bn == 128):
                continue
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=st)
            grid = (triton.cdiv(m, bm) * triton.cdiv(N, bn),)
            sa_, sb_ = (sab, sbb) if bs else (sa, sb)
            launch = lambda: g._fp8_gemm_kernel[grid](a, b, out, sa_, sb_, None, m, N, K, a.stride(0), b.stride(0),
                out.stride(0), sa_.stride(0) if bs else 0, sb_.stride(0) if bs else 0, A_PER_ROW=True, B_PER_ROW=True,
                BLOCK_SCALED=bs, SCALE_BLOCK=128, HAS_BIAS=False, **cfg)
            try:
                launch(); torch.cuda.synchronize()
                ok = torch.allclose(out.float(), (ref_bs if bs else ref_tc).float(), rtol=2e-2, atol=1e-1)
                row["configs"][f"{bm}x{bn}x{bk} w{w} s{st}"] = (t(launch), ok)
            except Exception as e:  # noqa: BLE001
                row["configs"][f"{bm}x{bn}x{bk} w{w} s{st}"] = (float("inf"), str(e)[:80])
        best = sorted(row["configs"].items(), key=lambda kv: kv[1][0])[:4]
        print(f"m={m} block_scaled={bs} current {cur:.1f} cutlass(tc) {cut:.1f} best {best}", flush=True)
        res.append(row)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "fp8-tiles.json"), "w"), indent=1)
