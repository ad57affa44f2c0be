"""``optimize``: Ascend graph rewrites, each one verified on onnxruntime and measured by the planner.

Before ATC, Ascend users rewrite their ONNX models so the device runs them well (the retired msit
surgeon's knowledge base, ``shared/reference/ascend-rewrites.md``). Each rewrite here is a :class:`Rule`
in one registry, :data:`RULES`: a *pattern* (``find``: the places it could apply), a *check* (the reason
it does not apply there, or ``None``; shown by ``--explain``) and a *rewrite* (the :class:`Change` it
makes). :func:`optimize` applies them one application at a time and, for every application:

All the places one rule matches (on disjoint nodes) are first tried together as one step; when that
step fails a check, or ``keep_if_faster`` finds it not faster, they are retried one at a time, so the
application at fault is the one rolled back. For every step:

1. builds the rewritten model and runs ``onnx.checker`` and strict shape inference on it;
2. runs it on onnxruntime on the same inputs as the original and compares every output with the
   original's within tolerances: a rewrite that changes the numbers is rolled back and reported;
3. plans it with the built-in lowering (``pipeline.lower(..., until="plan from ONNX")``) and records
   planned TransData, AI CPU ops and estimated time before and after; with ``keep_if_faster`` an
   application the cost model says does not pay off is rolled back too ("not faster");
4. with ``keep_if_faster`` and a ``device_timer`` (``optimize --measure atc``:
   :class:`npu_deploy.runtime.device_time.AtcAclTimer`), a step the cost model accepts is also
   compiled by ATC and timed on the device through ACL, before and after (median compute time of
   N runs after a warm-up; each model compiled and timed once): it is kept only when the device
   time drops by more than :data:`NOISE_MARGIN_PCT` (2 %), else it is "not faster" even though the
   cost model liked it. Both times are in the step's ``device`` record and the result's
   ``measured_by`` says what judged. This path is measured with ATC + ACL: verified against
   stand-ins only (the ATC and pyACL stand-ins of ``tests/standins``; no real Ascend device has run
   it yet).

Rewrites keep the model's dynamic dimensions: sizes seen only on the verification inputs are never
baked in (a rule that needs a static size checks the model's own declared shapes, :meth:`View.declared`).

>>> import numpy as np, onnx
>>> from onnx import helper, TensorProto, numpy_helper
>>> g = helper.make_graph(
...     [helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT),
...      helper.make_node("Relu", ["a"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
>>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
>>> res, out = optimize_model(m, rules=["merge-casts"])
>>> [n.op_type for n in out.graph.node], res.applied_count()
(['Relu'], 1)
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping, Protocol, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npu_deploy import _io
from npu_deploy._result import Result
from npu_deploy.converters.files import feeds as feeds_mod
from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.options import DEFAULT_SOC, ConvertOptions
from npu_deploy.errors import AtcError, InputError, InternalError, ModelError, NpuDeployError

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
MAX_APPLICATIONS_PER_RULE = 64
LARGE_KERNEL = 192          # the reference: kernel dims above ~192 exceed the cube's tiling
AVGPOOL_LIMIT = 255         # the ISA limit on kernel h*w
# A step timed on the device must gain more than this share of compute time to count as faster:
# medians of repeated runs still differ between two loads of a model (launch jitter, clock states).
# 2 % is an assumption, not a figure measured on a device here.
NOISE_MARGIN_PCT = 2.0
COST_MODEL = "built-in planner and cost model"

_UNARY_ELEMENTWISE = {"Relu", "Sigmoid", "Tanh", "Sqrt", "Abs", "Exp", "Neg", "LeakyRelu", "HardSigmoid",
                      "Elu", "Softplus", "Erf", "Log", "Reciprocal", "HardSwish", "Identity", "Selu",
                      "Floor", "Ceil", "Round", "Sign", "Sin", "Cos"}
_BINARY_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}


# ------------------------------------------------------------------------------------------ graph view
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


# ------------------------------------------------------------------------------------------ helpers
def _np_to_onnx(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _onnx_to_np(t: int) -> np.dtype:
    return helper.tensor_dtype_to_np_dtype(t)


def _conv_is_1d(v: View, n: onnx.NodeProto) -> bool:
    w = v.shape(n.input[1]) if len(n.input) > 1 else None
    return n.op_type == "Conv" and w is not None and len(w) == 3


# ------------------------------------------------------------------------------------------ rule: conv1d-to-conv2d
_REGION_OPS = _UNARY_ELEMENTWISE | _BINARY_ELEMENTWISE | {"Conv", "Slice", "BatchNormalization", "Clip"}


def _region_member(v: View, n: onnx.NodeProto) -> bool:
    if n.op_type == "Conv":
        return _conv_is_1d(v, n)
    if n.op_type not in _REGION_OPS or len(n.output) != 1:
        return False
    out = v.shape(n.output[0])
    if out is None or len(out) != 3:
        return False
    if n.op_type == "Slice":
        return all(v.const(i) is not None for i in n.input[1:] if i) and len(n.input) >= 4
    if n.op_type in _BINARY_ELEMENTWISE:
        # the other operand must broadcast the same way once both are 4-D: a full 3-D tensor of
        # the region or a scalar / single-element constant
        for i in n.input:
            s = v.shape(i)
            if s is None:
                return False
            if len(s) != 3 and int(np.prod(s)) != 1:
                return False
    return True


def _find_conv1d_regions(v: View) -> list[Match]:
    members = {n.name for n in v.model.graph.node if _region_member(v, n)}
    seen: set[str] = set()
    out = []
    for n in v.model.graph.node:
        if n.op_type != "Conv" or n.name not in members or n.name in seen:
            continue
        region, stack = [], [n.name]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            region.append(name)
            node = v.nodes[name]
            nbrs = [v.producer.get(i) for i in node.input if i]
            nbrs += [c for o in node.output for c in v.consumers.get(o, [])]
            for m in nbrs:
                if m is not None and m.name in members and m.name not in seen:
                    # a neighbour joins through a 3-D activation (not a constant side input)
                    stack.append(m.name)
        order = [x.name for x in v.model.graph.node if x.name in set(region)]
        out.append(Match(f"conv1d-region:{order[0]}", tuple(order)))
    return out


def _check_conv1d(v: View, m: Match) -> str | None:
    for name in m.nodes:
        n = v.nodes[name]
        if n.op_type == "Conv" and attr(n, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            return f"{name}: auto_pad is set (explicit pads needed)"
    return None


def _rewrite_conv1d(v: View, m: Match) -> Change:
    ch = Change(remove=set(m.nodes))
    region = set(m.nodes)
    internal: dict[str, str] = {}   # 3-D tensor -> its 4-D twin
    axes_name, t = v.init("conv2d_axis", np.array([2], dtype=np.int64))
    ch.inits.append(t)

    def twin(x: str) -> str:
        if x in internal:
            return internal[x]
        y = v.fresh(x + "_2d")
        internal[x] = y
        p = v.producer.get(x)
        if p is None or p.name not in region:  # enters the region: Unsqueeze once
            ch.add.append(helper.make_node("Unsqueeze", [x, axes_name], [y], name=v.fresh(f"{x}_to2d")))
        return y

    for name in m.nodes:
        n = v.nodes[name]
        ins = list(n.input)
        if n.op_type == "Conv":
            w = v.const(n.input[1])
            if w is not None:
                wn, wt = v.init(n.input[1] + "_2d", w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]))
                ch.inits.append(wt)
                ins[1] = wn
            else:
                ins[1] = twin(n.input[1])
            ins[0] = twin(n.input[0])
            k = attr(n, "kernel_shape") or [v.shape(n.input[1])[2]]
            pads = attr(n, "pads") or [0, 0]
            kw = {"kernel_shape": [1, k[0]], "pads": [0, pads[0], 0, pads[1]],
                  "strides": [1, (attr(n, "strides") or [1])[0]], "dilations": [1, (attr(n, "dilations") or [1])[0]],
                  "group": attr(n, "group", 1)}
            new = helper.make_node("Conv", ins, [twin(n.output[0])], name=n.name, **kw)
        elif n.op_type == "Slice":
            axes = v.const(n.input[3]).astype(np.int64)
            axes = np.where(axes < 0, axes + 3, axes)
            axes = np.where(axes >= 2, axes + 1, axes)
            an, at = v.init(f"{n.name}_axes2d", axes)
            ch.inits.append(at)
            ins[0] = twin(ins[0])
            ins[3] = an
            new = helper.make_node("Slice", ins, [twin(n.output[0])], name=n.name)
        else:
            for k, x in enumerate(ins):
                s = v.shape(x) if x else None
                if x and s is not None and len(s) == 3:
                    ins[k] = twin(x)
            new = helper.make_node(n.op_type, ins, [twin(n.output[0])], name=n.name, domain=n.domain)
            new.attribute.extend(n.attribute)
        ch.add.append(new)
    for x, y in list(internal.items()):
        p = v.producer.get(x)
        if p is None or p.name not in region:
            continue
        outside = [c for c in v.consumers.get(x, []) if c.name not in region]
        if outside or x in v.graph_outputs:
            ch.add.append(helper.make_node("Squeeze", [y, axes_name], [x], name=v.fresh(f"{x}_to1d")))
    return ch


# ------------------------------------------------------------------------------------------ rule: narrow-int64
# op -> input positions that carry data (narrowed); the rest (shapes, axes, indices) stay int64
_INT_DATA_OPS = {"Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Div": (0, 1), "Abs": (0,), "Neg": (0,),
                 "Relu": (0,), "Max": None, "Min": None, "Concat": None, "ReduceSum": (0,),
                 "Slice": (0,), "Transpose": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Reshape": (0,),
                 "Gather": (0,), "Expand": (0,), "Tile": (0,), "Flatten": (0,), "Identity": (0,),
                 "Where": (1, 2)}
_INT32 = np.iinfo(np.int32)


def _int_data_positions(n: onnx.NodeProto) -> tuple[int, ...]:
    pos = _INT_DATA_OPS[n.op_type]
    return tuple(range(len(n.input))) if pos is None else pos


def _int_candidate(v: View, n: onnx.NodeProto) -> bool:
    if n.op_type not in _INT_DATA_OPS or n.domain not in ("", "ai.onnx") or len(n.output) != 1:
        return False
    if v.dtype(n.output[0]) != np.int64:
        return False
    pos = _int_data_positions(n)
    return all(v.dtype(n.input[p]) == np.int64 for p in pos if p < len(n.input) and n.input[p])


def _find_int64(v: View) -> list[Match]:
    cands = {n.name for n in v.model.graph.node if _int_candidate(v, n)}
    seen: set[str] = set()
    out = []
    for n in v.model.graph.node:
        if n.name not in cands or n.name in seen:
            continue
        comp, stack = [], [n.name]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            comp.append(name)
            node = v.nodes[name]
            for p in _int_data_positions(node):
                if p < len(node.input):
                    q = v.producer.get(node.input[p])
                    if q is not None and q.name in cands:
                        stack.append(q.name)
            for c in v.consumers.get(node.output[0], []):
                if c.name in cands and any(c.input[p] == node.output[0] for p in _int_data_positions(c)
                                           if p < len(c.input)):
                    stack.append(c.name)
        order = [x.name for x in v.model.graph.node if x.name in set(comp)]
        out.append(Match(f"int64:{order[0]}", tuple(order)))
    return out


def _fits_int32(a: np.ndarray | None) -> bool:
    return a is None or a.size == 0 or (int(a.min()) >= _INT32.min and int(a.max()) <= _INT32.max)


def _check_int64(v: View, m: Match) -> str | None:
    if all(v.const(v.nodes[n].output[0]) is not None or _all_const_inputs(v, v.nodes[n]) for n in m.nodes):
        return "constant subgraph: folded at compile time, nothing runs on the AI CPU"
    for name in m.nodes:
        n = v.nodes[name]
        for p in _int_data_positions(n):
            if p < len(n.input) and n.input[p]:
                if not _fits_int32(v.const(n.input[p])) or not _fits_int32(v.values.get(n.input[p])):
                    return f"{n.input[p]} holds values outside int32 on these inputs"
        if not _fits_int32(v.values.get(n.output[0])):
            return f"{n.output[0]} holds values outside int32 on these inputs"
    return None


def _all_const_inputs(v: View, n: onnx.NodeProto) -> bool:
    return all(v.const(i) is not None for i in n.input if i)


def _rewrite_int64(v: View, m: Match) -> Change:
    ch = Change(remove=set(m.nodes))
    comp = set(m.nodes)
    narrowed: dict[str, str] = {}

    def narrow(x: str) -> str:
        if x in narrowed:
            return narrowed[x]
        c = v.const(x)
        if c is not None:
            name, t = v.init(x + "_i32", c.astype(np.int32))
            ch.inits.append(t)
        else:
            name = v.fresh(x + "_i32")
            p = v.producer.get(x)
            if p is None or p.name not in comp:
                ch.add.append(helper.make_node("Cast", [x], [name], to=TensorProto.INT32, name=v.fresh(f"{x}_cast32")))
        narrowed[x] = name
        return name

    for name in m.nodes:
        n = v.nodes[name]
        ins = list(n.input)
        for p in _int_data_positions(n):
            if p < len(ins) and ins[p]:
                ins[p] = narrow(ins[p])
        new = helper.make_node(n.op_type, ins, [narrow(n.output[0])], name=n.name)
        new.attribute.extend(n.attribute)
        ch.add.append(new)
    for name in m.nodes:
        o = v.nodes[name].output[0]
        readers = [c for c in v.consumers.get(o, []) if c.name not in comp
                   or not any(c.input[p] == o for p in _int_data_positions(c) if p < len(c.input))]
        if readers or o in v.graph_outputs:
            ch.add.append(helper.make_node("Cast", [narrowed[o]], [o], to=TensorProto.INT64, name=v.fresh(f"{o}_cast64")))
    return ch


# ------------------------------------------------------------------------------------------ rule: split-avgpool
def _find_avgpool(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        k = attr(n, "kernel_shape")
        if n.op_type == "AveragePool" and k and len(k) == 2 and k[0] * k[1] >= AVGPOOL_LIMIT:
            out.append(Match(f"avgpool:{n.name}", (n.name,)))
    return out


def _factor(k: int) -> tuple[int, int]:
    """k = a * b with a as close to sqrt(k) as possible (a >= b)."""
    best = (k, 1)
    for b in range(1, int(math.isqrt(k)) + 1):
        if k % b == 0:
            best = (k // b, b)
    return best


def _avgpool_plan(k: Sequence[int]) -> tuple[list[int], list[int]] | None:
    (h1, h2), (w1, w2) = _factor(k[0]), _factor(k[1])
    first, second = [h1, w1], [h2, w2]
    if first[0] * first[1] >= AVGPOOL_LIMIT or second[0] * second[1] >= AVGPOOL_LIMIT:
        # balance: move factors so each stage stays under the limit
        first, second = [h1, w2], [h2, w1]
        if first[0] * first[1] >= AVGPOOL_LIMIT or second[0] * second[1] >= AVGPOOL_LIMIT:
            return None
    return first, second


def _check_avgpool(v: View, m: Match) -> str | None:
    n = v.nodes[m.nodes[0]]
    k = attr(n, "kernel_shape")
    if any(attr(n, "pads") or [0]):
        return "padded AveragePool: the split is exact only without padding"
    if list(attr(n, "strides") or [1, 1]) != list(k):
        return "strides differ from the kernel: overlapping windows do not split into a cascade"
    if attr(n, "ceil_mode", 0):
        return "ceil_mode=1: partial windows do not split exactly"
    if any(d != 1 for d in (attr(n, "dilations") or [1, 1])):
        return "dilated AveragePool"
    if _avgpool_plan(k) is None:
        return f"kernel {k[0]}x{k[1]} has no factorisation with both stages under {AVGPOOL_LIMIT}"
    return None


def _rewrite_avgpool(v: View, m: Match) -> Change:
    n = v.nodes[m.nodes[0]]
    first, second = _avgpool_plan(attr(n, "kernel_shape"))
    mid = v.fresh(n.output[0] + "_stage1")
    return Change(remove={n.name}, add=[
        helper.make_node("AveragePool", [n.input[0]], [mid], name=v.fresh(n.name + "_stage1"),
                         kernel_shape=first, strides=first),
        helper.make_node("AveragePool", [mid], [n.output[0]], name=v.fresh(n.name + "_stage2"),
                         kernel_shape=second, strides=second)])


# ------------------------------------------------------------------------------------------ rule: split-large-kernel-conv
def _find_large_conv(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        w = v.shape(n.input[1]) if n.op_type == "Conv" and len(n.input) > 1 else None
        if w is not None and len(w) >= 3 and w[-1] > LARGE_KERNEL:
            out.append(Match(f"large-conv:{n.name}", (n.name,)))
    return out


def _check_large_conv(v: View, m: Match) -> str | None:
    n = v.nodes[m.nodes[0]]
    if v.const(n.input[1]) is None:
        return "weights are not constant"
    if attr(n, "group", 1) != 1:
        return "grouped convolution"
    rank = len(v.shape(n.input[1])) - 2
    pads = attr(n, "pads") or [0] * (2 * rank)
    if pads[rank - 1] or pads[2 * rank - 1]:
        return "padding along the large kernel axis"
    if (attr(n, "dilations") or [1] * rank)[-1] != 1:
        return "dilated along the large kernel axis"
    if attr(n, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return "auto_pad is set"
    if v.shape(n.output[0]) is None:
        return "output shape unknown"
    return None


def _rewrite_large_conv(v: View, m: Match) -> Change:
    n = v.nodes[m.nodes[0]]
    w = v.const(n.input[1])
    k = w.shape[-1]
    parts = -(-k // LARGE_KERNEL)
    size = -(-k // parts)
    axis = w.ndim - 1
    ch = Change(remove={n.name})
    acc = None
    for j, start in enumerate(range(0, k, size)):
        kj = min(size, k - start)
        wn, wt = v.init(f"{n.input[1]}_part{j}", np.ascontiguousarray(w[..., start:start + kj]))
        # the end counted from the far side keeps every part's output length (L - K) / s + 1 for any L
        tail = k - start - kj
        sl = [v.init(f"{n.name}_p{j}_{s}", np.array([x], dtype=np.int64)) for s, x in
              (("start", start), ("end", -tail if tail else np.iinfo(np.int64).max), ("axis", axis))]
        ch.inits += [wt] + [t for _, t in sl]
        xs = v.fresh(f"{n.name}_in{j}")
        ch.add.append(helper.make_node("Slice", [n.input[0], sl[0][0], sl[1][0], sl[2][0]], [xs],
                                       name=v.fresh(f"{n.name}_slice{j}")))
        ins = [xs, wn] + ([n.input[2]] if j == 0 and len(n.input) > 2 and n.input[2] else [])
        y = v.fresh(f"{n.name}_part{j}")
        conv = helper.make_node("Conv", ins, [y], name=v.fresh(f"{n.name}_part{j}"))
        conv.attribute.extend(a for a in n.attribute if a.name != "kernel_shape")
        ch.add.append(conv)
        if acc is None:
            acc = y
        else:
            s = v.fresh(f"{n.name}_sum{j}")
            ch.add.append(helper.make_node("Add", [acc, y], [s], name=v.fresh(f"{n.name}_sum{j}")))
            acc = s
    ch.add.append(helper.make_node("Identity", [acc], [n.output[0]], name=v.fresh(n.name + "_out")))
    return ch


# ------------------------------------------------------------------------------------------ rule: fold-transpose-bn
def _find_tbt(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "BatchNormalization" or len(n.output) != 1 and any(n.output[1:]):
            continue
        p = v.producer.get(n.input[0])
        c = v.only_consumer(n.output[0])
        if p is not None and p.op_type == "Transpose" and c is not None and c.op_type == "Transpose":
            out.append(Match(f"tbt:{n.name}", (p.name, n.name, c.name)))
    return out


def _check_tbt(v: View, m: Match) -> str | None:
    t1, bn, t2 = (v.nodes[x] for x in m.nodes)
    p, q = list(attr(t1, "perm") or []), list(attr(t2, "perm") or [])
    if not p or len(p) != len(q) or [p[i] for i in q] != list(range(len(p))):
        return "the two Transposes do not cancel"
    if any(v.const(x) is None for x in bn.input[1:5]):
        return "BatchNormalization parameters are not constant"
    if attr(bn, "training_mode", 0):
        return "training-mode BatchNormalization"
    if v.only_consumer(t1.output[0]) is None:
        return f"{t1.output[0]} has other readers (the first Transpose must stay)"
    return None


def _rewrite_tbt(v: View, m: Match) -> Change:
    t1, bn, t2 = (v.nodes[x] for x in m.nodes)
    p = list(attr(t1, "perm"))
    gamma, beta, mean, var = (v.const(x).astype(np.float64) for x in bn.input[1:5])
    eps = attr(bn, "epsilon", 1e-5)
    scale = gamma / np.sqrt(var + eps)
    shift = beta - mean * scale
    dtype = v.dtype(t1.input[0]) or np.float32
    shape = [1] * len(p)
    shape[p[1]] = scale.size          # the BN channel axis (1 after t1) is axis p[1] of the input
    sn, st = v.init(bn.name + "_scale", scale.reshape(shape).astype(dtype))
    bn_, bt = v.init(bn.name + "_shift", shift.reshape(shape).astype(dtype))
    mid = v.fresh(bn.name + "_scaled")
    return Change(remove=set(m.nodes), inits=[st, bt], add=[
        helper.make_node("Mul", [t1.input[0], sn], [mid], name=v.fresh(bn.name + "_mul")),
        helper.make_node("Add", [mid, bn_], [t2.output[0]], name=v.fresh(bn.name + "_add"))])


# ------------------------------------------------------------------------------------------ rule: merge-casts
# float/int widening chains that lose nothing: a -> b is exact when b holds every value of a
_EXACT = {("float16", "float32"), ("float16", "float64"), ("float32", "float64"), ("bfloat16", "float32"),
          ("bfloat16", "float64"), ("int8", "int16"), ("int8", "int32"), ("int8", "int64"), ("int16", "int32"),
          ("int16", "int64"), ("int32", "int64"), ("uint8", "int16"), ("uint8", "int32"), ("uint8", "int64"),
          ("uint8", "float16"), ("uint8", "float32"), ("int8", "float16"), ("int8", "float32"),
          ("int16", "float32"), ("int32", "float64"), ("bool", "int32"), ("bool", "int64"), ("bool", "float32")}


def _cast_to(n: onnx.NodeProto) -> np.dtype:
    return _onnx_to_np(attr(n, "to"))


def _find_casts(v: View) -> list[Match]:
    out = []
    by_input: dict[tuple[str, int], list[str]] = defaultdict(list)
    for n in v.model.graph.node:
        if n.op_type != "Cast":
            continue
        by_input[(n.input[0], attr(n, "to"))].append(n.name)
        if v.dtype(n.input[0]) == _cast_to(n):
            out.append(Match(f"cast-identity:{n.name}", (n.name,), "identity"))
        c = v.only_consumer(n.output[0])
        if c is not None and c.op_type == "Cast":
            out.append(Match(f"cast-chain:{n.name}", (n.name, c.name), "chain"))
    for (_, _), names in by_input.items():
        if len(names) > 1:
            out.append(Match(f"cast-siblings:{names[0]}", tuple(names), "siblings"))
    return out


def _check_casts(v: View, m: Match) -> str | None:
    if m.data == "identity":
        if v.dtype(v.nodes[m.nodes[0]].input[0]) is None:
            return "input dtype unknown"
        return None
    if m.data == "chain":
        a = v.nodes[m.nodes[0]]
        src, mid = v.dtype(a.input[0]), _cast_to(a)
        if src is None:
            return "input dtype unknown"
        if (src.name, mid.name) not in _EXACT and src != mid:
            return f"the first Cast {src.name} -> {mid.name} rounds or truncates: the chain is not one Cast"
    return None


def _rewrite_casts(v: View, m: Match) -> Change:
    if m.data == "identity":
        n = v.nodes[m.nodes[0]]
        return Change(remove={n.name}, reroute={n.output[0]: n.input[0]})
    if m.data == "chain":
        a, b = v.nodes[m.nodes[0]], v.nodes[m.nodes[1]]
        if v.dtype(a.input[0]) == _cast_to(b):
            return Change(remove={a.name, b.name}, reroute={b.output[0]: a.input[0]})
        return Change(remove={a.name, b.name}, add=[
            helper.make_node("Cast", [a.input[0]], [b.output[0]], name=b.name, to=attr(b, "to"))])
    keep, *drop = (v.nodes[x] for x in m.nodes)
    return Change(remove={d.name for d in drop}, reroute={d.output[0]: keep.output[0] for d in drop})


# ------------------------------------------------------------------------------------------ rule: merge-slices
def _slice_params(v: View, n: onnx.NodeProto):
    if len(n.input) < 4 or any(v.const(i) is None for i in n.input[1:] if i):
        return None
    rank = len(v.shape(n.input[0]) or ())
    starts, ends = v.const(n.input[1]), v.const(n.input[2])
    axes = v.const(n.input[3]) if len(n.input) > 3 and n.input[3] else np.arange(len(starts))
    steps = v.const(n.input[4]) if len(n.input) > 4 and n.input[4] else np.ones(len(starts), np.int64)
    axes = [int(a) + rank if a < 0 else int(a) for a in axes]
    return list(starts), list(ends), axes, list(steps)


def _find_slices(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "Slice":
            continue
        c = v.only_consumer(n.output[0])
        if c is not None and c.op_type == "Slice" and c.input[0] == n.output[0]:
            out.append(Match(f"slices:{n.name}", (n.name, c.name)))
    return out


def _check_slices(v: View, m: Match) -> str | None:
    a, b = (_slice_params(v, v.nodes[x]) for x in m.nodes)
    if a is None or b is None:
        return "starts/ends/axes/steps are not all constant (opset >= 10 inputs)"
    if v.shape(v.nodes[m.nodes[0]].input[0]) is None:
        return "input rank unknown"
    if set(a[2]) & set(b[2]):
        return f"both Slices cut axis {sorted(set(a[2]) & set(b[2]))[0]}: not merged (different axes only)"
    return None


def _rewrite_slices(v: View, m: Match) -> Change:
    na, nb = (v.nodes[x] for x in m.nodes)
    a, b = _slice_params(v, na), _slice_params(v, nb)
    names = []
    ch = Change(remove={na.name, nb.name})
    for k, what in enumerate(("starts", "ends", "axes", "steps")):
        name, t = v.init(f"{na.name}_{what}", np.array(a[k] + b[k], dtype=np.int64))
        ch.inits.append(t)
        names.append(name)
    ch.add.append(helper.make_node("Slice", [na.input[0], *names], [nb.output[0]], name=nb.name))
    return ch


# ------------------------------------------------------------------------------------------ rule: merge-concats
def _find_concats(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "Concat":
            continue
        inner = [v.producer.get(i) for i in n.input]
        inner = [p.name for p in inner if p is not None and p.op_type == "Concat"
                 and v.only_consumer(p.output[0]) is n]
        if inner:
            out.append(Match(f"concats:{n.name}", (n.name, *inner)))
    return out


def _norm_axis(v: View, n: onnx.NodeProto) -> int | None:
    a = attr(n, "axis", 0)
    s = v.shape(n.output[0])
    if a < 0:
        return None if s is None else a + len(s)
    return a


def _check_concats(v: View, m: Match) -> str | None:
    outer = v.nodes[m.nodes[0]]
    ax = _norm_axis(v, outer)
    for x in m.nodes[1:]:
        if _norm_axis(v, v.nodes[x]) != ax:
            return f"{x} concatenates on another axis"
    return None


def _rewrite_concats(v: View, m: Match) -> Change:
    outer = v.nodes[m.nodes[0]]
    inner = {v.nodes[x].output[0]: v.nodes[x] for x in m.nodes[1:]}
    ins: list[str] = []
    for i in outer.input:
        ins.extend(inner[i].input if i in inner else [i])
    return Change(remove=set(m.nodes), add=[helper.make_node("Concat", ins, [outer.output[0]], name=outer.name,
                                                             axis=attr(outer, "axis", 0))])


# ------------------------------------------------------------------------------------------ rule: gather-to-split
def _gather_range(v: View, n: onnx.NodeProto) -> tuple[int, int, bool] | None:
    idx = v.const(n.input[1])
    if idx is None or idx.ndim > 1 or idx.size == 0:
        return None
    dim = (v.shape(n.input[0]) or (None,) * 64)[_gather_axis(v, n)]
    if dim is None:
        return None
    flat = [int(i) + dim if i < 0 else int(i) for i in idx.reshape(-1)]
    if flat != list(range(flat[0], flat[0] + len(flat))):
        return None
    return flat[0], flat[0] + len(flat), idx.ndim == 0


def _gather_axis(v: View, n: onnx.NodeProto) -> int:
    a = attr(n, "axis", 0)
    return a + len(v.shape(n.input[0]) or ()) if a < 0 else a


def _find_gathers(v: View) -> list[Match]:
    groups: dict[tuple[str, int], list[str]] = defaultdict(list)
    for n in v.model.graph.node:
        if n.op_type == "Gather" and v.const(n.input[1]) is not None and v.shape(n.input[0]) is not None:
            groups[(n.input[0], _gather_axis(v, n))].append(n.name)
    return [Match(f"gathers:{names[0]}", tuple(names)) for names in groups.values() if len(names) > 1]


def _check_gathers(v: View, m: Match) -> str | None:
    first = v.nodes[m.nodes[0]]
    if v.const(first.input[0]) is not None:
        return "the data is constant: the Gathers fold at compile time"
    decl = v.declared(first.input[0])
    if decl is None or len(decl) <= _gather_axis(v, first) or decl[_gather_axis(v, first)] is None:
        return "the gathered axis is not static in the model (the Split sizes would be fixed)"
    ranges = []
    for x in m.nodes:
        r = _gather_range(v, v.nodes[x])
        if r is None:
            return f"{x}: indices are not a contiguous constant range"
        ranges.append(r)
    ranges.sort()
    for (a0, a1, _), (b0, b1, _) in zip(ranges, ranges[1:]):
        if b0 < a1:
            return "the index ranges overlap"
    return None


def _rewrite_gathers(v: View, m: Match) -> Change:
    nodes = [v.nodes[x] for x in m.nodes]
    data = nodes[0].input[0]
    axis = _gather_axis(v, nodes[0])
    dim = v.shape(data)[axis]
    spans = sorted((_gather_range(v, n), n) for n in nodes)
    ch = Change(remove={n.name for n in nodes})
    sizes, outs, pos = [], [], 0
    for (a, b, scalar), n in spans:
        if a > pos:
            sizes.append(a - pos)
            outs.append(v.fresh(f"{data}_gap{pos}"))
        sizes.append(b - a)
        if scalar:
            piece = v.fresh(n.output[0] + "_piece")
            an, at = v.init(n.name + "_axis", np.array([axis], dtype=np.int64))
            ch.inits.append(at)
            ch.add.append(helper.make_node("Squeeze", [piece, an], [n.output[0]], name=v.fresh(n.name + "_squeeze")))
            outs.append(piece)
        else:
            outs.append(n.output[0])
        pos = b
    if pos < dim:
        sizes.append(dim - pos)
        outs.append(v.fresh(f"{data}_gap{pos}"))
    sn, st = v.init(f"{data}_split_sizes", np.array(sizes, dtype=np.int64))
    ch.inits.append(st)
    ch.add.append(helper.make_node("Split", [data, sn], outs, name=v.fresh(f"{data}_split"), axis=axis))
    return ch


# ------------------------------------------------------------------------------------------ rule: remove-empty-slices
def _find_empty_slices(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type == "Concat":
            empty = [i for i in n.input if 0 in (v.declared(i) or ()) and v.producer.get(i) is not None
                     and v.producer[i].op_type == "Slice"]
            if empty:
                out.append(Match(f"empty-slices:{n.name}", (n.name,), tuple(empty)))
    return out


def _check_empty_slices(v: View, m: Match) -> str | None:
    n = v.nodes[m.nodes[0]]
    if len(n.input) - len(m.data) < 1:
        return "every input of the Concat is empty"
    return None


def _rewrite_empty_slices(v: View, m: Match) -> Change:
    n = v.nodes[m.nodes[0]]
    ins = [i for i in n.input if i not in m.data]
    ch = Change(remove={n.name}, add=[helper.make_node("Concat", ins, [n.output[0]], name=n.name,
                                                       axis=attr(n, "axis", 0))])
    for e in m.data:
        if v.only_consumer(e) is n:
            ch.remove.add(v.producer[e].name)
    return ch


# ------------------------------------------------------------------------------------------ rule: split-qkv-matmul
def _find_qkv(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "MatMul" or v.const(n.input[1]) is None:
            continue
        cur, chain = n, [n.name]
        nxt = v.only_consumer(cur.output[0])
        if nxt is not None and nxt.op_type == "Add" and v.const(nxt.input[1]) is not None:
            chain.append(nxt.name)
            cur, nxt = nxt, v.only_consumer(nxt.output[0])
        if nxt is None or nxt.op_type != "Reshape":
            continue
        r = nxt
        t = v.only_consumer(r.output[0])
        if t is None or t.op_type != "Transpose":
            continue
        gathers = v.consumers.get(t.output[0], [])
        if len(gathers) >= 2 and all(g.op_type == "Gather" and attr(g, "axis", 0) == 0 for g in gathers) \
                and t.output[0] not in v.graph_outputs:
            out.append(Match(f"qkv:{n.name}", tuple(chain + [r.name, t.name] + [g.name for g in gathers])))
    return out


def _qkv_parts(v: View, m: Match):
    names = list(m.nodes)
    mm = v.nodes[names[0]]
    add = v.nodes[names[1]] if v.nodes[names[1]].op_type == "Add" else None
    k = 2 if add is not None else 1
    r, t = v.nodes[names[k]], v.nodes[names[k + 1]]
    gathers = [v.nodes[x] for x in names[k + 2:]]
    return mm, add, r, t, gathers


def _check_qkv(v: View, m: Match) -> str | None:
    mm, add, r, t, gathers = _qkv_parts(v, m)
    shape = v.const(r.input[1])
    w = v.const(mm.input[1])
    perm = list(attr(t, "perm") or [])
    if shape is None or not perm:
        return "Reshape target or Transpose perm not constant"
    if w.ndim != 2:
        return "weights are not a 2-D matrix"
    rshape = v.shape(r.output[0])
    if rshape is None:
        return "Reshape output shape unknown"
    axis = perm[0]
    n = rshape[axis]
    if shape[axis] != n:
        return "the number of slices is not a constant of the Reshape target"
    if math.prod(rshape[axis:]) != w.shape[1]:
        return "the gathered axis is not the leading factor of the MatMul's last dimension"
    idx = [v.const(g.input[1]) for g in gathers]
    if any(i is None or i.ndim != 0 for i in idx):
        return "Gather indices are not constant scalars"
    if sorted(int(i) % n for i in idx) != list(range(n)):
        return f"the Gathers do not take each of the {n} slices once"
    if add is not None:
        b = v.const(add.input[1])
        if b.ndim != 1 or b.shape[0] != w.shape[1]:
            return "the bias is not a vector over the MatMul's last dimension"
    if 0 in shape.tolist():
        return "Reshape target uses 0 (copy a dimension)"
    return None


def _rewrite_qkv(v: View, m: Match) -> Change:
    mm, add, r, t, gathers = _qkv_parts(v, m)
    w = v.const(mm.input[1])
    b = v.const(add.input[1]) if add is not None else None
    shape = v.const(r.input[1]).astype(np.int64).tolist()
    perm = list(attr(t, "perm"))
    rshape = v.shape(r.output[0])
    axis = perm[0]
    n = rshape[axis]
    width = w.shape[1] // n
    new_shape = np.array(shape[:axis] + shape[axis + 1:], dtype=np.int64)
    new_perm = [p - (p > axis) for p in perm[1:]]
    ch = Change(remove=set(m.nodes))
    sn, st = v.init(r.name + "_part_shape", new_shape)
    ch.inits.append(st)
    for g in gathers:
        i = int(v.const(g.input[1])) % n
        wn, wt = v.init(f"{mm.input[1]}_part{i}", np.ascontiguousarray(w[:, i * width:(i + 1) * width]))
        ch.inits.append(wt)
        y = v.fresh(f"{mm.name}_part{i}")
        ch.add.append(helper.make_node("MatMul", [mm.input[0], wn], [y], name=v.fresh(f"{mm.name}_part{i}")))
        if b is not None:
            bn, bt = v.init(f"{add.input[1]}_part{i}", b[i * width:(i + 1) * width])
            ch.inits.append(bt)
            y2 = v.fresh(f"{add.name}_part{i}")
            ch.add.append(helper.make_node("Add", [y, bn], [y2], name=v.fresh(f"{add.name}_part{i}")))
            y = y2
        z = v.fresh(f"{r.name}_part{i}")
        ch.add.append(helper.make_node("Reshape", [y, sn], [z], name=v.fresh(f"{r.name}_part{i}")))
        ch.add.append(helper.make_node("Transpose", [z], [g.output[0]], name=v.fresh(f"{t.name}_part{i}"),
                                       perm=new_perm))
    return ch


# ------------------------------------------------------------------------------------------ rule: reflect-pad
def _find_reflect(v: View) -> list[Match]:
    return [Match(f"reflect:{n.name}", (n.name,)) for n in v.model.graph.node
            if n.op_type == "Pad" and attr(n, "mode", b"constant") in (b"reflect", "reflect")]


def _check_reflect(v: View, m: Match) -> str | None:
    n = v.nodes[m.nodes[0]]
    if len(n.input) < 2 or v.const(n.input[1]) is None:
        return "pads are not a constant input (opset >= 11)"
    if len(n.input) > 3 and n.input[3]:
        return "Pad with an axes input"
    pads = v.const(n.input[1])
    shape = v.shape(n.input[0])
    if shape is None:
        return "input shape unknown"
    if (pads < 0).any():
        return "negative pads (cropping)"
    r = len(shape)
    for a in range(r):
        if pads[a] >= shape[a] or pads[a + r] >= shape[a]:
            return f"pad on axis {a} is not smaller than the axis"
    return None


def _rewrite_reflect(v: View, m: Match) -> Change:
    n = v.nodes[m.nodes[0]]
    pads = v.const(n.input[1]).astype(np.int64)
    r = len(pads) // 2
    ch = Change(remove={n.name})
    cur = n.input[0]
    for a in range(r):
        b, e = int(pads[a]), int(pads[a + r])
        if not b and not e:
            continue
        parts = []

        def rev(start: int, end: int, tag: str) -> str:
            names = []
            for what, val in (("s", start), ("e", end), ("a", a), ("st", -1)):
                nm, t = v.init(f"{n.name}_{tag}{a}_{what}", np.array([val], dtype=np.int64))
                ch.inits.append(t)
                names.append(nm)
            out = v.fresh(f"{n.name}_{tag}{a}")
            ch.add.append(helper.make_node("Slice", [cur, *names], [out], name=v.fresh(f"{n.name}_{tag}{a}")))
            return out

        if b:
            parts.append(rev(b, 0, "left"))      # x[b], x[b-1], ..., x[1]
        parts.append(cur)
        if e:
            parts.append(rev(-2, -e - 2, "right"))  # x[n-2], ..., x[n-e-1]
        out = v.fresh(f"{n.name}_axis{a}")
        ch.add.append(helper.make_node("Concat", parts, [out], name=v.fresh(f"{n.name}_concat{a}"), axis=a))
        cur = out
    ch.add.append(helper.make_node("Identity", [cur], [n.output[0]], name=v.fresh(n.name + "_out")))
    return ch


# ------------------------------------------------------------------------------------------ rule: cancel-transpose-reshape
def _find_cancel(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type == "Transpose":
            p = v.producer.get(n.input[0])
            if p is not None and p.op_type == "Transpose" and v.only_consumer(p.output[0]) is n:
                out.append(Match(f"transposes:{n.name}", (p.name, n.name), "transposes"))
            perm = attr(n, "perm")
            if perm is not None and list(perm) == list(range(len(perm))):
                out.append(Match(f"transpose-identity:{n.name}", (n.name,), "transpose-identity"))
        elif n.op_type == "Reshape":
            p = v.producer.get(n.input[0])
            if p is not None and p.op_type == "Reshape" and v.only_consumer(p.output[0]) is n:
                out.append(Match(f"reshapes:{n.name}", (p.name, n.name), "reshapes"))
            s_in, s_out = v.declared(n.input[0]), v.declared(n.output[0])
            if s_in is not None and None not in s_in and s_in == s_out:
                out.append(Match(f"reshape-identity:{n.name}", (n.name,), "reshape-identity"))
    return out


def _check_cancel(v: View, m: Match) -> str | None:
    if m.data == "reshapes":
        second = v.nodes[m.nodes[1]]
        s = v.const(second.input[1])
        if s is None:
            return "the second Reshape's target is computed at run time"
        if 0 in s.tolist() and not attr(second, "allowzero", 0):
            return "the second Reshape copies a dimension (0) from the first one's output"
    if m.data == "reshape-identity" and v.const(v.nodes[m.nodes[0]].input[1]) is None \
            and v.model.graph.input and False:
        return "dynamic target"
    return None


def _rewrite_cancel(v: View, m: Match) -> Change:
    if m.data in ("transpose-identity", "reshape-identity"):
        n = v.nodes[m.nodes[0]]
        return Change(remove={n.name}, reroute={n.output[0]: n.input[0]})
    a, b = (v.nodes[x] for x in m.nodes)
    if m.data == "reshapes":
        new = helper.make_node("Reshape", [a.input[0], b.input[1]], [b.output[0]], name=b.name)
        new.attribute.extend(b.attribute)
        return Change(remove={a.name, b.name}, add=[new])
    p, q = list(attr(a, "perm")), list(attr(b, "perm"))
    comp = [p[i] for i in q]
    if comp == list(range(len(comp))):
        return Change(remove={a.name, b.name}, reroute={b.output[0]: a.input[0]})
    return Change(remove={a.name, b.name}, add=[helper.make_node("Transpose", [a.input[0]], [b.output[0]],
                                                                 name=b.name, perm=comp)])


# ------------------------------------------------------------------------------------------ rule: fold-channel-slice
def _find_channel_slices(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "Conv" or n.output[0] in v.graph_outputs:
            continue
        readers = v.consumers.get(n.output[0], [])
        if readers and all(r.op_type == "Slice" and r.input[0] == n.output[0] for r in readers):
            out.append(Match(f"channel-slice:{n.name}", (n.name, *[r.name for r in readers])))
    return out


def _check_channel_slices(v: View, m: Match) -> str | None:
    conv = v.nodes[m.nodes[0]]
    if v.const(conv.input[1]) is None or (len(conv.input) > 2 and conv.input[2] and v.const(conv.input[2]) is None):
        return "weights are not constant"
    if attr(conv, "group", 1) != 1:
        return "grouped convolution"
    rank = len(v.shape(conv.output[0]) or ())
    for x in m.nodes[1:]:
        p = _slice_params(v, v.nodes[x])
        if p is None:
            return f"{x}: starts/ends/axes/steps are not constant"
        if 1 not in p[2] or p[3][p[2].index(1)] != 1 or rank < 3:
            return f"{x} does not slice the channel axis with step 1"
    return None


def _rewrite_channel_slices(v: View, m: Match) -> Change:
    conv = v.nodes[m.nodes[0]]
    w = v.const(conv.input[1])
    b = v.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    ch = Change(remove=set(m.nodes))
    sliced: dict[tuple, str] = {}
    for x in m.nodes[1:]:
        s = v.nodes[x]
        start, end, axes, steps = _slice_params(v, s)
        k = axes.index(1)
        lo, hi, _ = slice(int(start[k]), int(end[k])).indices(w.shape[0])
        rest = [j for j in range(len(axes)) if j != k]
        wn, wt = v.init(f"{conv.input[1]}_{lo}_{hi}", np.ascontiguousarray(w[lo:hi]))
        ch.inits.append(wt)
        ins = [conv.input[0], wn]
        if b is not None:
            bn, bt = v.init(f"{conv.input[2]}_{lo}_{hi}", np.ascontiguousarray(b[lo:hi]))
            ch.inits.append(bt)
            ins.append(bn)
        y = v.fresh(f"{conv.output[0]}_{lo}_{hi}") if rest else s.output[0]
        new = helper.make_node("Conv", ins, [y], name=v.fresh(f"{conv.name}_{lo}_{hi}"))
        new.attribute.extend(conv.attribute)
        ch.add.append(new)
        moved = _input_slice(v, conv, w, [(axes[j], int(start[j]), int(end[j]), int(steps[j])) for j in rest])
        if moved is not None:
            # slice the input instead: the Conv's output then feeds its readers directly (the
            # output Slice is what made the planner leave NC1HWC0)
            key = tuple(moved)
            if key not in sliced:  # readers cutting the same input window share one Slice
                vals = list(zip(*moved))
                names = []
                for what, val in zip(("starts", "ends", "axes", "steps"), vals):
                    nm, t = v.init(f"{s.name}_in_{what}", np.array(val, dtype=np.int64))
                    ch.inits.append(t)
                    names.append(nm)
                sliced[key] = v.fresh(f"{conv.input[0]}_{s.name}")
                ch.add.append(helper.make_node("Slice", [conv.input[0], *names], [sliced[key]],
                                               name=v.fresh(f"{s.name}_input")))
            xs = sliced[key]
            new.input[0] = xs
            new.output[0] = s.output[0]
        elif rest:  # the other axes stay a Slice of the output
            names = []
            for what, vals in (("starts", start), ("ends", end), ("axes", axes), ("steps", steps)):
                nm, t = v.init(f"{s.name}_{what}", np.array([vals[j] for j in rest], dtype=np.int64))
                ch.inits.append(t)
                names.append(nm)
            ch.add.append(helper.make_node("Slice", [y, *names], [s.output[0]], name=s.name))
    return ch


_TO_END = 1 << 31


def _input_slice(v: View, conv: onnx.NodeProto, w: np.ndarray, cuts: list[tuple[int, int, int, int]]):
    """The input Slice (start, end, axis, step per axis) equivalent to slicing the Conv's output by
    ``cuts`` (axis, start, end, step), or None when it is not exact: batch cuts move as they are;
    spatial cuts need step 1, a non-negative start, no padding on the axis, and an end that is
    either "to the end" or inside the output."""
    if not cuts:
        return None
    rank = w.ndim - 2
    pads = attr(conv, "pads") or [0] * (2 * rank)
    strides = attr(conv, "strides") or [1] * rank
    dil = attr(conv, "dilations") or [1] * rank
    if attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    out_decl = v.declared(conv.output[0]) or ()
    moved = []
    for axis, start, end, step in cuts:
        if axis == 0:
            moved.append((start, end, 0, step))
            continue
        d = axis - 2
        if d < 0 or step != 1 or start < 0 or end < 0 or pads[d] or pads[d + rank]:
            return None
        ek = (w.shape[2 + d] - 1) * dil[d] + 1
        full = out_decl[axis] if axis < len(out_decl) else None
        if end >= _TO_END or (full is not None and end >= full):
            in_end = _TO_END
        elif full is not None:
            in_end = (end - 1) * strides[d] + ek
        else:
            return None
        moved.append((start * strides[d], in_end, axis, 1))
    return moved


# ------------------------------------------------------------------------------------------ registry
RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("fold-channel-slice", "Slices of a Conv output along channels become Convs with sliced weights "
         "(and spatial cuts move to the input): a Slice of a Conv output leaves NC1HWC0, two TransData", _find_channel_slices,
         _check_channel_slices, _rewrite_channel_slices),
    Rule("reflect-pad", "reflect-mode Pad becomes Slice (reversed) + Concat: reflect Pad is slow on the NPU",
         _find_reflect, _check_reflect, _rewrite_reflect),
    Rule("split-large-kernel-conv", f"Conv kernels above {LARGE_KERNEL} along the last axis split into "
         "Slice + Conv + Add: large kernels exceed the cube's tiling", _find_large_conv, _check_large_conv,
         _rewrite_large_conv),
    Rule("conv1d-to-conv2d", "regions of Conv1d and element-wise ops run as Conv2d between one Unsqueeze "
         "and Squeeze (ATC lowers each Conv1d to Conv2d; the region keeps the layout between them)", _find_conv1d_regions, _check_conv1d,
         _rewrite_conv1d),
    Rule("narrow-int64", "int64 subgraphs computed in int32 (values checked), Casts at the boundary: "
         "int64 runs on the AI CPU", _find_int64, _check_int64, _rewrite_int64),
    Rule("split-avgpool", f"AveragePool with kernel h*w >= {AVGPOOL_LIMIT} split into two cascaded pools "
         "(the ISA limit)", _find_avgpool, _check_avgpool, _rewrite_avgpool),
    Rule("fold-transpose-bn", "Transpose -> BatchNormalization -> inverse Transpose becomes Mul + Add",
         _find_tbt, _check_tbt, _rewrite_tbt),
    Rule("merge-casts", "identity Casts dropped, exact Cast chains collapsed, sibling Casts merged",
         _find_casts, _check_casts, _rewrite_casts),
    Rule("merge-slices", "chained Slices on different axes become one", _find_slices, _check_slices,
         _rewrite_slices),
    Rule("merge-concats", "chained Concats on the same axis become one", _find_concats, _check_concats,
         _rewrite_concats),
    Rule("gather-to-split", "Gathers of contiguous disjoint constant ranges on one axis become one Split",
         _find_gathers, _check_gathers, _rewrite_gathers, default=False),
    Rule("remove-empty-slices", "empty Slices feeding a Concat removed (the device Concat rejects them)",
         _find_empty_slices, _check_empty_slices, _rewrite_empty_slices, default=False),
    Rule("split-qkv-matmul", "MatMul(+Add) -> Reshape -> Transpose -> N Gathers becomes N MatMuls",
         _find_qkv, _check_qkv, _rewrite_qkv, default=False),
    Rule("cancel-transpose-reshape", "Transpose pairs composed or cancelled, Reshape chains collapsed, "
         "identity Transpose/Reshape dropped", _find_cancel, _check_cancel, _rewrite_cancel),
)}


def select_rules(rules: Sequence[str] | None = None, skip: Sequence[str] | None = None) -> list[Rule]:
    """The rules to run: ``rules`` (names, in registry order) or every default rule, minus ``skip``."""
    for name in list(rules or []) + list(skip or []):
        if name not in RULES:
            raise InputError(f"unknown rule {name!r}", hint=f"known rules: {', '.join(RULES)} (optimize --list)")
    chosen = [r for r in RULES.values() if (r.name in rules if rules else r.default)]
    return [r for r in chosen if r.name not in set(skip or ())]


# ------------------------------------------------------------------------------------------ inputs and running
def realistic_feeds(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None, *,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs in the ranges the model expects, from the one feed generator: token ids below the
    embedding table's size, masks of ones, images in [0, 1] (or whole numbers in [0, 255] where the
    model divides by 255), other integers 0 or 1, other floats standard normal."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for n in g.node:
        for k, i in enumerate(n.input):
            readers[i].append((n, k))
    metas = feeds_mod.model_inputs(model)
    tables = feeds_mod.index_ranges(model)
    ranges, pixels = {}, set()
    for m in metas:
        dims = list((shapes or {}).get(m.name, m.shape))
        if any(d < 0 for d in dims):
            raise InputError(f"input {m.name!r} has dynamic dimensions {dims}",
                             hint=f"give its shape with --input-shape \"{m.name}:...\" or --inputs FILE.npz")
        if m.dtype.kind in "iu" and "mask" in m.name.lower() and m.name not in tables:
            ranges[m.name] = (1, 1)
        elif m.dtype.kind == "f" and len(dims) == 4 and (dims[1] in (1, 3) or dims[3] in (1, 3)):
            ranges[m.name] = (0, 1)
            if _expects_pixels(readers.get(m.name, []), inits):
                ranges[m.name] = (0, 255)
                pixels.add(m.name)
    return feeds_mod.generate_inputs(metas, seed=seed, shapes=shapes, val_range=ranges,
                                     index_ranges=tables, whole=pixels)


def _expects_pixels(readers, inits) -> bool:
    """An image input whose first op scales pixel values (Div by ~255, Mul by ~1/255, Sub of a mean
    above 1) takes values in [0, 255], not [0, 1]."""
    for n, k in readers:
        other = [i for j, i in enumerate(n.input) if j != k and i in inits]
        if not other:
            continue
        c = numpy_helper.to_array(inits[other[0]]).astype(np.float64)
        if c.size == 0:
            continue
        if n.op_type == "Div" and k == 0 and c.min() >= 50:
            return True
        if n.op_type == "Mul" and 0 < abs(c).max() <= 0.02:
            return True
        if n.op_type == "Sub" and k == 0 and c.max() > 2:
            return True
    return False


def _run_all(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every typed tensor's value on ``feeds`` (one onnxruntime run with all of them as outputs)."""
    import onnxruntime as ort

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for vi in inferred.graph.value_info:
        if vi.name not in have and vi.type.tensor_type.elem_type:
            out = onnx.ValueInfoProto()
            out.name = vi.name
            out.type.tensor_type.elem_type = vi.type.tensor_type.elem_type
            m.graph.output.append(out)
            have.add(vi.name)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # failures are reported by us, in one line
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    vals = sess.run(names, dict(feeds))
    out = dict(zip(names, vals))
    out.update(feeds)
    return out


