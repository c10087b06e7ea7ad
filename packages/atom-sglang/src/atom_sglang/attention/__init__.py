"""ATOM attention inside SGLang: the ``atom`` attention backend (:mod:`.backend`; MLA: :mod:`.latent`),
the sliding-window convention shared with the model-side layer (:mod:`.window`) and the Gated DeltaNet
core over SGLang's state pool (:mod:`.gated_delta`)."""

from __future__ import annotations

import time

BACKEND_NAME = "atom"


def create_atom_backend(model_runner):
    """SGLang's attention-backend factory for ``atom`` (imports the backend only when used). SGLang
    calls it at start-up, after loading the model and allocating the KV pool, before capturing decode
    CUDA graphs: the backend compiles its prefill and extend kernels there."""
    from atom_core.hosting.warmup import log_warm_up

    if model_runner.use_mla_backend:
        from atom_sglang.attention.latent import ATOMLatentAttentionBackend as Backend
    else:
        from atom_sglang.attention.backend import ATOMAttentionBackend as Backend
    backend = Backend(model_runner)
    start = time.perf_counter()
    geometries = backend.compile_prefill_kernels(model_runner.model, model_runner.dtype)
    log_warm_up(f"prefill and extend attention kernels of {geometries} layer shape(s)",
                time.perf_counter() - start)
    return backend
