"""The quantization a checkpoint's ``quantization_config`` asks for, read once, in ATOM's terms.

ATOM serves FP8 (e4m3) weights in these published forms, and MXFP4 experts (below); anything else
raises
:class:`UnsupportedQuantization` with the reason, and the takeover decision hands the model back to
the host (atom_core.hosting.takeover):

| ``quant_method`` (CT: ``compressed-tensors``) | weights (scale tensor) | activations (dynamic unless said) |
|---|---|---|
| ``fp8``, ``weight_block_size: [B, B]`` | per B x B block (``weight_scale_inv``) | per token and B-channel group |
| ``fp8``, ``activation_scheme: dynamic`` | a scale per tensor (``weight_scale``) | dynamic, per token |
| ``fp8``, ``activation_scheme: static`` | a scale per tensor (``weight_scale``) | per tensor, ``input_scale`` |
| CT ``channel`` or ``tensor`` | per channel or tensor (``weight_scale``) | ``token`` dynamic, ``tensor`` static |
| CT ``block`` | a scale per B x B block (``weight_scale``) | ``group`` of B, dynamic |

Per-tensor weight scales fill a per-output-channel scale vector at load, so fused layers (q/k/v,
gate/up) keep each shard's own scale exactly. Layers the config leaves unquantized
(``ignored_layers`` / ``modules_to_not_convert`` / compressed-tensors ``ignore``, usually
``lm_head``) load as they ship.

``mxfp4`` (gpt-oss as published): only the MoE experts are quantized, to e2m1 values in blocks of
32 along each row's input dim with an e8m0 scale per block (:class:`Mxfp4Scheme`); every other
layer ships in bf16 whatever ``modules_to_not_convert`` says, as in HF transformers. ATOM serves it
for GPT-OSS's stacked experts only (atom_core.hosting.takeover); activations stay in the model dtype.

``quark`` (AMD Quark, as amd/DeepSeek-R1-0528-MXFP4 ships): MXFP4 weights and activations (W4A4),
``global_quant_config`` with ``weight`` and ``input_tensors`` both ``fp4``, ``per_group`` of 32 with
``e8m0`` scales, the weights static and the activations dynamic. Every linear layer outside
``exclude`` is quantized (the weight as ``weight`` uint8 [N, K / 2] and ``weight_scale`` uint8
[N, K / 32]); its input is rounded to MXFP4 and back per 32 values before the matmul. ``exclude``
holds module names, ``fnmatch`` globs (``*self_attn*``) and ``re:`` patterns. Every other Quark
configuration (FP8, INT4/INT8, NVFP4, other group sizes, static activation scales, per-layer or
per-layer-type overrides, quantized outputs or biases, KV-cache groups) is refused with the key that
differs.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class UnsupportedQuantization(ValueError):
    """The checkpoint's quantization is one ATOM does not implement; the message is the reason."""


@dataclass(frozen=True)
class Fp8Scheme:
    """FP8 e4m3 weights. ``weight_block``: B for block scales ([ceil(N/B), ceil(K/B)] per weight,
    activations quantized per token and B-channel group); None for a scale per output channel
    (activations per token, or per tensor with the checkpoint's ``input_scale`` when
    ``static_input``). ``weight_scale_name``: the checkpoint's name of the weight scale tensor."""

    weight_block: int | None
    static_input: bool
    weight_scale_name: str


@dataclass(frozen=True)
class Mxfp4Scheme:
    """MXFP4 (OCP microscaling) weights: two e2m1 values per uint8 (the first in the low nibble),
    in blocks of ``block`` values along the input dim, each with a uint8 e8m0 scale (the power of
    two ``2 ** (scale - 127)``). ``quantized_inputs`` (Quark's W4A4): each quantized layer's input is
    rounded to MXFP4 and back per block (atom_kernels.mxfp4_quant_dequant); otherwise (gpt-oss)
    activations stay in the model dtype."""

    block: int = 32
    quantized_inputs: bool = False


# HF's boundary for a module name pattern: the match ends at a dot or at the end of the name.
_MODULE_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


