"""Split an FX graph at its splitting ops (ATOM's attention), one submodule per piece."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx.passes.split_module import split_module


@dataclass
class SplitItem:
    submod_name: str
    graph_id: int
    is_splitting_graph: bool
    graph: torch.fx.GraphModule


def is_splitting_node(node: torch.fx.Node) -> bool:
    """Calls of ops flagged ``atom_splitting_op`` (layers.splitting_op) become their own piece."""
    if node.op != "call_function":
        return False
    target = node.target
    packet = getattr(target, "_overloadpacket", target)
    return bool(getattr(packet, "atom_splitting_op", False))


def split_graph(graph: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Number the nodes: each splitting op gets an id of its own, the nodes between them share one.
    Returns the split module and its pieces in execution order."""
    subgraph_id = 0
    node_to_subgraph: dict[torch.fx.Node, int] = {}
    splitting_ids = set()
    for node in graph.graph.nodes:
        if node.op in ("output", "placeholder"):
            continue
        if is_splitting_node(node):
            subgraph_id += 1
            node_to_subgraph[node] = subgraph_id
            splitting_ids.add(subgraph_id)
            subgraph_id += 1
        else:
            node_to_subgraph[node] = subgraph_id
    split_gm = split_module(graph, None, lambda node: node_to_subgraph[node], keep_original_order=True)
    items = []
    for name, module in split_gm.named_children():
        graph_id = int(name.replace("submod_", ""))
        items.append(SplitItem(name, graph_id, graph_id in splitting_ids, module))
    items.sort(key=lambda item: item.graph_id)
    return split_gm, items
