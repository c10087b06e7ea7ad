"""HF configs read as HF reads them: a key the config.json omits takes HF's default.

Published configs omit many keys (gpt-oss has no ``swiglu_alpha``), and transformers fills each
absent key from its config class. Older transformers releases lack some of those keys altogether
(transformers 5.12 and 5.17 know no ``GptOssConfig.swiglu_alpha``), so a model read on them would
miss the attribute. Each ATOM model class lists, as ``hf_defaults``, the defaults of the current
transformers (5.23) for the optional keys it reads; :func:`complete_hf_config` adds the absent ones
to a copy of the config, once, at the model boundary.
"""

from __future__ import annotations

import copy
from typing import Any


def complete_hf_config(hf_config: Any, defaults: dict[str, Any]) -> Any:
    """``hf_config`` with every key of ``defaults`` it lacks set to its default (a copy when any is
    missing; the host's own config object is never changed)."""
    missing = {key: value for key, value in defaults.items() if not hasattr(hf_config, key)}
    if getattr(hf_config, "num_key_value_heads", None) is None:
        # HF's rule for every family here: no KV-head count means multi-head attention.
        missing["num_key_value_heads"] = hf_config.num_attention_heads
    if not missing:
        return hf_config
    completed = copy.deepcopy(hf_config)
    for key, value in missing.items():
        setattr(completed, key, copy.deepcopy(value))
    return completed
