"""ATOM's torch.compile backend: split at attention, compile every other piece with Inductor.

Dynamo hands the backend the whole trunk graph with symbolic token counts. The backend splits it
(:func:`split_graph`), then walks the split module once with the fake example inputs to learn each
piece's inputs and compiles each non-attention piece with ``compile_fx``. Attention pieces stay
opaque calls into the host's attention. A host can wrap compiled pieces (vLLM: its piecewise CUDA
graph wrapper) through :func:`set_piece_wrapper`.

Compiled artefacts go to Inductor's FX-graph cache under a directory keyed by ATOM's compile
config, the traced source and the torch version; hits and misses are logged.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch._guards import detect_fake_mode

from atom_core.compile.split import split_graph
from atom_core.log import logger

# (compiled piece, piece index, number of compiled pieces) -> callable the graph will call instead.
PieceWrapper = Callable[[Callable[..., Any], int, int], Callable[..., Any]]
_piece_wrapper: PieceWrapper | None = None


def set_piece_wrapper(wrapper: PieceWrapper | None) -> None:
    global _piece_wrapper
    _piece_wrapper = wrapper


def compile_cache_dir(key_parts: list[str]) -> str:
    digest = hashlib.sha256("\n".join([torch.__version__, *key_parts]).encode()).hexdigest()[:16]
    root = os.environ.get("ATOM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "atom")
    return os.path.join(root, "compile", digest)


def source_digest(path: str) -> str:
    """Traced source that decides the graph: the trunk's module and every atom_core / atom_kernels
    module; editing any must miss the cache."""
    import atom_core
    import atom_kernels

    digest = hashlib.sha256()
    for package in (atom_core, atom_kernels):
        root = pathlib.Path(package.__file__).parent
        for file in sorted(root.rglob("*.py")):
            digest.update(file.read_bytes())
    digest.update(path.encode())
    return digest.hexdigest()[:16]


class _PieceCompiler(torch.fx.Interpreter):
    """Runs the split module on fake inputs, compiling each non-attention piece on the way."""

    def __init__(self, module: torch.fx.GraphModule, compile_names: set[str], fake_mode):
        super().__init__(module)
        self.compile_names = compile_names
        self.fake_mode = fake_mode
        self.compiled: dict[str, Callable[..., Any]] = {}

    def run(self, *args):
        # Dynamo passes parameters as real tensors next to the fake activations.
        fake_args = [self.fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with self.fake_mode:
            return super().run(*fake_args)

    def call_module(self, target, args, kwargs):
        output = super().call_module(target, args, kwargs)
        if target in self.compile_names:
            from torch._inductor.compile_fx import compile_fx

            submodule = self.fetch_attr(target)
            self.compiled[target] = compile_fx(submodule, list(args))
        return output


class ATOMCompileBackend:
    def __init__(self, split: bool, cache_key: list[str]):
        self.split = split
        self.cache_dir = compile_cache_dir(cache_key)

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = self.cache_dir
        hits0 = counters["inductor"]["fxgraph_cache_hit"]
        misses0 = counters["inductor"]["fxgraph_cache_miss"]
        start = time.perf_counter()
        if not self.split:
            compiled = compile_fx(graph, example_inputs)
            self._log(start, hits0, misses0, pieces=1, splits=0)
            return compiled

        split_gm, items = split_graph(graph)
        to_compile = [item.submod_name for item in items if not item.is_splitting_graph]
        compiler = _PieceCompiler(split_gm, set(to_compile), detect_fake_mode(example_inputs))
        compiler.run(*example_inputs)
        for index, name in enumerate(to_compile):
            piece = compiler.compiled[name]
            if _piece_wrapper is not None:
                piece = _piece_wrapper(piece, index, len(to_compile))
            # Instance attributes shadow the submodule, so the split graph calls the compiled piece.
            split_gm.__dict__[name] = piece
        self._log(start, hits0, misses0, pieces=len(to_compile), splits=len(items) - len(to_compile))
        return split_gm

    def _log(self, start: float, hits0: int, misses0: int, pieces: int, splits: int) -> None:
        hits = counters["inductor"]["fxgraph_cache_hit"] - hits0
        misses = counters["inductor"]["fxgraph_cache_miss"] - misses0
        logger.info(
            "torch.compile: %d attention split points, %d compiled pieces in %.2f s "
            "(inductor cache: %d hits, %d misses, dir %s)",
            splits, pieces, time.perf_counter() - start, hits, misses, self.cache_dir,
        )
