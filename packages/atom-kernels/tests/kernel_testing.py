"""Helpers shared by the kernel tests: the device, the backends under test and dtype tolerances."""

from __future__ import annotations

import pytest
import torch

from atom_kernels.registry import OPS

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"
BACKENDS = ["torch", "triton"]
FLOAT_DTYPES = [torch.float32, torch.bfloat16]

# (rtol, atol) against a float64 reference, for outputs of one rounding (elementwise) and for outputs
# that went through accumulations and intermediate roundings (matmuls, softmax, attention).
_TOLERANCES = {
    torch.float32: {"elementwise": (1e-5, 1e-5), "accumulated": (2e-4, 2e-4)},
    torch.bfloat16: {"elementwise": (8e-3, 8e-3), "accumulated": (2e-2, 2e-2)},
    torch.float16: {"elementwise": (2e-3, 2e-3), "accumulated": (5e-3, 5e-3)},
}


def impl(op_name: str, backend: str):
    return OPS[op_name].impl(backend)


def compiled_variants(*kernels) -> int:
    """How many variants of these Triton kernels this process has compiled (on any device): tests
    check that a batch mix compiles none beyond the first."""
    return sum(len(entry[0]) for kernel in kernels for entry in kernel.device_caches.values())


def tolerance(dtype: torch.dtype, kind: str = "elementwise") -> tuple[float, float]:
    """(rtol, atol) of ``dtype`` for outputs of one rounding or of accumulations."""
    return _TOLERANCES[dtype][kind]


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, kind: str = "elementwise"
) -> None:
    """Compare with the tolerance of ``dtype``; atol scales with the reference's magnitude."""
    rtol, atol = tolerance(dtype, kind)
    expected = expected.to(torch.float64)
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual.to(torch.float64), expected, rtol=rtol, atol=atol * scale)


def rand(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(device=DEVICE, dtype=dtype)


def cu_seqlens(lengths: list[int]) -> torch.Tensor:
    return torch.tensor(
        [0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE
    )


def paged_layout(
    lengths: list[int], block_size: int, spare_blocks: int = 3
) -> tuple[torch.Tensor, int]:
    """A block table that scatters each sequence over random, distinct blocks, and the block count."""
    blocks_per_seq = max(-(-n // block_size) for n in lengths)
    num_blocks = len(lengths) * blocks_per_seq + spare_blocks
    table = torch.randperm(num_blocks)[: len(lengths) * blocks_per_seq].view(
        len(lengths), blocks_per_seq
    )
    return table.to(device=DEVICE, dtype=torch.int32), num_blocks


def reference_attention(q, k, v, scale, causal, window, sinks):
    """float64 attention of one sequence: q [Lq, H, D], k [Lk, KH, D], v [Lk, KH, Dv] -> [Lq, H, Dv].

    Query i sits at key position Lk - Lq + i; it sees key j if j <= that (causal) and j is among the
    last ``window`` positions up to it. A sink adds exp(sink) to the softmax denominator.
    """
    num_q, num_heads = q.shape[:2]
    num_k, num_kv_heads = k.shape[:2]
    q_pos = torch.arange(num_q, device=q.device)[:, None] + (num_k - num_q)
    k_pos = torch.arange(num_k, device=q.device)[None, :]
    visible = torch.ones(num_q, num_k, dtype=torch.bool, device=q.device)
    if causal:
        visible &= k_pos <= q_pos
    if window is not None:
        visible &= k_pos > q_pos - window
    out = torch.zeros(num_q, num_heads, v.shape[-1], dtype=torch.float64, device=q.device)
    for h in range(num_heads):
        kv_head = h // (num_heads // num_kv_heads)
        scores = (q[:, h].double() @ k[:, kv_head].double().T) * scale
        scores = scores.masked_fill(~visible, float("-inf"))
        terms = [scores] if sinks is None else [scores, sinks[h].double().expand(num_q, 1)]
        log_denominator = torch.logsumexp(torch.cat(terms, dim=1), dim=1, keepdim=True)
        out[:, h] = torch.exp(scores - log_denominator) @ v[:, kv_head].double()
    return out


def gather_paged(cache: torch.Tensor, block_row: torch.Tensor, length: int) -> torch.Tensor:
    """Positions 0..length-1 of one sequence, read slot by slot through its block table row."""
    block_size = cache.shape[1]
    return torch.stack([cache[block_row[p // block_size], p % block_size] for p in range(length)])


backends = pytest.mark.parametrize("backend", BACKENDS)
# Ops with a torchlib implementation (torch's own kernels, Hopper and newer) test it too.
LIBRARY = ["torchlib"] if ON_GPU and torch.cuda.get_device_capability() >= (9, 0) else []
library_backends = pytest.mark.parametrize("backend", BACKENDS + LIBRARY)
float_dtypes = pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["fp32", "bf16"])
