"""Tiny random vision-language checkpoints built in code, as published: the HF composite config
(``text_config`` + ``vision_config``), HF's own model class written with ``save_pretrained`` (hub
tensor names: ``model.language_model.*``, ``model.visual.*``, ``lm_head``), a trained tokenizer with
the model's vision tokens, and the HF processor (image and video processors, chat template).

The language model is the text family's tiny config (atom_core.testing.tiny_models); the vision
tower is small (8-pixel patches merged 2 x 2, so a 32 x 48 image is 6 tokens), so that the host's
vision tower and processor run in seconds on a CPU.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from atom_core.testing.tiny_models import VOCAB_SIZE, build_tokenizer, tiny_hf_config


@dataclass(frozen=True)
class TinyVisionLanguage:
    text_architecture: str  # the key of the language model's tiny config
    model_type: str
    vision_config: dict[str, Any]
    vision_tokens: tuple[str, ...]  # appended to the text vocabulary, in this order
    token_id_keys: tuple[str, ...]  # the config keys holding their ids, in the same order


# Ids of the vision tokens: right after the trained vocabulary.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH, MERGE = 8, 2

# deepstack_visual_indexes as the published Qwen3.5 configs list it (empty: no deepstack features);
# SGLang's config class of the tower defaults to Qwen3-VL's [8, 16, 24] where it is absent.
QWEN_VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=PATCH,
                   spatial_merge_size=MERGE, temporal_patch_size=2, out_hidden_size=80,
                   num_position_embeddings=64, deepstack_visual_indexes=[])
QWEN_TOKEN_ID_KEYS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")

TINY_VISION_LANGUAGE: dict[str, TinyVisionLanguage] = {
    "Qwen3_5ForConditionalGeneration": TinyVisionLanguage(
        "Qwen3_5ForCausalLM", "qwen3_5", QWEN_VISION, VISION_TOKENS, QWEN_TOKEN_ID_KEYS),
    "Qwen3_5MoeForConditionalGeneration": TinyVisionLanguage(
        "Qwen3_5MoeForCausalLM", "qwen3_5_moe", QWEN_VISION, VISION_TOKENS, QWEN_TOKEN_ID_KEYS),
}

# HF's text-only class of each family -> the vision-language architecture whose language model
# ATOM's class is (tests build the text-only checkpoints and run ATOM's language model on them).
LANGUAGE_MODEL_OF = {spec.text_architecture: architecture for architecture, spec in TINY_VISION_LANGUAGE.items()}

# The processor's pixel budget: images resize to between 2 x 2 and 8 x 8 merged tokens.
MIN_PIXELS, MAX_PIXELS = (2 * PATCH * MERGE) ** 2, (8 * PATCH * MERGE) ** 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def tiny_vision_language_config(architecture: str, **text_overrides: Any):
    """The tiny composite config; ``text_overrides`` change the language model's tiny config (the
    vision tower's output width follows its hidden size)."""
    from atom_core.testing.hf_classes import transformers_config_class

    spec = TINY_VISION_LANGUAGE[architecture]
    text = tiny_hf_config(spec.text_architecture, vocab_size=VOCAB_SIZE + len(spec.vision_tokens), **text_overrides)
    ids = {key: VOCAB_SIZE + i for i, key in enumerate(spec.token_id_keys)}
    text_dict = text.to_dict()
    text_dict.pop("architectures", None)
    vision = dict(spec.vision_config, out_hidden_size=text.hidden_size)
    config = transformers_config_class(spec.model_type)(text_config=text_dict, vision_config=vision,
                                                          tie_word_embeddings=False, **ids)
    config.architectures = [architecture]
    return config


def build_tiny_vision_language_model(architecture: str, out_dir: str, seed: int = 0, std: float = 0.1,
                                     random_norms: bool = False, **text_overrides: Any) -> str:
    """Write a tiny random ``architecture`` checkpoint with its tokenizer and processor to
    ``out_dir`` (fp32) and return the path; ``random_norms`` as in build_tiny_model,
    ``text_overrides`` as in :func:`tiny_vision_language_config`."""
    from transformers import AutoModelForImageTextToText

    config = tiny_vision_language_config(architecture, **text_overrides)
    config.text_config.initializer_range = std
    config.vision_config.initializer_range = std
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("bias"):
                tensor.normal_(0.0, std)
            elif random_norms and name.endswith("norm.weight") and "language_model" in name:
                tensor.add_(torch.randn_like(tensor) * std)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer_and_processor(out_dir, architecture)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"do_sample": False, "bos_token_id": 1, "eos_token_id": None}, f)
    return out_dir


