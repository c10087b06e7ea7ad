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
import re
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


# Where vision-language checkpoints keep their language model (Qwen3.5: ``model.language_model.*``;
# Kimi-K2.5: ``language_model.model.*``, ``language_model.lm_head``), and the names the host hands
# ATOM's language model (``model.*``, ``lm_head``).
_LANGUAGE_MODEL_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                            ("language_model.", ""))
# The keys of a quantization_config that name modules left unquantized (fp8, compressed-tensors).
_UNQUANTIZED_MODULE_KEYS = ("modules_to_not_convert", "ignored_layers", "ignore")


def language_model_config(hf_config: Any, text_config: Any) -> Any:
    """The config ATOM's language model reads: ``text_config`` (a vision-language model's text
    config, or ``hf_config`` itself for a text model) with the checkpoint's ``quantization_config``,
    which a vision-language checkpoint keeps beside its ``text_config``, its module names renamed
    to those of the language model. A copy when anything changes; the host's config is untouched."""
    quantization = getattr(hf_config, "quantization_config", None)
    if text_config is hf_config or quantization is None:
        return text_config
    quantization = copy.deepcopy(dict(quantization))
    for key in _UNQUANTIZED_MODULE_KEYS:
        if quantization.get(key):
            quantization[key] = [_listed_language_model_name(name) for name in quantization[key]]
    config = copy.copy(text_config)
    config.quantization_config = quantization
    return config


def language_model_name(name: str) -> str:
    """A vision-language checkpoint's name of a language-model module or tensor as the host hands it
    to ATOM's language model (other names unchanged)."""
    for checkpoint, language_model in _LANGUAGE_MODEL_PREFIXES:
        if name.startswith(checkpoint):
            return language_model + name[len(checkpoint):]
    return name


def _listed_language_model_name(entry: str) -> str:
    """:func:`language_model_name` of an unquantized-module entry, a ``re:`` pattern's leading
    prefix included."""
    if not entry.startswith("re:"):
        return language_model_name(entry)
    for checkpoint, language_model in _LANGUAGE_MODEL_PREFIXES:
        if entry[3:].startswith(re.escape(checkpoint)):
            return "re:" + re.escape(language_model) + entry[3 + len(re.escape(checkpoint)):]
    return entry
