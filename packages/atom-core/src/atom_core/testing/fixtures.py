"""pytest fixtures shared by the packages' test suites (``pytest_plugins = [...]`` in a conftest)."""

from __future__ import annotations

import pytest

from atom_core.testing.tiny_models import build_tiny_model
from atom_core.testing.tiny_vision_language import TINY_VISION_LANGUAGE, build_tiny_vision_language_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(architecture, **overrides) -> path of a freshly built tiny checkpoint (with its
    processor, for a vision-language architecture), built once per session and per (architecture,
    overrides)."""
    built: dict = {}

    def make(architecture: str, **overrides) -> str:
        key = (architecture, repr(sorted(overrides.items())))
        if key not in built:
            out = tmp_path_factory.mktemp(architecture)
            build = (build_tiny_vision_language_model if architecture in TINY_VISION_LANGUAGE
                     else build_tiny_model)
            built[key] = build(architecture, str(out), **overrides)
        return built[key]

    return make
