"""One SGLang model class per architecture atom-core implements (``SUPPORTED_ARCHITECTURES``), but
vision-language ones: SGLang keeps its own classes for those (its multimodal processors are
registered against them), as this glue serves no language model inside SGLang's VLMs yet."""

from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_sglang.model_wrapper import entry_class

EntryClass = [entry_class(architecture) for architecture, entry in SUPPORTED_ARCHITECTURES.items()
              if not entry.vision_language]
