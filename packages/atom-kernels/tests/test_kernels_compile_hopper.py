"""The Gated DeltaNet and conv kernels compile for Hopper (sm90) without a GPU. The interpreter
never compiles, so a kernel could pass the suite and still fail to compile, or ask for more shared
memory than an sm90 block has (the state pass once asked 312 KiB), on its first GPU. Run without
TRITON_INTERPRET, this file compiles them (Triton, ptxas: CPU only) at Qwen3-Next's shapes and the
launchers' settings."""

from __future__ import annotations

import os
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from atom_kernels import gated_delta, short_conv

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


def compile_for_hopper(kernel, constexprs: dict, num_warps: int, num_stages: int) -> int:
    source = ASTSource(fn=kernel, signature=signature(kernel, constexprs),
                       constexprs={(kernel.arg_names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(source, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})
    return compiled.metadata.shared


def main() -> None:
    heads = dict(HEAD_K=128, HEAD_V=128, USE_QK_L2NORM=True, BLOCK_K=128)
    conv = dict(KERNEL_SIZE=4, HAS_SLOTS=True, BLOCK_C=128)
    chunks = dict(heads, CHUNK=gated_delta.CHUNK_SIZE, BLOCK_V=gated_delta.STATE_BLOCK_V, DOT_PRECISION="tf32")
    kernels = [
        (gated_delta._gated_delta_chunk_prepare_kernel,
         dict(heads, CHUNK=gated_delta.CHUNK_SIZE, BLOCK_V=128, DOT_PRECISION="tf32",
              INVERSE_PRECISION=gated_delta.INVERSE_PRECISION_NVIDIA),
         gated_delta.PREPARE_WARPS, gated_delta.NUM_STAGES),
        (gated_delta._gated_delta_chunk_state_kernel, dict(chunks, HAS_SLOTS=True), gated_delta.STATE_WARPS,
         gated_delta.NUM_STAGES),
        (gated_delta._gated_delta_rule_decode_kernel, dict(heads, HAS_SLOTS=True, BLOCK_V=gated_delta.STATE_BLOCK_V),
         4),
        (short_conv._causal_conv1d_prefill_kernel,
         dict(conv, bias_ptr=None, HAS_BIAS=False, SILU=True, BLOCK_T=short_conv.PREFILL_BLOCK_T,
              BLOCK_C=short_conv.PREFILL_BLOCK_C), short_conv.PREFILL_WARPS),
        (short_conv._conv_state_kernel, dict(conv, BLOCK_W=4), 4),
        (short_conv._causal_conv1d_decode_kernel, dict(conv, bias_ptr=None, HAS_BIAS=False, SILU=True, BLOCK_W=4),
         4),
    ]
    for kernel, constexprs, num_warps, *stages in kernels:  # none set: Triton's 3
        shared = compile_for_hopper(kernel, constexprs, num_warps, *(stages or [3]))
        print(f"compiled {kernel.fn.__name__} shared={shared}", flush=True)


HOPPER_SHARED_BYTES = 227 * 1024  # the most one sm90 block may use
KERNELS = {"_gated_delta_chunk_prepare_kernel", "_gated_delta_chunk_state_kernel", "_gated_delta_rule_decode_kernel",
           "_causal_conv1d_prefill_kernel", "_conv_state_kernel", "_causal_conv1d_decode_kernel"}


def test_gated_delta_and_conv_kernels_compile_for_hopper():
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
