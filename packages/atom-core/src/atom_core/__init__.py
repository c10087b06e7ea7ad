"""ATOM core: model implementations and layers written once, served by vLLM and SGLang.

Never imports a host engine at import time; hosts plug in through ``atom_core.distributed``
(TP group) and ``atom_core.layers.attention`` (attention factory).
"""

from atom_core.config import Config, get_current_atom_config, set_current_atom_config

__all__ = ["Config", "get_current_atom_config", "set_current_atom_config"]
