"""The plan, executed: the ONNX graph the emulator hands onnxruntime so that it runs the device plan.

:func:`build_plan_graph` turns a bundle (original-semantics graph + the plan in its manifest + the
weight blob) and one set of concrete input shapes into a graph in which

* every planned tensor lives in its **device format and storage shape** (C padded to C0, M/N padded
  to 16; zero padding) and in its **device dtype** (float16 where the plan stores it so): the
  producer's logical result is cast and packed (``Cast`` → ``Pad`` → ``Reshape`` → ``Transpose`` →
  ``Reshape``, derived from the format registry by :mod:`npu_deploy.converters.formats.graph`);
* every planned **TransData** is an explicit subgraph (unpack from its source format, pack to its
  destination format), named after it (``trans_TransData_3/...``);
* every op reads each input **in the format its node record says** (``node_formats[node]
  ["input_formats"][slot]``): the stored buffer is unpacked in that format and cast to the op's type.
  A buffer stored in another format than the reader expects is read as the bytes lie (what a device
  op does with a wrong descriptor): a wrong plan gives wrong numbers;
* layout-agnostic elementwise ops whose operands are all in the same blocked format run **on the
  storage directly** (as the device's vector unit does; constant operands are converted at compile
  time into a broadcastable storage form), so a Conv → Add → Relu chain in NC1HWC0 stays there;
* graph inputs arrive as device buffers (the host→device transfer has already converted the host
  array into the input's device format) and graph outputs leave as device buffers in the output's
  device format and dtype (the device→host transfer converts them back).

Constants (weights, initializers, folded nodes) are values known at compile time: a consumer reads
them in whatever format it wants (the conversion happened when the model was built), except that a
weight stored pre-packed is unpacked from its stored format. Nodes inside ``If``/``Loop``/``Scan``
bodies run on logical tensors (the plan does not reach into subgraphs yet); outer tensors they read
are provided in logical form.

Padding is never read by a reader that unpacks (``Slice`` drops it); elementwise ops on storage may
turn zero padding into other values (``Sigmoid(0) = 0.5``), as on the device, and nothing reads them.

The graph has static shapes (one graph per gear); :class:`PlanGraph` says which tensors were stored
in which format and dtype, for tests and for ``run --dump``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.formats import graph as format_graph
from npu_deploy.converters import formats
from npu_deploy.converters.formats.graph import IDENTITY_PLAIN, is_identity, norm_format, same_format
from npu_deploy.converters.lowering.fusion import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE, subgraph_reads
from npu_deploy.errors import FormatError, ModelError

LOW_PRECISION = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
_norm = norm_format


@dataclasses.dataclass(frozen=True)
class Stored:
    """How one buffer lies in device memory."""

    format: str
    dtype: np.dtype            # device dtype of the buffer
    shape: tuple[int, ...]     # logical shape
    c0: int | None
    origin: str | None = None  # the logical axis order (NCHW...) for channels-last plain buffers

    @property
    def storage(self) -> tuple[int, ...]:
        if is_identity(self.format):
            return self.shape
        return tuple(formats.storage_shape(self.format, self.shape, self.dtype, **self._kw()))

    def _kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        f = formats.get_format(self.format)
        if self.c0 and f.blocked and f.c0 is None:
            kw["c0"] = int(self.c0)
        if self.origin:
            kw["origin"] = self.origin
        return kw


@dataclasses.dataclass
class OpRecord:
    """One executed device op (an ONNX node, or a planned TransData): the buffers it read and wrote,
    as ``(tensor, buffer name)`` pairs in slot order (activations only; constants are not listed)."""

    name: str
    op_type: str
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]


@dataclasses.dataclass
class PlanGraph:
    """The executable graph and what it stores: ``stored[t]`` for every planned tensor, ``transdata``
    (names run), ``inputs`` / ``outputs`` (ONNX graph name → internal device-buffer name), the logical
    output shapes, ``storage_ops`` (nodes run on blocked storage directly)."""

    model: onnx.ModelProto
    stored: dict[str, Stored]
    inputs: dict[str, str]
    outputs: dict[str, str]
    output_shapes: dict[str, tuple[int, ...]]
    transdata: list[str]
    storage_ops: list[str]
    reinterpreted: list[str]
    records: list[OpRecord] = dataclasses.field(default_factory=list)
    buffers: dict[str, Stored] = dataclasses.field(default_factory=dict)  # every buffer the graph holds
    exposed: dict[str, str] = dataclasses.field(default_factory=dict)    # buffer -> graph output name

    @property
    def rounded_tensors(self) -> list[str]:
        return [t for t, s in self.stored.items() if s.dtype.name in LOW_PRECISION]


def _elem_np(t: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(t))


def _dtype_of(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _default_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 17


class _Scope:
    """One graph being built (the top level, or an If/Loop/Scan body): its nodes and its caches. A
    value made in a scope is visible in the bodies inside it, never in its parent or siblings."""

    def __init__(self, opset: int, parent: "_Scope | None" = None):
        self.out = _Graph(opset)
        self.parent = parent
        self.reads: dict[Any, str] = {}
        self.rounded: dict[str, str] = {}
        self.td_done: dict[str, str] = {}

    def find(self, table: str, key: Any) -> str | None:
        s: _Scope | None = self
        while s is not None:
            got = getattr(s, table).get(key)
            if got is not None:
                return got
            s = s.parent
        return None


class _Current:
    """The node list of the scope being built (``add``/``cast`` go there)."""

    def __init__(self, scopes: list[_Scope]):
        self._scopes = scopes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scopes[-1].out, name)


class _Graph:
    """Accumulates the new node list."""

    def __init__(self, opset: int):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.opset = opset

    def add(self, nodes, inits=()) -> None:
        self.nodes.extend(nodes)
        self.inits.extend(inits)

    def cast(self, src: str, dst: str, to: np.dtype, name: str) -> str:
        self.nodes.append(helper.make_node("Cast", [src], [dst], name=name,
                                           to=helper.np_dtype_to_tensor_dtype(to)))
        return dst


def build_plan_graph(graph: onnx.ModelProto, manifest: Mapping[str, Any], weights: Mapping[str, np.ndarray],
                     input_shapes: Mapping[str, tuple[int, ...]], *, literal: bool = False,
                     feeds: Mapping[str, np.ndarray] | None = None, expose: bool = False) -> PlanGraph:
    """The plan-executing graph for one set of concrete logical input shapes (see the module
    docstring). ``weights``: initializer name → logical array (already unpacked, in the graph's
    dtype); ``input_shapes``: graph input name → logical (graph-layout) shape. ``literal``: build
    every tensor's device buffer and have every reader unpack it (see the module docstring).
    ``feeds`` (logical input values), when given, are what a run that completes open shapes uses.
    ``expose`` (implies ``literal``): every buffer an op reads or writes is also a graph output
    (``PlanGraph.exposed``), for operator dumps."""
    return _PlanBuilder(graph, manifest, weights, input_shapes, literal or expose, feeds).build(expose)


class _PlanBuilder:
    """The state of one :func:`build_plan_graph` call: the model being rewritten, what is known of
    each tensor (type, shape), every device buffer made so far (``stored``, ``buffer_of``), the ones
    not built yet (``pending``) and the scopes of the If/Loop/Scan bodies being rewritten."""

    def __init__(self, graph: onnx.ModelProto, manifest: Mapping[str, Any], weights: Mapping[str, np.ndarray],
                 input_shapes: Mapping[str, tuple[int, ...]], literal: bool,
                 feeds: Mapping[str, np.ndarray] | None):
        self.literal = literal
        self.manifest, self.weights, self.input_shapes, self.feeds = manifest, weights, input_shapes, feeds
        model = onnx.ModelProto()
        model.CopyFrom(graph)
        if model.ir_version < 4:  # IR 3 wants every initializer listed as an input; IR 4 lifts that
            model.ir_version = 4
        self.model = model
        g = self.g = model.graph
        self.opset = _default_opset(model)
        self.node_formats = manifest.get("node_formats") or {}
        self.tensor_dtypes = manifest.get("tensor_dtypes") or {}
        self.tensor_formats = manifest.get("tensor_formats") or {}

        _fill_missing_optional_inputs(g, weights)
        for name, arr in weights.items():
            g.initializer.append(numpy_helper.from_array(arr, name))
        self.consts = {i.name for i in g.initializer}
        self.types, self.shapes, self.opaque, self.shaped = _types_and_shapes(model, input_shapes, feeds)
        self.ran = False
        # the plan records every tensor's shape at the shapes it was converted for (If/Loop bodies included,
        # which onnx shape inference does not reach): usable when these inputs have exactly those shapes
        self.planned = manifest.get("tensors") if isinstance(manifest.get("tensors"), dict) else {}
        self.planned_shapes_apply = all(
            tuple(e.get("graph_shape") or e.get("shape") or ()) == tuple(input_shapes.get(str(e.get("name")), ()))
            for e in manifest.get("inputs") or [] if isinstance(e, dict) and str(e.get("name")) in input_shapes)

        folded_outputs: set[str] = set()
        for n in g.node:
            nf = self.node_formats.get(n.name)
            if (isinstance(nf, dict) and nf.get("folded")) or n.op_type == "Constant":
                folded_outputs.update(o for o in n.output if o)
        self.consts |= folded_outputs

        self.sub_reads: set[str] = set()
        for n in g.node:
            self.sub_reads |= subgraph_reads(n)

        self.scopes: list[_Scope] = [_Scope(self.opset)]
        self.out = _Current(self.scopes)
        self.stored: dict[str, Stored] = {}     # buffer name -> how it lies
        self.buffer_of: dict[str, str] = {}      # tensor -> its own buffer
        self.reinterpreted: list[str] = []
        # buffer -> (tensor, logical source, tag, scope): not built yet
        self.pending: dict[str, tuple[str, str, str, _Scope]] = {}
        self.logical_of: dict[str, tuple[str, str]] = {}       # buffer -> (tensor, the logical value it was made from)

        # TransData by (tensor, consumer)
        self.td_by_edge: dict[tuple[str, str], dict] = {}
        self.td_list = [td for td in manifest.get("transdata") or [] if isinstance(td, dict)]
        for td in self.td_list:  # a chain's second step comes later in the list and wins its edges
            for c in td.get("consumers") or []:
                self.td_by_edge[(str(td.get("tensor")), str(c))] = td
        self.td_by_name = {str(td.get("name")): td for td in self.td_list}
        # tensors the plan fuses into their reader (never stored, so not rounded); literal stores all
        self.fused = set() if literal else {str(t) for t in manifest.get("fused_tensors") or []}
        self.storage_ops: list[str] = []
        self.records: list[OpRecord] = []
        self.ran_td: set[str] = set()

    # ---- what is known of a tensor
    def elem(self, t: str) -> int:
        if t not in self.types:
            raise ModelError(f"plan execution: tensor {t!r} has no known type",
                             hint="re-convert the model; if it persists this is a converter bug")
        return self.types[t]

    def shape_of(self, t: str) -> tuple[int, ...]:
        shapes = self.shapes
        if t not in shapes and not self.ran:  # a planned layout needs it: learn the open shapes once
            self.ran = True
            produced = [o for n in self.g.node for o in n.output if o and o not in shapes and o not in self.opaque]
            _shapes_by_running(self.shaped, self.input_shapes, produced, self.types, shapes, self.opaque, self.feeds)
        if t not in shapes and self.planned_shapes_apply:  # inside bodies: the plan's own record
            rec = self.planned.get(t)
            if isinstance(rec, dict) and rec.get("shape") is not None and all(
                    isinstance(d, int) and d >= 0 for d in rec["shape"]):
                shapes[t] = tuple(rec["shape"])
        if t not in shapes:
            raise ModelError(f"plan execution: tensor {t!r} has no static shape for these inputs",
                             hint="give fixed input shapes (--input-shape) when converting")
        return shapes[t]

    def device_dtype(self, t: str, node_dtype: str | None) -> np.dtype:
        logical = _elem_np(self.elem(t))
        if self.elem(t) not in _FLOAT_TYPES:
            return logical
        want = self.tensor_dtypes.get(t)
        if isinstance(want, str) and want in LOW_PRECISION:
            return _dtype_of(want)
        if want is None and node_dtype in LOW_PRECISION:
            return _dtype_of(node_dtype)
        return logical

    def stored_for(self, t: str, fmt: str, dt: np.dtype, c0: Any, origin: str | None = None) -> Stored:
        fmt = _norm(fmt)
        shp = self.shape_of(t) if not is_identity(fmt) else self.shapes.get(t, ())
        c0v = None
        if not is_identity(fmt):
            f = formats.get_format(fmt)
            if f.blocked:
                c0v = formats.resolve_c0(f, dt, int(c0) if c0 else None)
        return Stored(fmt, dt, tuple(shp), c0v, origin)

    def _sfx(self) -> str:
        """A suffix that keeps the names made inside a body apart from the same names outside it."""
        scopes = self.scopes
        return f"_{len(scopes) - 1}_{id(scopes[-1]) % 100000}" if len(scopes) > 1 else ""

    # ---- device buffers: written, built, read
    def store(self, t: str, src: str, st: Stored, tag: str, name: str | None = None, lazy: bool = True) -> str:
        """A buffer of tensor ``t`` (``name``, default ``t__dev``) made from its logical value ``src``:
        cast to the device dtype and packed into the device format. Built when something reads the
        bytes (:meth:`materialize`); always at once with ``literal``."""
        if t in self.opaque:
            self.stored[src] = st
            return src
        default = name is None
        name = name or f"{t}__dev"
        if default and is_identity(st.format) and st.dtype == _elem_np(self.elem(t)):
            self.stored[src] = st  # plain and in its own dtype: the logical tensor is the buffer
            return src
        self.stored[name] = st
        if lazy:
            self.logical_of[name] = (t, src)
        self.pending[name] = (t, src, tag, self.scopes[-1])
        if self.literal or not lazy:
            self.materialize(name)
        return name

    def materialize(self, buf: str) -> None:
        if buf not in self.pending:
            return
        t, src, tag, owner = self.pending.pop(buf)
        where = owner.out  # built where its source lives, so that every reader below sees it
        st = self.stored[buf]
        x = src
        if st.dtype != _elem_np(self.elem(t)):
            x = where.cast(x, f"{buf}__cast", st.dtype, f"{tag}/{t}/to_{st.dtype.name}")
        if not is_identity(st.format):
            nodes, inits = format_graph.pack_nodes(st.format, st.shape, st.dtype, x, buf,
                                                   prefix=f"{tag}/{t}/pack_{st.format}", opset=self.opset,
                                                   **st._kw())
            where.add(nodes, inits)
        else:
            where.add([helper.make_node("Identity", [x], [buf], name=f"{tag}/{t}/store")])

    def read(self, t: str, buf: str, fmt: str | None, c0: Any, reader: str, real: bool = False) -> str:
        """The logical value of ``t`` (in its ONNX type) as a reader expecting ``fmt`` sees ``buf``.

        A reader that wants the buffer in the format it was written in gets the value the buffer was
        made from, rounded to the buffer's dtype: unpack(pack(x)) is x, byte for byte (``real`` or
        ``literal`` build and unpack the buffer instead)."""
        st = self.stored[buf]
        if t in self.opaque:
            return buf
        want = _norm(fmt) if fmt else "ND"
        logical_t = _elem_np(self.elem(t))
        if same_format(want, st.format) and buf in self.logical_of and not (real or self.literal):
            return self._read_rounded(t, buf, st, logical_t, reader)
        key = (buf, want, st.c0 if same_format(want, st.format) else c0)
        got = self.scopes[-1].find("reads", key)
        if got is not None:
            return got
        sfx = self._sfx()
        self.materialize(buf)
        x = buf
        tag = f"{reader}/read_{t}"
        if same_format(want, st.format):
            view = st
        else:
            view, x = self._reinterpret(t, buf, st, want, c0, reader, tag, sfx)
        out = self.out
        if not is_identity(view.format):
            dst = f"{buf}__{want}_logical{sfx}"
            nodes, inits = format_graph.unpack_nodes(view.format, view.shape, view.dtype, x, dst,
                                                     prefix=f"{tag}/unpack_{want}", opset=self.opset, **view._kw())
            out.add(nodes, inits)
            x = dst
        if view.dtype != logical_t:
            x = out.cast(x, f"{buf}__{want}_as_{logical_t.name}{sfx}", logical_t, f"{tag}/to_{logical_t.name}")
        self.scopes[-1].reads[key] = x
        return x

    def _read_rounded(self, t: str, buf: str, st: Stored, logical_t: np.dtype, reader: str) -> str:
        """The value ``buf`` was made from, rounded through the buffer's dtype (once per scope)."""
        src = self.logical_of[buf][1]
        if st.dtype == logical_t:
            return src
        scope = self.scopes[-1]
        got = scope.find("rounded", buf)
        if got is None:
            sfx = self._sfx()
            low = self.out.cast(src, f"{buf}__rounded{sfx}", st.dtype, f"{reader}/{t}/round_{st.dtype.name}")
            got = self.out.cast(low, f"{buf}__rounded_back{sfx}", logical_t, f"{reader}/{t}/round_back")
            scope.rounded[buf] = got
        return got

    def _reinterpret(self, t: str, buf: str, st: Stored, want: str, c0: Any, reader: str, tag: str,
                     sfx: str) -> tuple[Stored, str]:
        """``buf``'s bytes seen as a ``want`` buffer (the view, and the name holding it)."""
        x = buf
        if is_identity(st.format) and not st.shape:  # a plain buffer stored without its shape
            st = dataclasses.replace(st, shape=tuple(self.shape_of(t)))
        view = self.stored_for(t, want, st.dtype, c0, _plain_origin(want, len(st.shape)))
        if st.storage != view.storage or not (is_identity(st.format) and is_identity(view.format)):
            nodes, inits = format_graph.reinterpret_nodes(buf, st.storage, view.storage,
                                                          f"{buf}__as_{want}{sfx}", prefix=f"{tag}/reinterpret",
                                                          opset=self.opset)
            self.out.add(nodes, inits)
            x = f"{buf}__as_{want}{sfx}"
            self.reinterpreted.append(f"{t} ({st.format} read as {want} by {reader})")
        return view, x

    def transdata_buffer(self, td: dict) -> str:
        name = str(td.get("name"))
        got = self.scopes[-1].find("td_done", name)
        if got is not None:
            return got
        t = str(td["tensor"])
        prev = None
        if td.get("after"):  # the second step of a chain (C0 8 <-> 16 through NCHW) converts the first's result
            prev = self.td_by_name.get(str(td["after"]))
            if prev is None or prev.get("after") or str(prev.get("tensor")) != t:
                raise ModelError(f"plan execution: TransData {name} on {t!r} follows {td['after']!r}, which is not "
                                 f"a first conversion of {t!r} in the manifest",
                                 hint="re-convert the model; if it persists this is a converter bug")
        src_buf = self.transdata_buffer(prev) if prev is not None else self.buffer_of[t]
        src_st = self.stored[src_buf]
        # a TransData is real: it unpacks its source buffer and packs the destination buffer
        logical = self.read(t, src_buf, td.get("src_format"), src_st.c0, name, real=True)
        dst = self.stored_for(t, td.get("dst_format"), src_st.dtype, td.get("c0"), _plain_origin(td.get("dst_format"),
                                                                                        len(src_st.shape)))
        sfx = self._sfx()
        buf = self.store(t, logical, dst, name, name=f"{t}__{name}{sfx}", lazy=False)
        self.scopes[-1].td_done[name] = buf
        self.ran_td.add(name)
        self.records.append(OpRecord(name, "TransData", [(t, src_buf)], [(t, buf)]))
        return buf

    def source(self, t: str, consumer: str) -> str:
        td = self.td_by_edge.get((t, consumer))
        return self.transdata_buffer(td) if td is not None else self.buffer_of[t]

    # ---- the graph, node by node
    def graph_inputs(self) -> list[onnx.ValueInfoProto]:
        """Graph inputs: device buffers in their device format; the new graph's input list."""
        in_entries = {str(e.get("name")): e for e in self.manifest.get("inputs") or []}
        self.inputs_map: dict[str, str] = {}
        new_inputs = []
        for vi in self.g.input:
            if vi.name in self.consts:
                continue
            e = in_entries.get(vi.name, {})
            dev_fmt = _norm(e.get("device_format") or e.get("format") or "ND")
            graph_fmt = _norm(e.get("graph_format") or "")
            origin = graph_fmt if graph_fmt and not is_identity(dev_fmt) else \
                _plain_origin(dev_fmt, len(self.shape_of(vi.name)))
            host_dt = _elem_np(self.elem(vi.name))
            st = self.stored_for(vi.name, dev_fmt, host_dt, e.get("c0"), origin)
            dev_name = f"{vi.name}__in"
            self.stored[dev_name] = st
            self.inputs_map[vi.name] = dev_name
            new_inputs.append(helper.make_tensor_value_info(dev_name, self.elem(vi.name), list(st.storage)))
            buf = dev_name
            low = self.device_dtype(vi.name, None)
            if low != host_dt:  # the plan stores this input in lower precision on the device
                buf = self.store(vi.name, self.read(vi.name, dev_name, dev_fmt, st.c0, "input"),
                                 dataclasses.replace(st, dtype=low), f"input:{vi.name}")
            self.buffer_of[vi.name] = buf
            if vi.name in self.sub_reads:
                _alias(self.out, self.read(vi.name, buf, dev_fmt, st.c0, "subgraph"), vi.name)
        return new_inputs

    def body(self, sub: onnx.GraphProto, owner: str) -> onnx.GraphProto:
        """The plan executed inside an If/Loop/Scan body: its inputs arrive as logical (ND) values, its
        outputs leave as logical values, and what happens between follows the plan like the top level."""
        self.scopes.append(_Scope(self.opset, self.scopes[-1]))
        try:
            for init in sub.initializer:
                self.consts.add(init.name)
            for nd in sub.node:
                nf = self.node_formats.get(nd.name)
                if (isinstance(nf, dict) and nf.get("folded")) or nd.op_type == "Constant":
                    self.consts.update(o for o in nd.output if o)
            for vi in sub.input:
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                    self.types.setdefault(vi.name, vi.type.tensor_type.elem_type)
                    self.stored[vi.name] = Stored("ND", _elem_np(vi.type.tensor_type.elem_type),
                                                  tuple(self.shapes.get(vi.name, ())), None)
                else:
                    self.opaque.add(vi.name)
                    self.stored[vi.name] = Stored("ND", np.dtype(object), (), None)
                self.buffer_of[vi.name] = vi.name
            self.process(sub.node)
            return self._body_graph(sub, owner)
        finally:
            self.scopes.pop()

    def _body_graph(self, sub: onnx.GraphProto, owner: str) -> onnx.GraphProto:
        """The rewritten body: the current scope's nodes, its outputs read back as logical values."""
        outs = []
        for k, vo in enumerate(sub.output):
            o = vo.name
            if o in self.consts or o not in self.buffer_of or o in self.opaque:
                outs.append(vo)
                continue
            value = self.read(o, self.source(o, "<graph output>"), "ND", None, f"{owner}/output")
            new_vo = onnx.ValueInfoProto()
            new_vo.CopyFrom(vo)
            new_vo.name = f"{o}__body_out"
            if new_vo.type.HasField("tensor_type"):
                new_vo.type.tensor_type.ClearField("shape")
            self.out.add([helper.make_node("Identity", [value], [new_vo.name], name=f"{owner}/{o}/body_output")])
            outs.append(new_vo)
        new = onnx.GraphProto()
        new.CopyFrom(sub)
        del new.node[:]
        new.node.extend(self.scopes[-1].out.nodes)
        new.initializer.extend(self.scopes[-1].out.inits)
        del new.output[:]
        new.output.extend(outs)
        del new.value_info[:]
        return new

    def process(self, nodes) -> None:
        for n in nodes:
            self.process_node(n)

    def process_node(self, n: onnx.NodeProto) -> None:
        nf = self.node_formats.get(n.name) if isinstance(self.node_formats.get(n.name), dict) else {}
        # a node the plan has no layout record for reads each input as it is stored (no constraint)
        unconstrained = "input_formats" not in nf
        in_fmts = list(nf.get("input_formats") or [])
        c0 = nf.get("c0")
        is_folded = bool(nf.get("folded")) or n.op_type == "Constant"
        new = onnx.NodeProto()
        new.CopyFrom(n)
        for a in new.attribute:  # If/Loop/Scan: their bodies follow the plan too
            if a.type == onnx.AttributeProto.GRAPH:
                a.g.CopyFrom(self.body(a.g, n.name))
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    sub.CopyFrom(self.body(sub, n.name))
        if is_folded:  # computed at compile time (Shape of a static tensor...): reads logical values
            for j, t in enumerate(n.input):
                if t and t in self.buffer_of:
                    new.input[j] = self.read(t, self.buffer_of[t], self.stored[self.buffer_of[t]].format, None, n.name)
            self.out.nodes.append(new)
            return
        writes = self._writes(n, nf, c0)
        fast = _storage_plan(n, in_fmts, writes, self.consts, self.buffer_of, self.stored, self.source, self.pending,
                             self.weights)
        if fast is not None:
            self.storage_ops.append(n.name)
            self.records.append(OpRecord(n.name, n.op_type, [(t, b) for t, (kind, b) in zip(n.input, fast.operands)
                                                             if kind == "buffer"], []))
            _emit_storage_op(self.out, new, fast, writes[0], self.elem, self.stored, self.buffer_of, self.sub_reads,
                             self.read, self.opset)
            self.records[-1].outputs.append((n.output[0], self.buffer_of[n.output[0]]))
            return
        rec = OpRecord(n.name, n.op_type, [], [])
        for j, t in enumerate(n.input):
            if not t or t in self.consts:
                continue
            if t not in self.buffer_of:
                raise ModelError(f"plan execution: node {n.name} reads {t!r}, which nothing produced",
                                 hint="re-convert the model; if it persists this is a converter bug")
            buf = self.source(t, n.name)
            rec.inputs.append((t, buf))
            fmt = self.stored[buf].format if unconstrained else (in_fmts[j] if j < len(in_fmts) else None)
            new.input[j] = self.read(t, buf, fmt, c0, n.name)
        self.out.nodes.append(new)
        for k, o in enumerate(n.output):
            if not o:
                continue
            self.buffer_of[o] = self.store(o, o, writes[k], n.name)
            rec.outputs.append((o, self.buffer_of[o]))
        self.records.append(rec)

    def _writes(self, n: onnx.NodeProto, nf: Mapping[str, Any], c0: Any) -> list[Stored | None]:
        """How each output of ``n`` is stored (None for an omitted optional output)."""
        out_fmts = list(nf.get("output_formats") or [])
        node_dtype = nf.get("dtype")
        writes: list[Stored | None] = []
        for k, o in enumerate(n.output):
            if not o:
                writes.append(None)
                continue
            if o in self.opaque:  # a sequence/optional/map between two ops: not a device tensor of the plan
                writes.append(Stored("ND", np.dtype(object), (), None))
                continue
            fmt = out_fmts[k] if k < len(out_fmts) and out_fmts[k] else self.tensor_formats.get(o, "ND")
            # fused into its only reader (an elementwise op, as ATC fuses them): never stored, not rounded
            dt = _elem_np(self.elem(o)) if o in self.fused else self.device_dtype(o, node_dtype)
            writes.append(self.stored_for(o, fmt, dt, c0, _plain_origin(fmt, len(self.shapes.get(o, ())))))
        return writes

    def graph_outputs(self) -> list[onnx.ValueInfoProto]:
        """Graph outputs: device buffers in the output's device format; the new graph's output list."""
        out_entries = {str(e.get("name")): e for e in self.manifest.get("outputs") or []}
        self.outputs_map: dict[str, str] = {}
        self.output_shapes: dict[str, tuple[int, ...]] = {}
        new_outputs = []
        out, stored = self.out, self.stored
        for vi in self.g.output:
            o = vi.name
            e = out_entries.get(o, {})
            dev_fmt = _norm(e.get("device_format") or e.get("format") or "ND")
            name = f"{o}__out"
            if o in self.consts:
                out.add([helper.make_node("Identity", [o], [name], name=f"output:{o}/identity")])
                stored[name] = Stored("ND", _elem_np(self.elem(o)), self.shapes.get(o, ()), None)
            else:
                buf = self.source(o, "<graph output>")
                self.materialize(buf)
                st = stored[buf]
                if same_format(dev_fmt, st.format):
                    src = buf
                else:
                    view = self.stored_for(o, dev_fmt, st.dtype, e.get("c0"), _plain_origin(dev_fmt, len(st.shape)))
                    nodes, inits = format_graph.reinterpret_nodes(buf, st.storage, view.storage, f"{buf}__as_out",
                                                                  prefix=f"output:{o}/reinterpret", opset=self.opset)
                    out.add(nodes, inits)
                    self.reinterpreted.append(f"{o} ({st.format} read as {dev_fmt} by the output transfer)")
                    src, st = f"{buf}__as_out", view
                out.add([helper.make_node("Identity", [src], [name], name=f"output:{o}/identity")])
                stored[name] = st
            self.outputs_map[o] = name
            self.output_shapes[o] = tuple(self.shapes.get(o, ()))
            new_outputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(stored[name].dtype),
                                                             list(stored[name].storage)))
        return new_outputs

    def exposed_outputs(self) -> tuple[dict[str, str], list[onnx.ValueInfoProto]]:
        """Every buffer an op reads or writes, also as a graph output (for operator dumps)."""
        exposed: dict[str, str] = {}
        new_outputs = []
        for r in self.records:
            for t, buf in r.inputs + r.outputs:
                if buf in exposed or t in self.opaque or buf not in self.stored:
                    continue
                name = f"{buf}__exposed"
                self.out.add([helper.make_node("Identity", [buf], [name], name=f"expose:{buf}")])
                exposed[buf] = name
                st = self.stored[buf]
                new_outputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(st.dtype),
                                                                 list(st.storage)))
        return exposed, new_outputs

    def build(self, expose: bool) -> PlanGraph:
        g = self.g
        new_inputs = self.graph_inputs()
        self.process(g.node)
        new_outputs = self.graph_outputs()
        exposed: dict[str, str] = {}
        if expose:
            exposed, more = self.exposed_outputs()
            new_outputs += more
        nodes = self.out.nodes
        seen: set[str] = set()
        for node in nodes:  # generated names are unique per tensor; make sure of it across tensors
            if node.name in seen:
                k = 1
                while f"{node.name}#{k}" in seen:
                    k += 1
                node.name = f"{node.name}#{k}"
            seen.add(node.name)
        del g.node[:]
        g.node.extend(nodes)
        g.initializer.extend(self.out.inits)
        kept_inputs = [vi for vi in g.input if vi.name in self.consts]
        del g.input[:]
        g.input.extend(new_inputs + kept_inputs)
        del g.output[:]
        g.output.extend(new_outputs)
        del g.value_info[:]
        td_names = [str(td.get("name")) for td in self.td_list if str(td.get("name")) in self.ran_td]
        tensor_stored = {t: self.stored[b] for t, b in self.buffer_of.items()}
        return PlanGraph(self.model, tensor_stored, self.inputs_map, self.outputs_map, self.output_shapes, td_names,
                         self.storage_ops, self.reinterpreted, self.records, dict(self.stored), exposed)


