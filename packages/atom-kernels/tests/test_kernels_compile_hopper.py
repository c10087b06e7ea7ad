"""The Gated DeltaNet and conv kernels, the dense block-FP8 GEMM (whole and split in K) with its split
sum, and the fused MoE GEMM's block-FP8 variants, its MXFP4 linear-layer variant and its MXFP4 gate/up
with register decoding, compile for Hopper (sm90) without
a GPU. The interpreter never compiles, so a kernel could pass the suite and still fail to compile, or
ask for more shared memory than an sm90 block has (the state pass once asked 312 KiB), on its first
GPU. Run without TRITON_INTERPRET, this file compiles them (Triton, ptxas: CPU only) at Qwen3-Next's
and DeepSeek-V3's shapes and the launchers' settings."""

from __future__ import annotations

import os
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from atom_kernels import gated_delta, gemm, moe, short_conv

HOPPER = GPUTarget("cuda", 90, 32)
FP32_POINTERS = {"g_ptr", "w_ptr", "u_ptr", "state_ptr"}
INT_POINTERS = {"slots_ptr": "*i32", "cu_seqlens_ptr": "*i32", "has_initial_state_ptr": "*i1"}


def signature(kernel, constexprs: dict) -> dict:
    """Argument types as the launchers pass them."""
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name in INT_POINTERS:
            types[name] = INT_POINTERS[name]
        elif name.endswith("_ptr"):
            types[name] = "*fp32" if name in FP32_POINTERS else "*bf16"
        else:
            types[name] = "fp32" if name == "scale" else "i32"
    return types


def runtime_hints(kernel, types: dict) -> dict:
    """The hints Triton's JIT gives a launch whose pointers and integers are multiples of 16 (torch's
    allocations; strides and sizes of 16k), except the kernel's ``do_not_specialize`` arguments.
    Without them the compiler pipelines no loop through shared memory (the MoE GEMMs asked 3-7 times
    less than with them), so this compiles the most shared memory a launch can ask for."""
    skip = {kernel.arg_names[i] if isinstance(i, int) else i for i in kernel.do_not_specialize}
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
            if name not in skip and (types[name].startswith("*") or types[name] == "i32")}