def _validate(model: onnx.ModelProto) -> str | None:
    try:
        onnx.checker.check_model(model, full_check=False)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as e:  # the checker's and inference's own errors, whatever their class
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


def _compare(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], names: Iterable[str],
             atol: float, rtol: float) -> tuple[float, str | None]:
    worst = 0.0
    for n in names:
        a, b = np.asarray(ref[n]), np.asarray(got.get(n))
        if b is None or a.shape != b.shape or a.dtype != b.dtype:
            return math.inf, f"output {n}: {b.dtype}{tuple(b.shape)} instead of {a.dtype}{tuple(a.shape)}"
        if a.dtype.kind in "fc":
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            bad = diff > atol + rtol * np.abs(a.astype(np.float64))
            if np.isnan(a).any() or np.isnan(b).any():
                bad |= np.isnan(a) != np.isnan(b)
                diff = np.where(np.isnan(diff), 0, diff)
            worst = max(worst, float(diff.max()) if diff.size else 0.0)
            if bad.any():
                return worst, f"output {n}: {int(bad.sum())} elements outside atol {atol:g} / rtol {rtol:g} " \
                              f"(max abs diff {float(diff.max()):.3g})"
        elif not np.array_equal(a, b):
            return math.inf, f"output {n}: values differ"
    return worst, None


