"""Build ``.om`` test files from the documented layout (``shared/reference/atc-acl-om.md`` §2).

Written independently of the reader in ``npu_deploy.converters.files.om``: the ModelDef is serialised with a
protobuf message class generated here at import time from a ``FileDescriptorProto`` that spells out
``ge_ir.proto``'s public field numbers; the header and partition tables are packed with ``struct`` from
the §2.1/§2.2 tables. Nothing is shared with the reader, so reader tests have an independent oracle.

Usage::

    from tests.standins.omfile import build_om, tensor, transdata

    path = build_om(tmp_path / "resnet.om",
                    header_version=2, table="64", soc_version="Ascend310P3",
                    inputs=[tensor("x", "float16", [1, 3, 224, 224], "NCHW")],
                    outputs=[tensor("prob", "float16", [1, 1000], "ND")],
                    ops=[transdata("trans_TransData_0", "NCHW", "NC1HWC0", [1, 3, 224, 224])])

    # dynamic batch: the input's -1 dim becomes gears, GE's extra last input is added
    build_om(tmp_path / "dyn.om", inputs=[tensor("x", "float32", [-1, 3, 8, 8])],
             outputs=[tensor("y", "float32", [-1, 10])], dynamic_batch=[1, 2, 4, 8])

    data = build_om_bytes(...)        # same keywords, returns the bytes (for fuzzing)

Conventions this builder follows (mirrored by GE, and what the ACL stand-in reads back):

* inputs are ``Data`` ops with an ``index`` attr, shape/dtype/format in ``output_desc[0]``;
  outputs are the ``input_desc`` entries of the one ``NetOutput`` op, names in the model attr
  ``attr_model_out_nodes_name``;
* tensor formats: ``TensorDescriptor.layout`` holds the primary format name; when a packed
  ge::Format word is given (an int, e.g. ``516`` = FRACTAL_Z groups 2) it is also stored as the int
  attr ``format``; ``origin_format`` is a string attr;
* ``TensorDescriptor.size`` is the device byte size (default: shape x itemsize, at the largest gear
  for gear models; pass ``size=`` in :func:`tensor` for padded device formats);
* gear models: an extra last ``Data`` input ``ascend_mbatch_shape_data`` (int32), data inputs carry
  ``_mbatch_origin_input_dims`` (dims with -1) while their ``output_desc`` has the largest gear; a
  ``Case`` op carries ``batch_num``, ``_pred_value_<i>`` (list int per gear) and
  ``mbatch_dynamic_type`` (1 batch, 2 image size, 3 dims);
* ATC's fusion mapping (accuracy-debug.md §4): ``op(..., original_names=[...])`` writes the op attr
  ``_datadump_original_op_names`` (``[]``: inserted by ATC; None: not written, the op is its own
  original node), ``tensor(..., origin=(node, index))`` an output descriptor's ``_datadump_origin_name``
  / ``_datadump_origin_output_index``; op ``inputs`` are edges ``"producer:index"`` and an output's
  ``source=`` is the NetOutput edge;
* model attrs: ``soc_version``, ``atc_version``, ``framework_type``, ``atc_cmdline`` (each when not
  None), ``memory_size``, ``weight_size``, ``stream_num``, ``event_num``, ``attr_model_out_nodes_name``,
  plus anything in ``model_attrs`` (e.g. ``{"om_info_list": [...]}``).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Iterable, Sequence

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# ------------------------------------------------------------------------------------------------
# ge_ir.proto, spelled out from the public field numbers (reference §2.4)

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# proto DataType enum values (reference §2.4)
GE_DTYPE = {
    "float32": 1, "float16": 2, "int8": 3, "uint8": 4, "int16": 5, "uint16": 6, "int32": 7,
    "int64": 8, "uint32": 9, "uint64": 10, "bool": 11, "float64": 12, "string": 13,
    "complex64": 16, "complex128": 17, "bfloat16": 27, "int4": 28, "hifloat8": 33,
    "float8_e5m2": 34, "float8_e4m3fn": 35,
}
_ITEMSIZE = {"float32": 4, "float16": 2, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4,
             "int64": 8, "uint32": 4, "uint64": 8, "bool": 1, "float64": 8, "complex64": 8,
             "complex128": 16, "bfloat16": 2, "hifloat8": 1, "float8_e5m2": 1, "float8_e4m3fn": 1}
# ge::Format primary values (reference formats.md §1.2), for the layout string of packed words
GE_FORMAT = {"NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4, "NC1HWC0_C04": 12,
             "FRACTAL_Z_C04": 13, "HWCN": 16, "C1HWNCoC0": 25, "NDHWC": 27, "FRACTAL_NZ": 29,
             "NCDHW": 30, "NDC1HWC0": 32, "FRACTAL_Z_3D": 33, "NC": 35, "NCL": 47}
_FORMAT_NAME = {v: k for k, v in GE_FORMAT.items()}


def _field(msg, name, number, ftype, label=_OPT, type_name=None, oneof=None):
    f = msg.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof
    return f


def _map(msg, name, number, value_type):
    entry = msg.nested_type.add(name=name[0].upper() + name[1:] + "Entry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=value_type)
    _field(msg, name, number, _F.TYPE_MESSAGE, _REP, f"{msg.name}.{entry.name}")


def _schema():
    fd = descriptor_pb2.FileDescriptorProto(name="standin_ge_ir.proto", package="ge.proto",
                                            syntax="proto3")
    dt = fd.enum_type.add(name="DataType")
    dt.value.add(name="DT_UNDEFINED", number=0)
    for k, v in GE_DTYPE.items():
        dt.value.add(name="DT_" + k.upper(), number=v)
    dt.value.add(name="DT_FUTURE_99", number=99)

    shape = fd.message_type.add(name="ShapeDef")
    _field(shape, "dim", 1, _F.TYPE_INT64, _REP)

    attr = fd.message_type.add(name="AttrDef")
    lv = attr.nested_type.add(name="ListValue")
    _field(lv, "s", 2, _F.TYPE_BYTES, _REP)
    _field(lv, "i", 3, _F.TYPE_INT64, _REP)
    _field(lv, "f", 4, _F.TYPE_FLOAT, _REP)
    _field(lv, "b", 5, _F.TYPE_BOOL, _REP)
    _field(lv, "td", 8, _F.TYPE_MESSAGE, _REP, ".ge.proto.TensorDescriptor")
    _field(lv, "dt", 12, _F.TYPE_INT64, _REP)
    _field(lv, "val_type", 20, _F.TYPE_INT32)
    lli = attr.nested_type.add(name="ListListInt")
    li = lli.nested_type.add(name="ListInt")
    _field(li, "list_i", 1, _F.TYPE_INT64, _REP)
    _field(lli, "list_list_i", 1, _F.TYPE_MESSAGE, _REP, ".ge.proto.AttrDef.ListListInt.ListInt")
    attr.oneof_decl.add(name="value")
    _field(attr, "list", 1, _F.TYPE_MESSAGE, type_name=".ge.proto.AttrDef.ListValue", oneof=0)
    _field(attr, "s", 2, _F.TYPE_BYTES, oneof=0)
    _field(attr, "i", 3, _F.TYPE_INT64, oneof=0)
    _field(attr, "f", 4, _F.TYPE_FLOAT, oneof=0)
    _field(attr, "b", 5, _F.TYPE_BOOL, oneof=0)
    _field(attr, "bt", 7, _F.TYPE_BYTES, oneof=0)
    _field(attr, "td", 11, _F.TYPE_MESSAGE, type_name=".ge.proto.TensorDescriptor", oneof=0)
    _field(attr, "g", 13, _F.TYPE_MESSAGE, type_name=".ge.proto.GraphDef", oneof=0)
    _field(attr, "list_list_int", 14, _F.TYPE_MESSAGE, type_name=".ge.proto.AttrDef.ListListInt", oneof=0)
    _field(attr, "dt", 15, _F.TYPE_INT64, oneof=0)

    td = fd.message_type.add(name="TensorDescriptor")
    _field(td, "name", 1, _F.TYPE_STRING)
    _field(td, "dtype", 2, _F.TYPE_ENUM, type_name=".ge.proto.DataType")
    _field(td, "shape", 3, _F.TYPE_MESSAGE, type_name=".ge.proto.ShapeDef")
    _field(td, "layout", 4, _F.TYPE_STRING)
    _map(td, "attr", 5, ".ge.proto.AttrDef")
    _field(td, "size", 10, _F.TYPE_INT64)
    _field(td, "weight_size", 11, _F.TYPE_INT64)
    _field(td, "real_dim_cnt", 16, _F.TYPE_INT64)
    _field(td, "data_offset", 18, _F.TYPE_INT64)

    op = fd.message_type.add(name="OpDef")
    _field(op, "name", 1, _F.TYPE_STRING)
    _field(op, "type", 2, _F.TYPE_STRING)
    _field(op, "input", 5, _F.TYPE_STRING, _REP)
    _map(op, "attr", 10, ".ge.proto.AttrDef")
    _field(op, "id", 21, _F.TYPE_INT64)
    _field(op, "stream_id", 22, _F.TYPE_INT64)
    _field(op, "input_name", 23, _F.TYPE_STRING, _REP)
    _field(op, "input_desc", 33, _F.TYPE_MESSAGE, _REP, ".ge.proto.TensorDescriptor")
    _field(op, "output_desc", 34, _F.TYPE_MESSAGE, _REP, ".ge.proto.TensorDescriptor")
    _field(op, "subgraph_name", 35, _F.TYPE_STRING, _REP)

    g = fd.message_type.add(name="GraphDef")
    _field(g, "name", 1, _F.TYPE_STRING)
    _field(g, "input", 4, _F.TYPE_STRING, _REP)
    _field(g, "output", 5, _F.TYPE_STRING, _REP)
    _field(g, "op", 6, _F.TYPE_MESSAGE, _REP, ".ge.proto.OpDef")
    _map(g, "attr", 11, ".ge.proto.AttrDef")

    m = fd.message_type.add(name="ModelDef")
    _field(m, "name", 1, _F.TYPE_STRING)
    _field(m, "version", 2, _F.TYPE_UINT32)
    _field(m, "custom_version", 3, _F.TYPE_STRING)
    _field(m, "graph", 7, _F.TYPE_MESSAGE, _REP, ".ge.proto.GraphDef")
    _map(m, "attr", 11, ".ge.proto.AttrDef")

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ge.proto.{name}"))
            for name in ("ModelDef", "GraphDef", "OpDef", "TensorDescriptor", "AttrDef")}


PB = _schema()
ModelDef, GraphDef, OpDef, TensorDescriptor, AttrDef = (PB[k] for k in
                                                        ("ModelDef", "GraphDef", "OpDef",
                                                         "TensorDescriptor", "AttrDef"))

# ------------------------------------------------------------------------------------------------
# specs


def tensor(name: str, dtype: str = "float16", shape: Sequence[int] = (1,), format: str | int = "ND",
           *, origin_format: str | None = None, size: int | None = None,
           origin_shape: Sequence[int] | None = None, origin: tuple[str, int] | None = None,
           source: str | None = None, shape_range: Sequence[Sequence[int]] | None = None) -> dict:
    """A tensor spec for ``inputs=``/``outputs=``/op descs. ``format`` is a name or a packed
    ge::Format word (int). ``origin_shape`` (optional) is stored as the list-int attr ``origin_shape``.
    ``origin=(node, index)`` writes ATC's fusion mapping on an output descriptor
    (``_datadump_origin_name`` / ``_datadump_origin_output_index``, accuracy-debug.md §4). ``source``
    (outputs only): the NetOutput input edge, ``"producer:index"`` (default ``"<name>:0"``).
    ``shape_range`` (``[[low, high], ...]`` per dim, high -1 unbounded) is written as the descriptor's
    list_list_int attr ``shape_range``, GE's spelling in ge_tensor.cc (a shape-range model, with
    ``is_unknown_model=1`` in the header)."""
    return {"name": name, "dtype": dtype, "shape": list(shape), "format": format,
            "origin_format": origin_format, "size": size,
            "origin_shape": list(origin_shape) if origin_shape is not None else None,
            "origin": tuple(origin) if origin is not None else None, "source": source,
            "shape_range": [list(r) for r in shape_range] if shape_range is not None else None}


def op(name: str, type: str, *, inputs: Sequence[str] = (), input_desc: Sequence[dict] = (),
       output_desc: Sequence[dict] = (), attrs: dict | None = None, engine: str | None = "AIcoreEngine",
       graph: int = 0, original_names: Sequence[str] | None = None) -> dict:
    """An op spec for ``ops=``. ``attrs`` values: str, int, float, bool, list of int/str/float,
    list of list of int. ``graph`` selects the GraphDef (0 = main; higher = extra subgraphs).
    ``original_names`` writes ``_datadump_original_op_names`` as ATC does (a string list; ``[]`` for an
    op ATC inserted); None leaves the attribute out (the op is the original node of its name)."""
    return {"name": name, "type": type, "inputs": list(inputs), "input_desc": list(input_desc),
            "output_desc": list(output_desc), "attrs": dict(attrs or {}), "engine": engine,
            "graph": graph, "original_names": list(original_names) if original_names is not None else None}


def transdata(name: str, src: str | int, dst: str | int, shape: Sequence[int], dtype: str = "float16",
              *, out_shape: Sequence[int] | None = None, inputs: Sequence[str] = (),
              attr_as_int: bool = False, engine: str = "AIcoreEngine", graph: int = 0,
              original_names: Sequence[str] | None = None, origin: tuple[str, int] | None = None) -> dict:
    """A TransData op with ``src_format``/``dst_format`` attrs (strings, or ge::Format ints when
    ``attr_as_int``) and matching input/output descriptors. ``original_names=[]`` marks it inserted by
    ATC (as real files do); ``origin`` puts the fusion mapping on its output descriptor."""
    def val(f):
        if attr_as_int:
            return f if isinstance(f, int) else GE_FORMAT[f]
        return f if isinstance(f, str) else _FORMAT_NAME[f & 0xFF]
    return op(name, "TransData", inputs=inputs,
              input_desc=[tensor(f"{name}_in", dtype, shape, src)],
              output_desc=[tensor(f"{name}_out", dtype, out_shape or shape, dst, origin=origin)],
              attrs={"src_format": val(src), "dst_format": val(dst)}, engine=engine, graph=graph,
              original_names=original_names)


def _norm(spec: Any) -> dict:
    if isinstance(spec, dict):
        base = tensor(spec["name"])
        base.update(spec)
        return base
    return tensor(*spec)


# ------------------------------------------------------------------------------------------------
# serialisation


def _set_attr(a, value: Any) -> None:
    if isinstance(value, bool):
        a.b = value
    elif isinstance(value, int):
        a.i = value
    elif isinstance(value, float):
        a.f = value
    elif isinstance(value, (str, bytes)):
        a.s = value.encode() if isinstance(value, str) else value
    elif isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (list, tuple)) for v in value):
            for row in value:
                a.list_list_int.list_list_i.add().list_i.extend(row)
        elif all(isinstance(v, bool) for v in value) and value:
            a.list.b.extend(value)
        elif all(isinstance(v, int) for v in value):
            a.list.i.extend(value)
            a.list.val_type = 2
        elif all(isinstance(v, float) for v in value):
            a.list.f.extend(value)
        else:
            a.list.s.extend(v.encode() for v in value)
            a.list.val_type = 1
    else:
        raise TypeError(f"unsupported attr value {value!r}")


def _nbytes(dtype: str, shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    if dtype == "int4":
        return (n + 1) // 2
    return n * _ITEMSIZE.get(dtype, 1)


def _fill_desc(td, spec: dict, shape: Sequence[int] | None = None) -> None:
    spec = _norm(spec)
    shape = list(spec["shape"] if shape is None else shape)
    td.name = spec["name"]
    td.dtype = GE_DTYPE.get(spec["dtype"], spec["dtype"]) if isinstance(spec["dtype"], str) else spec["dtype"]
    td.shape.dim.extend(shape)
    fmt = spec["format"]
    if isinstance(fmt, int):
        td.layout = _FORMAT_NAME.get(fmt & 0xFF, "RESERVED")
        _set_attr(td.attr["format"], fmt)
    else:
        td.layout = fmt
    if spec.get("origin_format"):
        _set_attr(td.attr["origin_format"], spec["origin_format"])
    if spec.get("origin_shape") is not None:
        _set_attr(td.attr["origin_shape"], [int(d) for d in spec["origin_shape"]])
    if spec.get("shape_range") is not None:
        _set_attr(td.attr["shape_range"], [[int(v) for v in r] for r in spec["shape_range"]])
    if spec.get("origin") is not None:
        node, index = spec["origin"]
        _set_attr(td.attr["_datadump_origin_name"], node)
        _set_attr(td.attr["_datadump_origin_output_index"], int(index))
    td.size = spec["size"] if spec.get("size") is not None else _nbytes(spec["dtype"], shape)
    td.real_dim_cnt = len(shape)


def _model_def(*, model_name: str, soc_version: str | None, atc_version: str | None,
               atc_cmdline: str | None, framework_type: str | None, inputs: list[dict],
               outputs: list[dict], ops: list[dict], gears: list[list[int]] | None, dyn_type: int,
               write_case: bool, model_attrs: dict, out_names: list[str] | None):
    md = ModelDef(name=model_name, version=2, custom_version="")
    n_graphs = 1 + max([o.get("graph", 0) for o in ops], default=0)
    graphs = [md.graph.add(name=model_name if i == 0 else f"{model_name}_sub_{i}") for i in range(n_graphs)]
    main = graphs[0]

    # substitute -1 dims by the largest gear (dims mode: in input order)
    max_gear = None
    if gears:
        max_gear = max(gears, key=lambda g: sum(g))
    pending = list(max_gear) if (max_gear is not None and dyn_type == 3) else []
    for idx, spec in enumerate(inputs):
        spec = _norm(spec)
        shape = list(spec["shape"])
        concrete = list(shape)
        if max_gear is not None:
            if dyn_type == 1:
                concrete = [max_gear[0] if d == -1 else d for d in shape]
            elif dyn_type == 2:
                hw = iter(max_gear)
                concrete = [next(hw, 1) if d == -1 else d for d in shape]
            else:
                concrete = [pending.pop(0) if d == -1 and pending else d for d in shape]
        o = main.op.add(name=spec["name"], type="Data")
        o.id = len(main.op) - 1
        _set_attr(o.attr["index"], idx)
        _set_attr(o.attr["_ge_attr_op_kernel_lib_name"], "DNN_VM_GE_LOCAL_OP_STORE")
        if max_gear is not None and -1 in shape:
            _set_attr(o.attr["_mbatch_origin_input_dims"], shape)
        _fill_desc(o.input_desc.add(), spec, concrete)
        _fill_desc(o.output_desc.add(), spec, concrete)
        main.input.append(f"{spec['name']}:0")
    if gears:
        n = len(inputs)
        dim = {1: 1, 2: 2, 3: len(gears[0])}[dyn_type]
        o = main.op.add(name=DYNAMIC_INPUT_NAME, type="Data")
        _set_attr(o.attr["index"], n)
        spec = tensor(DYNAMIC_INPUT_NAME, "int32", [dim], "ND")
        _fill_desc(o.input_desc.add(), spec)
        _fill_desc(o.output_desc.add(), spec)
        if write_case:
            c = main.op.add(name="ascend_mbatch_case", type="Case")
            c.input.append(f"{DYNAMIC_INPUT_NAME}:0")
            _set_attr(c.attr["batch_num"], len(gears))
            _set_attr(c.attr["mbatch_dynamic_type"], dyn_type)
            for i, g in enumerate(gears):
                _set_attr(c.attr[f"_pred_value_{i}"], list(g))
            _set_attr(c.attr["_ge_attr_op_kernel_lib_name"], "DNN_VM_GE_LOCAL_OP_STORE")
    for spec in ops:
        g = graphs[spec.get("graph", 0)]
        o = g.op.add(name=spec["name"], type=spec["type"])
        o.id = len(g.op) - 1
        o.input.extend(spec.get("inputs", []))
        for d in spec.get("input_desc", []):
            _fill_desc(o.input_desc.add(), d)
        for d in spec.get("output_desc", []):
            _fill_desc(o.output_desc.add(), d)
        if spec.get("engine"):
            _set_attr(o.attr["_ge_attr_op_kernel_lib_name"], spec["engine"])
        for k, v in spec.get("attrs", {}).items():
            _set_attr(o.attr[k], v)
        if spec.get("original_names") is not None:
            a = o.attr["_datadump_original_op_names"]
            a.list.s.extend(n.encode() for n in spec["original_names"])
            a.list.val_type = 1  # VT_LIST_STRING, also when empty (as ATC writes it)
    net = main.op.add(name="Node_Output", type="NetOutput")
    _set_attr(net.attr["_ge_attr_op_kernel_lib_name"], "DNN_VM_GE_LOCAL_OP_STORE")
    for spec in outputs:
        spec = _norm(spec)
        shape = list(spec["shape"])
        if max_gear is not None and dyn_type == 1:
            shape = [max_gear[0] if d == -1 else d for d in shape]
        net.input.append(spec.get("source") or f"{spec['name']}:0")
        _fill_desc(net.input_desc.add(), spec, shape)

    attrs: dict[str, Any] = {}
    if soc_version is not None:
        attrs["soc_version"] = soc_version
    if atc_version is not None:
        attrs["atc_version"] = atc_version
    if framework_type is not None:
        attrs["framework_type"] = framework_type
    if atc_cmdline is not None:
        attrs["atc_cmdline"] = atc_cmdline
    attrs.update({"memory_size": 1 << 20, "weight_size": 0, "stream_num": 1, "event_num": 0})
    attrs["attr_model_out_nodes_name"] = (out_names if out_names is not None
                                          else [f"{_norm(s)['name']}:0" for s in outputs])
    attrs.update(model_attrs)
    for k, v in attrs.items():
        _set_attr(md.attr[k], v)
    return md


DYNAMIC_INPUT_NAME = "ascend_mbatch_shape_data"


def _kernels() -> bytes:
    name = b"te_transdata_0"
    elf = b"\x7fELF" + bytes(28)
    return struct.pack("<III", 0x5D776EFD, len(name), len(elf)) + name + elf


def build_om_bytes(*, header_version: int = 2, table: str = "tiny", soc_version: str | None = "Ascend310P3",
                   model_name: str = "model", inputs: Iterable = (), outputs: Iterable = (),
                   ops: Iterable[dict] = (), dynamic_batch: Sequence[int] | None = None,
                   dynamic_hw: Sequence[Sequence[int]] | None = None,
                   dynamic_dims: Sequence[Sequence[int]] | None = None, write_case: bool = True,
                   atc_version: str | None = "7.0.0.1", atc_cmdline: str | None = None,
                   framework_type: str | None = "5", model_attrs: dict | None = None,
                   out_names: list[str] | None = None, weights: bytes = b"\0" * 64,
                   partitions: list[tuple[int, bytes]] | None = None, model_num: int = 1,
                   is_encrypt: int = 0, is_unknown_model: int = 0, model_type: int = 1,
                   platform_version: str = "1.11.z.0", platform_type: int = 1,
                   header_name: str | None = None, model_def: bytes | None = None) -> bytes:
    """Return the bytes of an ``.om`` file. See the module docstring; ``partitions`` replaces the
    default partition list ``[(0, ModelDef), (1, weights), (3, kernels), (2, task info)]`` (the order
    of real older files); ``model_def`` replaces the serialised ModelDef bytes."""
    if table not in ("tiny", "64"):
        raise ValueError("table must be 'tiny' or '64'")
    if header_version not in (1, 2):
        raise ValueError("header_version must be 1 or 2")
    if table == "64" and header_version == 1:
        raise ValueError("a version-1.0 header has no model_length, so it cannot use the 64-bit table")
    if model_num != 1 and header_version == 1:
        raise ValueError("a version-1.0 header has no model_num")
    gears, dyn_type = None, 0
    if dynamic_batch is not None:
        gears, dyn_type = [[int(b)] for b in dynamic_batch], 1
    elif dynamic_hw is not None:
        gears, dyn_type = [[int(h), int(w)] for h, w in dynamic_hw], 2
    elif dynamic_dims is not None:
        gears, dyn_type = [[int(d) for d in g] for g in dynamic_dims], 3

    if model_def is None:
        md = _model_def(model_name=model_name, soc_version=soc_version, atc_version=atc_version,
                        atc_cmdline=atc_cmdline, framework_type=framework_type, inputs=list(inputs),
                        outputs=list(outputs), ops=list(ops), gears=gears, dyn_type=dyn_type,
                        write_case=write_case, model_attrs=dict(model_attrs or {}), out_names=out_names)
        model_def = md.SerializeToString()
    if partitions is None:
        task = b"\x08\x01"  # domi.ModelTaskDef: version (1) = 1
        partitions = [(0, model_def), (1, weights), (3, _kernels()), (2, task)]

    body = bytearray()
    for _ in range(model_num):
        if table == "64":
            body += struct.pack("<I4x", len(partitions))
            off = 0
            for t, data in partitions:
                body += struct.pack("<I4xQQ", t, off, len(data))
                off += len(data)
        else:
            body += struct.pack("<I", len(partitions))
            off = 0
            for t, data in partitions:
                body += struct.pack("<III", t, off, len(data))
                off += len(data)
        for _, data in partitions:
            body += data

    head = bytearray(256)
    version = 0x20000000 if header_version == 2 else 0x10000000
    struct.pack_into("<III", head, 0, 0x444F4D49, 256, version)
    struct.pack_into("<I", head, 76, len(body) & 0xFFFFFFFF)
    head[80:84] = bytes([is_encrypt, 1, model_type, 0])
    hname = (header_name if header_name is not None else model_name).encode()[:31]
    head[84:84 + len(hname)] = hname
    struct.pack_into("<I", head, 152, 2)
    pv = platform_version.encode()[:19]
    if header_version == 2:
        struct.pack_into("<I", head, 156, model_num)
        head[160:160 + len(pv)] = pv
        head[180] = platform_type
        struct.pack_into("<Q", head, 184, len(body) if table == "64" else 0)
        head[193] = is_unknown_model
    else:
        head[156:156 + len(pv)] = pv
        head[176] = platform_type
    return bytes(head) + bytes(body)


def build_om(path: str | os.PathLike, **kwargs: Any) -> Path:
    """Write an ``.om`` built by :func:`build_om_bytes` (same keywords) to ``path``; return the path."""
    p = Path(path)
    p.write_bytes(build_om_bytes(**kwargs))
    return p


# ------------------------------------------------------------------------------------------------
# names as a real ATC 7.6 .om of an ONNX model gives them, without any fusion mapping attribute
# (shared/reference/ge-format-selection.md §8); spelled out here, independently of the reader's regexes

def inserted_name(cann_op: str, n: int) -> str:
    """A conversion ATC inserted: ``trans_TransData_3``, ``trans_Cast_2``."""
    return f"trans_{cann_op}_{n}"


def partitioned_name(onnx_node: str, cann_op: str, n: int) -> str:
    """An op of a parser subgraph: ``PartitionedCall_<onnx node>_<CANN op>_<n>``."""
    return f"PartitionedCall_{onnx_node}_{cann_op}_{n}"


def function_graph_name(onnx_node: str, n: int, k: int) -> str:
    """An op of an expanded function graph: ``<node>function_graph_<n>/<node>..._pass.<k>``."""
    return f"{onnx_node}function_graph_{n}/{onnx_node}_pass.{k}"


def fused_name(first: str, cann_op: str, second: str) -> str:
    """Two nodes fused around a CANN op: ``<bn>_BNInferenceD<prelu>``."""
    return f"{first}_{cann_op}{second}"


def output_name(producer: str, index: int, onnx_output: str) -> str:
    """A graph output: ``<producer>:<index>:<onnx output>``."""
    return f"{producer}:{index}:{onnx_output}"
