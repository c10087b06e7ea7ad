"""Whether ATOM serves a model instance, decided once from the configuration, before any weight
loads.

ATOM serves an architecture only when it supports the whole configuration the host asks for; for
anything else the host's own model class and attention serve, and one INFO line says why:

    INFO atom: ATOM hands Qwen3ForCausalLM back to vLLM: quantization 'awq' is not supported

``ATOM_STRICT_TAKEOVER=1`` turns a hand-back into a start-up error naming the same reasons.

The reasons, in the order they are checked (each one is a function below):

| reason | why ATOM cannot serve it today |
|---|---|
| architecture | ATOM has no implementation of it |
| task | the host runs the model as an embedding / pooling model, ATOM serves generation |
| quantization | unserved schemes; online FP8; MXFP4 (opt-in; Quark's on GPUs); MXFP4 attention; MLA KV scales; VLMs |
| LoRA | ATOM's layers take no adapters |
| pipeline parallelism | ATOM's models run whole on every rank |
| context parallelism | ATOM's attention keeps each sequence's KV cache whole on every rank |
| data parallelism | of attention (SGLang), or of experts the host shards across its replicas (vLLM) |
| expert load balancing | ATOM's experts stay where they load (no EPLB) |
| expert split | every TP rank holds its share of each expert: in whole blocks of a block-quantized checkpoint |
| speculative decoding | but vLLM's n-gram (drafts are host layers); any of Qwen3-Next (one state a sequence) |
| hybrid model on a GPU | slower than the host so far (opt-in: ATOM_SERVE_HYBRID_ON_GPU=1) |
| measured slower on a GPU | the (host, model) pairs of SLOWER_ON_GPU (opt-in: ATOM_SERVE_WHERE_SLOWER=1) |
| KV-cache dtype | ATOM's attention keeps the cache in the model dtype or in FP8 e4m3 |
| dtype | ATOM's kernels run float32, bfloat16 and float16 |
| rope type | ATOM builds default, linear, llama3 and yarn rotary tables |

Expert parallelism alone (one replica; vLLM's ``--enable-expert-parallel``, SGLang's ``--ep-size``) is
served: ATOM splits every expert across the tensor-parallel ranks instead of giving each rank whole
experts, the same weight memory per rank, and says so in one INFO line when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from atom_core import envs
from atom_core.layers.rotary import SUPPORTED_ROPE_TYPES, hf_rope_parameters
from atom_core.log import logger
from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_core.quantization import Mxfp4Scheme, QuantConfig, UnsupportedQuantization, quant_config_from_hf

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# KV-cache dtype names the hosts use for "the model's dtype" (vLLM: auto / bfloat16 / float16 /
# float32; SGLang: auto / bf16 / fp16 / fp32).
_KV_CACHE_DTYPE_NAMES = {
    torch.bfloat16: ("bfloat16", "bf16"),
    torch.float16: ("float16", "fp16", "half"),
    torch.float32: ("float32", "fp32", "float"),
}
# The hosts' names of an FP8 e4m3 KV cache (vLLM: fp8 = fp8_e4m3; SGLang: fp8_e4m3), which ATOM's
# attention serves; fp8_e5m2 and the FP4 caches it does not.
FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")


@dataclass(frozen=True)
class HostedModel:
    """What a host asks of one model instance, in host-agnostic terms: everything the takeover
    decision reads. The glues build it from the host's own config objects."""

    host: str  # "vLLM" or "SGLang", for the log line
    architecture: str
    hf_config: Any  # the language model's (a vision-language model's text_config)
    dtype: torch.dtype
    quantization: str | None = None  # the method the host resolved: checkpoint or requested
    lora: bool = False
    pipeline_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    speculative_method: str | None = None  # the host's proposer ("ngram", "eagle3", "mtp", "NEXTN", ...)
    tensor_parallel_size: int = 1
    # Ranks that split one sequence's attention and KV cache (decode / prefill context parallelism).
    context_parallel_size: int = 1
    # Replicas whose MoE layers the host shards jointly (vLLM's data-parallel size; SGLang's replicas
    # are independent: 1).
    data_parallel_size: int = 1
    data_parallel_attention: bool = False  # SGLang's --enable-dp-attention
    expert_parallel: bool = False  # the host would give each rank whole experts
    expert_load_balancing: bool = False  # EPLB
    generates: bool = True  # False: the host runs it as an embedding / pooling model
    device: str = "cpu"  # the host's device type: "cpu", "cuda", ...
    # The host's --model-impl: "auto" or the host's own name ("vllm", "sglang") build its registry's
    # class, which is ATOM's; others ("transformers", ...) build that implementation instead.
    model_impl: str = "auto"