# ------------------------------------------------------------------------------------------ measuring
@dataclasses.dataclass
class Measure:
    """The built-in plan of one model: planned TransData, AI CPU ops, estimated time (µs)."""

    transdata: int
    ai_cpu: int
    est_us: float | None

    @staticmethod
    def of(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], soc: str, workdir: Path) -> "Measure":
        path = workdir / "candidate.onnx"
        onnx.save(model, path)
        plan = pipeline.lower(path, None, ConvertOptions(backend="builtin", soc=soc, input_shapes=dict(shapes)),
                              until="plan from ONNX").plan
        r = plan.report
        cost = r.cost or {}
        return Measure(int(r.transdata_count), int(r.engines.get("AI CPU", 0)),
                       None if cost.get("total_us") is None else float(cost["total_us"]))


def _pct(before: float | None, after: float | None) -> float | None:
    if not before or after is None:
        return None
    return 100.0 * (after - before) / before


def device_faster(before_ms: float, after_ms: float, margin_pct: float = NOISE_MARGIN_PCT) -> bool:
    """True when the device time dropped by more than ``margin_pct`` percent of ``before_ms``.

    >>> device_faster(10.0, 9.7), device_faster(10.0, 9.9), device_faster(10.0, 10.5)
    (True, False, False)
    """
    return after_ms < before_ms * (1.0 - margin_pct / 100.0)