def _alias(out: _Graph, src: str, dst: str) -> None:
    out.add([helper.make_node("Identity", [src], [dst], name=f"logical:{dst}")])


def _plain_origin(fmt: Any, rank: int) -> str | None:
    """Channels-last plain layouts hold a channels-first logical tensor (NHWC of an NCHW tensor)."""
    f = _norm(fmt)
    if f in IDENTITY_PLAIN:
        return None
    try:
        entry = formats.get_format(f)
    except FormatError:
        return None
    if entry.is_plain and rank in (4, 5):
        return "NCHW" if rank == 4 else "NCDHW"
    return None


def _fill_missing_optional_inputs(g: onnx.GraphProto, weights: Mapping[str, np.ndarray]) -> None:
    """LayerNormalization without its optional bias crashes onnxruntime 1.32 when the scale is not
    a constant it can inspect: give it the zero bias the op defines."""
    for n in g.node:
        if n.op_type == "LayerNormalization" and (len(n.input) < 3 or not n.input[2]) and len(n.input) >= 2:
            scale = weights.get(n.input[1])
            if scale is None:
                scale = next((numpy_helper.to_array(i) for i in g.initializer if i.name == n.input[1]), None)
            if scale is None:
                continue
            name = f"{n.name or n.output[0]}__zero_bias"
            g.initializer.append(numpy_helper.from_array(np.zeros_like(scale), name))
            while len(n.input) < 3:
                n.input.append("")
            n.input[2] = name


