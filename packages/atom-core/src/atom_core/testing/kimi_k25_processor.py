"""A stand-in for Kimi-K2.5's remote-code processor, written into tiny Kimi-K2.5 checkpoints
(atom_core.testing.tiny_vision_language) as their ``AutoProcessor``.

The published checkpoints ship Moonshot's processor as remote code; SGLang's Kimi-K2.5 processor
reads its tokenizer and its ``media_processor.media_proc_cfg`` (the checkpoint's image settings) at
start-up, and neither HF's native Kimi-K2.5 processor nor its tokenizer has that attribute. This one
has what SGLang reads at start-up and no image processing: the tiny checkpoints carry no vision tower
and serve text.
"""

import json
import os
from types import SimpleNamespace

from transformers import AutoTokenizer, ProcessorMixin


class TinyKimiK25Processor(ProcessorMixin):
    attributes = ["tokenizer"]
    tokenizer_class = "AutoTokenizer"

    def __init__(self, tokenizer, media_proc_cfg: dict):
        super().__init__(tokenizer)
        self.media_processor = SimpleNamespace(media_proc_cfg=media_proc_cfg)
        self.image_processor = None

    @classmethod
    def from_pretrained(cls, path: str, **kwargs):
        with open(os.path.join(path, "preprocessor_config.json")) as f:
            media_proc_cfg = json.load(f)["media_proc_cfg"]
        return cls(AutoTokenizer.from_pretrained(path), media_proc_cfg)
