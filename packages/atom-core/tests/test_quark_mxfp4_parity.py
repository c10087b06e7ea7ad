"""AMD Quark MXFP4 checkpoints (W4A4, the layout of amd/DeepSeek-R1-0528-MXFP4): ATOM's DeepSeek-V3
logits against HF transformers running the same checkpoint dequantized, on CPU with the torch
kernels.

HF transformers loads Quark checkpoints only through the ``amd-quark`` package, whose MXFP4
kernels are GPU builds; vLLM's CPU build emulates Quark's MXFP4 through the same package (and
refuses MLA on CPU). So the references are HF's own DeepSeek-V3 on the dequantized weights:
- with every quantized linear layer's input, and both expert GEMMs' inputs, rounded to MXFP4 and back
  by the test's quantizer (``fake_quantized_activations``): the format's math, written apart from
  ATOM's kernels. Weights decode exactly, so what remains is fp32 summation order, which would show
  only where a value lands within an ulp of an MXFP4 rounding boundary;
- plain: ATOM differs from it by the activation rounding itself (e2m1 keeps one mantissa bit), which
  shows that the first match is not trivial.
"""

import dataclasses
import json
import os

import pytest
import torch
from test_hf_parity import atom_batch_logits, atom_model

from atom_core.hosting.takeover import QUARK_MXFP4_GPU_OPT_IN_REASON, HostedModel, decide_takeover
from atom_core.loader import CheckpointError
from atom_core.testing.hf_classes import hf_reference_model
from atom_core.testing.quark_checkpoints import (
    DEEPSEEK_EXCLUDE,
    fake_quantized_activations,
    write_tiny_quark_checkpoints,
)

torch.set_default_dtype(torch.float32)

# Relative error of ATOM's logits against HF with the same activation rounding (fp32 summation order).
TIGHT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dir, tmp_path_factory):
    """(Quark MXFP4 checkpoint, its dequantized fp32 copy)."""
    return write_tiny_quark_checkpoints(tiny_model_dir, str(tmp_path_factory.mktemp("deepseek-v3-quark")))


def hf_logits(model_dir: str, sequences, rounded_like: str | None = None) -> torch.Tensor:
    hf = hf_reference_model(model_dir)
    outputs = []
    with torch.no_grad():
        for seq in sequences:
            if rounded_like is None:
                outputs.append(hf(torch.tensor([seq])).logits[0])
            else:
                with fake_quantized_activations(hf, rounded_like):
                    outputs.append(hf(torch.tensor([seq])).logits[0])
    return torch.cat(outputs)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_quark_mxfp4_matches_hf_with_the_same_activation_rounding(checkpoints):
    quark, dequantized = checkpoints
    model = atom_model(quark)
    dense, sparse = model.model.layers[0].mlp, model.model.layers[1].mlp
    packed = [dense.gate_up_proj, dense.down_proj, sparse.shared_experts.gate_up_proj,
              sparse.shared_experts.down_proj]
    assert all(layer.weight.dtype == layer.weight_scale.dtype == torch.uint8 for layer in packed)
    assert dense.gate_up_proj.weight.shape == (256, 64)  # [2I, D / 2]: kept packed
    assert sparse.experts.w13_weight.dtype == sparse.experts.w13_weight_scale.dtype == torch.uint8
    assert sparse.experts.w13_weight.shape == (8, 128, 64)  # [E, 2I, D / 2]
    assert sparse.experts.kernel_options()["input_format"] == "mxfp4"
    attention = model.model.layers[1].self_attn
    assert attention.o_proj.weight.dtype == attention.kv_b_proj.weight.dtype == torch.float32
    sequences, logits = atom_batch_logits(model, [9, 1, 17], seed=3)
    rounded = hf_logits(dequantized, sequences, rounded_like=quark)
    plain = hf_logits(dequantized, sequences)
    tight = relative_error(logits, rounded)
    print(f"relative error: {tight:.2e} against HF with MXFP4 activations, "
          f"{relative_error(logits, plain):.2e} against plain HF")
    assert tight < TIGHT_TOLERANCE
    assert relative_error(rounded, plain) > 100 * tight


def test_a_bf16_tensor_where_the_config_says_mxfp4_names_the_tensor(tiny_model_dir, tmp_path):
    """The shared experts shipped in bf16 (written excluded), under a config that quantizes them."""
    quark, _ = write_tiny_quark_checkpoints(tiny_model_dir, str(tmp_path),
                                            exclude=[*DEEPSEEK_EXCLUDE, "*shared_experts*"])
    config_path = os.path.join(quark, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["quantization_config"]["exclude"] = DEEPSEEK_EXCLUDE
    with open(config_path, "w") as f:
        json.dump(config, f)
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.shared_experts\.\w+_proj\.weight"):
        atom_model(quark)


def test_attention_left_quantized_is_handed_back(checkpoints, monkeypatch):
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(checkpoints[0])
    hosted = HostedModel("vLLM", "DeepseekV3ForCausalLM", hf_config, torch.bfloat16, quantization="quark")
    assert decide_takeover(hosted).atom_serves
    # On a GPU the host keeps it unless opted in (ATOM's A4 is emulated there, unmeasured).
    monkeypatch.delenv("ATOM_SERVE_MXFP4", raising=False)
    on_gpu = dataclasses.replace(hosted, device="cuda")
    assert decide_takeover(on_gpu).reasons == (QUARK_MXFP4_GPU_OPT_IN_REASON,)
    monkeypatch.setenv("ATOM_SERVE_MXFP4", "1")
    assert decide_takeover(on_gpu).atom_serves
    hf_config.quantization_config["exclude"] = ["*mlp.gate", "lm_head"]
    assert decide_takeover(hosted).reasons == (
        "quark MXFP4 attention projections are not supported (model.layers.0.self_attn.q_a_proj is not in "
        "'exclude'; ATOM serves MXFP4 MLPs and experts)",)
