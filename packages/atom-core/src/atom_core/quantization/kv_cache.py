"""KV-cache scales from checkpoints: one fp32 scale per layer for K and one for V, which an FP8 KV
cache divides K / V by on write and multiplies back on read.

The checkpoint names ATOM reads (as vLLM 0.26 does, ``maybe_remap_kv_scale_name``) map onto the
``k_scale`` / ``v_scale`` parameters of the layer's ``self_attn.attn`` (atom_core.layers.attention):

| checkpoint tensors (``model.layers.N.``...) | written by | ATOM parameter (``self_attn.attn.``) |
|---|---|---|
| ``self_attn.k_scale``, ``self_attn.v_scale`` | compressed-tensors ``kv_cache_scheme`` | ``k_scale``, ``v_scale`` |
| ``self_attn.k_proj.k_scale``, ``self_attn.v_proj.v_scale`` | older ``fp8`` checkpoints | the same |
| ``self_attn.kv_scale`` | legacy: one for K and V | ``k_scale``; the host copies it to V |

compressed-tensors zero points (``self_attn.k_zero_point``; symmetric schemes only, so zero) are
skipped, as vLLM skips them. Query and probability scales (``q_scale``, ``prob_scale``) let an
attention kernel quantize its query and softmax probabilities to FP8 (vLLM uses them only with an
FP8 KV cache, on backends that do so); ATOM's attention keeps both in 16 bits, so it skips them
(:data:`FP8_ATTENTION_SCALE`) and says so once per load, rather than refusing a checkpoint that the
host serves.
"""

from __future__ import annotations

import re

import torch

_KV_SCALE_NAMES = (
    (re.compile(r"\.self_attn\.([kv])_proj\.\1_scale$"), r".self_attn.attn.\1_scale"),
    (re.compile(r"\.self_attn\.([kv])_scale$"), r".self_attn.attn.\1_scale"),
    (re.compile(r"\.self_attn\.kv_scale$"), r".self_attn.attn.k_scale"),
)
KV_ZERO_POINT = r".*\.self_attn\.[qkv]_zero_point"
FP8_ATTENTION_SCALE = r".*\.self_attn\.(?:q_proj\.)?(?:q_scale|prob_scale)"


def kv_scale_param_name(name: str) -> str | None:
    """The ATOM parameter of the checkpoint KV-cache scale ``name``, or None when ``name`` is none."""
    for pattern, replacement in _KV_SCALE_NAMES:
        if pattern.search(name):
            return pattern.sub(replacement, name)
    return None


def kv_scale_loader(param: torch.nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """Loader of a per-layer KV-cache scale: one positive, finite value (shape ``[]`` or ``[1]``)."""
    if loaded.numel() != 1:
        raise ValueError(f"a KV-cache scale is one value per layer, got shape {tuple(loaded.shape)} "
                         "(per-head or per-channel KV-cache scales are not supported)")
    value = loaded.float().reshape(())
    if not bool(torch.isfinite(value)) or value.item() <= 0:
        raise ValueError(f"a KV-cache scale must be positive and finite, got {value.item()}")
    param.data.copy_(value)

