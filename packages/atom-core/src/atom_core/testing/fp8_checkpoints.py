"""FP8 checkpoints written in code, in the layouts the published ones ship, and their references.

Every projection weight of the decoder layers (attention, MLP, each expert's, MLA's) is
``float8_e4m3fn`` ``[N, K]`` with its scales under the published names; everything else
(embedding, norms, routers, ``lm_head``) stays in bfloat16. The forms (:data:`FORMS`):

| form | ``quantization_config`` | tensors per layer |
|---|---|---|
| ``fp8-block`` | ``fp8``, ``weight_block_size [B, B]`` (Qwen3-FP8, DeepSeek-V3) | ``weight_scale_inv`` [N/B, K/B] |
| ``fp8-tensor`` | ``fp8``, dynamic activations | ``weight_scale`` [] |
| ``fp8-tensor-static`` | ``fp8``, ``activation_scheme: static`` | ``weight_scale`` [], ``input_scale`` [] |
| ``ct-channel`` | compressed-tensors FP8_DYNAMIC (channel / token) | ``weight_scale`` [N, 1] |
| ``ct-tensor-static`` | compressed-tensors FP8 (tensor / tensor, static) | ``weight_scale`` [1], ``input_scale`` [1] |
| ``ct-block`` | compressed-tensors FP8_BLOCK (block / group) | ``weight_scale`` [N/B, K/B] |

Static input scales are calibrated: the amax of each layer's input over a few random sequences,
run through HF transformers on the source checkpoint, over 448.

Per-layer KV-cache scales go into such a checkpoint with :func:`add_kv_cache_scales`, under the names
of :data:`KV_SCALE_LAYOUTS`.

References for parity tests: :func:`write_dequantized_checkpoint` (the same weights in fp32, no
quantization) and :func:`fake_quantized_activations` (HF's linear layers and experts see their
inputs quantized and dequantized as ATOM quantizes them).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import torch
from safetensors.torch import load_file, save_file

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
# Projection weights of the decoder layers (a vision-language model's under ``language_model``),
# experts' and the Gated DeltaNet's input projections included; routers are ``mlp.gate.weight``.
QUANTIZED_WEIGHT = re.compile(
    r"^model\.(language_model\.)?layers\.\d+\..*(_proj(_with_mqa)?|\.in_proj_(qkvz|qkv|z))\.weight$")
# Modules the published checkpoints keep in bfloat16 and list in ``modules_to_not_convert``: the
# Gated DeltaNet's b / a projections (Qwen3-Next's fused ``in_proj_ba``; Qwen3.5's split ones) and a
# vision-language model's vision tower, module by module.
PUBLISHED_UNQUANTIZED = re.compile(r"^model\.(visual\..*|.*\.linear_attn\.in_proj_(ba|b|a))$")
# Tiny test models in FP8: blocks of 32 (the fused MoE's smallest), and sizes that are multiples of
# them wherever activations are quantized in groups (every GEMM's K) or experts are blocked.
TINY_BLOCK = 32
_TINY_SIZES = dict(hidden_size=128, intermediate_size=128)
_TINY_MOE_SIZES = dict(_TINY_SIZES, moe_intermediate_size=64)
# Gated DeltaNet heads of 32, as vLLM's CPU kernels need to run the hybrids themselves.
_GDN_HEADS_OF_32 = dict(linear_key_head_dim=32, linear_value_head_dim=32)
TINY_FP8_OVERRIDES = {
    "Qwen3ForCausalLM": _TINY_SIZES,
    "LlamaForCausalLM": _TINY_SIZES,
    "Qwen3MoeForCausalLM": _TINY_MOE_SIZES,
    "DeepseekV3ForCausalLM": dict(_TINY_MOE_SIZES, q_lora_rank=64, v_head_dim=32),
    "Qwen3NextForCausalLM": dict(_TINY_MOE_SIZES, shared_expert_intermediate_size=64, **_GDN_HEADS_OF_32),
    "Qwen3_5ForCausalLM": dict(_TINY_SIZES, **_GDN_HEADS_OF_32),
    "Qwen3_5MoeForCausalLM": dict(_TINY_MOE_SIZES, shared_expert_intermediate_size=64, **_GDN_HEADS_OF_32),
}
# The vision-language models' language models: those of their text-only classes.
TINY_FP8_OVERRIDES["Qwen3_5ForConditionalGeneration"] = TINY_FP8_OVERRIDES["Qwen3_5ForCausalLM"]
TINY_FP8_OVERRIDES["Qwen3_5MoeForConditionalGeneration"] = TINY_FP8_OVERRIDES["Qwen3_5MoeForCausalLM"]
FORMS = ("fp8-block", "fp8-tensor", "fp8-tensor-static", "ct-channel", "ct-tensor-static", "ct-block")


def quantize_block_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 weight, weight_scale_inv)`` of a 2-D weight, one scale per block (partial blocks at
    the edges have their own scale, as in the published checkpoints), on the weight's device."""
    n, k = weight.shape
    bn, bk = block
    rows, cols = math.ceil(n / bn), math.ceil(k / bk)
    padded = torch.zeros(rows * bn, cols * bk, dtype=torch.float32, device=weight.device)
    padded[:n, :k] = weight.float()
    tiles = padded.view(rows, bn, cols, bk)
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    quantized = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return quantized.view(rows * bn, cols * bk)[:n, :k].contiguous(), scale


