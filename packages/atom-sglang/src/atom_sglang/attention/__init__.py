"""ATOM attention inside SGLang: the ``atom`` attention backend (:mod:`.backend`) and the sliding-window
convention shared with the model-side layer (:mod:`.window`)."""

from __future__ import annotations

BACKEND_NAME = "atom"


def create_atom_backend(model_runner):
    """SGLang's attention-backend factory for ``atom`` (imports the backend only when used)."""
    from atom_sglang.attention.backend import ATOMAttentionBackend

    if model_runner.use_mla_backend:
        raise NotImplementedError("the atom attention backend has no MLA path in SGLang yet")
    return ATOMAttentionBackend(model_runner)
