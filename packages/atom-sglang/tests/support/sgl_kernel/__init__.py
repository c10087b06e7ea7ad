"""TEST-ONLY stand-in for ``sgl_kernel`` on CPU machines. Not shipped in any wheel.

PyPI's ``sglang-kernel`` carries CUDA builds only: ``import sgl_kernel`` fails without libcuda, yet
SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports a few ``*_cpu`` ops at module level. The
tests put this directory first on ``PYTHONPATH`` of the engine processes. One op is implemented for
real in plain torch; every other name resolves to a stub that raises if it is ever called, so a
silent wrong result is impossible.

A few modules also bind ``torch.ops.sgl_kernel.*_cpu`` ops at import (SGLang's Qwen3.5, whose VLM
classes ATOM's subclass): those are registered as torch ops that raise the same way.

``torch.ops.sgl_kernel.convert_weight_packed`` is deliberately absent: SGLang then reports no AMX
support and takes its pure-torch CPU paths (RMSNorm, SiLU, RoPE, KV-cache stores).
"""

from __future__ import annotations

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For request i: ``req_to_token[req_pool_indices[i], start[i]:end[i]]`` takes the next
    ``end[i] - start[i]`` entries of ``out_cache_loc`` (packed request after request)."""
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


class StandInOpCalled(RuntimeError):
    pass


def _stub(name: str):
    def op(*args, **kwargs):
        raise StandInOpCalled(
            f"sgl_kernel.{name} was called, but the test stand-in does not implement it"
        )

    op.__name__ = name
    return op


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _stub(name)


# torch ops that SGLang modules bind at import on CPU (sglang.srt.models.qwen3_5, 0.5.17 to 0.5.23).
IMPORT_TIME_TORCH_OPS = (
    "fused_sigmoid_mul_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
)
_library = torch.library.Library("sgl_kernel", "FRAGMENT")
for _name in IMPORT_TIME_TORCH_OPS:
    _library.define(f"{_name}(Tensor[] args) -> Tensor")
    _library.impl(_name, _stub(_name), "CompositeExplicitAutograd")
