"""Editing a graph's node list in place: the two steps every export rewrite ends with."""
from __future__ import annotations

__all__ = ["splice_nodes", "prune_dead_nodes"]


def splice_nodes(graph, replace: dict, drop: set) -> None:
    """Rebuild graph.node in order: a node whose id() is in `replace` gives way to that list of new nodes (at its
    place, so what it read exists there), a node whose id() is in `drop` goes, the rest stay."""
    nodes = []
    for n in graph.node:
        if id(n) in replace:
            nodes.extend(replace[id(n)])
        elif id(n) not in drop:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)


def prune_dead_nodes(graph) -> None:
    """Drop nodes no node and no graph output reads, until none is left."""
    while True:
        read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        keep = [n for n in graph.node if any(o in read for o in n.output if o)]
        if len(keep) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(keep)