def write_tokenizer_and_processor(out_dir: str, architecture: str) -> None:
    """A trained tokenizer with ``architecture``'s vision tokens and the HF processor, in ``out_dir``.
    Hosts load the processor of a vision-language model even when they take token ids only."""
    from transformers import AutoProcessor, AutoTokenizer

    build_tokenizer(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": list(TINY_VISION_LANGUAGE[architecture].vision_tokens)})
    tokenizer.save_pretrained(out_dir)
    write_processor_configs(out_dir)
    processor = AutoProcessor.from_pretrained(out_dir)
    processor.chat_template = CHAT_TEMPLATE
    processor.save_pretrained(out_dir)


def write_processor_configs(out_dir: str) -> None:
    """The image and video processors' configs at the tiny tower's patch and merge sizes."""
    common = {"patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": 2,
              "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor",
                   **common}, f)
    with open(os.path.join(out_dir, "video_preprocessor_config.json"), "w") as f:
        json.dump({"video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor",
                   **common}, f)


# (height, width) of the test images: 4 x 6, 2 x 2 and 3 x 2 merged tokens of the tiny tower.
TEST_IMAGE_SIZES = ((64, 96), (32, 32), (48, 32))
TEST_QUESTIONS = ("The quick brown fox", "Paged attention stores keys")


def write_test_images(out_dir: str) -> list[str]:
    """Random RGB images of :data:`TEST_IMAGE_SIZES` as PNG files in ``out_dir``; their paths."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i, (height, width) in enumerate(TEST_IMAGE_SIZES):
        path = os.path.join(out_dir, f"image{i}.png")
        Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8")).save(path)
        paths.append(path)
    return paths


def image_prompts(model: str, images: list[str]) -> list[dict[str, str]]:
    """One chat prompt per image, ``{"text", "image"}``: the image, then a question, by the
    checkpoint's chat template (one image placeholder, which the host's processor expands)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model)
    return [{"text": processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}],
                add_generation_prompt=True),
             "image": image}
            for question, image in zip(TEST_QUESTIONS, images)]


def processor_inputs(processor, prompt: dict[str, str]) -> dict:
    """HF's processor on one of :func:`image_prompts`' prompts: the model's inputs."""
    from PIL import Image

    return processor(text=[prompt["text"]], images=[Image.open(prompt["image"]).convert("RGB")],
                     return_tensors="pt")


