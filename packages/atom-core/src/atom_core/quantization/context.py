"""Which quantization the layers under construction get: a model sets it around building its
trunk (:func:`quantized_layers`), and each layer asks for its own scheme by name
(:func:`layer_scheme`). Outside that block (tests building single layers, the LM head, routers)
layers are unquantized."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from atom_core.quantization.scheme import Fp8Scheme, Mxfp4Scheme, QuantConfig

CheckpointModules = Callable[[str], Sequence[str]]
_active: tuple[QuantConfig, CheckpointModules | None] | None = None


@contextlib.contextmanager
def quantized_layers(config: QuantConfig | None,
                     checkpoint_modules: CheckpointModules | None = None) -> Iterator[None]:
    """Layers built inside get ``config``'s scheme (None: unquantized). ``checkpoint_modules``: the
    checkpoint's names of the modules an ATOM layer holds (atom_core.loader.WeightMap), which the
    config's unquantized-module list names."""
    global _active
    previous, _active = _active, (None if config is None else (config, checkpoint_modules))
    try:
        yield
    finally:
        _active = previous


def layer_scheme(prefix: str, experts: bool = False) -> Fp8Scheme | Mxfp4Scheme | None:
    """The scheme of the layer named ``prefix`` being built now (None: unquantized); ``experts``:
    the layer is a fused MoE experts layer, the only kind an MXFP4 config quantizes."""
    if _active is None:
        return None
    config, checkpoint_modules = _active
    return config.scheme_for(prefix, checkpoint_modules, experts)
