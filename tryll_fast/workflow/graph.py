"""Graph compilation: GraphDescription -> Graph, every rule checked before the agent exists.

Rules (3003 GraphCompilationFailed, the message names the node and the field):
- at least one node; names non-empty and unique; `start_node` names a node;
- every non-empty `<exit>_exit` names a node (the message names source, exit and target);
- each node's params are checked by its node type (models in the catalog, on disk and of
  the llm role; ranges; templates parse; regexes compile; input slots exist);
- node types whose feature this build lacks are 2007 FeatureNotAvailable.
ChangeAgentParam re-runs the node type's check with code 3007 InvalidParamValue, after
refusing a different params type (3007) or a changed structural field (3006).
`fingerprint()` hashes the graph's shape for dialog snapshots (workflow/snapshot.py).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.workflow.variables import Variables

END = ""


@dataclass
class CompileContext:
    """What node checks need to know about the world outside the graph."""
    node_names: frozenset[str]
    default_model: str
    variables: Variables
    # model name, where -> (catalog entry, KV cells its engine will have); raises
    # TryllError (with `code`) when the model cannot serve the node
    resolve_model: Callable[[str, str], tuple[Any, int]]
    code: int = ErrorCode.GraphCompilationFailed
    # a node's string_storage, the kinds it reads, where -> the StringStorage (a session
    # storage by name or a file under the storage root; knowledge/strings.py); raises
    # TryllError naming `where`
    resolve_strings: Callable[[str, tuple, str], Any] | None = None
    # a node's embedded_string_storage, where -> the EmbeddedStorage (a session storage by
    # name or a KB config under the storage root; knowledge/embedded.py)
    resolve_embedded: Callable[[str, str], Any] | None = None
    # where a node's files (LoRA adapters) are found; None = nowhere
    storage_root: Any = None

    def fail(self, where: str, problem: str) -> TryllError:
        return TryllError(self.code, f"{where}: {problem}")

    def strings(self, ref: str, kinds: tuple, where: str):
        if self.resolve_strings is None:
            raise self.fail(where, f"string_storage {ref!r}: no string storages here")
        return self.resolve_strings(ref, kinds, where)

    def embedded(self, ref: str, where: str):
        if not ref:
            raise self.fail(where, "embedded_string_storage is empty: name a storage of the "
                                   "session or a KB config file")
        if self.resolve_embedded is None:
            raise self.fail(where, f"embedded_string_storage {ref!r}: no storages here")
        return self.resolve_embedded(ref, where)


class NodeType:
    """One kind of node: its params table, its exits, its checks and how it runs."""
    kind: str = ""
    params_cls: type = type(None)
    exits: tuple[str, ...] = ("default",)
    uses_model = False
    speaks = False              # sends the agent's voice (needs a VoiceProfile)
    # the feature this build lacks for the node type (2007 at CreateAgent), else None
    missing_feature: str | None = None

    def compile(self, name: str, params, ctx: CompileContext) -> Any:
        """Validate params; return the node's compiled spec (what run() uses)."""
        return None

    async def run(self, turn, node: "Node") -> str:
        """Run once in a turn; return the exit taken."""
        raise NotImplementedError

    def model_names(self, node: "Node", default_model: str) -> tuple[str, ...]:
        """Models this node runs on (for leases)."""
        return ()

    def prefix_args(self, agent, node: "Node", formatter) -> dict[str, Any]:
        """A language-model node: the Projection.build arguments that shape its prompt
        before the turn's input (for the KV lifecycle's cacheable prefix)."""
        raise NotImplementedError


class Node:
    """A node of a compiled graph. `params` and `spec` change together (ChangeAgentParam)."""

    __slots__ = ("name", "type", "params", "spec", "exits")

    def __init__(self, name: str, node_type: NodeType, params, spec, exits: dict[str, str]):
        self.name = name
        self.type = node_type
        self.params = params
        self.spec = spec
        self.exits = exits

    def __repr__(self) -> str:
        return f"<Node {self.name} {self.type.kind}>"


class Graph:
    def __init__(self, nodes: dict[str, Node], start: str) -> None:
        self.nodes = nodes
        self.start = start

    def next(self, node: Node, exit_name: str) -> Node | None:
        target = node.exits[exit_name]
        return self.nodes[target] if target else None


def exit_fields(node_type: NodeType) -> tuple[str, ...]:
    return tuple(f"{e}_exit" for e in node_type.exits)