def _quantize_rows(weight: torch.Tensor, per_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 weight, scale [N, 1] or [])``: one scale per output row, or one for the tensor."""
    amax = weight.float().abs().amax(dim=1, keepdim=True) if per_row else weight.float().abs().amax()
    scale = amax.clamp(min=1e-12) / FP8_MAX
    return (weight.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _ct_config(weights: dict, inputs: dict) -> dict:
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": inputs}}}


def _quantization_config(form: str, block: int) -> dict:
    fp8 = {"fmt": "e4m3", "quant_method": "fp8"}
    float8 = {"num_bits": 8, "type": "float", "symmetric": True}
    return {
        "fp8-block": {**fp8, "activation_scheme": "dynamic", "weight_block_size": [block, block]},
        "fp8-tensor": {**fp8, "activation_scheme": "dynamic"},
        "fp8-tensor-static": {**fp8, "activation_scheme": "static"},
        "ct-channel": _ct_config({**float8, "strategy": "channel", "dynamic": False},
                                 {**float8, "strategy": "token", "dynamic": True}),
        "ct-tensor-static": _ct_config({**float8, "strategy": "tensor", "dynamic": False},
                                       {**float8, "strategy": "tensor", "dynamic": False}),
        "ct-block": _ct_config(
            {**float8, "strategy": "block", "dynamic": False, "block_structure": [block, block]},
            {**float8, "strategy": "group", "dynamic": True, "group_size": block}),
    }[form]


def _quantize(form: str, name: str, weight: torch.Tensor, block: int) -> dict[str, torch.Tensor]:
    base = name[: -len(".weight")]
    if form in ("fp8-block", "ct-block"):
        q, scale = quantize_block_fp8(weight, (block, block))
        return {name: q, f"{base}.weight_scale{'_inv' if form == 'fp8-block' else ''}": scale}
    q, scale = _quantize_rows(weight, per_row=form == "ct-channel")
    if form == "ct-tensor-static":
        scale = scale.reshape(1)
    return {name: q, f"{base}.weight_scale": scale}


def calibrate_input_scales(model_dir: str, sequences: int = 4, length: int = 24) -> dict[str, torch.Tensor]:
    """Per linear layer name: the amax of its inputs over random sequences / 448, as a scalar."""
    from atom_core.testing.hf_classes import hf_reference_model

    model = hf_reference_model(model_dir)
    amax: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(module, args):
            value = args[0].detach().abs().amax()
            amax[name] = torch.maximum(amax.get(name, value), value)
        return hook

    handles = [module.register_forward_pre_hook(record(name))
               for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _ in range(sequences):
            model(torch.randint(4, model.config.vocab_size, (1, length), generator=generator))
    for handle in handles:
        handle.remove()
    return {name: (value / FP8_MAX).float() for name, value in amax.items()}


def write_fp8_checkpoint(src_dir: str, out_dir: str, form: str = "fp8-block", block: int = 128,
                         unquantized: tuple[str, ...] = ()) -> str:
    """Copy the checkpoint at ``src_dir`` (one ``model.safetensors``, tokenizer, configs) to
    ``out_dir`` in FP8 ``form`` (:data:`FORMS`) and return ``out_dir``. ``unquantized``: module
    names the config lists as left unquantized (their weights stay bfloat16), beside those the
    published checkpoints list (:data:`PUBLISHED_UNQUANTIZED`)."""
    if form not in FORMS:
        raise ValueError(f"unknown FP8 form {form!r}; known: {FORMS}")
    shutil.copytree(src_dir, out_dir, dirs_exist_ok=True)
    static = form.endswith("static")
    input_scales = calibrate_input_scales(src_dir) if static else {}
    source = load_file(os.path.join(src_dir, "model.safetensors"))
    unquantized = (*unquantized, *sorted({name.rsplit(".", 1)[0] for name in source
                                          if PUBLISHED_UNQUANTIZED.match(name.rsplit(".", 1)[0])}))
    tensors = {}
    for name, tensor in source.items():
        module = name[: -len(".weight")]
        if QUANTIZED_WEIGHT.match(name) and tensor.dim() == 2 and module not in unquantized:
            tensors.update(_quantize(form, name, tensor, block))
            if static:
                # HF runs the experts as one module: experts of a static checkpoint are not supported
                # by ATOM anyway (takeover), so any calibrated layer's scale serves them.
                scale = input_scales.get(module, next(iter(input_scales.values())))
                tensors[f"{module}.input_scale"] = scale.reshape(1) if form.startswith("ct") else scale
        else:
            tensors[name] = tensor.to(torch.bfloat16)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config_path = os.path.join(out_dir, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    quantization = _quantization_config(form, block)
    if unquantized:
        key = "ignore" if form.startswith("ct") else "modules_to_not_convert"
        quantization[key] = [*quantization.get(key, []), *unquantized]
    config["quantization_config"] = quantization
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def write_tiny_fp8_checkpoint(tiny_model_dir, architecture: str, out_dir: str, form: str,
                              **options) -> str:
    """A tiny ``architecture`` model (the ``tiny_model_dir`` fixture, sized by
    :data:`TINY_FP8_OVERRIDES`) written in FP8 ``form`` with :data:`TINY_BLOCK` blocks."""
    source = tiny_model_dir(architecture, **TINY_FP8_OVERRIDES[architecture])
    return write_fp8_checkpoint(source, out_dir, form, TINY_BLOCK, **options)


def write_block_fp8_checkpoint(src_dir: str, out_dir: str, block: tuple[int, int] = (128, 128)) -> str:
    """:func:`write_fp8_checkpoint` in the ``fp8-block`` form (square blocks)."""
    return write_fp8_checkpoint(src_dir, out_dir, "fp8-block", block[0])


# Where published checkpoints keep each layer's KV-cache scales (atom_core.quantization.kv_cache).
KV_SCALE_LAYOUTS = {
    "compressed-tensors": ("self_attn.k_scale", "self_attn.v_scale"),
    "fp8-attn": ("self_attn.k_scale", "self_attn.v_scale"),  # an ``fp8`` checkpoint without k_proj (MLA)
    "fp8-proj": ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"),
    "legacy": ("self_attn.kv_scale",),  # one scale for K and V
}
CT_KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                      "symmetric": True}


def add_kv_cache_scales(fp8_dir: str, scales: list[tuple[float, float]], layout: str,
                        kv_cache_scheme: dict | None = None) -> str:
    """Add layer i's KV-cache scales ``scales[i] = (k, v)`` to the FP8 checkpoint at ``fp8_dir``
    (in place) under ``layout``'s names (``legacy``: k's only), shaped ``[1]`` as compressed-tensors
    writes them, else ``[]``. compressed-tensors checkpoints declare ``kv_cache_scheme`` (default
    :data:`CT_KV_CACHE_SCHEME`). Returns ``fp8_dir``."""
    path = os.path.join(fp8_dir, "model.safetensors")
    tensors = load_file(path)
    shape = (1,) if layout == "compressed-tensors" else ()
    for layer, pair in enumerate(scales):
        for name, value in zip(KV_SCALE_LAYOUTS[layout], pair):
            tensors[f"model.layers.{layer}.{name}"] = torch.tensor(value, dtype=torch.float32).reshape(shape)
    save_file(tensors, path, metadata={"format": "pt"})
    if layout == "compressed-tensors":
        config_path = os.path.join(fp8_dir, "config.json")
        with open(config_path) as f:
            config = json.load(f)
        config["quantization_config"]["kv_cache_scheme"] = kv_cache_scheme or CT_KV_CACHE_SCHEME
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2)
    return fp8_dir


def write_dequantized_checkpoint(fp8_dir: str, out_dir: str) -> str:
    """The checkpoint at ``fp8_dir`` with every FP8 weight dequantized to fp32 and no
    ``quantization_config``: what HF transformers runs as the reference."""
    shutil.copytree(fp8_dir, out_dir, dirs_exist_ok=True)
    with open(os.path.join(fp8_dir, "config.json")) as f:
        config = json.load(f)
    quantization = config.pop("quantization_config")
    block = quantization.get("weight_block_size") or (
        quantization.get("config_groups", {}).get("group_0", {}).get("weights", {}).get("block_structure"))
    tensors = load_file(os.path.join(fp8_dir, "model.safetensors"))
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(("_scale", "_scale_inv")):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            base = name[: -len(".weight")]
            scale = tensors.get(f"{base}.weight_scale_inv", tensors.get(f"{base}.weight_scale"))
            if block:
                scale = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
                tensor = tensor.float() * scale[: tensor.shape[0], : tensor.shape[1]]
            else:
                tensor = tensor.float() * scale.float().reshape(-1, 1)
        out[name] = tensor.float()
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config["torch_dtype"] = config["dtype"] = "float32"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def fake_quantize(x: torch.Tensor, quantization: dict[str, Any], input_scale: torch.Tensor | None) -> torch.Tensor:
    """``x`` quantized to FP8 and back, as the scheme of ``quantization`` quantizes activations:
    per token and group (block forms), per tensor with ``input_scale`` (static), else per token.
    Written from the formats' definitions, independently of ATOM's kernels."""
    rows = x.reshape(-1, x.shape[-1]).float()
    block = quantization.get("weight_block_size") or (
        quantization.get("config_groups", {}).get("group_0", {}).get("weights", {}).get("block_structure"))
    if input_scale is not None:
        scale = input_scale.float().reshape(1, 1)
    elif block:
        groups = rows.view(rows.shape[0], -1, block[1])
        scale = (groups.abs().amax(-1, keepdim=True).clamp(min=1e-10) / FP8_MAX)
        q = (groups / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return (q.float() * scale).view(x.shape).to(x.dtype)
    else:
        scale = rows.abs().amax(-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
    q = (rows / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).view(x.shape).to(x.dtype)


def fake_quantized_experts(round_input: Callable[[torch.Tensor], torch.Tensor]):
    """A forward hook for HF's fused experts modules (3-D ``gate_up_proj`` [E, 2I, D] and
    ``down_proj`` [E, D, I], called with hidden states, top-k ids and top-k weights) that recomputes
    their output with both GEMMs' inputs passed through ``round_input`` (a fake quantization)."""

    def hook(module, args, kwargs, output):
        hidden, top_k_index, top_k_weights = (*args, *kwargs.values())[:3]
        out = torch.zeros_like(hidden)
        for expert in top_k_index.unique().tolist():
            token, slot = torch.where(top_k_index == expert)
            x = round_input(hidden[token])
            gate, up = torch.nn.functional.linear(x, module.gate_up_proj[expert]).chunk(2, dim=-1)
            h = round_input(module.act_fn(gate) * up)
            down = torch.nn.functional.linear(h, module.down_proj[expert])
            out.index_add_(0, token, down * top_k_weights[token, slot, None])
        return out

    return hook


