"""The block-FP8 GEMM at 1-64 rows with swapped operands and/or TMA weight loads (fp8-h200.json.gz[swap-ab]).

    PYTHONPATH=packages/atom-kernels/src python3 fp8_swap_ab.py OUT.json [--rows 1,16,32,64]

``shipped``: ``gemm._launch_fp8_gemm`` (at 50bae49: activations on the MMA's M side, 16- and 64-row
tiles); ``swap``: the weight tile on the M side, the rows on N, which wgmma takes 16 and 32 wide (what
``gemm`` ships up to 32 rows since); ``swap_tma``: swapped, weights through a TMA descriptor; ``tma``:
shipped orientation, weights through TMA. Weight tile 64 / 128 columns, 4 / 6 stages, split K by the
shipped rule (``auto``) and 1 / 2 / 4. Quantized inputs, CUDA-graph us, each output's max |diff| /
max |shipped|. The data's ``vllm_path_us`` / ``atom_path_us`` came from this script's ``--vllm`` at
50bae49 (``bench_fp8_gemm.py`` measures the shipped GEMM against vLLM).
"""

import argparse
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fp8_scales_ahead import scales  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

from atom_kernels import gemm  # noqa: E402
from atom_kernels.triton_utils import cdiv, sm_count  # noqa: E402

SHAPES = {
    "qwen3-8b qkv": (6144, 4096), "qwen3-8b o": (4096, 4096), "qwen3-8b gate_up": (24576, 4096),
    "qwen3-8b down": (4096, 12288), "qwen3-30b qkv": (5120, 2048), "v3 q_b": (24576, 1536),
    "v3 o": (7168, 16384), "v3 shared down": (7168, 2048),
}
VARIANTS = ("swap", "swap_tma", "tma")
SPLITS = (None, 1, 2, 4)
# The fewest K steps a split may have, by token tile, as the shipped rule takes them.
MIN_STEPS = {16: 6, 32: 8, 64: 12}
FP8 = torch.float8_e4m3fn
BLOCK_K = 128