def hf_image_greedy(model: str, prompts: list[dict[str, str]], max_tokens: int) -> list[list[int]]:
    """HF's own vision-language model's greedy tokens for :func:`image_prompts`' prompts, its
    processor expanding each image's placeholder."""
    from transformers import AutoProcessor

    from atom_core.testing.hf_classes import hf_reference_model

    processor = AutoProcessor.from_pretrained(model)
    hf = hf_reference_model(model, "AutoModelForImageTextToText")
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            inputs = processor_inputs(processor, prompt)
            out = hf.generate(**inputs, max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
            outputs.append(out[0, inputs["input_ids"].shape[1]:].tolist())
    return outputs


def hf_image_next_logits(dequantized: str, fp8: str, prompts: list[dict[str, str]]) -> list[torch.Tensor]:
    """HF's own VLM on the dequantized copy of the FP8 checkpoint ``fp8``, with its activation
    quantization (fp32): each of :func:`image_prompts`' prompts' next-token logits."""
    from transformers import AutoProcessor

    from atom_core.testing.fp8_checkpoints import fake_quantized_activations
    from atom_core.testing.hf_classes import hf_reference_model

    processor = AutoProcessor.from_pretrained(dequantized)
    hf = hf_reference_model(dequantized, "AutoModelForImageTextToText")
    logits = []
    with torch.no_grad(), fake_quantized_activations(hf, fp8):
        for prompt in prompts:
            inputs = processor_inputs(processor, prompt)
            logits.append(hf(**inputs).logits[0, -1])
    return logits


# Kimi-K2.5's text_config.quantization_config as published: int4 routed experts (compressed-tensors).
KIMI_K25_INT4_QUANTIZATION = {
    "config_groups": {"group_0": {"input_activations": None, "output_activations": None, "targets": ["Linear"],
                                  "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                              "group_size": 32, "num_bits": 4, "observer": "minmax",
                                              "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                                              "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}


def build_tiny_kimi_k25_language_model(out_dir: str, text_dir: str, remote_code_processor: bool = False) -> str:
    """A tiny Kimi-K2.5 checkpoint with its language model only: ``text_dir``'s DeepSeek-V3
    checkpoint (atom_core.testing.tiny_models) under Kimi-K2.5's published names
    (``language_model.*``, config ``text_config`` with Kimi-K2's ``topk_method: noaux_tc`` and the
    keys SGLang reads), a tiny vision config (the tower's sizes under both names the hosts read:
    vLLM's tower and SGLang's tower read ``hidden_size`` and the like, SGLang's projector the
    published ``vt_*`` ones) and the image processor settings the hosts' Kimi-K2.5 processors read,
    but no vision tower tensors (:func:`add_tiny_kimi_k25_vision_tower` adds them): it serves text
    with the tower off (vLLM's ``limit_mm_per_prompt`` of 0 for every modality).
    ``remote_code_processor``: the checkpoint's ``AutoProcessor`` is
    atom_core.testing.kimi_k25_processor (SGLang's processor needs one; load it with
    ``trust_remote_code``). HF transformers' DeepSeek-V3 on ``text_dir`` is its reference."""
    import shutil

    from safetensors.torch import load_file, save_file

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(text_dir, "config.json")) as f:
        text_config = json.load(f)
    text_config.update(topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1)
    tower = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 48}
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": text_config, "media_placeholder_token_id": VOCAB_SIZE - 1, "pad_token_id": 0,
        "tie_word_embeddings": False,
        "vision_config": {"patch_size": 14, "init_pos_emb_height": 8, "init_pos_emb_width": 8,
                          "merge_kernel_size": [2, 2], "mm_hidden_size": tower["hidden_size"],
                          "text_hidden_size": text_config["hidden_size"], **tower,
                          **{f"vt_{key}": value for key, value in tower.items()}},
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)
    preprocessor = {"image_processor_type": "Kimi_K25ImageProcessor", "media_proc_cfg": {
        "patch_size": 14, "merge_kernel_size": [2, 2], "temporal_merge_kernel_size": 4,
        "in_patch_limit": 256, "in_patch_limit_each_frame": 256, "in_patch_limit_video": 256,
        "patch_limit_on_one_side": 16, "fixed_output_tokens": None,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}}
    if remote_code_processor:
        from atom_core.testing import kimi_k25_processor

        shutil.copy(kimi_k25_processor.__file__, out_dir)
        preprocessor["auto_map"] = {"AutoProcessor": "kimi_k25_processor.TinyKimiK25Processor"}
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(preprocessor, f)
    tensors = load_file(os.path.join(text_dir, "model.safetensors"))
    save_file({f"language_model.{name}": t for name, t in tensors.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    for name in os.listdir(text_dir):
        if name.startswith("tokenizer") or name in ("chat_template.jinja", "generation_config.json"):
            shutil.copy(os.path.join(text_dir, name), out_dir)
    return out_dir


def add_tiny_kimi_k25_vision_tower(model_dir: str, std: float = 0.1, seed: int = 0) -> None:
    """Random tensors of Kimi-K2.5's vision tower (MoonViT) and projector in
    :func:`build_tiny_kimi_k25_language_model`'s checkpoint, beside its language model, under the
    names vLLM 0.26 reads the published checkpoint by (a fused ``wqkv`` per block; the projector's
    ``proj.0`` / ``proj.2``, which it maps to its own): the host's tower then runs images."""
    from safetensors.torch import load_file, save_file

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    vision, text_hidden = config["vision_config"], config["text_config"]["hidden_size"]
    hidden, inter, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    merged = hidden * vision["merge_kernel_size"][0] * vision["merge_kernel_size"][1]
    shapes = {
        "vision_tower.patch_embed.proj.weight": (hidden, 3, patch, patch),
        "vision_tower.patch_embed.proj.bias": (hidden,),
        "vision_tower.patch_embed.pos_emb.weight": (vision["init_pos_emb_height"], vision["init_pos_emb_width"],
                                                    hidden),
        "mm_projector.proj.0.weight": (merged, merged), "mm_projector.proj.0.bias": (merged,),
        "mm_projector.proj.2.weight": (text_hidden, merged), "mm_projector.proj.2.bias": (text_hidden,),
    }
    norms = ["vision_tower.encoder.final_layernorm", "mm_projector.pre_norm"]
    for i in range(vision["num_hidden_layers"]):
        block = f"vision_tower.encoder.blocks.{i}"
        norms += [f"{block}.norm0", f"{block}.norm1"]
        for name, (rows, cols) in {"wqkv": (3 * hidden, hidden), "wo": (hidden, hidden),
                                   "mlp.fc0": (inter, hidden), "mlp.fc1": (hidden, inter)}.items():
            shapes |= {f"{block}.{name}.weight": (rows, cols), f"{block}.{name}.bias": (rows,)}
    generator = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(shape, generator=generator) * std for name, shape in shapes.items()}
    for norm in norms:
        tensors[f"{norm}.weight"] = 1 + torch.randn(hidden, generator=generator) * std
        tensors[f"{norm}.bias"] = torch.randn(hidden, generator=generator) * std
    path = os.path.join(model_dir, "model.safetensors")
    save_file(load_file(path) | tensors, path, metadata={"format": "pt"})
