"""Backend registry: one public function per op, several implementations behind it.

An op is defined once, by a typed stub whose signature and docstring are the op's public API::

    @define_op
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        '''RMSNorm over the last dim.'''

Backends register implementations with ``@rms_norm.register("triton")``; an implementation whose
parameters differ from the stub's (names, order, kinds, defaults) is an error at import time. The
torch custom op of :mod:`atom_kernels.opaque` is derived from the same stub.

A call dispatches on the device type of its first tensor argument; the chosen backend per
(op, device type) is cached. Selection:

1. ``ATOM_KERNEL_BACKEND_<OP>`` (e.g. ``ATOM_KERNEL_BACKEND_RMS_NORM``) forces one backend for one
   op; an op without that backend raises :class:`BackendUnavailableError`.
2. ``ATOM_KERNEL_BACKEND`` forces one backend for every op that has it; an op without it keeps its
   default selection (rule 3), and :func:`backend_report_line` says which ops did.
3. Otherwise the first available of ``aiter``, ``torchlib``, ``triton``, ``torch``.

``torchlib`` is a kernel the installed torch ships (``torch._scaled_mm``: cuBLASLt / CUTLASS) where
it measured faster than our Triton kernel; such an implementation hands the shapes where it did not
to the Triton one, so its op's report names ``torchlib``.

A forced backend that the op has but that cannot run on the device (``aiter`` off ROCm, ``triton``
on CPU without the interpreter) raises :class:`BackendUnavailableError`.

Under torch.compile a model's call of an op becomes the opaque custom op of :mod:`atom_kernels.opaque`,
which runs the selected backend; the ops of ``ATOM_INDUCTOR_OPS`` are traced instead (by default the
norm, rope, activation and quantization ops whose backend is Triton: Inductor launches ATOM's kernels
itself; :func:`set_inductor_ops`).

``Op.calls`` counts the calls an op dispatched, eagerly or from a compiled graph run without CUDA
graphs (a replayed CUDA graph runs the kernels without Python): tests use it to check which ops a
model path takes.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch

BACKENDS = ("aiter", "torchlib", "triton", "torch")


class BackendUnavailableError(RuntimeError):
    pass


@functools.cache
def _is_rocm() -> bool:
    return torch.version.hip is not None


@functools.cache
def _aiter_installed() -> bool:
    return importlib.util.find_spec("aiter") is not None


@functools.cache
def _hopper_or_newer() -> bool:
    """torch._scaled_mm's block-wise FP8 recipes run on sm90 and newer."""
    return torch.cuda.get_device_capability() >= (9, 0)


def backend_available(backend: str, device_type: str) -> bool:
    """Whether ``backend`` can run on tensors of ``device_type`` in this process."""
    if backend == "torch":
        return True
    if backend == "triton":
        # On CPU Triton runs only through its interpreter (tests use this at small shapes).
        return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "aiter":
        return device_type == "cuda" and _is_rocm() and _aiter_installed()
    if backend == "torchlib":
        return device_type == "cuda" and not _is_rocm() and _hopper_or_newer()
    raise ValueError(f"unknown kernel backend {backend!r}; known: {', '.join(BACKENDS)}")


def _env_backend(variable: str) -> str | None:
    value = os.environ.get(variable) or None
    if value is not None and value not in BACKENDS:
        raise ValueError(f"{variable}={value!r}: expected one of {BACKENDS}")
    return value


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter: what an implementation must share with its stub."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


