"""The opaque ops around which the compile backend splits graphs (ATOM's attention cores), as
``torch.ops.atom.<name>``.

Defined through ``torch.library.Library`` rather than the ``@torch.library.custom_op`` decorator: the
decorator's Python dispatch took 10.4 us a call against 1.6 us (one CPU core, torch 2.11), paid once
a layer in every step that runs outside CUDA graphs, prefills among them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_library = torch.library.Library("atom", "FRAGMENT")


def _no_output(*args, **kwargs) -> None:
    return None


def define_splitting_op(fn: Callable[..., None]):
    """``torch.ops.atom.<fn's name>`` running ``fn``, which writes its result into its ``output``
    argument, flagged ``atom_splitting_op`` for :mod:`atom_core.compile.split`."""
    name = fn.__name__
    _library.define(name + torch.library.infer_schema(fn, mutates_args=["output"]))
    _library.impl(name, fn, "CompositeExplicitAutograd")
    torch.library.register_fake(f"atom::{name}", _no_output, lib=_library)
    packet = getattr(torch.ops.atom, name)
    packet.atom_splitting_op = True
    return packet