class DeviceTimer(Protocol):
    """What ``optimize_model(device_timer=...)`` needs: ``timer(onnx_path, feeds, shapes, soc) -> ms``
    (device compute time of the model saved at ``onnx_path``; it may write next to it), ``runs`` (the
    timed runs behind each figure), ``measured_by`` (the label of its figures) and, optionally,
    ``check()`` raising when its tools are missing. :class:`npu_deploy.runtime.device_time.AtcAclTimer`
    is the ATC + ACL one."""

    runs: int
    measured_by: str

    def __call__(self, onnx_path: Path, feeds: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]],
                 soc: str) -> float: ...


class _DeviceTimes:
    """The device timer's figure per model: each distinct model is saved, compiled and timed once."""

    def __init__(self, timer: DeviceTimer, workdir: Path, feeds, shapes, soc: str, say: Callable[[str], None]):
        self.timer, self.dir, self.feeds, self.shapes, self.soc, self.say = timer, workdir, feeds, shapes, soc, say
        self.runs = int(getattr(timer, "runs", 0)) or None
        self._ms: dict[str, float] = {}
        self._tried = 0   # folders made (a model ATC could not compile has one, and no figure)

    @staticmethod
    def _key(model: onnx.ModelProto) -> str:
        return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()

    def known(self, model: onnx.ModelProto) -> float | None:
        return self._ms.get(self._key(model))

    def ms(self, model: onnx.ModelProto, what: str) -> float:
        key = self._key(model)
        if key not in self._ms:
            d = self.dir / f"device-{self._tried}"
            self._tried += 1
            d.mkdir()
            path = d / "model.onnx"
            onnx.save(model, path)
            self.say(f"timing {what} on the device")
            ms = float(self.timer(path, self.feeds, self.shapes, self.soc))
            if not (math.isfinite(ms) and ms >= 0):
                raise InternalError(f"the device timer {type(self.timer).__name__} returned {ms} ms for {what}: "
                                    f"a device time is a finite, non-negative number of milliseconds")
            self._ms[key] = ms
        return self._ms[key]


