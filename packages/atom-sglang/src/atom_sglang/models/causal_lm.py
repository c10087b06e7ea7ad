"""One SGLang model class per text architecture atom-core implements (``SUPPORTED_ARCHITECTURES``);
vision-language ones are in :mod:`atom_sglang.models.vision_language`."""

from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_sglang.model_wrapper import entry_class

EntryClass = [entry_class(architecture) for architecture, entry in SUPPORTED_ARCHITECTURES.items()
              if not entry.vision_language]
