"""MXFP4 checkpoints (gpt-oss as published): ATOM's logits against HF transformers running the same
checkpoint dequantized, on CPU with the torch kernels.

MXFP4 is weight-only and every dequantized weight is exact in fp32, so both references compute
ATOM's products; what remains is fp32 summation order. Two references:
- HF on the MXFP4 checkpoint itself: on CPU without its kernels HF dequantizes the experts at load
  (its own decoder, ``convert_moe_packed_tensors``);
- HF on an fp32 checkpoint of the values the quantizer chose (no MXFP4 decoder at all).
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_hf_parity import atom_batch_logits, atom_model
from transformers import Mxfp4Config

from atom_core.distributed import SINGLE_RANK, TPGroup, set_tp_group
from atom_core.layers.moe import STACKED_TRANSPOSED, FusedMoE
from atom_core.loader import CheckpointError
from atom_core.quantization import quantized_layers
from atom_core.quantization.scheme import Mxfp4Scheme, QuantConfig
from atom_core.testing.hf_classes import hf_reference_model
from atom_core.testing.mxfp4_checkpoints import quantize_mxfp4, write_tiny_mxfp4_checkpoints

torch.set_default_dtype(torch.float32)

# Relative error of ATOM's fp32 logits against either reference (fp32 summation order only).
TOLERANCE = 1e-5
EXPERTS = "model.layers.1.mlp.experts"


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dir, tmp_path_factory):
    """(MXFP4 checkpoint, its dequantized fp32 copy)."""
    return write_tiny_mxfp4_checkpoints(tiny_model_dir, str(tmp_path_factory.mktemp("gpt-oss-mxfp4")))


def hf_logits(model_dir: str, sequences, **options) -> torch.Tensor:
    hf = hf_reference_model(model_dir, **options)
    with torch.no_grad():
        return torch.cat([hf(torch.tensor([seq])).logits[0] for seq in sequences])


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_mxfp4_matches_hf_on_the_dequantized_weights(checkpoints):
    mxfp4, dequantized = checkpoints
    model = atom_model(mxfp4)
    experts = model.model.layers[1].mlp.experts
    assert experts.w13_weight.dtype == experts.w13_weight_scale.dtype == torch.uint8
    assert experts.w13_weight.shape == (6, 128, 64)  # [E, 2I, D / 2]
    assert model.model.layers[1].self_attn.qkv_proj.weight.dtype == torch.float32
    sequences, logits = atom_batch_logits(model, [9, 1, 17], seed=3)
    from_fp32 = hf_logits(dequantized, sequences)
    from_mxfp4 = hf_logits(mxfp4, sequences, quantization_config=Mxfp4Config(dequantize=True))
    assert relative_error(from_mxfp4, from_fp32) < TOLERANCE  # HF's decoder agrees with the quantizer
    errors = relative_error(logits, from_fp32), relative_error(logits, from_mxfp4)
    print(f"relative errors: ATOM vs HF fp32 {errors[0]:.2e}, vs HF mxfp4 {errors[1]:.2e}, HF vs HF "
          f"{relative_error(from_mxfp4, from_fp32):.2e}")
    assert max(errors) < TOLERANCE, errors


def modified_copy(mxfp4: str, tmp_path, name: str, change) -> str:
    out = tmp_path / "m"
    shutil.copytree(mxfp4, out, dirs_exist_ok=True)
    tensors = load_file(out / "model.safetensors")
    if change is None:
        del tensors[name]
    else:
        tensors[name] = change(tensors[name])
    save_file(tensors, out / "model.safetensors")
    return str(out)


@pytest.mark.parametrize("name,change,message", [
    (f"{EXPERTS}.gate_up_proj_scales", None, "checkpoint is missing tensor '{name}'"),
    (f"{EXPERTS}.down_proj_blocks", None, "checkpoint is missing tensor '{name}'"),
    (f"{EXPERTS}.down_proj_scales", lambda t: t[:, :-1].contiguous(), r"'{name}': shape mismatch"),
    (f"{EXPERTS}.gate_up_proj_blocks", lambda t: t.flatten(2).contiguous(),
     r"'{name}': MXFP4 blocks are \[experts, rows, K / 32, 16\], got \(6, 128, 64\)"),
    (f"{EXPERTS}.down_proj_blocks", lambda t: t[:, :, :1].contiguous(), r"'{name}': checkpoint tensor .* along dim 2"),
    (f"{EXPERTS}.gate_up_proj_blocks", lambda t: t.to(torch.bfloat16), "'{name}' is torch.bfloat16 but"),
])
def test_checkpoint_errors_name_the_tensor(checkpoints, tmp_path, name, change, message):
    broken = modified_copy(checkpoints[0], tmp_path, name, change)
    with pytest.raises(CheckpointError, match=message.format(name=name.replace(".", r"\."))):
        atom_model(broken)


def test_bf16_experts_in_an_mxfp4_checkpoint_are_an_error(checkpoints, tmp_path):
    dequantized = load_file(f"{checkpoints[1]}/model.safetensors")[f"{EXPERTS}.down_proj"]
    broken = modified_copy(checkpoints[0], tmp_path, f"{EXPERTS}.down_proj_blocks", None)
    tensors = load_file(f"{broken}/model.safetensors")
    tensors[f"{EXPERTS}.down_proj"] = dequantized
    save_file(tensors, f"{broken}/model.safetensors")
    with pytest.raises(CheckpointError, match=rf"'{EXPERTS}\.down_proj' does not match any ATOM parameter"):
        atom_model(broken)


def mxfp4_experts(rank: int, world_size: int, tensors: dict[str, torch.Tensor], inter: int = 64) -> FusedMoE:
    set_tp_group(TPGroup(rank, world_size, lambda x: x, lambda x, dim: x))
    try:
        with quantized_layers(QuantConfig("mxfp4", Mxfp4Scheme(), experts_only=True)):
            experts = FusedMoE(4, 64, inter, prefix="experts", activation="clamped_swiglu",
                               interleaved=True, bias=True, checkpoint_layout=STACKED_TRANSPOSED)
    finally:
        set_tp_group(SINGLE_RANK)
    params = dict(experts.named_parameters())
    for name, tensor in tensors.items():
        experts.weight_loader(params[name], tensor)
    return experts


def experts_checkpoint(inter: int) -> dict[str, torch.Tensor]:
    """gpt-oss's stacked MXFP4 experts (4 experts, hidden 64, intermediate ``inter``) with biases."""
    gate_up_blocks, gate_up_scales, _ = quantize_mxfp4(torch.randn(4, 2 * inter, 64) * 0.1)
    down_blocks, down_scales, _ = quantize_mxfp4(torch.randn(4, 64, inter) * 0.1)
    return {"w13_weight": gate_up_blocks, "w13_weight_scale": gate_up_scales,
            "w2_weight": down_blocks, "w2_weight_scale": down_scales,
            "w13_bias": torch.randn(4, 2 * inter) * 0.1, "w2_bias": torch.randn(4, 64) * 0.1}


