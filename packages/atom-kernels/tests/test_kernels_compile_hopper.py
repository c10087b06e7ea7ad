"""The Gated DeltaNet and conv kernels compile for Hopper (sm90), checked without a GPU.

The kernel suite runs Triton's interpreter, which never compiles: a kernel can pass every test here
and still fail to compile, or ask for more shared memory than an H100/H200 block has, on the first
GPU it meets (the chunked delta rule's state pass once asked for 312 KiB). compile_for_hopper.py
compiles them for sm90 in a process of its own, without the interpreter.
"""

import os
import subprocess
import sys
from pathlib import Path

HOPPER_SHARED_BYTES = 227 * 1024  # the most shared memory one block may use on sm90
KERNELS = {"_gated_delta_chunk_prepare_kernel", "_gated_delta_chunk_state_kernel", "_gated_delta_rule_decode_kernel",
           "_causal_conv1d_prefill_kernel", "_conv_state_kernel", "_causal_conv1d_decode_kernel"}


def test_gated_delta_and_conv_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_for_hopper.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    shared = {}
    for line in proc.stdout.splitlines():
        if line.startswith("compiled "):
            name, size = line.split()[1:]
            shared[name] = int(size.removeprefix("shared="))
    assert set(shared) == KERNELS
    assert all(size <= HOPPER_SHARED_BYTES for size in shared.values()), shared
