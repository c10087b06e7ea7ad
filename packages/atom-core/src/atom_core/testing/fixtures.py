"""pytest fixtures shared by the packages' test suites (``pytest_plugins = [...]`` in a conftest)."""

from __future__ import annotations

import pytest

from atom_core.testing.tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(architecture, **overrides) -> path of a freshly built tiny checkpoint,
    built once per session and per (architecture, overrides)."""
    built: dict = {}

    def make(architecture: str, **overrides) -> str:
        key = (architecture, repr(sorted(overrides.items())))
        if key not in built:
            out = tmp_path_factory.mktemp(architecture)
            built[key] = build_tiny_model(architecture, str(out), **overrides)
        return built[key]

    return make
