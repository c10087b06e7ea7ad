"""Building the ATOM model a host glue wraps: the same steps for every host."""

from __future__ import annotations

import dataclasses

from torch import nn

import atom_kernels
from atom_core.config import Config, set_current_atom_config
from atom_core.hosting.hf_config import complete_hf_config
from atom_core.log import logger
from atom_core.models import get_model_class
from atom_core.quantization.fp8 import fusion_report_line

_backends_logged = False


def build_atom_model(config: Config, architecture: str, host: str, prefix: str = "") -> nn.Module:
    """ATOM's model for ``architecture``, from ``config`` whose HF config gets HF's defaults for the
    keys it lacks; that completed config becomes the process's current ATOM config. Logs which
    class serves, and the kernel backends once per process."""
    global _backends_logged
    model_cls = get_model_class(architecture)
    config = dataclasses.replace(
        config, hf_config=complete_hf_config(config.hf_config, model_cls.hf_defaults)
    )
    set_current_atom_config(config)
    logger.info("Use ATOM model %s.%s for %s in %s", model_cls.__module__, model_cls.__name__,
                architecture, host)
    if not _backends_logged:
        logger.info(atom_kernels.backend_report_line())
        logger.info(fusion_report_line())
        _backends_logged = True
    return model_cls(config, prefix=prefix)
