"""SGLang entry point (``sglang.srt.plugins``). SGLang's ``load_plugins()`` runs it early in every
process (main, scheduler, ...); it is idempotent and cheap: no model, kernel or attention code is
imported here, only registered for SGLang to import when it needs it."""

from __future__ import annotations

import os
import sys

from atom_core.hosting.version import HostVersionError
from atom_core.log import logger
from atom_sglang import envs
from atom_sglang.version import SGLANG_RELEASE

MODELS_PACKAGE = "atom_sglang.models"
EXTERNAL_MODEL_PACKAGE = "SGLANG_EXTERNAL_MODEL_PACKAGE"
_registered = False


def register_plugin() -> None:
    """Make ATOM's model package active, register the ``atom`` attention backend and ATOM's hooks."""
    global _registered
    if envs.plugin_disabled():
        # A parent process with ATOM active hands its model package down through the environment.
        if os.environ.get(EXTERNAL_MODEL_PACKAGE) == MODELS_PACKAGE:
            del os.environ[EXTERNAL_MODEL_PACKAGE]
        return
    if _registered:
        return
    try:
        SGLANG_RELEASE.check()
    except HostVersionError as exc:
        # SGLang logs and swallows plugin exceptions; say it plainly and stay out of the way.
        logger.error("SGLang plugin not activated: %s", exc)
        return
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    from atom_sglang import patches
    from atom_sglang.attention import BACKEND_NAME, create_atom_backend

    # SGLang registers the package named by SGLANG_EXTERNAL_MODEL_PACKAGE over its own classes when
    # its model registry is first imported (in the scheduler, after this runs; child processes
    # inherit the variable). If the registry is already imported, or the user named a package of
    # their own, register directly; the user's package goes last so that it keeps the last word.
    external = os.environ.get(EXTERNAL_MODEL_PACKAGE)
    if "sglang.srt.models.registry" not in sys.modules and external in (None, "", MODELS_PACKAGE):
        os.environ[EXTERNAL_MODEL_PACKAGE] = MODELS_PACKAGE
    else:
        from sglang.srt.models.registry import ModelRegistry

        ModelRegistry.register(MODELS_PACKAGE, overwrite=True)
        if external and external != MODELS_PACKAGE:
            ModelRegistry.register(external, overwrite=True)

    register_attention_backend(BACKEND_NAME)(create_atom_backend)
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    patches.register_hooks()
    _registered = True
    logger.info("SGLang plugin active: ATOM models (%s) and the %r attention backend", MODELS_PACKAGE,
                BACKEND_NAME)
