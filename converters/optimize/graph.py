"""The graph view rules read and the change they return: :class:`View`, :class:`Match`, :class:`Change`,
:class:`Rule`, and applying a change to a model.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.lowering import ops

# the op table's elementwise classes (converters/lowering/ops.py)
_UNARY_ELEMENTWISE = ops.UNARY_ELEMENTWISE
_BINARY_ELEMENTWISE = ops.BINARY_ELEMENTWISE




class View:
    """Facts about one model that rules read: producers, consumers, constants, observed values.

    ``values`` are every tensor's value on the verification inputs (from the last onnxruntime run), so
    ``shape(name)`` and ``dtype(name)`` are exact for the inputs the rewrite is verified on."""

    def __init__(self, model: onnx.ModelProto, values: Mapping[str, np.ndarray]):
        self.model = model
        g = model.graph
        self.nodes = {n.name: n for n in g.node}
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.inits = {t.name: t for t in g.initializer}
        self.graph_outputs = {o.name for o in g.output}
        self.graph_inputs = {i.name for i in g.input if i.name not in self.inits}
        self.values = values
        self._names = set(self.producer) | set(self.inits) | set(self.nodes) | self.graph_inputs
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self._declared: dict[str, tuple[int | None, ...]] | None = None

    def const(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor (initializer or ``Constant`` node output), else None."""
        if not name:
            return None
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        n = self.producer.get(name)
        if n is not None and n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
        return None

    def shape(self, name: str) -> tuple[int, ...] | None:
        v = self.values.get(name)
        if v is not None:
            return tuple(v.shape)
        c = self.const(name)
        return None if c is None else tuple(c.shape)

    def declared(self, name: str) -> tuple[int | None, ...] | None:
        """The shape the model itself declares (symbolic inference on its own input shapes): None
        for a dimension that varies with the inputs. Rewrites that bake a size in need it static,
        not just the size seen on the verification inputs."""
        if self._declared is None:
            self._declared = {}
            try:
                inf = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
            except Exception:  # inference gave up: nothing is known to be static
                inf = None
            if inf is not None:
                for vi in list(inf.graph.value_info) + list(inf.graph.input) + list(inf.graph.output):
                    t = vi.type.tensor_type
                    if t.HasField("shape"):
                        self._declared[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                                        for d in t.shape.dim)
        c = self.const(name)
        if c is not None:
            return tuple(c.shape)
        return self._declared.get(name)

    def dtype(self, name: str) -> np.dtype | None:
        v = self.values.get(name)
        if v is None:
            v = self.const(name)
        return None if v is None else v.dtype

    def only_consumer(self, name: str) -> onnx.NodeProto | None:
        c = self.consumers.get(name, [])
        if len(c) == 1 and name not in self.graph_outputs:
            return c[0]
        return None

    def fresh(self, base: str) -> str:
        k, name = 0, base
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def init(self, base: str, value: np.ndarray) -> tuple[str, TensorProto]:
        name = self.fresh(base)
        return name, numpy_helper.from_array(np.asarray(value), name)


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def regions(v: "View", members: set[str], starts: Callable[[onnx.NodeProto], bool],
            neighbours: Callable[[onnx.NodeProto], Sequence[str]]) -> list[tuple[str, ...]]:
    """The connected groups of ``members``: each grown from a member that ``starts`` accepts, through
    the node names ``neighbours(node)`` gives (only members join); each group in graph order, groups in
    the order of their first node."""
    seen: set[str] = set()
    out = []
    for n in v.model.graph.node:
        if n.name not in members or n.name in seen or not starts(n):
            continue
        group, stack = set(), [n.name]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            group.add(name)
            stack.extend(m for m in neighbours(v.nodes[name]) if m in members and m not in seen)
        out.append(tuple(x.name for x in v.model.graph.node if x.name in group))
    return out


@dataclasses.dataclass
class Change:
    """What one application does: nodes removed, nodes and initializers added, and uses rerouted
    (``reroute[old] = new``: readers of ``old`` read ``new``; a graph output keeps its name)."""

    remove: set[str] = dataclasses.field(default_factory=set)
    add: list[onnx.NodeProto] = dataclasses.field(default_factory=list)
    inits: list[TensorProto] = dataclasses.field(default_factory=list)
    reroute: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Match:
    """One place a rule's pattern matched: ``key`` identifies it, ``nodes`` are the node names involved."""

    key: str
    nodes: tuple[str, ...]
    data: Any = None


@dataclasses.dataclass(frozen=True)
class Rule:
    """A rewrite: ``find(view) -> [Match]`` (pattern), ``check(view, match) -> reason | None``,
    ``rewrite(view, match) -> Change``. ``default``: on without ``--rules`` (off rules are the
    reference's "off by default" ones)."""

    name: str
    summary: str
    find: Callable[[View], list[Match]]
    check: Callable[[View, Match], str | None]
    rewrite: Callable[[View, Match], Change]
    default: bool = True


def merge_changes(changes: Sequence[Change]) -> Change:
    """One change doing what ``changes`` (on disjoint nodes) do; reroute chains are resolved."""
    out = Change()
    for c in changes:
        out.remove |= c.remove
        out.add += c.add
        out.inits += c.inits
        out.reroute.update(c.reroute)
    for old in list(out.reroute):
        new, seen = out.reroute[old], {old}
        while new in out.reroute and new not in seen:
            seen.add(new)
            new = out.reroute[new]
        out.reroute[old] = new
    return out


def apply_change(model: onnx.ModelProto, change: Change) -> onnx.ModelProto:
    """A new model with ``change`` applied, nodes in topological order, unused initializers dropped."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    kept = [n for n in g.node if n.name not in change.remove] + list(change.add)
    outs = {o.name for o in g.output}
    extra = []
    for old, new in change.reroute.items():
        for n in kept:
            for k, i in enumerate(n.input):
                if i == old:
                    n.input[k] = new
        if old in outs:
            extra.append(helper.make_node("Identity", [new], [old], name=f"{old}__keep_output"))
    kept += extra
    del g.node[:]
    g.node.extend(_toposort(kept, {i.name for i in g.input} | {t.name for t in g.initializer}
                            | {t.name for t in change.inits}))
    g.initializer.extend(change.inits)
    used = {i for n in g.node for i in n.input} | outs
    keep_inits = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep_inits)
    del g.value_info[:]
    return m


def _toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Stable topological order; a node with subgraphs (If, Loop, Scan) also waits for the outer
    names its bodies read."""
    produced = {o for n in nodes for o in n.output}
    have = set(available) | {""}
    needs = {id(n): [i for i in n.input] + sorted(_outer_names(n) & produced) for n in nodes}
    pending = list(nodes)
    order: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for n in pending:
            if all(i in have for i in needs[id(n)]):
                order.append(n)
                have.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            order.extend(rest)  # a cycle or an unknown name: the checker reports it
            break
        pending = rest
    return order


def _outer_names(n: onnx.NodeProto) -> set[str]:
    names: set[str] = set()
    for a in n.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            inner = {o for m in g.node for o in m.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
            for m in g.node:
                names |= {i for i in m.input if i and i not in inner}
                names |= _outer_names(m) - inner
    return names


def _np_to_onnx(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _onnx_to_np(t: int) -> np.dtype:
    return helper.tensor_dtype_to_np_dtype(t)


def _conv_is_1d(v: View, n: onnx.NodeProto) -> bool:
    w = v.shape(n.input[1]) if len(n.input) > 1 else None
    return n.op_type == "Conv" and w is not None and len(w) == 3