def _types_and_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]], feeds=None):
    """Element type and concrete shape of every top-level tensor for these input shapes, from onnx
    shape inference; an onnxruntime run (on ``feeds``, else zeros) completes missing types. Returns
    (types, shapes, opaque names, the model with the concrete input shapes)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for vi in g.input:
        if vi.name in input_shapes and vi.type.HasField("tensor_type"):
            shp = vi.type.tensor_type.shape
            del shp.dim[:]
            for d in input_shapes[vi.name]:
                shp.dim.add().dim_value = int(d)
    del g.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # inference is best effort: the run below completes it
        inferred = m
    types: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    opaque: set[str] = set()  # sequences, optionals, maps: passed between ops as they are
    for vi in _value_infos(inferred.graph):
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None:
            if vi.type.WhichOneof("value") is not None:
                opaque.add(vi.name)
            continue
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for init in g.initializer:
        types[init.name] = init.data_type
        shapes[init.name] = tuple(init.dims)
    produced = [o for n in g.node for o in n.output if o]
    missing = [o for o in produced if o not in types and o not in opaque]
    if missing:  # types are needed everywhere; shapes only where a layout is not plain (see below)
        _shapes_by_running(m, input_shapes, missing, types, shapes, opaque, feeds)
    return types, shapes, opaque, m


def _value_infos(g: onnx.GraphProto):
    """Every value_info of ``g`` and of its If/Loop/Scan bodies (names are unique model-wide)."""
    yield from list(g.input) + list(g.value_info) + list(g.output)
    for n in g.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                for init in sub.initializer:
                    yield helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                yield from _value_infos(sub)


def _shapes_by_running(m: onnx.ModelProto, input_shapes, missing: list[str], types: dict, shapes: dict,
                       opaque: set[str], feeds=None) -> None:
    import onnxruntime as ort

    run = onnx.ModelProto()
    run.CopyFrom(m)
    have = {o.name for o in run.graph.output}
    for t in missing:
        if t not in have:
            run.graph.output.append(onnx.ValueInfoProto(name=t))
    given = dict(feeds or {})
    feeds = {}
    for vi in run.graph.input:
        if vi.name in given:
            feeds[vi.name] = given[vi.name]
        elif vi.name in input_shapes:
            feeds[vi.name] = np.zeros(input_shapes[vi.name], _elem_np(vi.type.tensor_type.elem_type))
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(run.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        values = sess.run(names, feeds)
    except Exception as e:
        raise ModelError(f"plan execution: onnxruntime cannot run the lowered graph to learn its shapes "
                         f"({str(e).splitlines()[0][:300]})",
                         hint="re-convert the model; if it persists this is a converter bug") from e
    for name, v in zip(names, values):
        if isinstance(v, np.ndarray):
            shapes.setdefault(name, tuple(v.shape))
            types.setdefault(name, helper.np_dtype_to_tensor_dtype(v.dtype))
        elif name not in types:
            opaque.add(name)


# ---------------------------------------------------------------------- ops on storage
@dataclasses.dataclass
class _StoragePlan:
    fmt: Stored                       # the layout every operand and the result share
    operands: list[tuple[str, str]]   # (kind, name): ("buffer", buf) or ("const", initializer name)
    consts: list[onnx.TensorProto]


def _storage_plan(n: onnx.NodeProto, in_fmts, writes, consts, buffer_of, stored, source, pending,
                  weights) -> _StoragePlan | None:
    """How ``n`` runs on blocked storage directly, or None when it must read logical tensors."""
    op = n.op_type
    if op not in UNARY_ELEMENTWISE and op not in BINARY_ELEMENTWISE:
        return None
    if len(n.output) != 1 or writes[0] is None or is_identity(writes[0].format):
        return None
    target = writes[0]
    acts = [(j, t) for j, t in enumerate(n.input) if t and t not in consts]
    if not acts or (op in UNARY_ELEMENTWISE and acts[0][0] != 0):
        return None
    first = None
    operands: list[tuple[str, str]] = []
    new_consts: list[onnx.TensorProto] = []
    for j, t in enumerate(n.input):
        if not t:
            operands.append(("none", ""))
            continue
        fmt = in_fmts[j] if j < len(in_fmts) else None
        if t in consts:
            if op in UNARY_ELEMENTWISE:  # Clip's min/max and the like: scalars, used as they are
                operands.append(("const", t))
                continue
            arr = weights.get(t)
            if arr is None:
                return None
            packed = _const_in_storage(arr, target)
            if packed is None:
                return None
            name = f"{t}__{target.format}_for_{n.name}"
            new_consts.append(numpy_helper.from_array(packed, name))
            operands.append(("const", name))
            continue
        if t not in buffer_of:
            return None
        buf = source(t, n.name)
        if buf in pending:  # the bytes are not built (the reader would get the logical value): no gain
            return None
        st = stored[buf]
        if not (fmt and same_format(fmt, st.format) and same_format(st.format, target.format)):
            return None
        if st.shape != target.shape or st.c0 != target.c0:
            return None
        first = first or st
        operands.append(("buffer", buf))
    if first is None:
        return None
    return _StoragePlan(first, operands, new_consts)


def _const_in_storage(arr: np.ndarray, target: Stored) -> np.ndarray | None:
    """A constant operand of an elementwise op, in a form that broadcasts against ``target``'s
    storage exactly as the logical constant broadcasts against the logical tensor (compile time)."""
    if arr.size == 1:
        return np.asarray(arr).reshape(())
    rank = len(target.shape)
    if arr.ndim > rank:
        return None
    full = (1,) * (rank - arr.ndim) + tuple(arr.shape)
    try:
        np.broadcast_shapes(full, target.shape)
    except ValueError:
        return None
    if tuple(np.broadcast_shapes(full, target.shape)) != tuple(target.shape):
        return None
    a = np.asarray(arr).reshape(full)
    kw = target._kw()
    try:
        p = formats._plan(target.format, target.shape, arr.dtype, kw.get("c0"), 1, kw.get("origin"))
        natural = len(p.stages) == 1
        if natural:
            # the constant may broadcast (size 1) only along axes that are neither split into blocks
            # nor padded: there a size-1 storage axis broadcasts exactly as the logical one does
            exp_t = p.expanded
            exp_c = [1] * len(exp_t)
            for i, k in enumerate(p.expand_pos):
                exp_c[k] = full[i]
            sp = p.stages[0]
            nb = len(sp.batch)
            for letter, axis in enumerate(p.perm):
                if letter < nb:
                    continue
                sizes, length = sp.lhs_sizes[letter - nb], sp.lengths[letter - nb]
                if (len(sizes) > 1 or math.prod(sizes) != length) and exp_c[axis] != exp_t[axis]:
                    natural = False
        if natural:
            return formats.pack(a, target.format, **kw)
        return formats.pack(np.ascontiguousarray(np.broadcast_to(a, target.shape)), target.format, **kw)
    except FormatError:
        return None


def _emit_storage_op(out: _Graph, node: onnx.NodeProto, plan: _StoragePlan, target: Stored, elem, stored,
                     buffer_of, sub_reads, read, opset) -> None:
    o = node.output[0]
    compute = _elem_np(elem(o))
    for j, (kind, name) in enumerate(plan.operands):
        if kind == "buffer":
            x = name
            if stored[name].dtype != compute:
                x = out.cast(name, f"{name}__{compute.name}_for_{node.name}", compute, f"{node.name}/in{j}_to_{compute.name}")
            node.input[j] = x
        elif kind == "const":
            node.input[j] = name
    out.inits.extend(plan.consts)
    raw = f"{o}__storage_raw"
    node.output[0] = raw
    out.nodes.append(node)
    buf = f"{o}__dev"
    if target.dtype != compute:
        out.cast(raw, buf, target.dtype, f"{node.name}/to_{target.dtype.name}")
    else:
        out.add([helper.make_node("Identity", [raw], [buf], name=f"{node.name}/stored")])
    stored[buf] = target
    buffer_of[o] = buf
    if o in sub_reads:
        _alias(out, read(o, buf, target.format, target.c0, "subgraph"), o)