def compile_for_hopper(kernel, constexprs: dict, num_warps: int, num_stages: int) -> int:
    types = signature(kernel, constexprs)
    source = ASTSource(fn=kernel, signature=types, attrs=runtime_hints(kernel, types),
                       constexprs={(kernel.arg_names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(source, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})
    return compiled.metadata.shared


def moe_gemm_signature(w: str, w_scale: str, out: str, a_scale: bool, routed: bool, bias: bool) -> dict:
    """_moe_gemm_kernel's argument types as launch_moe_gemm passes them (None pointers are constexprs)."""
    pointers = {"a_ptr": "*fp8e4nv" if a_scale else "*bf16", "w_ptr": w, "bias_ptr": "*bf16" if bias else None,
                "out_ptr": out, "topk_weights_ptr": "*fp32" if routed else None, "sorted_ids_ptr": "*i32",
                "block_expert_ptr": "*i32", "a_scale_ptr": "*fp32" if a_scale else None, "w_scale_ptr": w_scale}
    floats = {"alpha", "limit"}
    return {name: pointers[name] if name in pointers else ("fp32" if name in floats else "i32")
            for name in moe._moe_gemm_kernel.arg_names}


def compile_variant(kernel, signature: dict, constexprs: dict, tiles: dict) -> int:
    types = {name: "constexpr" if name in constexprs else kind for name, kind in signature.items()}
    source = ASTSource(fn=kernel, signature=types, attrs=runtime_hints(kernel, types),
                       constexprs={(kernel.arg_names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(source, target=HOPPER,
                              options={"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})
    return compiled.metadata.shared


def compile_moe_gemm(signature: dict, constexprs: dict, tiles: dict) -> int:
    constexprs = {**{name: None for name, kind in signature.items() if kind is None}, **constexprs,
                  **{k: v for k, v in tiles.items() if k not in ("num_warps", "num_stages")}}
    return compile_variant(moe._moe_gemm_kernel, signature, constexprs, tiles)


def moe_gemm_variants() -> list[tuple[dict, dict, dict]]:
    """(signature, constexprs, tiles): block-FP8 gate/up and down (DeepSeek-V3's one-token tiles of the
    H100 table, the down GEMM split in K), both again with swapped operands, a bf16 gate/up swapped, an
    MXFP4 linear (microscaled dot) and an MXFP4 gate/up decoded in registers."""
    common = dict(A_ROW_DIVISOR=1, ACT=moe.ACT_SILU, DOT_PRECISION="ieee", EVEN_K=True, MXFP4=False,
                  MX_DOT=False, MX_REGISTERS=False, A_FORMAT="", HAS_BIAS=False, MUL_ROUTED_WEIGHT=False,
                  GATED=False, W8A8=True, SCALE_BLOCK=128, PARTIAL=False, BLOCK_M=16, SWAP_AB=False)
    gate_up = dict(common, GATED=True, A_ROW_DIVISOR=8)
    down = dict(common, MUL_ROUTED_WEIGHT=True, PARTIAL=True)
    linear = dict(common, W8A8=False, MXFP4=True, MX_DOT=True, A_FORMAT="bf16", SCALE_BLOCK=0, HAS_BIAS=True)
    # gpt-oss's gate/up GEMM with the weights decoded in registers (inline PTX: only ptxas checks it).
    registers = dict(linear, MX_DOT=False, MX_REGISTERS=True, GATED=True, A_ROW_DIVISOR=4,
                     ACT=moe.ACTIVATIONS["clamped_swiglu"])
    bf16_gate_up = dict(gate_up, W8A8=False, SCALE_BLOCK=0, SWAP_AB=True)
    tiles = moe.default_moe_config(1, 1)["down"]
    swapped = {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
    return [
        (moe_gemm_signature("*fp8e4nv", "*fp32", "*bf16", True, False, False), dict(gate_up, SWAP_AB=True), swapped),
        (moe_gemm_signature("*fp8e4nv", "*fp32", "*fp32", True, True, False), dict(down, SWAP_AB=True), swapped),
        (moe_gemm_signature("*bf16", None, "*bf16", False, False, False), bf16_gate_up, swapped),
        (moe_gemm_signature("*fp8e4nv", "*fp32", "*bf16", True, False, False), gate_up,
         {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 8, "num_stages": 4}),
        (moe_gemm_signature("*fp8e4nv", "*fp32", "*fp32", True, True, False), down,
         {"BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}),
        (moe_gemm_signature("*u8", "*u8", "*bf16", False, False, True), linear, tiles),
        (moe_gemm_signature("*u8", "*u8", "*bf16", False, False, True), registers,
         {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 3}),
    ]


def dense_fp8_variants() -> list[tuple]:
    """(kernel, signature, constexprs, tiles): the block-FP8 GEMM at one token (swapped operands) and
    64 rows, both split in K as at decode, and at prefill rows (whole), and the split sum."""
    pointers = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "out_ptr": "*bf16", "a_scale_ptr": "*fp32",
                "b_scale_ptr": "*fp32", "partial_ptr": "*fp32"}
    fixed = dict(bias_ptr=None, A_PER_ROW=True, B_PER_ROW=True, BLOCK_SCALED=True, SCALE_BLOCK=128,
                 HAS_BIAS=False)
    gemm_signature = {name: pointers.get(name, "i32") for name in gemm._fp8_gemm_kernel.arg_names}
    sum_signature = {"partial_ptr": "*fp32", "out_ptr": "*bf16", "bias_ptr": None}
    sum_signature = {name: sum_signature.get(name, "i32") for name in gemm._split_k_sum_kernel.arg_names}
    variants = []
    for rows, split in ((1, True), (64, True), (4096, False)):
        tiles = gemm._gemm_config(rows)
        constexprs = dict(fixed, SPLIT=split, **{k: v for k, v in tiles.items() if k.isupper()},
                          **({} if split else {"partial_ptr": None}))
        variants.append((gemm._fp8_gemm_kernel, gemm_signature, constexprs, tiles))
    variants.append((gemm._split_k_sum_kernel, sum_signature, dict(bias_ptr=None, HAS_BIAS=False, BLOCK_N=1024),
                     {"num_warps": 4, "num_stages": 3}))
    return variants


def main() -> None:
    heads = dict(HEAD_K=128, HEAD_V=128, USE_QK_L2NORM=True, BLOCK_K=128)
    conv = dict(KERNEL_SIZE=4, HAS_SLOTS=True, BLOCK_C=128)
    chunks = dict(heads, CHUNK=gated_delta.CHUNK_SIZE, BLOCK_V=gated_delta.STATE_BLOCK_V, DOT_PRECISION="tf32")
    kernels = [
        *((gated_delta._gated_delta_chunk_prepare_kernel,
           dict(heads, CHUNK=gated_delta.CHUNK_SIZE, BLOCK_V=128, DOT_PRECISION="tf32",
                INVERSE_PRECISION=gated_delta.INVERSE_PRECISION_NVIDIA, INVERSE_SUB=sub, DOT_16BIT=d16),
           gated_delta.PREPARE_WARPS, 1) for sub, d16 in ((16, False), (4, False), (4, True))),
        *((gated_delta._gated_delta_chunk_state_kernel, dict(chunks, HAS_SLOTS=True, DOT_16BIT=dot_16bit),
           gated_delta.STATE_WARPS, gated_delta.STATE_STAGES) for dot_16bit in (False, True)),
        (gated_delta._gated_delta_rule_decode_kernel, dict(heads, HAS_SLOTS=True, BLOCK_V=gated_delta.STATE_BLOCK_V),
         4),
        *((short_conv._causal_conv1d_prefill_kernel,
           dict(conv, KERNEL_SIZE=width, bias_ptr=None, HAS_BIAS=False, SILU=True, BLOCK_T=short_conv.PREFILL_BLOCK_T,
                BLOCK_C=short_conv.PREFILL_BLOCK_C, UNROLL=short_conv.PREFILL_UNROLL), short_conv.PREFILL_WARPS)
          for width in (4, 2)),
        (short_conv._conv_state_kernel, dict(conv, BLOCK_W=4), 4),
        (short_conv._causal_conv1d_decode_kernel, dict(conv, bias_ptr=None, HAS_BIAS=False, SILU=True, BLOCK_W=4),
         4),
    ]
    for kernel, constexprs, num_warps, *stages in kernels:  # none set: Triton's 3
        shared = compile_for_hopper(kernel, constexprs, num_warps, *(stages or [3]))
        print(f"compiled {kernel.fn.__name__} shared={shared}", flush=True)
    for signature, constexprs, tiles in moe_gemm_variants():
        shared = compile_moe_gemm(signature, constexprs, tiles)
        print(f"compiled _moe_gemm_kernel shared={shared}", flush=True)
    for kernel, signature, constexprs, tiles in dense_fp8_variants():
        shared = compile_variant(kernel, signature, constexprs, tiles)
        print(f"compiled {kernel.fn.__name__} shared={shared}", flush=True)


HOPPER_SHARED_BYTES = 227 * 1024  # the most one sm90 block may use
KERNELS = {"_gated_delta_chunk_prepare_kernel", "_gated_delta_chunk_state_kernel", "_gated_delta_rule_decode_kernel",
           "_causal_conv1d_prefill_kernel", "_conv_state_kernel", "_causal_conv1d_decode_kernel", "_moe_gemm_kernel",
           "_fp8_gemm_kernel", "_split_k_sum_kernel"}


def test_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    shared = {}
    for line in proc.stdout.splitlines():
        if line.startswith("compiled "):
            name, size = line.split()[1:]
            shared[name] = max(shared.get(name, 0), int(size.removeprefix("shared=")))
    assert set(shared) == KERNELS
    assert all(size <= HOPPER_SHARED_BYTES for size in shared.values()), shared


if __name__ == "__main__":
    main()
