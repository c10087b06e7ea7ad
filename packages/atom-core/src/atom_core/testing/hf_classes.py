"""HF transformers' own config and model classes, whatever the host registered in this process.

vLLM registers its own config classes into ``AutoConfig`` for some model types (``qwen3_next``,
``qwen3_5``, ``qwen3_5_moe``, ``kimi_k25``, ...) once it has read such a checkpoint's config. From
then on, in that process, ``AutoConfig`` builds vLLM's class: a tiny checkpoint built with it, or an
HF reference loaded with it, is no longer HF's model (vLLM's Qwen3.5 vision config has no rope
parameters, for one). Tests build checkpoints and load references through these helpers instead.
"""

from __future__ import annotations

from typing import Any

import torch


def transformers_config_class(model_type: str) -> type:
    """transformers' own config class for ``model_type``."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return getattr(transformers, CONFIG_MAPPING_NAMES[model_type])


def transformers_config(model_dir: str):
    """``model_dir``'s config.json read by transformers' own config class."""
    from transformers import PretrainedConfig

    model_type = PretrainedConfig.get_config_dict(model_dir)[0]["model_type"]
    return transformers_config_class(model_type).from_pretrained(model_dir)


def hf_reference_model(model_dir: str, auto_class: str = "AutoModelForCausalLM", **options: Any):
    """HF's own model for ``model_dir`` in fp32 and eval mode, built on transformers' own config."""
    import transformers

    model_class = getattr(transformers, auto_class)
    return model_class.from_pretrained(model_dir, config=transformers_config(model_dir), dtype=torch.float32,
                                       **options).eval()
