"""Walking an ONNX graph's nodes: who produces and reads each value, a node's inputs with its
subgraphs' outer reads, topological order. The one leaf of ``export/`` that the graph rewrites,
the precisions, the quantiser and SmoothQuant all read, so none of them imports another for it."""

from __future__ import annotations

from typing import Any


def node_edges(graph: Any) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(value -> the node producing it, value -> the nodes reading it) of an ``onnx.GraphProto``."""
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return producers, consumers


def toposort(graph: Any) -> None:
    """Reorder ``graph.node`` topologically, keeping the existing order wherever it is valid."""
    import heapq

    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    nodes = list(graph.node)
    producer_of: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for out in node.output:
            producer_of[out] = index
    waiting_on: list[set[int]] = []
    dependants: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        needs = {producer_of[i] for i in node_inputs(node) if i not in available and i in producer_of}
        needs.discard(index)
        waiting_on.append(needs)
        for dep in needs:
            dependants.setdefault(dep, []).append(index)
    ready = [i for i, needs in enumerate(waiting_on) if not needs]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for child in dependants.get(index, ()):
            waiting_on[child].discard(index)
            if not waiting_on[child]:
                heapq.heappush(ready, child)
    if len(order) != len(nodes):
        raise RuntimeError("the converted graph has a cycle")
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)


def node_inputs(node: Any) -> list[str]:
    """A node's inputs, including the outer-scope names its subgraphs read."""
    names = list(node.input)
    for attribute in node.attribute:
        for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
            inner = {o for n in sub.node for o in n.output} | {t.name for t in sub.initializer} | {i.name for i in sub.input}
            names.extend(i for n in sub.node for i in node_inputs(n) if i not in inner)
    return names
