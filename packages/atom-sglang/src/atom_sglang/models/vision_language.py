"""SGLang's vision-language classes of the architectures atom-core serves the language model of
(atom_sglang.vision_language)."""

from atom_sglang.vision_language import (
    KimiK25ForConditionalGeneration,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration,
)

EntryClass = [KimiK25ForConditionalGeneration, Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration]
