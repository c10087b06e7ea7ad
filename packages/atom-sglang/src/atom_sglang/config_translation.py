"""SGLang ModelConfig -> atom_core Config, as one pure function.

| ATOM Config field        | from SGLang                                                    |
|--------------------------|----------------------------------------------------------------|
| model                    | model_config.model_path                                        |
| hf_config                | the HF config SGLang hands the model class, unpadded (below);  |
|                          | a VLM's text config, with the checkpoint's quantization_config |
| torch_dtype              | model_config.dtype                                             |
| max_model_len            | model_config.context_len                                       |
| compilation level        | always 0: torch.compile and CUDA graphs are SGLang's           |

On ``--device cpu`` SGLang pads the HF config in place before building the model
(``adjust_config_with_unaligned_cpu_tp``): MLP/expert intermediate sizes up to a multiple of 32 x TP,
keeping the true value in ``original_<name>``. SGLang's layers zero-pad their weights to match; ATOM's
layers load the checkpoint as it is, so ATOM gets a copy with the true sizes. Padded attention
heads (a TP size that does not divide them) would change SGLang's KV pool as well: such models are
handed back (:func:`cpu_padded_heads`).

SGLang's own config classes of Qwen3-Next and of Qwen3.5's text model keep no ``layer_types``: SGLang
splits the layers by ``full_attention_interval`` alone, and sizes its state pool by that split. ATOM's
model reads ``layer_types``, so ATOM gets a copy with them, by HF's rule for a config without them
(every ``full_attention_interval``-th layer full attention, 4 by HF's default): the split SGLang's
pool has.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from atom_core.config import Config
from atom_core.hosting.hf_config import language_model_config
from atom_core.hosting.takeover import HostedModel, TakeoverDecision, decide_takeover
from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_core.quantization import quant_config_from_hf


def architecture_of(model_config: Any) -> str:
    """The architecture SGLang looks up first for ``model_config`` ("" where the config names none)."""
    return (getattr(model_config.hf_config, "architectures", None) or [""])[0]


# SGLang's vision-language classes that build their language model themselves, as a text architecture
# ATOM implements (no ``language_model_cls`` argument): ATOM's class of the VLM puts its model of that
# architecture in (atom_sglang.vision_language), so the decision is that architecture's.
LANGUAGE_MODEL_ARCHITECTURES = {"KimiK25ForConditionalGeneration": "DeepseekV3ForCausalLM"}


def served_architecture(model_config: Any) -> str:
    """The architecture ATOM's model would be built as: :func:`architecture_of`, or the language
    model's for the VLMs of :data:`LANGUAGE_MODEL_ARCHITECTURES`."""
    architecture = architecture_of(model_config)
    return LANGUAGE_MODEL_ARCHITECTURES.get(architecture, architecture)


def hosted_model_from_sglang(server_args: Any, model_config: Any) -> HostedModel:
    """What SGLang asks of the model, for the takeover decision (atom_core.hosting.takeover).
    ``model_config.quantization`` is the method SGLang resolved: the checkpoint's, or the one
    ``--quantization`` asked for."""
    return HostedModel(
        host="SGLang",
        architecture=served_architecture(model_config),
        hf_config=language_model_config(model_config.hf_config, model_config.hf_text_config),
        dtype=model_config.dtype,
        quantization=model_config.quantization,
        lora=bool(server_args.enable_lora or server_args.lora_paths),
        tensor_parallel_size=server_args.tp_size,
        pipeline_parallel_size=server_args.pp_size,
        context_parallel_size=server_args.dcp_size * server_args.attn_cp_size,
        # SGLang's --dp-size replicas are independent engines unless attention is data-parallel.
        data_parallel_attention=server_args.enable_dp_attention,
        expert_parallel=server_args.ep_size > 1,
        expert_load_balancing=server_args.enable_eplb,
        kv_cache_dtype=server_args.kv_cache_dtype,
        speculative_method=server_args.speculative_algorithm,
        generates=not server_args.is_embedding,
        device=server_args.device,
        model_impl=model_config.model_impl,
    )


# SGLang 0.5.17's compressed-tensors config gives RadixAttention no KV-cache method: its own models
# drop a kv_cache_scheme's scales (and keep --kv-cache-dtype as given). ATOM would apply them, so
# SGLang serves such checkpoints itself.
CT_KV_SCALES_REASON = "compressed-tensors KV-cache scales are not read by SGLang"


# Qwen3-Next's Gated DeltaNet states live in SGLang's state pool (atom_sglang.attention.gated_delta).
# SGLang's extra_buffer strategy of its radix cache (its default where overlap scheduling is on or pages
# hold more than one token, i.e. on GPUs) also keeps each prefill's state at its last 64-token chunk
# boundary, an intermediate state of the chunked rule that ATOM's kernel does not return.
STATE_CHECKPOINTS_REASON = ("SGLang's extra_buffer radix cache of linear-attention states is not supported "
                            "(--mamba-radix-cache-strategy no_buffer with --disable-overlap-schedule is)")


