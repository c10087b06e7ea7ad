"""One SGLang model class per architecture atom-core implements (``SUPPORTED_ARCHITECTURES``)."""

from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_sglang.model_wrapper import entry_class

EntryClass = [entry_class(architecture) for architecture in SUPPORTED_ARCHITECTURES]
