"""ATOM's environment switches that every host glue shares (read at call time, so tests can flip
them). The glues' own switches (``atom_vllm.envs``, ``atom_sglang.envs``) parse flags with
:func:`flag` as well."""

from __future__ import annotations

import os


def flag(name: str) -> bool:
    """A boolean environment switch: ``1``, ``true`` or ``yes`` (any case) turns it on."""
    return os.environ.get(name, "0").lower() in ("1", "true", "yes")


def strict_takeover() -> bool:
    """ATOM_STRICT_TAKEOVER=1: where ATOM would hand a model back to the host (see
    :mod:`atom_core.hosting.takeover`), refuse to start instead, naming the reasons."""
    return flag("ATOM_STRICT_TAKEOVER")
