"""Checkpoint loading: HF tensor names -> ATOM parameters, strict in both directions.

Every checkpoint tensor must map to a parameter (else :class:`CheckpointError` naming the tensor),
and every parameter shard must be filled (else an error naming the checkpoint tensor that was
expected) when the tensors are a checkpoint; a later update of a running engine's weights may carry
any subset (``complete=False``, atom_core.models.decoder). ATOM's parameters declare their shards
through ``expected_shards`` (see layers.linear); others under the model belong to the host's layers
(vLLM's KV-scale parameters on its attention) and are not ATOM's to fill. Once every tensor is in,
each module's ``after_loading()`` runs, if it has one (atom_core.layers.attention hands KV-cache
scales to the host there).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from atom_core.log import logger
from atom_core.quantization.kv_cache import FP8_ATTENTION_SCALE, KV_ZERO_POINT, kv_scale_param_name


class CheckpointError(ValueError):
    pass


@dataclass(frozen=True)
class StackedWeight:
    """A checkpoint module fused into a bigger parameter: ``q_proj`` -> ``qkv_proj`` shard ``"q"``."""

    checkpoint: str
    param: str
    shard: Any


class Sections(tuple):
    """The shard id of one checkpoint tensor that fills several consecutive shards of a merged
    parameter (Qwen3.5's ``in_proj_qkv`` -> shards 0, 1 and 2 of ``in_proj_qkvz``): the parameter's
    loader splits it, and each shard counts as loaded."""


# The tensors of one expert projection: its weight and, in FP8 checkpoints, its scales. Each goes
# to the stacked FusedMoE parameter of the same suffix (``w13_weight_scale_inv``).
EXPERT_TENSORS = ("weight", "weight_scale_inv", "weight_scale", "input_scale")


@dataclass(frozen=True)
class ExpertWeightNames:
    """Per-expert checkpoint names (``experts.{e}.<gate>.weight`` and the scales of
    :data:`EXPERT_TENSORS`) of a stacked FusedMoE."""

    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    container: str = "experts"


@dataclass
class WeightMap:
    stacked: list[StackedWeight] = field(default_factory=list)
    experts: ExpertWeightNames | None = None
    # Checkpoint name components that ATOM spells differently (``block_sparse_moe`` -> ``mlp``),
    # applied to every dot-separated component of a name before the rules above.
    renamed: dict[str, str] = field(default_factory=dict)
    # Checkpoint tensors that carry nothing ATOM needs (e.g. rotary inv_freq, tied lm_head).
    ignored: list[str] = field(default_factory=list)

    def is_ignored(self, name: str) -> bool:
        return any(re.fullmatch(pattern, name) for pattern in (*self.ignored, KV_ZERO_POINT))

    def to_param(self, name: str) -> tuple[str, Any]:
        """(parameter name, shard id) of a checkpoint tensor name."""
        name = ".".join(self.renamed.get(part, part) for part in name.split("."))
        kv_scale = kv_scale_param_name(name)
        if kv_scale is not None:
            return kv_scale, None
        if self.experts is not None:
            e = self.experts
            match = re.fullmatch(
                rf"(.*\.{e.container})\.(\d+)\.({e.gate}|{e.up}|{e.down})\.({'|'.join(EXPERT_TENSORS)})",
                name,
            )
            if match:
                base, expert, kind, tensor = match.groups()
                if kind == e.down:
                    return f"{base}.w2_{tensor}", int(expert)
                return f"{base}.w13_{tensor}", (int(expert), 0 if kind == e.gate else 1)
        parts = name.split(".")
        for rule in self.stacked:
            if rule.checkpoint in parts:
                parts[parts.index(rule.checkpoint)] = rule.param
                return ".".join(parts), rule.shard
        return name, None

    def checkpoint_modules(self, module: str) -> list[str]:
        """The checkpoint's names of the modules ATOM's ``module`` holds: those a fused layer stacks
        (``qkv_proj`` -> q/k/v_proj), spelled as the checkpoint spells them (``renamed``)."""
        head, _, last = module.rpartition(".")
        parts = [rule.checkpoint for rule in self.stacked if rule.param == last] or [last]
        original = {atom: checkpoint for checkpoint, atom in self.renamed.items()}
        names = [f"{head}.{part}" if head else part for part in parts]
        return [".".join(original.get(piece, piece) for piece in name.split(".")) for name in names]

    def to_checkpoint(self, param_name: str, shard: Any) -> str:
        """The checkpoint tensor that fills ``shard`` of ``param_name`` (for error messages)."""
        original = {atom: checkpoint for checkpoint, atom in self.renamed.items()}
        name = self._to_checkpoint_unrenamed(param_name, shard)
        return ".".join(original.get(part, part) for part in name.split("."))

    def _to_checkpoint_unrenamed(self, param_name: str, shard: Any) -> str:
        expert_param = re.fullmatch(rf"(.*)\.(w13|w2)_({'|'.join(EXPERT_TENSORS)})", param_name)
        if self.experts is not None and expert_param:
            e = self.experts
            base, kind, tensor = expert_param.groups()
            if kind == "w2":
                return f"{base}.{shard}.{e.down}.{tensor}"
            expert, half = shard
            return f"{base}.{expert}.{e.gate if half == 0 else e.up}.{tensor}"
        parts = param_name.split(".")
        for rule in self.stacked:
            if rule.param in parts and rule.shard == shard:
                parts[parts.index(rule.param)] = rule.checkpoint
                return ".".join(parts)
        return param_name


def load_weights(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], weight_map: WeightMap, complete: bool = True
) -> set[str]:
    """Load HF-named tensors into ``model``; returns the names of all its parameters. ``complete``: the
    tensors are a checkpoint, which must fill every parameter; else they update some of the weights."""
    params = {name: p for name, p in model.named_parameters() if hasattr(p, "expected_shards")}
    filled: dict[str, set[Any]] = {name: set() for name in params}
    fp8_attention_scales = 0
    for name, tensor in weights:
        if re.fullmatch(FP8_ATTENTION_SCALE, name):
            fp8_attention_scales += 1
            continue
        if weight_map.is_ignored(name):
            continue
        try:
            param_name, shard = weight_map.to_param(name)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from exc
        param = params.get(param_name)
        if param is None:
            raise CheckpointError(f"checkpoint tensor {name!r} does not match any ATOM parameter")
        _check_quantized_dtype(name, tensor, param_name, param)
        if not getattr(param, "accepts_fp8", False) or tensor.dtype != torch.float8_e4m3fn:
            tensor = tensor.to(param.dtype)
        try:
            with torch.no_grad():
                param.weight_loader(param, tensor, shard)
        except (ValueError, IndexError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint tensor {name!r}: {exc}") from exc
        filled[param_name].update(shard if isinstance(shard, Sections) else (shard,))
    if fp8_attention_scales:
        logger.info("skipped the checkpoint's %d FP8-attention scales (q_scale / prob_scale): ATOM's "
                    "attention keeps queries and probabilities in 16 bits", fp8_attention_scales)
    if complete:
        _check_every_shard_filled(params, filled, weight_map)
    for module in model.modules():
        after_loading = getattr(module, "after_loading", None)
        if after_loading is not None:
            after_loading()
    return set(params)


def _check_every_shard_filled(params: dict[str, Any], filled: dict[str, set[Any]], weight_map: WeightMap) -> None:
    for param_name, param in params.items():
        missing = [s for s in param.expected_shards if s not in filled[param_name]]
        if missing:
            names = ", ".join(repr(weight_map.to_checkpoint(param_name, s)) for s in missing[:4])
            more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            raise CheckpointError(f"checkpoint is missing tensor {names}{more}")


# Dtypes of quantized codes: FP8 weights, and MXFP4's packed e2m1 values and e8m0 scales (uint8).
_CODE_DTYPES = (torch.float8_e4m3fn, torch.uint8)


def _check_quantized_dtype(name: str, tensor: torch.Tensor, param_name: str,
                           param: nn.Parameter) -> None:
    """A tensor of quantized codes must meet a parameter of its dtype (or one that dequantizes FP8
    at load), and such a parameter a tensor of its dtype: casting between them would drop or invent
    the scales."""
    fp8 = torch.float8_e4m3fn
    dequantizes = tensor.dtype == fp8 and getattr(param, "accepts_fp8", False)
    codes = tensor.dtype in _CODE_DTYPES or param.dtype in _CODE_DTYPES
    if codes and tensor.dtype != param.dtype and not dequantizes:
        raise CheckpointError(
            f"checkpoint tensor {name!r} is {tensor.dtype} but ATOM's {param_name} is {param.dtype}: "
            "the checkpoint and its quantization_config disagree on which layers are quantized"
        )


def iter_safetensors(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """All tensors of the ``*.safetensors`` files in ``model_dir``."""
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {model_dir}")
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
