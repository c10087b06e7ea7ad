"""A stand-in for Kimi-K2.5's remote-code processor, written into tiny Kimi-K2.5 checkpoints
(atom_core.testing.tiny_vision_language) as their ``AutoProcessor``.

The published checkpoints ship Moonshot's processor as remote code; SGLang's Kimi-K2.5 processor
reads its tokenizer and its ``media_processor`` (the checkpoint's image settings
``media_proc_cfg``, and on CPU ``media_tokens_calculator`` and ``__call__(text, medias=...)``), which
neither HF's native Kimi-K2.5 processor nor its tokenizer has. This one has them, with the published
image preprocessing: each image resized (bicubic) to fit the patch limits, padded with black to whole
merged patches, normalised with the checkpoint's mean and std, cut into ``[patches, 3, p, p]``
row-major with its ``grid_thws`` row ``(1, rows, cols)``; one placeholder token per merged patch.
"""

import json
import math
import os

import numpy as np
import torch
from PIL import Image
from transformers import AutoTokenizer, ProcessorMixin


class TinyKimiK25MediaProcessor:
    """The image half (``media_processor``): sizing and patches of one image."""

    def __init__(self, media_proc_cfg: dict):
        self.media_proc_cfg = media_proc_cfg

    def resize_config(self, image) -> dict:
        """NaViT sizing: at most ``in_patch_limit`` patches and ``patch_limit_on_one_side`` a side."""
        cfg = self.media_proc_cfg
        patch, limit_side = cfg["patch_size"], cfg["patch_limit_on_one_side"]
        merge = cfg["merge_kernel_size"]
        merge = merge[0] if isinstance(merge, list) else merge
        width, height = image.size
        scale = min(1.0, math.sqrt(cfg["in_patch_limit"] / (max(1, width // patch) * max(1, height // patch))),
                    limit_side * patch / width, limit_side * patch / height)
        new_w = min(max(1, int(width * scale)), limit_side * patch)
        new_h = min(max(1, int(height * scale)), limit_side * patch)
        factor = merge * patch
        padded_w, padded_h = -(-new_w // factor) * factor, -(-new_h // factor) * factor
        return {"new_width": new_w, "new_height": new_h, "padded_width": padded_w, "padded_height": padded_h,
                "num_tokens": cfg.get("fixed_output_tokens") or (padded_w // factor) * (padded_h // factor)}

    def media_tokens_calculator(self, media: dict) -> int:
        return self.resize_config(media["image"])["num_tokens"]

    def patches(self, image) -> tuple[torch.Tensor, list[int]]:
        """The image's normalised patches ``[rows * cols, 3, p, p]`` and its ``grid_thws`` row."""
        cfg, size = self.media_proc_cfg, self.resize_config(image)
        resized = image.convert("RGB").resize((size["new_width"], size["new_height"]), Image.Resampling.BICUBIC)
        canvas = np.zeros((size["padded_height"], size["padded_width"], 3), dtype=np.float32)
        canvas[: size["new_height"], : size["new_width"]] = np.asarray(resized, dtype=np.float32) / 255.0
        canvas = (canvas - np.asarray(cfg["image_mean"], np.float32)) / np.asarray(cfg["image_std"], np.float32)
        p = cfg["patch_size"]
        rows, cols = size["padded_height"] // p, size["padded_width"] // p
        patches = canvas.reshape(rows, p, cols, p, 3).transpose(0, 2, 4, 1, 3).reshape(rows * cols, 3, p, p)
        return torch.from_numpy(np.ascontiguousarray(patches)), [1, rows, cols]


class TinyKimiK25Processor(ProcessorMixin):
    attributes = ["tokenizer"]
    tokenizer_class = "AutoTokenizer"

    def __init__(self, tokenizer, media_proc_cfg: dict):
        super().__init__(tokenizer)
        self.media_processor = TinyKimiK25MediaProcessor(media_proc_cfg)
        self.image_processor = None

    @classmethod
    def from_pretrained(cls, path: str, **kwargs):
        with open(os.path.join(path, "preprocessor_config.json")) as f:
            media_proc_cfg = json.load(f)["media_proc_cfg"]
        return cls(AutoTokenizer.from_pretrained(path), media_proc_cfg)

    def __call__(self, text=None, medias=None, **kwargs) -> dict:
        """Token ids of ``text`` (placeholders already expanded, as SGLang passes it) and, for
        ``medias`` (``{"type": "image", "image": PIL image}``), the images' patches."""
        out = {"input_ids": self.tokenizer(text, return_tensors="pt")["input_ids"]}
        if medias:
            patches, grids = zip(*(self.media_processor.patches(media["image"]) for media in medias))
            out |= {"pixel_values": torch.cat(patches), "grid_thws": torch.tensor(grids)}
        return out