# ------------------------------------------------------------------------------------------ result
@dataclasses.dataclass
class Application:
    """One place one rule matched, and what became of it: ``status`` is ``applied``, ``not applicable``
    (``reason`` from the rule's check), ``rolled back`` (numbers or checks failed: ``reason``) or
    ``not faster`` (``--keep-if-faster``)."""

    rule: str
    where: str
    status: str
    reason: str | None = None
    before: dict | None = None
    after: dict | None = None
    max_abs_diff: float | None = None
    #: with a device timer: ``{"before_ms", "after_ms", "runs", "change_pct"}`` (median compute times)
    device: dict | None = None


@dataclasses.dataclass
class OptimizeResult(Result):
    """What ``optimize`` did. ``bool()``: every applied rewrite matched the original's outputs and the
    output passed the checks (rolled-back rewrites are reported, not failures)."""

    SCHEMA: ClassVar[str] = "npu-deploy/optimize-result"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: str
    output: str | None
    soc: str
    rules: list
    inputs: dict
    atol: float
    rtol: float
    before: dict
    after: dict
    applications: list = dataclasses.field(default_factory=list)
    keep_if_faster: bool = False
    outputs_match: bool = True
    #: what judged ``keep_if_faster``: the cost model, or also the device timer (its label)
    measured_by: str = COST_MODEL
    #: with a device timer: the original's and the output's device time ``{"before_ms", "after_ms",
    #: "runs", "margin_pct"}`` (None when no step reached the device)
    device: dict | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "OptimizeResult":
        r = super().from_dict(d)
        r.applications = [a if isinstance(a, Application) else Application(**a) for a in r.applications]
        return r

    def __bool__(self) -> bool:
        return self.outputs_match

    def applied(self) -> list[Application]:
        return [a for a in self.applications if a.status == "applied"]

    def applied_count(self) -> int:
        return len(self.applied())

    def per_rule(self) -> dict[str, dict[str, int]]:
        """Rule name → count per status."""
        out: dict[str, dict[str, int]] = {r: {} for r in self.rules}
        for a in self.applications:
            out.setdefault(a.rule, {})
            out[a.rule][a.status] = out[a.rule].get(a.status, 0) + 1
        return out

    def table(self) -> str:
        timed = any(a.device for a in self.applications)
        rows = [("rule", "applied", "not applicable", "rolled back / not faster", "TransData", "AI CPU", "est. us")
                + (("device ms",) if timed else ())]
        for rule, counts in self.per_rule().items():
            apps = [a for a in self.applied() if a.rule == rule and a.before is not None]
            td = sum(a.after["transdata"] - a.before["transdata"] for a in apps)
            cpu = sum(a.after["ai_cpu"] - a.before["ai_cpu"] for a in apps)
            us = sum((a.after["est_us"] or 0) - (a.before["est_us"] or 0) for a in apps)
            ms = sum(a.device["after_ms"] - a.device["before_ms"] for a in apps if a.device)
            rows.append((rule, str(counts.get("applied", 0)), str(counts.get("not applicable", 0)),
                         str(counts.get("rolled back", 0) + counts.get("not faster", 0)),
                         f"{td:+d}", f"{cpu:+d}", f"{us:+.1f}") + ((f"{ms:+.3f}",) if timed else ()))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in
                                   enumerate(zip(r, widths))) for r in rows)

    def verdict(self) -> str:
        n = self.applied_count()
        pct = _pct(self.before.get("est_us"), self.after.get("est_us"))
        est = "est. n/a" if pct is None else f"est. {pct:+.0f} %".replace("+-", "-")
        back = sum(1 for a in self.applications if a.status == "rolled back")
        slow = sum(1 for a in self.applications if a.status == "not faster")
        tail = "outputs match" if self.outputs_match else "OUTPUTS DIFFER"
        extra = (f", {back} rolled back" if back else "") + (f", {slow} not faster" if slow else "")
        dev = ""
        if self.device:
            b, a = self.device["before_ms"], self.device["after_ms"]
            dpct = _pct(b, a)
            dev = f", device {b:.3f} -> {a:.3f} ms" + ("" if dpct is None else f", {dpct:+.0f} %") \
                + " (ATC + ACL, stand-in verified only)"
        return (f"{n} rewrite{'s' if n != 1 else ''}{extra}, TransData {self.before['transdata']} -> "
                f"{self.after['transdata']}, AI CPU {self.before['ai_cpu']} -> {self.after['ai_cpu']}, "
                f"{est}{dev}, {tail}")


