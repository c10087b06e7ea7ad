"""Model-level parity: ATOM logits equal HF transformers' on a batch of sequences (fp32)."""

import pytest
import torch
from transformers import AutoConfig

from atom_core import Config
from atom_core.hosting.build import build_atom_model
from atom_core.layers.attention import standalone_batch
from atom_core.loader import iter_safetensors
from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_core.testing.hf_classes import hf_reference_model
from atom_core.testing.tiny_vision_language import LANGUAGE_MODEL_OF

torch.set_default_dtype(torch.float32)


def atom_model(model_dir: str):
    hf_config = AutoConfig.from_pretrained(model_dir)
    config = Config(model=model_dir, hf_config=hf_config, torch_dtype=torch.float32)
    architecture = hf_config.architectures[0]
    model = build_atom_model(config, LANGUAGE_MODEL_OF.get(architecture, architecture), "this test")
    model.load_weights(iter_safetensors(model_dir))
    return model.eval()


def hf_logits(model_dir: str, sequences: list[list[int]]) -> list[torch.Tensor]:
    hf = hf_reference_model(model_dir)
    with torch.no_grad():
        return [hf(torch.tensor([seq])).logits[0] for seq in sequences]


# Vision-language architectures: their language model's parity is test_qwen3_5_parity's.
TEXT_ARCHITECTURES = sorted(a for a, entry in SUPPORTED_ARCHITECTURES.items() if not entry.vision_language)


@pytest.mark.parametrize("architecture", TEXT_ARCHITECTURES)
def test_logits_match_hf(tiny_model_dir, architecture):
    assert_logits_match_hf(tiny_model_dir(architecture))


def atom_batch_logits(model, lengths: list[int], seed: int) -> tuple[list[list[int]], torch.Tensor]:
    """Random sequences of ``lengths`` and ATOM's logits for all of them, run as one batch."""
    generator = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(4, 499, (n,), generator=generator).tolist() for n in lengths]
    input_ids = torch.tensor([t for seq in sequences for t in seq])
    positions = torch.cat([torch.arange(n) for n in lengths])
    with torch.no_grad(), standalone_batch(lengths):
        return sequences, model.compute_logits(model(input_ids, positions))


def assert_logits_match_hf(model_dir: str) -> None:
    """ATOM's logits on four sequences of 1 to 23 tokens, batched, vs HF's one sequence at a time."""
    sequences, logits = atom_batch_logits(atom_model(model_dir), [7, 1, 23, 12], seed=1)
    assert_logits_close(logits, torch.cat(hf_logits(model_dir, sequences)))


def assert_logits_close(logits: torch.Tensor, expected: torch.Tensor) -> None:
    """fp32 parity: relative error below 1e-4 overall, and per logit within 1e-4 (relative) plus
    1e-4 of the largest logit."""
    assert logits.shape == expected.shape
    rel = (logits - expected).norm() / expected.norm()
    assert rel < 1e-4, f"relative error {rel:.2e}"
    assert torch.allclose(logits, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
