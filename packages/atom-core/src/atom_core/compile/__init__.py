"""ATOM-owned torch.compile: Dynamo traces the model trunk, ATOM's backend splits the graph at
attention and compiles each piece with Inductor. The host engine keeps CUDA graphs (it may wrap the
pieces, see :func:`set_piece_wrapper`)."""

from atom_core.compile.backend import ATOMCompileBackend, set_piece_wrapper
from atom_core.compile.decorator import support_torch_compile
from atom_core.compile.split import SplitItem, split_graph

__all__ = ["ATOMCompileBackend", "SplitItem", "set_piece_wrapper", "split_graph", "support_torch_compile"]