def compile_graph(graph, ctx: CompileContext, types: Mapping[type, NodeType]) -> Graph:
    fail = ctx.fail
    if graph is None:
        raise fail("graph", "missing: CreateAgentRequest needs a GraphDescription")
    descriptions = list(graph.nodes)
    if not descriptions:
        raise fail("graph.nodes", "the graph has no nodes")
    names: list[str] = []
    for i, d in enumerate(descriptions):
        if not d.name:
            raise fail(f"graph.nodes[{i}].name", "empty: every node needs a unique name")
        if d.name in names:
            raise fail(f"graph.nodes[{i}]", f"node name {d.name!r} is used twice")
        names.append(d.name)
    ctx.node_names = frozenset(names)
    if not graph.start_node:
        raise fail("graph.start_node", "empty: name the node each turn starts at")
    if graph.start_node not in ctx.node_names:
        raise fail("graph.start_node", f"{graph.start_node!r} is not a node of the graph "
                                       f"(nodes: {', '.join(names)})")
    nodes: dict[str, Node] = {}
    for d in descriptions:
        params = d.params
        node_type = types.get(type(params))
        if node_type is None:
            raise fail(f"node {d.name!r}", "params are missing (NodeParams is NONE)")
        if node_type.missing_feature:
            raise TryllError(ErrorCode.FeatureNotAvailable,
                             f"node {d.name!r}: {node_type.kind} nodes need "
                             f"{node_type.missing_feature}, which this server build does "
                             "not include yet")
        exits = {}
        for exit_name in node_type.exits:
            target = getattr(params, f"{exit_name}_exit")
            if target and target not in ctx.node_names:
                raise fail(f"node {d.name!r}",
                           f"exit {exit_name}_exit names {target!r}, which is not a node of "
                           f"the graph")
            exits[exit_name] = target or END
        spec = node_type.compile(d.name, params, ctx)
        nodes[d.name] = Node(d.name, node_type, params, spec, exits)
    return Graph(nodes, graph.start_node)


def check_change(node: Node, params, ctx: CompileContext) -> Any:
    """ChangeAgentParam: the same params type, no structural field changed (3006), then
    the node type's checks with 3007. Returns the new spec."""
    if type(params) is not type(node.params):
        got = "no params" if params is None else type(params).__name__
        raise TryllError(ErrorCode.InvalidParamValue,
                         f"node {node.name!r} is a {node.type.kind} node: params must be "
                         f"{node.type.params_cls.__name__}, got {got}")
    changed = _structural_change(node.params, params, type(params).__name__)
    if changed:
        raise TryllError(ErrorCode.ParamNotMutable,
                         f"node {node.name!r}: {changed} is structural (fixed at "
                         "CreateAgent) and cannot change")
    return node.type.compile(node.name, params, ctx)


def _structural_change(old, new, where: str) -> str | None:
    """The first structural field whose value differs (looking into nested tables, e.g.
    SamplingOverrides.max_tokens inside a mutable `sampling`)."""
    cls = type(new)
    for name in cls.FIELDS:
        a, b = getattr(old, name), getattr(new, name)
        if name in cls.STRUCTURAL:
            if _plain(a) != _plain(b):
                return f"{where}.{name}"
        elif isinstance(a, codec.Table) or isinstance(b, codec.Table):
            sub_cls = type(a if a is not None else b)
            if sub_cls.STRUCTURAL:
                a = a if a is not None else sub_cls()
                b = b if b is not None else sub_cls()
                found = _structural_change(a, b, f"{where}.{name}")
                if found:
                    return found
    return None


def structural_values(params) -> dict:
    """The structural fields of a node's params (nested tables included), as plain values:
    what ChangeAgentParam can never change, so what identifies the graph's shape."""
    out: dict = {}
    if params is None:
        return out
    cls = type(params)
    for name in cls.FIELDS:
        v = getattr(params, name)
        if name in cls.STRUCTURAL:
            out[name] = _plain(v)
        elif isinstance(v, codec.Table) and type(v).STRUCTURAL:
            out[name] = structural_values(v)
    return out


def fingerprint(graph: Graph) -> str:
    """Lowercase hex SHA-256 over the start node and, per node (by name), its kind and
    structural params: stable across ChangeAgentParam, different for another graph."""
    shape = {"start": graph.start,
             "nodes": [[n.name, n.type.kind, structural_values(n.params)]
                       for n in sorted(graph.nodes.values(), key=lambda n: n.name)]}
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _json_default(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    raise TypeError(f"{type(v).__name__} in structural params")


def _plain(v):
    if isinstance(v, codec.Table):
        return v.to_dict()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