# ------------------------------------------------------------------------------------------ driver
def _name_nodes(model: onnx.ModelProto) -> None:
    """Unique node names, as the loader gives them (rules and reports key nodes by name)."""
    from npu_deploy.converters.files.onnx_model import name_nodes

    name_nodes(model.graph)


def optimize_model(model: onnx.ModelProto, *, rules: Sequence[str] | None = None, skip: Sequence[str] | None = None,
                   feeds: Mapping[str, np.ndarray] | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
                   soc: str | None = None, atol: float | None = None, rtol: float | None = None,
                   keep_if_faster: bool = False, seed: int = 0, source: str = "<model>",
                   progress: Callable[[str], None] | None = None,
                   device_timer: DeviceTimer | None = None) -> tuple[OptimizeResult, onnx.ModelProto]:
    """Apply the rules to ``model``; return the result and the rewritten model (see the module doc).

    ``device_timer`` (with ``keep_if_faster`` only): also time each step the cost model accepts on
    the device, e.g. ``AtcAclTimer()`` from :mod:`npu_deploy.runtime.device_time`."""
    chosen = select_rules(rules, skip)
    if device_timer is not None:
        if not keep_if_faster:
            raise InputError("a device timer (--measure atc) judges --keep-if-faster, which is off",
                             hint="add --keep-if-faster, or drop --measure atc")
        check = getattr(device_timer, "check", None)
        if check is not None:
            check()  # ATC or pyACL missing: say so before any rewrite is verified
    soc = soc or DEFAULT_SOC
    atol = DEFAULT_ATOL if atol is None else float(atol)
    rtol = DEFAULT_RTOL if rtol is None else float(rtol)
    say = progress or (lambda s: None)
    cur = onnx.ModelProto()
    cur.CopyFrom(model)
    _name_nodes(cur)
    if feeds is None:
        feeds = realistic_feeds(cur, input_shapes, seed=seed)
    feeds = {k: np.asarray(v) for k, v in feeds.items()}
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    out_names = [o.name for o in cur.graph.output]
    try:
        values = _run_all(cur, feeds)
    except NpuDeployError:
        raise
    except Exception as e:
        raise ModelError(f"{source}: onnxruntime cannot run the model on the verification inputs "
                         f"({str(e).splitlines()[0][:200]})", hint="check the model and --inputs/--input-shape") from None
    reference = {n: values[n] for n in out_names}
    applications: list[Application] = []
    with tempfile.TemporaryDirectory(prefix="npu-deploy-optimize-") as tmp:
        work = Path(tmp)
        device = None if device_timer is None else _DeviceTimes(device_timer, work, feeds, shapes, soc, say)
        original = cur
        before = Measure.of(cur, shapes, soc, work)
        now = before
        for rule in chosen:
            tried: set[str] = set()
            single = False  # after a batch failed: one application at a time finds the culprit
            for _ in range(MAX_APPLICATIONS_PER_RULE):
                view = View(cur, values)
                try:
                    matches = [m for m in rule.find(view) if m.key not in tried]
                except Exception as e:  # a rule that cannot read this graph is reported, the model unchanged
                    applications.append(Application(rule.name, "<graph>", "not applicable",
                                                    f"the pattern could not be matched: {type(e).__name__}: {e}"))
                    break
                if not matches:
                    break
                batch: list[Match] = []
                used: set[str] = set()
                for m in matches:
                    if used & set(m.nodes) or (single and batch):
                        continue
                    tried.add(m.key)
                    reason = rule.check(view, m)
                    if reason is not None:
                        applications.append(Application(rule.name, m.nodes[0], "not applicable", reason))
                        continue
                    batch.append(m)
                    used |= set(m.nodes)
                if not batch:
                    continue
                say(f"{rule.name} at {batch[0].nodes[0]}" + (f" and {len(batch) - 1} more" if len(batch) > 1 else ""))
                apps, new, new_values, measured = _try(rule, view, batch, cur, feeds, reference, out_names, shapes,
                                                       soc, work, now, atol, rtol, keep_if_faster, device)
                if new is None and len(batch) > 1:
                    tried -= {m.key for m in batch}
                    single = True
                    continue
                applications += apps
                if new is not None:
                    cur, values, now = new, new_values, measured
        after = now
        device_summary = None
        if device is not None and device.known(original) is not None:
            device_summary = {"before_ms": device.known(original), "after_ms": device.ms(cur, "the output model"),
                              "runs": device.runs, "margin_pct": NOISE_MARGIN_PCT}
    res = OptimizeResult(source, None, soc, [r.name for r in chosen],
                         {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in feeds.items()},
                         atol, rtol, dataclasses.asdict(before), dataclasses.asdict(after), applications,
                         keep_if_faster, True,
                         COST_MODEL if device_timer is None else
                         f"{COST_MODEL}; device time {device_timer.measured_by}", device_summary)
    problem = _validate(cur)
    if problem is not None:  # pragma: no cover - every accepted step passed the same check
        raise ModelError(f"{source}: the rewritten model fails the ONNX checks ({problem})")
    return res, cur


