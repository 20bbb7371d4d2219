"""What every export rewrite needs from a graph: an index of who makes and who reads each value, and the two steps
it ends with (splice the node list in place, prune what nothing reads)."""
from __future__ import annotations

__all__ = ["GraphIndex", "splice_nodes", "prune_dead_nodes", "drop_unread_initializers"]


class GraphIndex:
    """Lookups over a graph as it was when built: the node making each value (`made`), the nodes reading each value
    (`readers`, in node order), the initializers by name (`inits`) and the graph outputs' names (`outputs`). A rewrite
    that edits the graph builds a new index afterwards."""

    def __init__(self, graph, read=None):
        self.graph = graph
        self.read = read  # initializer -> array (LazyWeights.array, for external data); default: inline only
        self.made = {o: n for n in graph.node for o in n.output}
        self.readers = {}
        for n in graph.node:
            for name in n.input:
                self.readers.setdefault(name, []).append(n)
        self.inits = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}

    def const(self, name):
        """The initializer `name` as a numpy array, or None when it is not one."""
        from onnx import numpy_helper

        t = self.inits.get(name)
        if t is None:
            return None
        return self.read(t) if self.read is not None else numpy_helper.to_array(t)

    def n_readers(self, name) -> int:
        return len(self.readers.get(name, ()))

    def only_reader(self, name):
        """The one node reading `name` when exactly one does and it is no graph output, else None."""
        r = self.readers.get(name, [])
        return r[0] if len(r) == 1 and name not in self.outputs else None

    def op(self, name, op_type):
        """The node making `name` when it is an `op_type`, else None."""
        n = self.made.get(name)
        return n if n is not None and n.op_type == op_type else None


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


def drop_unread_initializers(graph) -> None:
    """Drop the initializers no node and no graph output reads. Deleted where they stand: rebuilding the list would
    copy every kept tensor into the message's arena (export/lazy_weights.py), its weights included."""
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for i in reversed(range(len(graph.initializer))):
        if graph.initializer[i].name not in read:
            del graph.initializer[i]
