"""ATOM kernels: one Python API per LLM op, dispatched to the best available backend.

Backends: ``aiter`` (AMD AITER on ROCm), ``triton`` (our kernels, NVIDIA and AMD), ``torch`` (the
reference, runs anywhere). See :mod:`atom_kernels.registry` for selection and overrides.
"""

# After the op modules: registers the aiter adapters (imports no aiter).
# Last: wraps the ops defined above as torch.ops.atom.* for torch.compile.
from atom_kernels import (
    aiter,  # noqa: E402, F401, I001
    opaque,  # noqa: E402, F401, I001
)
from atom_kernels.activation import (
    clamped_swiglu,
    gelu_and_mul,
    silu_and_mul,
    silu_and_mul_quant_fp8,
)
from atom_kernels.attention import paged_attention, varlen_attention
from atom_kernels.cache import concat_and_cache_mla, reshape_and_cache
from atom_kernels.gated_delta import gated_delta_rule, gated_delta_rule_decode
from atom_kernels.gemm import fp8_block_scaled_mm, fp8_scaled_mm
from atom_kernels.mla import concat_mla_k, fused_qk_rope_concat_and_cache_mla, mla_decode
from atom_kernels.moe import fused_moe, warm_up_fused_moe
from atom_kernels.moe_align import moe_align_block_size
from atom_kernels.mxfp4 import dequantize_mxfp4, mxfp4_quant_dequant
from atom_kernels.mxfp4_gemm import mxfp4_linear
from atom_kernels.norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_quant_fp8,
    rms_norm,
    rms_norm_quant_fp8,
)
from atom_kernels.quant import per_group_quant_fp8, per_tensor_quant_fp8, per_token_quant_fp8
from atom_kernels.registry import (
    OPS,
    BackendUnavailableError,
    backend_report,
    backend_report_line,
    reset_selection,
    set_inductor_ops,
)
from atom_kernels.rope import (
    compute_cos_sin_cache,
    deepseek_yarn_mscale,
    default_inv_freq,
    llama3_inv_freq,
    qk_norm_rope,
    rotary_embedding,
    yarn_inv_freq,
    yarn_mscale,
)
from atom_kernels.routing import ROUTING_WARM_UP_TOKENS, grouped_topk, router_logits, topk_softmax
from atom_kernels.short_conv import causal_conv1d, causal_conv1d_decode

__all__ = [
    "OPS",
    "ROUTING_WARM_UP_TOKENS",
    "BackendUnavailableError",
    "backend_report",
    "backend_report_line",
    "causal_conv1d",
    "causal_conv1d_decode",
    "clamped_swiglu",
    "compute_cos_sin_cache",
    "concat_and_cache_mla",
    "concat_mla_k",
    "deepseek_yarn_mscale",
    "default_inv_freq",
    "dequantize_mxfp4",
    "fp8_block_scaled_mm",
    "fp8_scaled_mm",
    "fused_add_rms_norm",
    "fused_add_rms_norm_quant_fp8",
    "fused_moe",
    "fused_qk_rope_concat_and_cache_mla",
    "gated_delta_rule",
    "gated_delta_rule_decode",
    "gelu_and_mul",
    "grouped_topk",
    "llama3_inv_freq",
    "mla_decode",
    "moe_align_block_size",
    "mxfp4_linear",
    "mxfp4_quant_dequant",
    "paged_attention",
    "per_group_quant_fp8",
    "per_tensor_quant_fp8",
    "per_token_quant_fp8",
    "qk_norm_rope",
    "reset_selection",
    "reshape_and_cache",
    "rms_norm",
    "rms_norm_quant_fp8",
    "rotary_embedding",
    "router_logits",
    "set_inductor_ops",
    "silu_and_mul",
    "silu_and_mul_quant_fp8",
    "topk_softmax",
    "varlen_attention",
    "warm_up_fused_moe",
    "yarn_inv_freq",
    "yarn_mscale",
]
