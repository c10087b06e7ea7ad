"""The opaque ops around which the compile backend splits graphs (ATOM's attention cores), as
``torch.ops.atom.<name>`` (defined as atom_kernels.opaque defines the kernel ops)."""

from __future__ import annotations

from collections.abc import Callable

from atom_kernels.opaque import define_custom_op


def _no_output(*args, **kwargs) -> None:
    return None


def define_splitting_op(fn: Callable[..., None]):
    """``torch.ops.atom.<fn's name>`` running ``fn``, which writes its result into its ``output``
    argument, flagged ``atom_splitting_op`` for :mod:`atom_core.compile.split`."""
    packet = define_custom_op(fn.__name__, fn, fn, _no_output, mutates_args=["output"])
    packet.atom_splitting_op = True
    return packet
