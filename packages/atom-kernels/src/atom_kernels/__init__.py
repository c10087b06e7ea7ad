"""ATOM kernels: one Python API per LLM op, dispatched to the best available backend.

Backends: ``aiter`` (AMD AITER on ROCm), ``triton`` (our kernels, NVIDIA and AMD), ``torch`` (the
reference, runs anywhere). See :mod:`atom_kernels.registry` for selection and overrides.
"""

from atom_kernels.activation import silu_and_mul
from atom_kernels.attention import paged_attention, varlen_attention
from atom_kernels.cache import reshape_and_cache
from atom_kernels.moe import fused_moe, topk_softmax
from atom_kernels.norm import fused_add_rms_norm, rms_norm
from atom_kernels.registry import (
    OPS,
    BackendUnavailableError,
    backend_report,
    backend_report_line,
    reset_selection,
)
from atom_kernels.rope import compute_cos_sin_cache, rotary_embedding

__all__ = [
    "OPS",
    "BackendUnavailableError",
    "backend_report",
    "backend_report_line",
    "compute_cos_sin_cache",
    "fused_add_rms_norm",
    "fused_moe",
    "paged_attention",
    "reset_selection",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "topk_softmax",
    "varlen_attention",
]