def assert_ranks_sum_to_one_rank(tensors: dict[str, torch.Tensor], inter: int, world_size: int) -> list[FusedMoE]:
    """The ranks' partial outputs (summed by the all-reduce) equal one rank's output."""
    x = torch.randn(5, 64)
    weights, ids = torch.rand(5, 2).softmax(-1), torch.tensor([[0, 1], [2, 3], [1, 3], [0, 2], [3, 0]])
    whole = mxfp4_experts(0, 1, tensors, inter)
    ranks = [mxfp4_experts(rank, world_size, tensors, inter) for rank in range(world_size)]
    with torch.no_grad():
        summed = sum(rank(x, weights, ids) for rank in ranks)
        torch.testing.assert_close(summed, whole(x, weights, ids), rtol=1e-5, atol=1e-6)
    return [whole, *ranks]


def test_tensor_parallel_ranks_hold_whole_blocks_and_sum_to_one_rank():
    """TP=2 splits I = 64 into two blocks of 32: each rank's share of gate/up rows and of down's
    packed K."""
    whole, _, rank_1 = assert_ranks_sum_to_one_rank(experts_checkpoint(64), 64, 2)
    assert rank_1.w2_weight.shape == (4, 64, 16) and rank_1.w2_weight_scale.shape == (4, 64, 1)
    assert torch.equal(rank_1.w2_weight, whole.w2_weight[:, :, 16:])
    assert torch.equal(rank_1.w13_weight_scale, whole.w13_weight_scale[:, 64:])  # interleaved rows


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_share_inside_a_block_is_padded_to_whole_blocks(world_size):
    """I = 96 (three blocks) splits into 48 or 24 values a rank, inside a block (gpt-oss's 2880 at
    TP 4 or 8): every rank holds whole blocks, 64 or 32 values, the last ones' tails zero weights with
    scale code 127 (so register decoding still takes the layer) and zero biases; the ranks' partial
    outputs still sum to one rank's."""
    models = assert_ranks_sum_to_one_rank(experts_checkpoint(96), 96, world_size)
    last = models[-1]
    assert last.local_intermediate == 128 // world_size
    real = 96 - (world_size - 1) * last.local_intermediate  # 32 at TP 2, 0 at TP 4
    assert not last.w2_weight[:, :, real // 2:].any() and not last.w13_weight[:, 2 * real:].any()
    assert (last.w2_weight_scale[:, :, real // 32:] == 127).all()
    assert (last.w13_weight_scale[:, 2 * real:] == 127).all() and not last.w13_bias[:, 2 * real:].any()


def test_an_intermediate_size_split_inside_a_block_is_an_error_per_expert():
    """Per-expert MXFP4 experts (AMD Quark's layout) are not padded: their split must be whole blocks."""
    set_tp_group(TPGroup(0, 4, lambda x: x, lambda x, dim: x))
    try:
        with quantized_layers(QuantConfig("mxfp4", Mxfp4Scheme(), experts_only=True)):
            with pytest.raises(ValueError, match="per-rank intermediate size 16 \\(TP 4\\)"):
                FusedMoE(4, 64, 64, prefix="experts")
    finally:
        set_tp_group(SINGLE_RANK)


def test_packed_experts_start_at_zero_as_in_vllm():
    """vLLM's dummy loader fills floating-point parameters only; vLLM's MXFP4 method allocates its
    packed weights and scales with zeros, so ATOM's start at zero too and a dummy load gives both
    engines the same experts (and no scale byte of 255, which decodes to infinity)."""
    experts = mxfp4_experts(0, 1, {})
    packed = [experts.w13_weight, experts.w2_weight, experts.w13_weight_scale, experts.w2_weight_scale]
    assert all(p.dtype == torch.uint8 and not p.any() for p in packed)
