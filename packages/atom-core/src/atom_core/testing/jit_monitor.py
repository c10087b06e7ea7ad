"""Which ATOM Triton kernels compiled while a host served: the check of the hosts' GPU warm-up tests.

vLLM's kernel JIT monitor (``jit_monitor_mode``) hooks Triton's ``jit_post_compile_hook`` once its
warm-up is over and logs one line per compile (:data:`JIT_LINE`). SGLang has no such monitor:
:func:`log_triton_compiles` installs the same hook, logging the same line, from the start of a
process; a test then reads the lines its engine logged after it was ready.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from atom_core.log import logger

JIT_LINE = re.compile(r"Triton kernel JIT compilation during inference: (\w+)")


def atom_triton_kernels() -> set[str]:
    """Every @triton.jit kernel of every atom_kernels module (a new module is picked up too)."""
    import triton

    import atom_kernels

    modules = [importlib.import_module(f"atom_kernels.{info.name}")
               for info in pkgutil.iter_modules(atom_kernels.__path__)]
    return {obj.fn.__name__ for module in modules
            for obj in vars(module).values() if isinstance(obj, triton.runtime.jit.JITFunction)}


def atom_kernels_compiled(log: str) -> set[str]:
    """The ATOM kernels among the compiles that ``log`` reports in :data:`JIT_LINE`'s form."""
    return set(JIT_LINE.findall(log)) & atom_triton_kernels()


def log_triton_compiles() -> None:
    """From now on, log every Triton compile of this process in :data:`JIT_LINE`'s form."""
    import triton

    def log_compile(*, fn, **_) -> None:
        logger.warning("Triton kernel JIT compilation during inference: %s", fn.name)

    triton.knobs.runtime.jit_post_compile_hook = log_compile