@dataclass(frozen=True)
class QuantConfig:
    """``method`` as the checkpoint names it, the one scheme of its quantized layers, and the module
    names (or ``re:`` patterns) it leaves unquantized. ``experts_only``: the scheme covers the MoE
    experts only (MXFP4); every other layer is unquantized. ``kv_cache_scales``: the config declares
    per-layer KV-cache scales (compressed-tensors ``kv_cache_scheme``; ``fp8`` checkpoints may ship
    them undeclared, see atom_core.quantization.kv_cache)."""

    method: str
    scheme: Fp8Scheme | Mxfp4Scheme
    unquantized: tuple[str, ...] = ()
    experts_only: bool = False
    kv_cache_scales: bool = False

    def _left_unquantized(self, module: str) -> bool:
        for entry in self.unquantized:
            if entry.startswith("re:"):
                if re.match(entry[3:], module):
                    return True
            elif f".{entry}." in f".{module}.":  # a whole dotted run of the name
                return True
            # HF transformers reads a plain entry as a pattern from the start of the name up to a
            # module boundary as well: gpt-oss lists ``model.layers.*.self_attn``.
            elif re.match(rf"(?:{entry}){_MODULE_BOUNDARY}", module):
                return True
        return False

    def scheme_for(self, module: str, checkpoint_modules: Callable[[str], Sequence[str]] | None = None,
                   experts: bool = False) -> Fp8Scheme | Mxfp4Scheme | None:
        """The scheme of ATOM's layer named ``module`` (``experts``: a fused MoE experts layer), or
        None where the config leaves it unquantized. ``checkpoint_modules`` gives the checkpoint's
        names of the modules the layer holds (a fused ``qkv_proj``: q/k/v_proj; default: its own
        name), which the config's list names; a fused layer is quantized only if all its parts are."""
        if self.experts_only and not experts:
            return None
        names = list(checkpoint_modules(module)) if checkpoint_modules else [module]
        skipped = {self._left_unquantized(name) for name in names}
        if len(skipped) > 1:
            raise UnsupportedQuantization(
                f"{module} fuses {', '.join(names)}, which the checkpoint quantizes only in part"
            )
        return None if skipped.pop() else self.scheme


def _ignored(config: Mapping[str, Any], *keys: str) -> tuple[str, ...]:
    for key in keys:
        if config.get(key):
            return tuple(config[key])
    return ()


def _fp8(config: Mapping[str, Any]) -> QuantConfig:
    fmt = config.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise UnsupportedQuantization(f"fp8 format {fmt!r} is not supported (only e4m3)")
    activation = config.get("activation_scheme", "dynamic")
    if activation not in ("dynamic", "static"):
        raise UnsupportedQuantization(f"fp8 activation_scheme {activation!r} is not supported")
    block = config.get("weight_block_size")
    if block is not None:
        if activation != "dynamic":
            raise UnsupportedQuantization("block-FP8 with static activation scales is not supported")
        block = _square_block(block, "weight_block_size")
    return QuantConfig(
        method="fp8",
        scheme=Fp8Scheme(block, activation == "static",
                         "weight_scale_inv" if block else "weight_scale"),
        unquantized=_ignored(config, "ignored_layers", "modules_to_not_convert"),
    )


def _square_block(block: Sequence[int], key: str) -> int:
    if len(block) != 2 or block[0] != block[1] or block[0] % 16:
        raise UnsupportedQuantization(
            f"{key} {list(block)} is not supported (square blocks, a multiple of 16)"
        )
    return int(block[0])


def _compressed_tensors_scheme(group: Mapping[str, Any]) -> Fp8Scheme:
    weights, inputs = group.get("weights") or {}, group.get("input_activations")
    if (weights.get("type"), weights.get("num_bits")) != ("float", 8) or not weights.get("symmetric", True):
        raise UnsupportedQuantization(f"compressed-tensors weights {dict(weights)} are not supported "
                                      "(only symmetric 8-bit float)")
    if inputs is None or (inputs.get("type"), inputs.get("num_bits")) != ("float", 8):
        raise UnsupportedQuantization("compressed-tensors without 8-bit float activations "
                                      "(weight-only) is not supported")
    strategy, input_strategy = weights.get("strategy"), inputs.get("strategy")
    dynamic = bool(inputs.get("dynamic"))
    if strategy == "block" and input_strategy == "group" and dynamic:
        block = _square_block(weights.get("block_structure") or (), "block_structure")
        if inputs.get("group_size") != block:
            raise UnsupportedQuantization(f"activation group_size {inputs.get('group_size')} differs "
                                          f"from the weight block {block}")
        return Fp8Scheme(block, False, "weight_scale")
    if strategy in ("channel", "tensor") and (input_strategy, dynamic) in (("token", True),
                                                                            ("tensor", False)):
        return Fp8Scheme(None, not dynamic, "weight_scale")
    raise UnsupportedQuantization(
        f"compressed-tensors weights {strategy!r} with {'dynamic' if dynamic else 'static'} "
        f"{input_strategy!r} activations are not supported"
    )


def _compressed_tensors(config: Mapping[str, Any]) -> QuantConfig:
    fmt = config.get("format")
    if fmt != "float-quantized":
        raise UnsupportedQuantization(f"compressed-tensors format {fmt!r} is not supported")
    groups = list((config.get("config_groups") or {}).values())
    schemes = {_compressed_tensors_scheme(group) for group in groups}
    if len(schemes) != 1 or any(group.get("targets") != ["Linear"] for group in groups):
        raise UnsupportedQuantization("compressed-tensors with several schemes or targets other "
                                      "than Linear is not supported")
    kv_cache_scheme = config.get("kv_cache_scheme")
    if kv_cache_scheme:
        _check_kv_cache_scheme(kv_cache_scheme)
    return QuantConfig("compressed-tensors", schemes.pop(), _ignored(config, "ignore"),
                       kv_cache_scales=bool(kv_cache_scheme))