@triton.jit(do_not_specialize=["M", "a_scale_stride_k"])
def _variant_kernel(a_ptr, b_ptr, b_desc, out_ptr, a_scale_ptr, b_scale_ptr, partial_ptr, M, N, K, a_stride,
                    b_stride, out_stride, a_scale_stride, a_scale_stride_k, b_scale_stride, k_per_split,
                    SWAP: tl.constexpr, TMA: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # Programs of one weight tile are adjacent (its token tiles), so they share it in L2.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m, pid_n = tl.program_id(0) % num_pid_m, tl.program_id(0) // num_pid_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid, col_valid = rows < M, cols < N
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * a_stride
    b_rows = b_ptr + cols.to(tl.int64)[:, None] * b_stride
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_first = tl.program_id(1) * k_per_split
    for k0 in range(k_first, tl.minimum(K, k_first + k_per_split), BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows + ks[None, :], mask=row_valid[:, None] & (ks < K)[None, :], other=0.0)
        if TMA:
            b = b_desc.load([pid_n * BLOCK_N, k0])  # zeros past N and K (the descriptor's bounds)
        else:
            b = tl.load(b_rows + ks[None, :], mask=col_valid[:, None] & (ks < K)[None, :], other=0.0)
        k_group = k0 // BLOCK_K
        sa = tl.load(a_scale_ptr + rows * a_scale_stride + k_group * a_scale_stride_k, mask=row_valid, other=0.0)
        sb = tl.load(b_scale_ptr + (cols // BLOCK_K) * b_scale_stride + k_group, mask=col_valid, other=0.0)
        if SWAP:
            acc += tl.dot(b, tl.trans(a)) * sb[:, None] * sa[None, :]
        else:
            acc += tl.dot(a, tl.trans(b)) * sa[:, None] * sb[None, :]
    if SWAP:
        acc = tl.trans(acc)
    mask = row_valid[:, None] & col_valid[None, :]
    if SPLIT:
        partial = partial_ptr + (tl.program_id(1) * M + rows.to(tl.int64))[:, None] * N + cols[None, :]
        tl.store(partial, acc, mask=mask)
    else:
        out = out_ptr + rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


def token_tile(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def launch_variant(a, b, a_scale, b_scale, variant: str, block_n: int, stages: int, split: int | None):
    """``out`` [M, N] bf16 of one variant; ``split`` None: the shipped rule's count for these tiles."""
    (m, k), n = a.shape, b.shape[0]
    block_m = token_tile(m)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    tiles, k_steps = cdiv(m, block_m) * cdiv(n, block_n), cdiv(k, BLOCK_K)
    if split is None:
        split = gemm._split_k(tiles, k_steps, MIN_STEPS[block_m], a.device)
    steps = cdiv(k_steps, min(split, k_steps))
    split = cdiv(k_steps, steps)
    partial = torch.empty((split, m, n), dtype=torch.float32, device=a.device) if split > 1 else None
    tma = variant.endswith("tma")
    b_desc = TensorDescriptor(b, [n, k], [b.stride(0), 1], [block_n, BLOCK_K]) if tma else None
    _variant_kernel[(tiles, split)](
        a, b, b_desc, out, a_scale, b_scale, partial, m, n, k, a.stride(0), b.stride(0), out.stride(0),
        a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), steps * BLOCK_K,
        SWAP=variant.startswith("swap"), TMA=tma, SPLIT=split > 1, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=BLOCK_K, num_warps=4, num_stages=stages)
    if split > 1:
        gemm._split_k_sum_kernel[(m, cdiv(n, 1024))](partial, out, None, m, n, out.stride(0), split,
                                                     HAS_BIAS=False, BLOCK_N=1024)
    return out


def us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return round(do_bench_cudagraph(fn, rep=5) * 1000, 2)


def measure_shape(name: str, n: int, k: int, rows: list[int], report: dict) -> None:
    """Every variant at each row count of ``rows``."""
    b = (torch.randn(n, k, device="cuda") * 0.05).to(FP8)
    b_scale = scales(cdiv(n, 128), k // 128)
    for m in rows:
        a, a_scale = torch.randn(m, k, device="cuda").to(FP8), scales(m, k // 128)
        shipped_out = gemm._launch_fp8_gemm(a, b, a_scale, b_scale, torch.bfloat16, None, True, 128).float()
        shipped = us(lambda: gemm._launch_fp8_gemm(a, b, a_scale, b_scale, torch.bfloat16, None, True, 128))
        best = None
        for variant, block_n, stages, split in itertools.product(VARIANTS, (64, 128), (4, 6), SPLITS):
            def run():
                return launch_variant(a, b, a_scale, b_scale, variant, block_n, stages, split)
            try:
                diff = ((run().float() - shipped_out).abs().max() / shipped_out.abs().max()).item()
                time = us(run)
            except triton.runtime.errors.OutOfResources:
                diff = time = float("inf")
            row = [name, m, variant, block_n, stages, split or "auto", time, float(f"{diff:.1e}")]
            report["rows"].append(row)
            if diff < 0.05 and (best is None or time < best[6]):
                best = row
        line = {"shape": name, "n": n, "k": k, "m": m, "shipped_us": shipped, "best": best}
        report["summary"].append(line)
        print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--rows", default="1,16,32,64")
    args = parser.parse_args()
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "sms": sm_count(torch.device("cuda")),
              "columns": ["shape", "m", "variant", "block_n", "stages", "split", "us", "max_rel_diff"],
              "rows": [], "summary": []}
    for name, (n, k) in SHAPES.items():
        measure_shape(name, n, k, [int(m) for m in args.rows.split(",")], report)
        with open(args.out, "w") as f:
            json.dump(report, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