def _architecture(model: HostedModel) -> str | None:
    if model.architecture not in SUPPORTED_ARCHITECTURES:
        return f"ATOM has no implementation of {model.architecture}"
    return None


def other_model_impl(host: str, model_impl: Any) -> str | None:
    """The implementation a host's ``--model-impl`` asks for instead of its registry's class (which is
    ATOM's), if it does: the host then builds that one, and no class of ATOM's sees the model."""
    impl = getattr(model_impl, "value", model_impl)
    return None if impl in ("auto", host.lower()) else impl


def _model_impl(model: HostedModel) -> str | None:
    impl = other_model_impl(model.host, model.model_impl)
    return None if impl is None else f"--model-impl {impl} asks for {model.host}'s {impl} implementation"


def _task(model: HostedModel) -> str | None:
    return None if model.generates else "ATOM serves text generation, not embedding or pooling"


MXFP4_OPT_IN_REASON = ("MXFP4 experts are left to the host until ATOM's MXFP4 MoE is measurably faster "
                       "(ATOM_SERVE_MXFP4=1 serves them with ATOM)")


def _quantization(model: HostedModel) -> str | None:
    try:
        checkpoint = quant_config_from_hf(model.hf_config)
    except UnsupportedQuantization as exc:
        return str(exc)
    if checkpoint is None:
        if model.quantization is None:
            return None
        # ModelOpt checkpoints may keep their method in hf_quant_config.json, which only the hosts read.
        if model.quantization.startswith("modelopt"):
            return f"quantization {model.quantization!r} is not supported"
        return f"online quantization {model.quantization!r} of an unquantized checkpoint is not supported"
    if model.quantization not in (None, checkpoint.method):
        return (f"quantization {model.quantization!r} differs from the checkpoint's "
                f"{checkpoint.method!r}")
    if checkpoint.method == "quark":
        return _quark_mxfp4(model, checkpoint)
    if isinstance(checkpoint.scheme, Mxfp4Scheme):
        if not SUPPORTED_ARCHITECTURES[model.architecture].mxfp4_experts:
            return f"quantization 'mxfp4' is served for GPT-OSS only, not {model.architecture}"
        if not envs.serve_mxfp4():
            return MXFP4_OPT_IN_REASON
        return None
    if checkpoint.kv_cache_scales and getattr(model.hf_config, "kv_lora_rank", None) is not None:
        return "KV-cache scales of MLA models are not supported"
    if checkpoint.scheme.static_input and _has_experts(model):
        return "static FP8 activation scales on MoE experts are not supported"
    return None