def _check_kv_cache_scheme(scheme: Mapping[str, Any]) -> None:
    """ATOM loads one static scale per layer for K and for V (atom_core.quantization.kv_cache)."""
    served = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    differing = {key: scheme.get(key) for key, value in served.items() if scheme.get(key) != value}
    if differing:
        raise UnsupportedQuantization(
            f"compressed-tensors kv_cache_scheme with {differing} is not supported (only static, "
            "symmetric 8-bit float scales per tensor)"
        )


def _mxfp4(config: Mapping[str, Any]) -> QuantConfig:
    # HF's Mxfp4Config has no other keys: the block (32) and the value and scale formats are fixed.
    return QuantConfig(config["quant_method"], Mxfp4Scheme(),
                       _ignored(config, "modules_to_not_convert"), experts_only=True)


# Quark's MXFP4 tensor spec (weights: static; inputs: dynamic). Keys Quark writes beside these
# (``observer_cls``, ``is_scale_quant``, ...) say how the checkpoint was made, not how it is read.
_QUARK_MXFP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}
# Optional keys: when present, the value ATOM computes with (``ch_axis`` -1: groups along the input
# dim; ties to even; the shared scale rounded in Quark's ``even`` mode, atom_kernels.mxfp4).
_QUARK_MXFP4_OPTIONAL = {"ch_axis": -1, "round_method": "half_even", "scale_calculation_mode": "even",
                         "mx_element_dtype": None}


def _quark_tensor_spec(spec: Any, where: str, dynamic: bool) -> None:
    if not isinstance(spec, Mapping):
        raise UnsupportedQuantization(f"quark {where} {spec!r} is not supported (one MXFP4 spec)")
    expected = {**_QUARK_MXFP4, "is_dynamic": dynamic}
    for key, value in expected.items():
        got = bool(spec.get(key)) if key == "is_dynamic" else spec.get(key)
        if got != value:
            raise UnsupportedQuantization(
                f"quark {where}.{key} {spec.get(key)!r} is not supported (ATOM serves MXFP4: fp4 "
                "per_group of 32 with e8m0 scales, static weights and dynamic activations)")
    for key, value in _QUARK_MXFP4_OPTIONAL.items():
        if key in spec and spec[key] != value:
            raise UnsupportedQuantization(f"quark {where}.{key} {spec[key]!r} is not supported "
                                          f"(only {value!r})")


def _quark_exclude_entry(entry: str) -> str:
    """Quark's ``exclude`` entry in :meth:`QuantConfig._left_unquantized`'s terms: a glob becomes
    an ``re:`` pattern matching the whole name, or a module under it."""
    if entry.startswith("re:") or not any(c in entry for c in "*?["):
        return entry
    return f"re:{fnmatch.translate(entry)}|{fnmatch.translate(entry + '.*')}"


def _quark(config: Mapping[str, Any]) -> QuantConfig:
    for key in ("layer_quant_config", "layer_type_quant_config"):
        if config.get(key):
            raise UnsupportedQuantization(f"quark {key} (per-layer overrides: {sorted(config[key])}) "
                                          "is not supported")
    kv_cache_group = (config.get("export") or {}).get("kv_cache_group")
    if kv_cache_group:
        raise UnsupportedQuantization(f"quark export.kv_cache_group {kv_cache_group} (KV-cache "
                                      "quantization) is not supported")
    spec = config.get("global_quant_config") or {}
    for key in ("output_tensors", "bias"):
        if spec.get(key):
            raise UnsupportedQuantization(f"quark global_quant_config.{key} (quantized {key}) is not "
                                          "supported")
    _quark_tensor_spec(spec.get("weight"), "global_quant_config.weight", dynamic=False)
    _quark_tensor_spec(spec.get("input_tensors"), "global_quant_config.input_tensors", dynamic=True)
    exclude = tuple(_quark_exclude_entry(entry) for entry in config.get("exclude") or ())
    return QuantConfig("quark", Mxfp4Scheme(_QUARK_MXFP4["group_size"], quantized_inputs=True), exclude)


_PARSERS = {
    "fp8": _fp8,
    "compressed-tensors": _compressed_tensors,
    "mxfp4": _mxfp4,
    "quark": _quark,
    # vLLM 0.26 renames gpt-oss's "mxfp4" in the hf_config it builds models from, and in its resolved
    # quantization (GptOssForCausalLMConfig.verify_and_update_model_config). Delete when vLLM keeps
    # the checkpoint's name.
    "gpt_oss_mxfp4": _mxfp4,
}


def quant_config_from_hf(hf_config: Any) -> QuantConfig | None:
    """The checkpoint's quantization (``hf_config.quantization_config``), or None for an
    unquantized checkpoint; :class:`UnsupportedQuantization` for one ATOM does not serve."""
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        return None
    if not isinstance(config, Mapping):
        config = config.to_dict()
    method = config.get("quant_method")
    if not method:
        raise UnsupportedQuantization("quantization_config names no quant_method")
    if method not in _PARSERS:
        raise UnsupportedQuantization(f"quantization {method!r} is not supported")
    return _PARSERS[method](config)