def keeps_state_checkpoints(server_args: Any) -> bool:
    """Whether SGLang's radix cache keeps linear-attention states by its extra_buffer strategy: as set,
    or, while ``auto`` is still being resolved (the attention default is decided before it), as SGLang
    resolves it (``_mamba_radix_cache_resolution``)."""
    if server_args.disable_radix_cache:
        return False
    strategy = server_args.mamba_radix_cache_strategy
    if strategy == "auto":
        return not server_args.disable_overlap_schedule or (server_args.page_size or 1) > 1
    return strategy != "no_buffer"


# On CPU, --enable-torch-compile makes SGLang capture CPU graphs (its CPUGraphRunner), which ask the
# attention backend for init_cpu_graph_state: SGLang's intel_amx backend has it, ATOM's has not.
CPU_GRAPHS_REASON = "SGLang's CPU graphs (--enable-torch-compile on CPU) are not supported"

# The vision half of SGLang's encoder/language split builds no language model, the part ATOM serves.
ENCODER_ONLY_REASON = "SGLang's encoder-only server (--encoder-only) runs no language model"


def cpu_padded_heads(model: HostedModel) -> str | None:
    """Why SGLang pads this model's attention heads, where it does: on CPU, for a TP size that does not
    divide the query or KV heads, it pads both (``adjust_config_with_unaligned_cpu_tp``, when the model
    runner starts, keeping the true counts in ``original_*``). Read from those where present."""
    config, tp = model.hf_config, model.tensor_parallel_size
    heads = getattr(config, "original_num_attention_heads", config.num_attention_heads)
    kv_heads = getattr(config, "original_total_num_kv_heads", getattr(config, "num_key_value_heads", None) or heads)
    if model.device != "cpu" or (heads % tp == 0 and kv_heads % tp == 0):
        return None
    return (f"SGLang pads {heads} query and {kv_heads} KV heads on CPU for TP size {tp}, which does not divide "
            "them; ATOM's models take unpadded heads only")


def takeover_decision(server_args: Any, model_config: Any) -> TakeoverDecision:
    model = hosted_model_from_sglang(server_args, model_config)
    decision = decide_takeover(model)
    padded_heads = cpu_padded_heads(model) if decision.atom_serves else None
    if padded_heads:
        return dataclasses.replace(decision, reasons=(padded_heads,))
    if decision.atom_serves and model.device == "cpu" and getattr(server_args, "enable_torch_compile", False):
        return dataclasses.replace(decision, reasons=(CPU_GRAPHS_REASON,))
    if decision.atom_serves and server_args.encoder_only:
        return dataclasses.replace(decision, reasons=(ENCODER_ONLY_REASON,))
    recurrent_state = decision.atom_serves and SUPPORTED_ARCHITECTURES[model.architecture].recurrent_state
    if recurrent_state and keeps_state_checkpoints(server_args):
        return dataclasses.replace(decision, reasons=(STATE_CHECKPOINTS_REASON,))
    checkpoint = quant_config_from_hf(model.hf_config) if decision.atom_serves else None
    if checkpoint is not None and checkpoint.kv_cache_scales:
        return dataclasses.replace(decision, reasons=(CT_KV_SCALES_REASON,))
    return decision


PADDED_SIZES = (
    "intermediate_size",
    "moe_intermediate_size",
    "intermediate_size_mlp",
    "shared_expert_intermediate_size",
)


def unpadded_hf_config(hf_config: Any) -> Any:
    """``hf_config`` with SGLang's CPU padding undone (a copy; the original is left as it is)."""
    heads = getattr(hf_config, "original_num_attention_heads", hf_config.num_attention_heads)
    if heads != hf_config.num_attention_heads:
        raise NotImplementedError(
            f"SGLang padded {heads} attention heads to {hf_config.num_attention_heads} for a TP size "
            "that does not divide them; ATOM models need a TP size that divides the head counts"
        )
    padded = [name for name in PADDED_SIZES if hasattr(hf_config, f"original_{name}")]
    if not padded:
        return hf_config
    config = copy.deepcopy(hf_config)
    for name in padded:
        setattr(config, name, getattr(hf_config, f"original_{name}"))
    return config


def with_layer_types(hf_config: Any, architecture: str) -> Any:
    """``hf_config`` of a hybrid ``architecture`` with HF's ``layer_types`` (a copy where it has none)."""
    entry = SUPPORTED_ARCHITECTURES.get(architecture)
    if entry is None or not entry.recurrent_state or getattr(hf_config, "layer_types", None) is not None:
        return hf_config
    interval = getattr(hf_config, "full_attention_interval", 4)
    config = copy.deepcopy(hf_config)
    config.layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                          for i in range(hf_config.num_hidden_layers)]
    return config


def atom_config_from_sglang(model_config: Any, hf_config: Any) -> Config:
    """``hf_config``: the config SGLang hands the model class (a vision-language model's text config
    where it builds the language model)."""
    hf_config = language_model_config(model_config.hf_config, hf_config)
    return Config(
        model=model_config.model_path,
        hf_config=with_layer_types(unpadded_hf_config(hf_config), served_architecture(model_config)),
        torch_dtype=model_config.dtype,
        max_model_len=model_config.context_len,
    )