def _try(rule: Rule, view: View, batch: list[Match], cur, feeds, reference, out_names, shapes, soc, work,
         now: Measure, atol, rtol, keep_if_faster, device: _DeviceTimes | None = None):
    """Apply ``batch`` (matches on disjoint nodes) in one step, verify and measure it. Returns the
    applications, and the new model, values and measure (None when rolled back)."""
    where = batch[0].nodes[0]

    def failed(reason: str):
        return [Application(rule.name, m.nodes[0], "rolled back", reason) for m in batch], None, None, None

    try:
        change = merge_changes([rule.rewrite(view, m) for m in batch])
        new = apply_change(cur, change)
    except Exception as e:
        return failed(f"rewrite failed: {type(e).__name__}: {e}")
    problem = _validate(new)
    if problem is not None:
        return failed(f"checks failed: {problem}")
    try:
        values = _run_all(new, feeds)
    except Exception as e:
        return failed(f"onnxruntime failed: {str(e).splitlines()[0][:200]}")
    diff, bad = _compare(reference, values, out_names, atol, rtol)
    if bad is not None:
        return failed(f"changes the numbers: {bad}")
    try:
        measured = Measure.of(new, shapes, soc, work)
    except NpuDeployError as e:
        return failed(f"the built-in lowering cannot plan it: {e}")
    together = None if len(batch) == 1 else \
        f"verified and measured together with {where} ({len(batch)} {rule.name} rewrites in one step)"
    apps = [Application(rule.name, where, "applied", None, dataclasses.asdict(now), dataclasses.asdict(measured), diff)]
    apps += [Application(rule.name, m.nodes[0], "applied", together, None, None, diff) for m in batch[1:]]
    if keep_if_faster and not (measured.est_us is not None and now.est_us is not None and measured.est_us < now.est_us):
        reason = (f"estimated {now.est_us:.1f} -> {measured.est_us:.1f} us"
                  if measured.est_us is not None and now.est_us is not None else "no cost estimate for this SoC")
        for a in apps:
            a.status, a.reason = "not faster", reason
        return apps, None, None, None
    if device is not None:
        try:
            before_ms = device.ms(cur, f"the model before {rule.name} at {where}")
        except NpuDeployError as e:  # the model that already ran (or the original) cannot be timed
            e.message = f"--measure atc, timing the model before {rule.name} at {where}: {e.message}"
            raise
        try:
            after_ms = device.ms(new, f"{rule.name} at {where}")
        except (AtcError, ModelError) as e:  # this rewrite does not compile: it goes, the others stay
            return failed(f"ATC cannot compile the rewritten model: {e}")
        apps[0].device = {"before_ms": before_ms, "after_ms": after_ms, "runs": device.runs,
                          "change_pct": _pct(before_ms, after_ms)}
        if not device_faster(before_ms, after_ms):
            reason = (f"device compute {before_ms:.3f} -> {after_ms:.3f} ms (ATC + ACL, median of {device.runs} "
                      f"runs): not faster by more than {NOISE_MARGIN_PCT:g} %, although the cost model estimated "
                      f"{now.est_us:.1f} -> {measured.est_us:.1f} us")
            for a in apps:
                a.status, a.reason = "not faster", reason
            return apps, None, None, None
    return apps, new, values, measured


