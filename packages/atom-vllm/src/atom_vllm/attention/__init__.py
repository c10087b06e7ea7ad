"""ATOM's attention backends for vLLM: one module per backend (``mha``, ``mla``)."""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport

import atom_kernels


class ATOMBackendBase(AttentionBackend):
    """What ATOM's backends share: they write into vLLM's output buffer, update the KV cache inside
    forward, and carry vLLM's out-of-tree name."""

    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        # Out-of-tree backends are named CUSTOM in vLLM's enum (registered in register.register_model).
        return "CUSTOM"


# Backends whose kernels read lengths and block tables on the device only. The torch references
# and the AITER adapters (which compute a max query length with int(...)) read them back to the host,
# which CUDA-graph capture forbids.
CAPTURE_SAFE_BACKENDS = frozenset({"triton"})


def decode_graph_support(decode_ops: tuple[str, ...]) -> AttentionCGSupport:
    """Uniform single-token decode batches can be captured whole as CUDA graphs when every op of the
    decode path runs a capture-safe kernel on the GPU."""
    if not torch.cuda.is_available():
        return AttentionCGSupport.NEVER
    backends = {atom_kernels.OPS[name].select("cuda") for name in decode_ops}
    if backends <= CAPTURE_SAFE_BACKENDS:
        return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    return AttentionCGSupport.NEVER
