"""Mixture-of-experts: a top-k router, fused experts, and the sparse block that composes them.

Family differences are constructor arguments:

- :class:`TopKRouter`: softmax top-k (Mixtral, Qwen3-MoE, GPT-OSS; optionally with a router bias)
  or sigmoid group-limited top-k steered by an ``e_score_correction_bias`` (GLM-4-MoE, DeepSeek-V3),
  with optional renormalisation and a routed scaling factor.
- :class:`FusedMoE`: the gated activation (SiLU, or GPT-OSS's clamped SwiGLU), gate/up rows
  concatenated ``[gate | up]`` or interleaved, expert biases, and the checkpoint layout.
- :class:`SparseMoeBlock`: routed experts plus optional always-on shared experts, optionally
  scaled per token by a sigmoid gate (Qwen3-Next's ``shared_expert_gate``).

A model describes its experts once, as a :class:`MoeSpec` read from its HF config, and builds each
sparse layer's block with :meth:`SparseMoeBlock.from_spec`.

Expert weights are stacked per layer in ATOM's layout: ``w13_weight`` [E, 2 * I/tp, D] (gate/up
rows) and ``w2_weight`` [E, D, I/tp], with biases ``w13_bias`` [E, 2 * I/tp] and ``w2_bias`` [E, D].
Under an FP8 scheme (atom_core.quantization) the weights are fp8 with each expert's scales stacked
the same way, under the checkpoint's scale name: per B x B block ``w13_weight_scale_inv``
[E, 2 * I/tp / B, D / B] and ``w2_weight_scale_inv`` [E, D / B, I/tp / B], or per output channel
``w13_weight_scale`` [E, 2 * I/tp] and ``w2_weight_scale`` [E, D] (a per-tensor checkpoint scale
fills its expert's channels). Expert activations are quantized dynamically.
Under an MXFP4 scheme (gpt-oss as published) the weights stay packed as they ship: ``w13_weight``
uint8 [E, 2 * I/tp, D / 2] and ``w2_weight`` uint8 [E, D, I/tp / 2], two e2m1 values per byte, with
e8m0 ``w13_weight_scale`` uint8 [E, 2 * I/tp, D / 32] and ``w2_weight_scale`` [E, D, I/tp / 32]; a
rank's share of the intermediate dim is whole 32-value blocks: where I/tp is not (gpt-oss's 2880 at
TP 4 or 8), every rank holds I/tp rounded up to them, the last ranks' tails zero weights (scale code
127, in the range of register decoding), as vLLM pads. gpt-oss's activations are not
quantized; AMD Quark's W4A4 experts (per expert, ``experts.{e}.gate_proj.weight`` uint8 [I, D / 2]
and ``.weight_scale`` uint8 [I, D / 32], ...) round both GEMMs' inputs to MXFP4 and back.
A checkpoint provides them in one of two layouts, which fixes the parameters' shard ids:

- per expert, nn.Linear style (``experts.{e}.gate_proj.weight`` [I, D], ...): shard ids
  ``(expert, 0 | 1)`` for gate/up and ``expert`` for down;
- stacked, transposed (GPT-OSS's ``experts.gate_up_proj`` [E, D, 2I], ``experts.down_proj``
  [E, I, D], biases [E, 2I] and [E, D]): one tensor per parameter, shard id ``None``. GPT-OSS's
  MXFP4 tensors are stacked but not transposed: ``gate_up_proj_blocks`` [E, 2I, D / 32, 16] and
  ``gate_up_proj_scales`` [E, 2I, D / 32], ``down_proj_blocks`` [E, D, I / 32, 16] and
  ``down_proj_scales`` [E, D, I / 32].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import atom_kernels
from atom_core.distributed import divide, get_tp_group
from atom_core.layers.linear import ReplicatedLinear, copy_checked, default_weight_loader, make_param
from atom_core.layers.mlp import GatedMLP
from atom_core.quantization import Mxfp4Scheme, layer_scheme, quantized_layers
from atom_core.quantization.fp8 import FP8_DTYPE

PER_EXPERT = "per_expert"
STACKED_TRANSPOSED = "stacked_transposed"


class TopKRouter(nn.Module):
    """Router logits ``x W^T (+ b)`` -> (weights fp32 [T, top_k], expert ids int32 [T, top_k]).

    ``scoring="softmax"``: the top-k of the softmax over all experts (renormalised over the k when
    ``renormalize``); with ``num_expert_group`` > 1, only within the best ``topk_group`` groups
    ranked by their best expert (DeepSeek-V2's ``group_limited_greedy``). ``scoring="sigmoid"``:
    sigmoid scores, the best ``topk_group`` of ``num_expert_group`` groups, top-k within them; with
    ``correction_bias`` a learned ``e_score_correction_bias`` steers the choice but not the weights.
    Weights are multiplied by ``routed_scaling_factor``. The router weights are replicated on every
    TP rank.
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        renormalize: bool,
        prefix: str = "",
        bias: bool = False,
        scoring: str = "softmax",
        num_expert_group: int = 1,
        topk_group: int = 1,
        correction_bias: bool = False,
        routed_scaling_factor: float = 1.0,
    ):
        super().__init__()
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"router scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
        if scoring == "softmax" and correction_bias:
            raise ValueError("bias-corrected routing needs scoring='sigmoid'")
        self.prefix = prefix
        self.top_k = top_k
        self.renormalize = renormalize
        self.scoring = scoring
        self.num_expert_group = num_expert_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.weight = make_param((num_experts, hidden_size), default_weight_loader)
        self.bias = make_param((num_experts,), default_weight_loader) if bias else None
        # Kept in fp32 whatever the model dtype, as the checkpoints store it.
        self.e_score_correction_bias = (
            make_param((num_experts,), default_weight_loader, dtype=torch.float32)
            if correction_bias else None
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.scoring == "sigmoid":
            logits = atom_kernels.router_logits(x, self.weight, self.bias)
        else:
            logits = F.linear(x, self.weight, self.bias)
        if self.scoring == "softmax" and self.num_expert_group == 1:
            weights, ids = atom_kernels.topk_softmax(logits, self.top_k, self.renormalize)
            if self.routed_scaling_factor != 1.0:
                weights = weights * self.routed_scaling_factor
            return weights, ids
        return atom_kernels.grouped_topk(
            logits, self.top_k, self.num_expert_group, self.topk_group, self.renormalize,
            self.scoring, self.e_score_correction_bias, self.routed_scaling_factor,
        )

    def warm_up(self, activation_dtype: torch.dtype) -> None:
        """Route zeros at each token count of ``atom_kernels.ROUTING_WARM_UP_TOKENS``, so that every
        launch config of the routing kernels compiles before serving; nothing while a CUDA graph is
        being captured (compiling is not capturable)."""
        if self.weight.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        for num_tokens in atom_kernels.ROUTING_WARM_UP_TOKENS:
            self(torch.zeros(num_tokens, self.weight.shape[1], dtype=activation_dtype, device=self.weight.device))


class FusedMoE(nn.Module):
    """Routed experts: ``sum_k w_k * down_k(act(gate_up_k(x)))``, column/row split across TP ranks.

    ``activation`` is ``"silu"`` or ``"clamped_swiglu"`` (with ``swiglu_alpha``, ``swiglu_limit``);
    ``interleaved`` says the gate/up rows alternate (g0, u0, g1, ...) instead of ``[gate | up]``;
    ``bias`` adds ``w13_bias`` / ``w2_bias``; ``checkpoint_layout`` is :data:`PER_EXPERT` or
    :data:`STACKED_TRANSPOSED` (see the module docstring); ``reduce_results=False`` returns this
    rank's partial sum for the caller to reduce.
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        prefix: str = "",
        activation: str = "silu",
        interleaved: bool = False,
        bias: bool = False,
        swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
        checkpoint_layout: str = PER_EXPERT,
        reduce_results: bool = True,
    ):
        super().__init__()
        if checkpoint_layout not in (PER_EXPERT, STACKED_TRANSPOSED):
            raise ValueError(f"unknown expert checkpoint layout {checkpoint_layout!r}")
        per_expert = checkpoint_layout == PER_EXPERT
        if per_expert and (interleaved or bias):
            raise ValueError("per-expert checkpoints have [gate | up] rows and no expert biases")
        self.prefix = prefix
        self.tp = get_tp_group()
        self.num_experts = num_experts
        self.activation = activation
        self.interleaved = interleaved
        self.swiglu_alpha = swiglu_alpha
        self.swiglu_limit = swiglu_limit
        self.checkpoint_layout = checkpoint_layout
        self.reduce_results = reduce_results
        self.intermediate_size = intermediate_size
        self.scheme = layer_scheme(prefix, experts=True)
        self.mxfp4 = isinstance(self.scheme, Mxfp4Scheme)
        if self.mxfp4 and not per_expert and intermediate_size % self.scheme.block == 0:
            block = self.scheme.block
            self.local_intermediate = -(-intermediate_size // (block * self.tp.world_size)) * block
        else:
            self.local_intermediate = divide(intermediate_size, self.tp.world_size)
        if self.mxfp4:
            self._make_mxfp4_params(num_experts, hidden_size, per_expert)
        else:
            self._make_params(num_experts, hidden_size, per_expert)
        inter = self.local_intermediate
        self.w13_bias = self.w2_bias = None
        if bias:
            self.w13_bias = make_param((num_experts, 2 * inter), self.weight_loader)
            self.w2_bias = make_param((num_experts, hidden_size), self.weight_loader)

    def _make_params(self, num_experts: int, hidden_size: int, per_expert: bool) -> None:
        """Weights in the model dtype, or FP8 with their scales."""
        prefix = self.prefix
        if self.scheme is not None and (not per_expert or self.scheme.static_input):
            raise ValueError(f"{prefix}: FP8 experts need per-expert checkpoint tensors and dynamic "
                             "activations")
        experts = range(num_experts)
        w13_shards = [(e, j) for e in experts for j in (0, 1)] if per_expert else (None,)
        w2_shards = experts if per_expert else (None,)
        inter = self.local_intermediate
        dtype = None if self.scheme is None else FP8_DTYPE
        self.w13_weight = make_param((num_experts, 2 * inter, hidden_size), self.weight_loader,
                                     w13_shards, dtype)
        self.w2_weight = make_param((num_experts, hidden_size, inter), self.weight_loader, w2_shards,
                                    dtype)
        if self.scheme is not None:
            block = self.scheme.weight_block
            if block is not None and (inter % block or hidden_size % block):
                raise ValueError(f"{prefix}: block-FP8 experts need the hidden size {hidden_size} and "
                                 f"the per-rank intermediate size {inter} to be multiples of {block}")
            w13_scale, w2_scale = (
                ((2 * inter // block, hidden_size // block), (hidden_size // block, inter // block))
                if block else ((2 * inter,), (hidden_size,))
            )
            name = self.scheme.weight_scale_name
            self.register_parameter(f"w13_{name}", make_param(
                (num_experts, *w13_scale), self.weight_loader, w13_shards, torch.float32))
            self.register_parameter(f"w2_{name}", make_param(
                (num_experts, *w2_scale), self.weight_loader, w2_shards, torch.float32))

    def _make_mxfp4_params(self, num_experts: int, hidden_size: int, per_expert: bool) -> None:
        """Packed uint8 weights and e8m0 scales, as gpt-oss (stacked) or Quark (per expert) ships
        them (module docstring)."""
        block, inter = self.scheme.block, self.local_intermediate
        if hidden_size % block or inter % block:
            raise ValueError(f"{self.prefix}: MXFP4 experts need the hidden size {hidden_size} and the "
                             f"per-rank intermediate size {inter} (TP {self.tp.world_size}) to be "
                             f"multiples of {block}")
        shapes = {"w13_weight": (2 * inter, hidden_size // 2), "w2_weight": (hidden_size, inter // 2),
                  "w13_weight_scale": (2 * inter, hidden_size // block),
                  "w2_weight_scale": (hidden_size, inter // block)}
        experts = range(num_experts)
        for name, shape in shapes.items():
            shards = (None,)
            if per_expert:
                shards = [(e, j) for e in experts for j in (0, 1)] if name.startswith("w13") else experts
            self.register_parameter(name, make_param((num_experts, *shape), self.weight_loader, shards,
                                                     dtype=torch.uint8))

    @property
    def _scale_name(self) -> str:
        return "weight_scale" if self.mxfp4 else self.scheme.weight_scale_name

    @property
    def w13_scale(self) -> nn.Parameter | None:
        return None if self.scheme is None else getattr(self, f"w13_{self._scale_name}")

    @property
    def w2_scale(self) -> nn.Parameter | None:
        return None if self.scheme is None else getattr(self, f"w2_{self._scale_name}")

    def _copy_rank_part(self, target: torch.Tensor, full: torch.Tensor, dim: int, per_value: float,
                        pad: int = 0) -> None:
        """Copy this rank's share of ``full`` along ``dim`` into ``target``: ``per_value`` entries per
        intermediate value (rows 1, packed bytes 1/2, scales 1/32, interleaved gate/up rows 2). Past
        the checkpoint's intermediate size (a padded rank's tail) ``target`` gets ``pad``."""
        local, total = int(self.local_intermediate * per_value), int(self.intermediate_size * per_value)
        if full.shape[dim] != total:
            raise ValueError(f"checkpoint tensor {tuple(full.shape)} has {full.shape[dim]} entries "
                             f"along dim {dim}, expected {total}")
        start = self.tp.rank * local
        real = max(0, min(local, total - start))
        copy_checked(target.narrow(dim, 0, real), full.narrow(dim, start, real))
        target.narrow(dim, real, local - real).fill_(pad)

    def _copy_rank_gate_up(self, target: torch.Tensor, full: torch.Tensor, dim: int, pad: int = 0) -> None:
        """This rank's gate/up rows of a full [.., 2I, ..] tensor (``dim`` indexes the 2I rows)."""
        if self.interleaved:  # g0 u0 g1 u1 ...: a rank's intermediate slice is contiguous
            self._copy_rank_part(target, full, dim, 2, pad)
            return
        for part, whole in zip(target.chunk(2, dim=dim), full.chunk(2, dim=dim), strict=True):
            self._copy_rank_part(part, whole, dim, 1, pad)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        rank = self.tp.rank
        if self.checkpoint_layout == PER_EXPERT:
            self._load_per_expert(param, loaded, shard_id)
            return
        if shard_id is not None:
            raise ValueError(f"a stacked expert tensor takes no shard id, got {shard_id!r}")
        if self.mxfp4 and param is not self.w13_bias and param is not self.w2_bias:
            self._load_mxfp4(param, loaded)
        elif param is self.w13_weight:  # [E, D, 2I] -> [E, 2I, D]
            self._copy_rank_gate_up(param.data, loaded.transpose(1, 2), 1)
        elif param is self.w2_weight:  # [E, I, D] -> [E, D, I]
            self._copy_rank_part(param.data, loaded.transpose(1, 2), 2, 1)
        elif param is self.w13_bias:
            self._copy_rank_gate_up(param.data, loaded, 1)
        else:
            # The down bias is added once: every rank's partial sum would otherwise carry it.
            copy_checked(param.data, loaded if rank == 0 else torch.zeros_like(loaded))

    def _load_mxfp4(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """gpt-oss's packed blocks [E, N, K / 32, 16] (flattened to [E, N, K / 2]) or scales
        [E, N, K / 32]: rows are output channels, so gate/up rows split as the bf16 ones do and
        down's K (the intermediate dim) splits in whole blocks. Padding is zero bytes with scale code
        127 (a factor of 1)."""
        block = self.scheme.block
        values_per_entry, pad = block, 127  # a scale covers a block
        if param is self.w13_weight or param is self.w2_weight:
            if loaded.dim() != 4 or loaded.shape[-1] != block // 2:
                raise ValueError(f"MXFP4 blocks are [experts, rows, K / {block}, {block // 2}], got "
                                 f"{tuple(loaded.shape)}")
            loaded, values_per_entry, pad = loaded.flatten(2), 2, 0  # a byte holds two values
        if param is self.w13_weight or param is self.w13_scale:
            self._copy_rank_gate_up(param.data, loaded, 1, pad)
        else:
            self._copy_rank_part(param.data, loaded, 2, 1 / values_per_entry, pad)

    def _load_per_expert(self, param: nn.Parameter, loaded: torch.Tensor, shard_id) -> None:
        """One expert's gate, up or down tensor (or its scale); the intermediate dim is split across
        ranks, in units of blocks for block scales."""
        gate_up = param is self.w13_weight or param is self.w13_scale
        expert, half = shard_id if gate_up else (shard_id, None)
        target = param.data[expert]
        unit = 1
        if self.mxfp4 and not gate_up:
            # Down's input dim splits: a rank's bytes (two values each) or scales (a block each).
            unit = 2 if param is self.w2_weight else self.scheme.block
        elif param is self.w13_scale or param is self.w2_scale:
            unit = 1 if self.mxfp4 else self.scheme.weight_block or 1
            if target.dim() == 1:  # per output channel, shipped as [N], [N, 1] or one per tensor
                full = self.local_intermediate * self.tp.world_size if gate_up else target.shape[0]
                loaded = loaded.reshape(-1).expand(full) if loaded.numel() == 1 else loaded.reshape(-1)
        size, rank = self.local_intermediate // unit, self.tp.rank
        if gate_up:
            copy_checked(target.narrow(0, half * size, size), loaded.narrow(0, rank * size, size))
        elif target.dim() == 1:  # down's per-channel scale: its channels are not split
            copy_checked(target, loaded)
        else:
            copy_checked(target, loaded.narrow(1, rank * size, size))

    def kernel_options(self) -> dict:
        """This layer's keyword arguments of :func:`atom_kernels.fused_moe` (and of its warm-up)."""
        return dict(
            activation=self.activation, interleaved=self.interleaved,
            w13_bias=self.w13_bias, w2_bias=self.w2_bias,
            swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit,
            w13_scale=self.w13_scale, w2_scale=self.w2_scale,
            block_size=0 if self.scheme is None or self.mxfp4 else self.scheme.weight_block or 0,
            weight_format="mxfp4" if self.mxfp4 else "auto",
            input_format="mxfp4" if self.mxfp4 and self.scheme.quantized_inputs else "auto",
        )

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        out = atom_kernels.fused_moe(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids,
                                     **self.kernel_options())
        if self.tp.world_size > 1 and self.reduce_results:
            out = self.tp.all_reduce(out)
        return out

    def warm_up(self, top_k: int, activation_dtype: torch.dtype) -> None:
        """Compile this layer's fused MoE for every tuned tile config of its shape before serving
        (:func:`atom_kernels.warm_up_fused_moe`); ``activation_dtype``: the dtype of ``x``."""
        atom_kernels.warm_up_fused_moe(self.w13_weight, self.w2_weight, top_k, x_dtype=activation_dtype,
                                       **self.kernel_options())


@dataclass(frozen=True)
class MoeSpec:
    """The sparse MLP of one model: router (:class:`TopKRouter`'s arguments; ``router_bias`` is its
    ``bias``), routed experts (:class:`FusedMoE`'s; ``expert_bias`` is its ``bias``) and shared
    experts, a :class:`GatedMLP` of ``shared_intermediate_size`` (0: none) with ``shared_bias``,
    scaled by ``sigmoid(shared_expert_gate(x))`` if ``shared_gate``."""

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    scoring: str = "softmax"
    num_expert_group: int = 1
    topk_group: int = 1
    correction_bias: bool = False
    routed_scaling_factor: float = 1.0
    router_bias: bool = False
    activation: str = "silu"
    interleaved: bool = False
    expert_bias: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    checkpoint_layout: str = PER_EXPERT
    shared_intermediate_size: int = 0
    shared_bias: bool = False
    shared_gate: bool = False


class SparseMoeBlock(nn.Module):
    """``experts(x, gate(x))`` plus, if given, ``shared_experts(x)`` (a dense MLP every token runs),
    times ``sigmoid(shared_expert_gate(x))`` (one logit per token) if that is given too. Under TP
    both give partial sums, reduced once (one all-reduce per MoE layer, not two).

    Checkpoint names follow the attribute names: ``<prefix>.gate``, ``<prefix>.experts``,
    ``<prefix>.shared_experts``, ``<prefix>.shared_expert_gate``.
    """

    def __init__(self, gate: TopKRouter, experts: FusedMoE, shared_experts: nn.Module | None = None,
                 shared_expert_gate: nn.Module | None = None):
        super().__init__()
        if shared_expert_gate is not None and shared_experts is None:
            raise ValueError("a shared expert gate needs shared experts")
        if experts.reduce_results or (shared_experts is not None and shared_experts.down_proj.reduce_results):
            raise ValueError("the block sums its experts' partial outputs over TP ranks itself: build them "
                             "with reduce_results=False")
        self.gate = gate
        self.experts = experts
        self.shared_experts = shared_experts
        self.shared_expert_gate = shared_expert_gate

    @classmethod
    def from_spec(cls, spec: MoeSpec, hidden_size: int, prefix: str) -> SparseMoeBlock:
        gate = TopKRouter(
            hidden_size, spec.num_experts, spec.top_k, spec.renormalize, prefix=f"{prefix}.gate",
            bias=spec.router_bias, scoring=spec.scoring, num_expert_group=spec.num_expert_group,
            topk_group=spec.topk_group, correction_bias=spec.correction_bias,
            routed_scaling_factor=spec.routed_scaling_factor,
        )
        experts = FusedMoE(
            spec.num_experts, hidden_size, spec.intermediate_size, prefix=f"{prefix}.experts",
            activation=spec.activation, interleaved=spec.interleaved, bias=spec.expert_bias,
            swiglu_alpha=spec.swiglu_alpha, swiglu_limit=spec.swiglu_limit,
            checkpoint_layout=spec.checkpoint_layout, reduce_results=False,
        )
        shared = shared_gate = None
        if spec.shared_intermediate_size:
            shared = GatedMLP(hidden_size, spec.shared_intermediate_size, f"{prefix}.shared_experts",
                              bias=spec.shared_bias, reduce_results=False)
        if spec.shared_gate:
            # One logit per token, shipped unquantized: vLLM builds it unquantized whatever the
            # checkpoint's list of unquantized modules says, and so does ATOM.
            with quantized_layers(None):
                shared_gate = ReplicatedLinear(hidden_size, 1, prefix=f"{prefix}.shared_expert_gate")
        return cls(gate, experts, shared, shared_gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, *self.gate(x))
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_expert_gate is not None:
                # One replicated gate per token scales every rank's partial sum alike.
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        tp = self.experts.tp
        return tp.all_reduce(out) if tp.world_size > 1 else out
