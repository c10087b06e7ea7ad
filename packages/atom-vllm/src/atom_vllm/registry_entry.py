"""ATOM's entry in vLLM's model registry, for each architecture ATOM implements.

vLLM inspects a registered class's interfaces (pipeline parallelism, multimodality, ...) when it
builds its config, before ATOM can see the configuration; ATOM's wrapper decides per model instance
whether ATOM or vLLM's own class serves (atom_vllm.model_wrapper). So the entry reports the
interfaces of vLLM's own class, which serves every configuration ATOM hands back, and loads ATOM's
wrapper.

Host internal used: ``ModelRegistry.models`` holds ``_BaseRegisteredModel`` entries, and
``register_model`` accepts only a class or a ``module:Class`` string (vLLM 0.26). A registry hook
that sees the model config would let this go.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from vllm.model_executor.models.registry import _BaseRegisteredModel


@dataclass(frozen=True)
class ATOMRegisteredModel(_BaseRegisteredModel):
    host_entry: _BaseRegisteredModel  # vLLM's own entry for the architecture
    wrapper: str  # "module:Class" of ATOM's wrapper

    def inspect_model_cls(self):
        return self.host_entry.inspect_model_cls()

    def load_model_cls(self):
        module, name = self.wrapper.split(":")
        return getattr(importlib.import_module(module), name)


def register_atom_model(registry, architecture: str, wrapper: str) -> None:
    """Point ``registry`` at ATOM's wrapper for ``architecture``, keeping vLLM's own entry."""
    entry = registry.models[architecture]
    host_entry = entry.host_entry if isinstance(entry, ATOMRegisteredModel) else entry
    registry.models[architecture] = ATOMRegisteredModel(host_entry, wrapper)


def host_model_class(registry, architecture: str) -> type:
    """vLLM's own model class for ``architecture`` (the one ATOM's registration replaced)."""
    return registry.models[architecture].host_entry.load_model_cls()