# MLA's projections (atom_core.layers.mla; q through q_a_proj / q_b_proj with a q LoRA rank), which
# ATOM does not run in MXFP4: a Quark checkpoint must leave them out (its ``exclude``).
MLA_PROJECTIONS = ("kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


QUARK_MXFP4_GPU_OPT_IN_REASON = (
    "Quark MXFP4 is left to the host on GPUs: ATOM emulates its MXFP4 activations and decodes the dense "
    "MLPs' weights at every call, unmeasured on a GPU (ATOM_SERVE_MXFP4=1 serves it with ATOM)")


def _quark_mxfp4(model: HostedModel, checkpoint: QuantConfig) -> str | None:
    """Quark MXFP4 (W4A4): DeepSeek-V3's dense MLPs, shared and routed experts; no attention. Served on
    CPUs (where vLLM alone cannot run it: its emulation needs AMD Quark's GPU kernels; nor SGLang alone:
    its Quark config asks for a GPU's compute capability); on GPUs, with native FP4 (MI355) or without,
    only when opted in."""
    if not SUPPORTED_ARCHITECTURES[model.architecture].quark_mxfp4:
        return f"quantization 'quark' (MXFP4) is served for DeepSeek-V3 only, not {model.architecture}"
    if model.device != "cpu" and not envs.serve_mxfp4():
        return QUARK_MXFP4_GPU_OPT_IN_REASON
    hf = model.hf_config
    q_projections = ("q_a_proj", "q_b_proj") if getattr(hf, "q_lora_rank", None) else ("q_proj",)
    for layer in range(hf.num_hidden_layers):
        for projection in (*q_projections, *MLA_PROJECTIONS):
            name = f"model.layers.{layer}.self_attn.{projection}"
            if checkpoint.scheme_for(name) is not None:
                return (f"quark MXFP4 attention projections are not supported ({name} is not in "
                        "'exclude'; ATOM serves MXFP4 MLPs and experts)")
    return None


def _lora(model: HostedModel) -> str | None:
    return "LoRA is not supported" if model.lora else None


def _pipeline_parallel(model: HostedModel) -> str | None:
    if model.pipeline_parallel_size <= 1:
        return None
    return f"pipeline parallelism (size {model.pipeline_parallel_size}) is not supported"


def _context_parallel(model: HostedModel) -> str | None:
    if model.context_parallel_size <= 1:
        return None
    return f"context parallelism (size {model.context_parallel_size}) is not supported"


def _has_experts(model: HostedModel) -> bool:
    """Whether the (supported) architecture has routed experts: the checks run after _architecture."""
    return SUPPORTED_ARCHITECTURES[model.architecture].is_moe


def _data_parallel(model: HostedModel) -> str | None:
    if model.data_parallel_attention:
        return "data-parallel attention is not supported"
    if model.data_parallel_size > 1 and _has_experts(model):
        return (f"experts sharded across {model.data_parallel_size} data-parallel replicas are not supported "
                "(ATOM shards experts across the tensor-parallel ranks of one replica)")
    return None


def _expert_load_balancing(model: HostedModel) -> str | None:
    return "expert-parallel load balancing (EPLB) is not supported" if model.expert_load_balancing else None


def _expert_split(model: HostedModel) -> str | None:
    """ATOM gives each TP rank 1/tp of every expert's intermediate rows (expert parallelism too), so
    they must divide, into whole blocks of a block-FP8 or MXFP4 checkpoint's scales. The host, asked
    for expert parallelism, keeps experts whole and serves such a split (Qwen3-30B-A3B-FP8 at TP 4:
    192 rows a rank, against 128-row blocks); without it the host refuses it too. gpt-oss's MXFP4
    experts are padded to whole blocks a rank instead (atom_core.layers.moe), as vLLM pads them."""
    tp = model.tensor_parallel_size
    if not _has_experts(model) or tp <= 1:
        return None
    entry = SUPPORTED_ARCHITECTURES[model.architecture]
    rows = getattr(model.hf_config, entry.expert_intermediate_key)
    try:
        checkpoint = quant_config_from_hf(model.hf_config)
    except UnsupportedQuantization:  # _quantization names it
        return None
    scheme = checkpoint.scheme if checkpoint is not None else None
    if isinstance(scheme, Mxfp4Scheme) and entry.mxfp4_experts:
        return None
    block = (scheme.block if isinstance(scheme, Mxfp4Scheme) else scheme.weight_block) if scheme else None
    if rows % tp or (block and rows // tp % block):
        whole = f"whole {block}-row blocks of the checkpoint's scales" if block else "equal parts"
        return (f"experts of {rows} intermediate rows do not split across {tp} tensor-parallel ranks in "
                f"{whole}")
    return None


# The speculative decoding ATOM's models serve: vLLM's n-gram proposer, which needs no draft model
# (the target verifies the draft tokens as a short extend; tokens equal HF's on CPU). Every other
# proposer is handed back: a draft model (EAGLE, EAGLE-3, MTP, a second model) is built of the host's
# own layers, which would get ATOM's attention backends (DeepSeek's MTP layers are vLLM's MLA layers,
# on which ATOM's MLA backend fails at start-up), and EAGLE-3 reads hidden states through hooks of
# the host's own model classes; SGLang's n-gram verifies a token tree with its own attention mask.
SERVED_SPECULATION = {("vLLM", "ngram")}


def _speculative(model: HostedModel) -> str | None:
    method = model.speculative_method
    if method is None:
        return None
    if SUPPORTED_ARCHITECTURES[model.architecture].recurrent_state:
        return f"speculative decoding of {model.architecture}'s recurrent state is not supported"
    if (model.host, method.lower()) not in SERVED_SPECULATION:
        return f"speculative decoding by '{method}' is not supported (ATOM serves vLLM's n-gram proposer only)"
    return None


HYBRID_GPU_OPT_IN_REASON = ("hybrid linear-attention models ran no faster with ATOM than with the host on a GPU "
                            "so far (Qwen3-Next: 1.00x vLLM alone on an H200, benchmarks/results/"
                            "offline-hybrid-h200.json[2026-12-02-0c65880-checkpoint-3-timed]; Qwen3.5-35B-A3B at 20 "
                            "layers: 0.98x, [54f18ee-qwen3.5-checkpoint-20l]) "
                            "(ATOM_SERVE_HYBRID_ON_GPU=1 serves them with ATOM on GPUs)")


def _hybrid_on_gpu(model: HostedModel) -> str | None:
    if model.device == "cpu" or not SUPPORTED_ARCHITECTURES[model.architecture].recurrent_state:
        return None
    return None if envs.serve_hybrid_on_gpu() else HYBRID_GPU_OPT_IN_REASON


# (host, architecture) pairs that ran slower with ATOM than with the host alone on a GPU, same machine,
# checkpoint weights: the measurement, said in the hand-back line. On GPUs the host serves them unless
# ATOM_SERVE_WHERE_SLOWER=1.
SLOWER_ON_GPU = {
    ("SGLang", "GptOssForCausalLM"): ("0.82x SGLang alone's throughput on an H200, bf16 "
                                      "(benchmarks/results/offline-sglang-h200.json.gz[cf4c7d6]); 0.98x on "
                                      "an H100 with MoE tiles tuned there (offline-sglang-h100.json.gz"
                                      "[2026-12-05-13697dc-gpt-oss-tuned-tiles])"),
}


def _slower_on_gpu(model: HostedModel) -> str | None:
    measured = SLOWER_ON_GPU.get((model.host, model.architecture))
    if model.device == "cpu" or measured is None or envs.serve_where_slower():
        return None
    return f"ATOM ran it at {measured} (ATOM_SERVE_WHERE_SLOWER=1 serves it with ATOM)"


def _kv_cache_dtype(model: HostedModel) -> str | None:
    if model.kv_cache_dtype in ("auto", *_KV_CACHE_DTYPE_NAMES.get(model.dtype, ())):
        return None
    if model.kv_cache_dtype in FP8_KV_CACHE_DTYPES:
        return None
    return f"KV-cache dtype {model.kv_cache_dtype!r} is not supported"


def _dtype(model: HostedModel) -> str | None:
    if model.dtype in SUPPORTED_DTYPES:
        return None
    return f"dtype {model.dtype} is not supported"


def _rope(model: HostedModel) -> str | None:
    rope_type = hf_rope_parameters(model.hf_config)["rope_type"]
    if rope_type in SUPPORTED_ROPE_TYPES:
        return None
    return f"rope type {rope_type!r} is not supported"


# The architecture comes first: the others read config keys only the supported families have.
_CHECKS: tuple[Callable[[HostedModel], str | None], ...] = (
    _architecture, _model_impl, _task, _quantization, _lora, _pipeline_parallel, _context_parallel, _data_parallel,
    _expert_load_balancing, _expert_split, _speculative, _hybrid_on_gpu, _slower_on_gpu, _kv_cache_dtype, _dtype, _rope,
)


EXPERT_PARALLEL_NOTE = ("expert parallelism is served by splitting every expert across the tensor-parallel "
                        "ranks (each rank holds about the same share of the expert weights as with whole experts)")


@dataclass(frozen=True)
class TakeoverDecision:
    host: str
    architecture: str
    reasons: tuple[str, ...]
    # Where ATOM serves: what it does differently from what the host was asked for, logged at start.
    notes: tuple[str, ...] = ()

    @property
    def atom_serves(self) -> bool:
        return not self.reasons

    def hand_back_line(self) -> str:
        return f"ATOM hands {self.architecture} back to {self.host}: {'; '.join(self.reasons)}"


class TakeoverRefused(RuntimeError):
    """ATOM_STRICT_TAKEOVER=1 and ATOM would have handed the model back."""


def decide_takeover(model: HostedModel) -> TakeoverDecision:
    reasons = []
    for check in _CHECKS:
        reason = check(model)
        if reason is not None:
            reasons.append(reason)
            if check is _architecture:
                break
    notes = (EXPERT_PARALLEL_NOTE,) if not reasons and model.expert_parallel and _has_experts(model) else ()
    return TakeoverDecision(model.host, model.architecture, tuple(reasons), notes)


def enforce_strict(decision: TakeoverDecision) -> None:
    """Raise :class:`TakeoverRefused` for a hand-back under ATOM_STRICT_TAKEOVER=1."""
    if not decision.atom_serves and envs.strict_takeover():
        raise TakeoverRefused(
            f"{decision.hand_back_line()}. ATOM_STRICT_TAKEOVER=1 forbids handing back: unset it to "
            f"let {decision.host} serve the model itself"
        )


def report_hand_back(decision: TakeoverDecision) -> None:
    """For a model the host serves itself: the one INFO line saying why (or the strict error)."""
    enforce_strict(decision)
    logger.info(decision.hand_back_line())


def report_not_implemented(host: str, architecture: str) -> None:
    """For an architecture ATOM implements no class of: the one INFO line saying the host serves it."""
    logger.info(f"Architecture {architecture} is not implemented by ATOM; {host}'s own model serves it")


def new_wrapper_or_host_model(cls: type, decision: TakeoverDecision,
                              host_model: Callable[[], Any]) -> Any:
    """What a glue's model wrapper ``cls.__new__`` returns: a new ``cls`` where ATOM serves, else,
    after the hand-back line, ``host_model()``, the host's own model. That is no instance of
    ``cls``, so Python skips ``cls.__init__`` and the host gets its model as it would have built it."""
    if decision.atom_serves:
        for note in decision.notes:
            logger.info(f"ATOM serves {decision.architecture} on {decision.host}: {note}")
        return object.__new__(cls)
    report_hand_back(decision)
    return host_model()
