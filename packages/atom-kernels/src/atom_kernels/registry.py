"""Backend registry: one public function per op, several implementations behind it.

Each op is an :class:`Op`. Backends register implementations with ``@OP.register("torch")``.
A call dispatches on the device type of its first tensor argument; the chosen backend per
(op, device type) is cached.

Selection order: per-op env ``ATOM_KERNEL_BACKEND_<OP>`` (e.g. ``ATOM_KERNEL_BACKEND_RMS_NORM``),
then ``ATOM_KERNEL_BACKEND`` for all ops, then the first available of ``aiter``, ``triton``,
``torch``. A backend that was asked for explicitly but cannot run on the device raises
:class:`BackendUnavailableError`; with no request, unavailable backends are skipped.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

BACKENDS = ("aiter", "triton", "torch")


class BackendUnavailableError(RuntimeError):
    pass


@functools.cache
def _is_rocm() -> bool:
    return torch.version.hip is not None


@functools.cache
def _aiter_installed() -> bool:
    return importlib.util.find_spec("aiter") is not None


def backend_available(backend: str, device_type: str) -> bool:
    """Whether ``backend`` can run on tensors of ``device_type`` in this process."""
    if backend == "torch":
        return True
    if backend == "triton":
        # On CPU Triton runs only through its interpreter (tests use this at small shapes).
        return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "aiter":
        return device_type == "cuda" and _is_rocm() and _aiter_installed()
    raise ValueError(f"unknown kernel backend {backend!r}; known: {', '.join(BACKENDS)}")


def _requested_backend(op_name: str) -> str | None:
    value = os.environ.get(f"ATOM_KERNEL_BACKEND_{op_name.upper()}") or os.environ.get(
        "ATOM_KERNEL_BACKEND"
    )
    if value and value not in BACKENDS:
        raise ValueError(f"ATOM_KERNEL_BACKEND={value!r} for op {op_name}: expected one of {BACKENDS}")
    return value or None


class Op:
    """A named op with per-backend implementations and cached per-device selection."""

    def __init__(self, name: str, doc: str = ""):
        self.name = name
        self.__doc__ = doc
        self.impls: dict[str, Callable[..., Any]] = {}
        self._chosen: dict[str, Callable[..., Any]] = {}
        # torch.ops.atom.<name>, set for ops that models call inside torch.compile'd code
        # (see atom_kernels.opaque): Dynamo then sees one opaque node instead of the kernel.
        self.custom_op: Callable[..., Any] | None = None

    def register(self, backend: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if backend not in BACKENDS:
            raise ValueError(f"unknown kernel backend {backend!r}")

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.impls[backend] = fn
            self._chosen.clear()
            return fn

        return decorator

    def select(self, device_type: str) -> str:
        """The backend this op uses for tensors on ``device_type``."""
        requested = _requested_backend(self.name)
        if requested is not None:
            if requested not in self.impls:
                if requested == "aiter" or requested == "triton":
                    # An op without such a kernel falls back to the reference rather than failing
                    # the whole model: the report shows which ops did.
                    return "torch"
                raise BackendUnavailableError(f"op {self.name} has no {requested} backend")
            if not backend_available(requested, device_type):
                raise BackendUnavailableError(
                    f"kernel backend {requested!r} requested for op {self.name} "
                    f"(ATOM_KERNEL_BACKEND) is not available on device type {device_type!r}"
                )
            return requested
        for backend in BACKENDS:
            if backend in self.impls and backend_available(backend, device_type):
                return backend
        raise BackendUnavailableError(f"op {self.name} has no backend for {device_type!r}")

    def impl(self, backend: str) -> Callable[..., Any]:
        """The implementation of one backend, for tests and benchmarks."""
        return self.impls[backend]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.custom_op is not None and torch.compiler.is_compiling():
            return self.custom_op(*args, **kwargs)
        return self.dispatch(*args, **kwargs)

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        """Run the selected backend (eager)."""
        device_type = _first_tensor_device_type(args, kwargs)
        fn = self._chosen.get(device_type)
        if fn is None:
            fn = self.impls[self.select(device_type)]
            self._chosen[device_type] = fn
        return fn(*args, **kwargs)


def _first_tensor_device_type(args: tuple, kwargs: dict) -> str:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


OPS: dict[str, Op] = {}


def define_op(name: str, doc: str = "") -> Op:
    if name in OPS:
        raise ValueError(f"op {name} defined twice")
    OPS[name] = op = Op(name, doc)
    return op


def reset_selection() -> None:
    """Forget cached choices (after changing ATOM_KERNEL_BACKEND* in-process)."""
    for op in OPS.values():
        op._chosen.clear()


def backend_report(device_type: str | None = None) -> dict[str, str]:
    """Which backend each op uses on ``device_type`` (default: cuda if present, else cpu)."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return {name: op.select(device_type) for name, op in sorted(OPS.items())}


def backend_report_line(device_type: str | None = None) -> str:
    report = backend_report(device_type)
    return "atom kernels: " + ", ".join(f"{op}={backend}" for op, backend in report.items())