class Op:
    """A named op: the stub's signature and docstring, per-backend implementations, cached selection."""

    def __init__(self, stub: Callable[..., Any]):
        self.name = stub.__name__
        self.stub = stub
        self.__doc__ = stub.__doc__
        self.__signature__ = inspect.signature(stub)
        self.impls: dict[str, Callable[..., Any]] = {}
        self._chosen: dict[str, Callable[..., Any]] = {}
        self.calls = 0
        # torch.ops.atom.<name>, set for ops that models call inside torch.compile'd code
        # (see atom_kernels.opaque): Dynamo then sees one opaque node instead of the kernel.
        self.custom_op: Callable[..., Any] | None = None
        # The backend whose implementation torch.compile traces (set_inductor_ops); None: opaque.
        self.traced_backend: str | None = None

    def register(self, backend: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if backend not in BACKENDS:
            raise ValueError(f"unknown kernel backend {backend!r}")

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            expected, got = _parameters(self.stub), _parameters(fn)
            if got != expected:
                raise TypeError(
                    f"op {self.name}: the {backend} implementation {fn.__qualname__}"
                    f"{inspect.signature(fn)} does not match the op's signature "
                    f"{self.name}{self.__signature__}"
                )
            self.impls[backend] = fn
            self._chosen.clear()
            return fn

        return decorator

    def requested(self) -> tuple[str | None, str | None]:
        """(backend, the variable that asked for it), or (None, None) when nothing forces one."""
        for variable in (f"ATOM_KERNEL_BACKEND_{self.name.upper()}", "ATOM_KERNEL_BACKEND"):
            backend = _env_backend(variable)
            if backend is not None:
                return backend, variable
        return None, None

    def select(self, device_type: str) -> str:
        """The backend this op uses for tensors on ``device_type`` (the rules of the module doc)."""
        requested, variable = self.requested()
        if variable == "ATOM_KERNEL_BACKEND" and requested not in self.impls:
            requested = None  # rule 2: the global request skips ops without that backend
        if requested is not None:
            if requested not in self.impls:
                raise BackendUnavailableError(f"op {self.name} has no {requested} backend ({variable})")
            if not backend_available(requested, device_type):
                raise BackendUnavailableError(
                    f"kernel backend {requested!r} requested for op {self.name} ({variable}) "
                    f"is not available on device type {device_type!r}"
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
        if torch.compiler.is_compiling():
            if _traces_on(self.name, _first_tensor_device_type(args, kwargs)):
                return self.impls[self.traced_backend](*args, **kwargs)
            if self.custom_op is not None:
                return self.custom_op(*args, **kwargs)
        return self.dispatch(*args, **kwargs)

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        """Run the selected backend (eager)."""
        # Not while Dynamo traces an op it inlines (one without a custom op): a Python counter bumped
        # in traced code is a guard that fails on every call, recompiling each time.
        if not torch.compiler.is_compiling():
            self.calls += 1
        device_type = _first_tensor_device_type(args, kwargs)
        fn = self._chosen.get(device_type)
        if fn is None:
            fn = self.impls[self.select(device_type)]
            self._chosen[device_type] = fn
        return fn(*args, **kwargs)


@torch.compiler.assume_constant_result
def _traces_on(op_name: str, device_type: str) -> bool:
    """Whether the op is traced on ``device_type``, checked as plain Python while Dynamo traces. A
    ``triton`` entry is traced where Triton is the op's backend (not where ATOM_KERNEL_BACKEND* or
    AITER chose another) and Dynamo traces Triton launches: on GPUs, not on CPU (the interpreter)."""
    op = OPS[op_name]
    if op.traced_backend in (None, "torch"):
        return op.traced_backend == "torch"
    return device_type != "cpu" and op.select(device_type) == op.traced_backend


def _first_tensor_device_type(args: tuple, kwargs: dict) -> str:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


OPS: dict[str, Op] = {}


def define_op(stub: Callable[..., Any]) -> Op:
    """Define the op named after ``stub``, with its signature and docstring."""
    if stub.__name__ in OPS:
        raise ValueError(f"op {stub.__name__} defined twice")
    OPS[stub.__name__] = op = Op(stub)
    return op


def reset_selection() -> None:
    """Forget cached choices (after changing ATOM_KERNEL_BACKEND* in-process)."""
    for op in OPS.values():
        op._chosen.clear()


INDUCTOR_OPS_VARIABLE = "ATOM_INDUCTOR_OPS"
# Traced unless ATOM_INDUCTOR_OPS says otherwise (``none``: every op opaque): ops made of allocations
# and one Triton launch. A 1024-token Qwen3-8B-FP8 prefill step took 21 ms instead of 43 on an H200,
# decode steps level (docs/performance.md, "Where a lone FP8 prefill goes"); with the rope and routing
# ops too, Moonlight's took 25 ms instead of 53, greedy tokens unchanged ("Traced rope and routing").
DEFAULT_TRACED_OPS = ("rms_norm", "fused_add_rms_norm", "qk_norm_rope", "silu_and_mul", "rms_norm_quant_fp8",
                      "fused_add_rms_norm_quant_fp8", "silu_and_mul_quant_fp8", "per_group_quant_fp8",
                      "rotary_embedding", "topk_softmax", "grouped_topk")
DEFAULT_INDUCTOR_OPS = ",".join(f"{name}:triton" for name in DEFAULT_TRACED_OPS)
# Implementations made of torch ops and Triton launches only, which Dynamo traces; the others (AITER's,
# the library GEMM's row-count branches) stay behind the opaque op.
TRACEABLE_BACKENDS = ("torch", "triton")


def set_inductor_ops(entries: str | None = None) -> dict[str, str]:
    """Mark the ops torch.compile traces instead of calling them opaquely: ``entries`` (``name`` or
    ``name:backend``, comma-separated; ``none``), by default ``ATOM_INDUCTOR_OPS`` or, unset,
    :data:`DEFAULT_INDUCTOR_OPS`; returns {name: backend}.
    Why: an opaque op costs the host a dispatch, a Python wrapper and Triton's launch per call (tens of
    microseconds), which counts in steps without CUDA graphs (a long prefill). ``name`` traces the
    torch implementation (Inductor's kernels); ``name:triton`` the Triton one (its allocations join
    the graph, Inductor launches ATOM's kernels; GPUs only). Compiled graphs keep what they traced."""
    if entries is None:
        entries = os.environ.get(INDUCTOR_OPS_VARIABLE, DEFAULT_INDUCTOR_OPS)
    chosen = {}
    if entries.strip() == "none":
        entries = ""
    for entry in filter(None, entries.split(",")):
        name, _, backend = entry.partition(":")
        backend = backend or "torch"
        if name not in OPS or backend not in TRACEABLE_BACKENDS or backend not in OPS[name].impls:
            traceable = sorted(f"{n}:{b}" for n, op in OPS.items() for b in TRACEABLE_BACKENDS if b in op.impls)
            raise ValueError(f"{INDUCTOR_OPS_VARIABLE}: {entry!r} is not one of {', '.join(traceable)}")
        chosen[name] = backend
    for name, op in OPS.items():
        op.traced_backend = chosen.get(name)
    return chosen


def backend_report(device_type: str | None = None) -> dict[str, str]:
    """Which backend each op uses on ``device_type`` (default: cuda if present, else cpu)."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return {name: op.select(device_type) for name, op in sorted(OPS.items())}


def backend_report_line(device_type: str | None = None) -> str:
    """One log line of :func:`backend_report`; an op that ``ATOM_KERNEL_BACKEND`` could not force
    (it has no such backend) is marked ``(no <backend>)``; then the ops torch.compile traces there."""
    entries, traced = [], []
    for name, backend in backend_report(device_type).items():
        requested, _ = OPS[name].requested()
        missing = requested is not None and requested not in OPS[name].impls
        entries.append(f"{name}={backend}" + (f" (no {requested})" if missing else ""))
        if _traces_on(name, device_type or ("cuda" if torch.cuda.is_available() else "cpu")):
            traced.append(f"{name}:{OPS[name].traced_backend}")
    return "atom kernels: " + ", ".join(entries) + (f"; traced by torch.compile: {', '.join(traced)}" if traced else "")
