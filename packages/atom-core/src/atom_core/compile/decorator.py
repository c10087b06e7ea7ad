"""``@support_torch_compile``: compile a model trunk with ATOM's backend at the configured level.

Levels (``Config.compilation_config.level``, numbered as vLLM's compilation mode): 0 eager; 1 and 2
one Inductor graph for the trunk; 3 piecewise: split at every attention layer, each piece compiled by
Inductor (the host may CUDA-graph the pieces). The token dimension of ``input_ids``, ``positions``
(its last: M-RoPE's are [3, T]) and ``inputs_embeds`` is dynamic: one compile serves every batch size
(Dynamo specialises size 1, so one-token decode batches compile once more).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from atom_core.compile.backend import ATOMCompileBackend, source_digest
from atom_core.config import CompilationLevel, Config, get_current_atom_config
from atom_core.log import logger
from atom_kernels.registry import OPS, set_inductor_ops

# Each argument's token dimension.
DYNAMIC_ARGS = {"input_ids": 0, "positions": -1, "inputs_embeds": 0}


def _compile_level(args: tuple, kwargs: dict) -> CompilationLevel:
    """The level of the Config the trunk is built with (else the process's current Config)."""
    config = next((a for a in (*args, *kwargs.values()) if isinstance(a, Config)), None)
    if config is None:
        try:
            config = get_current_atom_config()
        except RuntimeError:  # standalone use without a Config: eager
            return CompilationLevel.NO_COMPILATION
    return config.compilation_config.level


def support_torch_compile(cls: type[torch.nn.Module]) -> type[torch.nn.Module]:
    eager_forward = cls.forward
    original_init = cls.__init__
    parameters = list(inspect.signature(eager_forward).parameters)[1:]
    source_file = inspect.getsourcefile(cls) or cls.__name__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self._atom_compile_level = _compile_level(args, kwargs)
        self._atom_compiled = None

    def forward(self, *args: Any, **kwargs: Any):
        level = self._atom_compile_level
        if level == CompilationLevel.NO_COMPILATION or torch.compiler.is_compiling():
            return eager_forward(self, *args, **kwargs)
        if self._atom_compiled is None:
            bound = dict(zip(parameters, args)) | kwargs
            for name, dim in DYNAMIC_ARGS.items():
                value = bound.get(name)
                if isinstance(value, torch.Tensor):
                    torch._dynamo.mark_dynamic(value, dim % value.dim())
            # Each model instance is a new guard target for the shared forward code: a process building
            # several models (tests, multi-model hosts) needs more than Dynamo's 8.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            backend = ATOMCompileBackend(split=level == CompilationLevel.PIECEWISE,
                                         cache_key=[cls.__qualname__, str(int(level)), source_digest(source_file)])
            self._atom_compiled = torch.compile(eager_forward.__get__(self), backend=backend, fullgraph=True)
        return _run_compiled(self._atom_compiled, args, kwargs)

    cls.__init__ = __init__
    cls.forward = forward
    return cls


def _run_compiled(compiled, args: tuple, kwargs: dict):
    """Should torch.compile fail while ATOM's ops are traced (ATOM_INDUCTOR_OPS), they turn opaque, with a
    warning, and the call compiles again: a call pattern the tests did not meet must not stop a server."""
    try:
        return compiled(*args, **kwargs)
    except torch._dynamo.exc.TorchDynamoException as error:
        traced = sorted(f"{name}:{op.traced_backend}" for name, op in OPS.items() if op.traced_backend)
        if not traced:
            raise
        logger.warning("torch.compile failed with ATOM's ops %s traced (%s): they run as opaque ops now",
                       ", ".join(traced), str(error).strip().splitlines()[0])
        set_inductor_ops("none")
        return compiled(*args, **kwargs)