@contextlib.contextmanager
def fake_quantized_activations(model: torch.nn.Module, fp8_dir: str) -> Iterator[None]:
    """Inside, the HF model computes as ATOM does on the FP8 checkpoint at ``fp8_dir`` (of which it
    runs the dequantized copy): its quantized ``nn.Linear`` layers (FP8 weights in the checkpoint,
    but MLA's ``kv_b_proj``) see :func:`fake_quantize`'d inputs, with the checkpoint's static input
    scales where it has them, and its fused experts modules quantize both GEMMs' inputs."""
    with open(os.path.join(fp8_dir, "config.json")) as f:
        quantization = json.load(f)["quantization_config"]
    tensors = load_file(os.path.join(fp8_dir, "model.safetensors"))
    handles = []
    for name, module in model.named_modules():
        weight = tensors.get(f"{name}.weight")
        # MLA's kv_b_proj is dequantized at load and runs unquantized (absorbed into W_UK / W_UV).
        quantized = weight is not None and weight.dtype == torch.float8_e4m3fn and not name.endswith("kv_b_proj")
        if isinstance(module, torch.nn.Linear) and quantized:
            scale = tensors.get(f"{name}.input_scale")
            handles.append(module.register_forward_pre_hook(
                lambda m, args, scale=scale: (fake_quantize(args[0], quantization, scale), *args[1:])))
        elif getattr(module, "gate_up_proj", None) is not None and f"{name}.0.down_proj.weight" in tensors:
            # Dynamically: ATOM serves no static MoE.
            experts_hook = fake_quantized_experts(lambda x: fake_quantize(x, quantization, None))
            handles.append(module.register_forward_hook(experts_hook, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
