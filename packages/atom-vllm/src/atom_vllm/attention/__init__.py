"""ATOM's attention backends for vLLM: one module per backend (``mha``, ``mla``)."""

from __future__ import annotations

import torch
from vllm.v1.attention.backend import AttentionCGSupport

import atom_kernels


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