def optimize(model: str | os.PathLike, output: str | os.PathLike, *, rules: Sequence[str] | None = None,
             skip: Sequence[str] | None = None, inputs: str | os.PathLike | None = None,
             input_shapes: Mapping[str, Sequence[int]] | None = None, soc: str | None = None,
             atol: float | None = None, rtol: float | None = None, keep_if_faster: bool = False, seed: int = 0,
             report: str | os.PathLike | None = None,
             progress: Callable[[str], None] | None = None,
             device_timer: DeviceTimer | None = None) -> OptimizeResult:
    """Rewrite ``model`` for Ascend into ``output`` (see the module doc); return an :class:`OptimizeResult`.

    ``inputs``: an ``.npz`` of verification inputs (else generated in realistic ranges, shapes from
    ``input_shapes`` for dynamic dimensions). ``device_timer``: see :func:`optimize_model`. The output
    is written only when every check passed."""
    src = Path(model)
    _io.check_dest(output)
    if report is not None:
        _io.check_dest(report)
    _io.refuse_overwriting([("-o", output), ("--json", report)],
                           [("model being optimized", src), ("--inputs file", inputs)])
    select_rules(rules, skip)
    if not src.is_file():
        raise InputError(f"model {src} does not exist")
    try:
        m = onnx.load(str(src), load_external_data=False)
    except Exception as e:
        raise ModelError(f"{src}: not an ONNX model ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})",
                         hint="check the file is a .onnx export") from None
    if any(t.data_location == TensorProto.EXTERNAL for t in m.graph.initializer):
        raise ModelError(f"{src}: weights in external data files are not supported by optimize",
                         hint="save the model with its weights inside (onnx.save(..., save_as_external_data=False))")
    problem = _validate(m)
    if problem is not None:
        raise ModelError(f"{src}: the model fails the ONNX checks, nothing was rewritten ({problem})")
    feeds = None
    if inputs is not None:
        from npu_deploy._io import load_npz

        feeds = load_npz(inputs)
        names = {i.name for i in m.graph.input} - {t.name for t in m.graph.initializer}
        missing = sorted(names - set(feeds))
        if missing:
            raise InputError(f"--inputs {inputs} lacks input {missing[0]!r} of {src.name}",
                             hint=f"the model's inputs are {', '.join(sorted(names))}")
        feeds = {k: feeds[k] for k in names}
    res, out = optimize_model(m, rules=rules, skip=skip, feeds=feeds, input_shapes=input_shapes, soc=soc,
                              atol=atol, rtol=rtol, keep_if_faster=keep_if_faster, seed=seed, source=str(src),
                              progress=progress, device_timer=device_timer)
    res.output = str(output)
    with _io.outputs():
        with _io.atomic_path(output) as tmp:
            onnx.save(out, str(tmp))
        if report is not None:
            res.to_json(report)
    return res
