"""Read Ascend offline models (``.om``) without CANN: header, partition tables and the ModelDef.

The layout is the one ATC writes (``ModelFileHeader`` of 256 bytes starting with ``IMOD``, a 32-bit
"tiny" or a 64-bit partition table, partitions; several back to back when ``model_num > 1``). Partition 0
is a protobuf ``ge.proto.ModelDef``; it is decoded here directly from the wire format, with every length
checked against the bytes that are left, so a hostile file can only ever produce :class:`OmError`.

>>> from npu_deploy.converters.files.om import read_om, preflight_info   # doctest: +SKIP
>>> om = read_om("resnet50.om")                                     # doctest: +SKIP
>>> om.soc_version, [t.name for t in om.inputs]                     # doctest: +SKIP
('Ascend310P3', ['actual_input_1'])
>>> preflight_info("resnet50.om").dynamic_mode is None              # doctest: +SKIP
True
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from npu_deploy.errors import OmError
from npu_deploy.converters import formats

OM_MAGIC = b"IMOD"                       # MODEL_FILE_MAGIC_NUM 0x444F4D49, little-endian
HEADER_SIZE = 256
MODEL_VERSION_2 = 0x20000000             # from here on the header has model_num
OTHER_MAGICS = {b"PICO": "PICO (HiSilicon SVP / NNIE model, not an Ascend ATC .om)",
                b"PK\x03\x04": "ZIP container (the newest GE writes OM2 models as ZIPs), not a classic ATC .om"}

PARTITION_TYPES = {
    0: "MODEL_DEF", 1: "WEIGHTS_DATA", 2: "TASK_INFO", 3: "TBE_KERNELS", 4: "CUST_AICPU_KERNELS",
    5: "SO_BINS", 6: "FLOW_MODEL", 7: "FLOW_SUBMODEL", 8: "MODEL_INOUT_INFO", 9: "STATIC_TASK_DESC",
    10: "DYNAMIC_TASK_DESC", 11: "TASK_PARAM", 12: "TILING_DATA", 20: "PRE_MODEL_DESC",
    21: "PRE_MODEL_SQE", 22: "PRE_KERNEL_ARGS", 23: "PRE_MODEL_DESC_EXTEND", 24: "BUNDLE_MODEL_INFO",
    25: "BUNDLE_MODEL_VAR_INFO", 26: "CUSTOM_OPS",
}
MODEL_TYPES = {0: "IR model", 1: "standard", 2: "OM tiny", 3: "flow model", 4: "lite (exeom)", 5: "bundle"}

# ge_ir.proto `DataType` (the protobuf enum, not aclDataType and not the C++ ge::DataType) -> numpy name.
GE_PROTO_DTYPES = {
    1: "float32", 2: "float16", 3: "int8", 4: "uint8", 5: "int16", 6: "uint16", 7: "int32", 8: "int64",
    9: "uint32", 10: "uint64", 11: "bool", 12: "float64", 13: "string", 16: "complex64",
    17: "complex128", 27: "bfloat16", 28: "int4", 33: "hifloat8", 34: "float8_e5m2",
    35: "float8_e4m3fn",
}

# Names GE gives its multi-batch (gear) machinery: the extra last input, and the attributes of the
# `Case` op that selects a gear (ge_attr_define: batch_num, _pred_value_<i>, mbatch_dynamic_type).
DYNAMIC_INPUT_NAME = "ascend_mbatch_shape_data"
DYNAMIC_TYPES = {1: "batch", 2: "hw", 3: "dims"}
LAYOUT_OPS = ("TransData", "TransDataRNN", "Cast", "Transpose", "TransposeD")
INPUT_OP_TYPES = ("Data", "AippData", "AnnData")
_DESC_OPS = frozenset(LAYOUT_OPS + INPUT_OP_TYPES + ("NetOutput",))
ENGINE_ATTR = "_ge_attr_op_kernel_lib_name"

MAX_PARTITIONS = 64        # GE accepts at most ~9; anything far above is a corrupt table
MAX_MODELS = 4096
MAX_OPS = 2_000_000
MAX_GEARS = 4096
MAX_RANK = 128             # ACL_MAX_DIM_CNT
# ATC's fusion mapping (accuracy-debug.md §4): the op attr lists the original-model nodes fused into the
# op (absent: the op is the original node itself; empty: ATC inserted it); an output descriptor's
# `_datadump_origin_name` / `_datadump_origin_output_index` say which original tensor that output is.
ORIGINAL_NAMES_ATTR = "_datadump_original_op_names"
# How ATC names things when the fusion mapping attributes are absent (a real ATC 7.6 .om of an ONNX model
# for Ascend310B4, shared/reference/ge-format-selection.md §8): conversions it inserts are
# `trans_<CANN op>_<n>` (trans_TransData_3, trans_Cast_2); parser subgraph ops are
# `PartitionedCall_<onnx node>_<CANN op>_<n>`; expanded function graphs `<node>function_graph_<n>/...`;
# fused ops concatenate the fused nodes' names around the CANN op (`<bn>_BNInferenceD<prelu>`); graph
# outputs are `<producer>:<index>:<onnx output>`.
INSERTED_NAME = re.compile(r"trans_[A-Za-z][A-Za-z0-9]*_\d+")
PARTITIONED_PREFIX = "PartitionedCall_"
FUNCTION_GRAPH_MARK = "function_graph_"
OUTPUT_NAME = re.compile(r"(?P<producer>.+):(?P<index>\d+):(?P<output>.+)")


def is_inserted_name(name: str) -> bool:
    """True for the names ATC gives the conversions it inserts (``trans_TransData_12``, ``trans_Cast_2``)."""
    return INSERTED_NAME.fullmatch(name) is not None
ORIGIN_NAME_ATTR = "_datadump_origin_name"
ORIGIN_INDEX_ATTR = "_datadump_origin_output_index"
MAX_ORIGIN_INDEX = 1 << 20   # an original node with more outputs than this is a corrupt attribute
_KEEP_OP_ATTRS = ("src_format", "dst_format", "dst_type", "perm", "index", "groups",
                  "_mbatch_origin_input_dims", "input_dims", "_dynamic_aipp_input_dims",
                  "batch_num", "mbatch_dynamic_type", ORIGINAL_NAMES_ATTR)


# ---------------------------------------------------------------------------------------------------
# results

@dataclass
class OmHeader:
    """The 256-byte ``ModelFileHeader`` as written (fields of both header versions)."""

    magic: str
    headsize: int
    version: int
    version_text: str
    length: int
    is_encrypt: int
    is_checksum: int
    model_type: int
    model_type_name: str
    gen_mode: int
    name: str
    ops: int
    om_ir_version: int
    model_num: int
    platform_version: str
    platform_type: int
    model_length: int
    need_check_os_cpu_info: int
    is_unknown_model: int
    checksum_zero: bool


@dataclass
class OmPartition:
    """One partition table entry; ``offset`` is absolute in the file."""

    model_index: int
    type: int
    type_name: str
    offset: int
    size: int


@dataclass
class OmTensor:
    """A model input or output as recorded in the ModelDef (``shape`` uses -1 for dynamic dims)."""

    name: str
    dtype: str                    # numpy name ("float16"), or "ge_dtype:N" when there is none
    ge_dtype: int
    shape: list[int]
    format: str                   # "NCHW", "NC1HWC0", "FRACTAL_Z:2", "FRACTAL_NZ[C0=8]", "ge_format:77"
    format_word: int | None = None
    origin_format: str | None = None
    origin_shape: list[int] | None = None
    size: int = 0                 # device bytes (TensorDescriptor.size), largest gear for gear models
    #: per-dim ``(low, high)`` of a shape-range model (``high == -1``: unbounded), from the descriptor's
    #: ``shape_range`` attribute (see :data:`SHAPE_RANGE_ATTR`); None when not recorded
    shape_range: list[tuple[int, int]] | None = None

    @property
    def np_dtype(self):
        """The numpy dtype (ml_dtypes for bfloat16/int4/float8), or None when numpy has none."""
        import numpy as np
        try:
            return np.dtype(self.dtype)
        except TypeError:
            try:
                import ml_dtypes
                return np.dtype(getattr(ml_dtypes, self.dtype))
            except (ImportError, AttributeError, TypeError):
                return None


@dataclass
class OmOrigin:
    """The original-model tensor an op output is: output ``output_index`` of node ``name``."""

    name: str
    output_index: int


@dataclass
class OmOp:
    """An op of the ModelDef: type, where it runs, the formats on its edges and the attributes kept.

    ``inputs`` are the data edges as written (``"producer:index"``; ``":-1"`` is a control edge, ``""``
    an absent optional input). ``original_names`` is ATC's fusion mapping: the original-model nodes
    fused into this op, ``[]`` for an op ATC inserted (TransData, Cast…), None when the attribute is
    absent (the op is the original node of its own name). ``output_origins[i]`` is the original tensor
    output ``i`` stands for, when the file says so. ``id`` is the execution-order id (None when not
    written; protobuf leaves out an id of 0).
    """

    name: str
    type: str
    graph: str
    engine: str | None
    input_formats: list[str]
    output_formats: list[str]
    input_shapes: list[list[int]] = field(default_factory=list)
    output_shapes: list[list[int]] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    original_names: list[str] | None = None
    output_origins: list[OmOrigin | None] = field(default_factory=list)
    id: int | None = None


@dataclass
class OmModelDef:
    """What one ModelDef partition says: name, model attributes, graphs, I/O, gears, ops."""

    name: str
    version: int
    custom_version: str
    graphs: list[str]
    attrs: dict[str, Any]
    inputs: list[OmTensor]
    outputs: list[OmTensor]
    dynamic_mode: str | None
    gears: list[list[int]]
    op_count: int
    op_types: dict[str, int]
    engines: dict[str, int]
    layout_ops: list[OmOp]
    ops: list[OmOp] | None = None      # every op, only when read with ``keep_ops=True``


@dataclass
class OmModel:
    """Everything :func:`read_om` found. ``variant`` is ``"om"``, ``"encrypted"``, or a foreign
    container (``"PICO"``, ``"ZIP"``: maybe an OM2) that is reported, not decoded."""

    path: str
    file_size: int
    variant: str
    header: OmHeader | None
    partitions: list[OmPartition]
    models: list[OmModelDef]
    notes: list[str] = field(default_factory=list)

    @property
    def main(self) -> OmModelDef | None:
        return self.models[0] if self.models else None

    @property
    def soc_version(self) -> str | None:
        m = self.main
        v = m.attrs.get("soc_version") if m else None
        return v if isinstance(v, str) and v else None

    @property
    def inputs(self) -> list[OmTensor]:
        return self.main.inputs if self.main else []

    @property
    def outputs(self) -> list[OmTensor]:
        return self.main.outputs if self.main else []

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class OmPreflight:
    """What the runtime checks before loading: target SoC and dynamic mode.

    ``soc_version`` is None when the file does not record it (CANN 20.x) or is encrypted: do not block
    on it then. ``dynamic_mode``: None (static), ``"batch"``, ``"hw"``, ``"dims"``, ``"shape"``
    (unknown-shape model), or ``"gears"`` (gear input present but the gear list not found).
    """

    soc_version: str | None
    dynamic_mode: str | None
    batch_gears: list[int]
    dims_gears: list[list[int]]
    inputs: list[OmTensor]
    outputs: list[OmTensor]
    hw_gears: list[tuple[int, int]] = field(default_factory=list)
    atc_version: str | None = None
    encrypted: bool = False
    model_name: str = ""


# ---------------------------------------------------------------------------------------------------
# protobuf wire format, bounds-checked

class _Malformed(ValueError):
    """Bytes that are not the protobuf wire format (a ValueError: :mod:`onnx_model`'s scan reads the same
    wire format with :func:`read_varint`)."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos < end and buf[pos] < 0x80:  # the common one-byte case
        return buf[pos], pos + 1
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise _Malformed("varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Malformed("varint longer than 10 bytes")


read_varint = _varint   # the one bounds-checked varint reader of the files layer (onnx_model's scan too)


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """Yield (field number, wire type, value); LEN values are (start, end) pairs inside ``buf``."""
    pos = start
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise _Malformed("field number 0")
        if wt == 0:
            v, pos = _varint(buf, pos, end)
        elif wt == 1:
            if pos + 8 > end:
                raise _Malformed("fixed64 runs past the end of its message")
            v = buf[pos:pos + 8]
            pos += 8
        elif wt == 2:
            if pos < end and buf[pos] < 0x80:
                n = buf[pos]
                pos += 1
            else:
                n, pos = _varint(buf, pos, end)
            if n > end - pos:
                raise _Malformed(f"field {num} declares {n} bytes but only {end - pos} are left")
            v = (pos, pos + n)
            pos += n
        elif wt == 5:
            if pos + 4 > end:
                raise _Malformed("fixed32 runs past the end of its message")
            v = buf[pos:pos + 4]
            pos += 4
        else:
            raise _Malformed(f"field {num} has unsupported wire type {wt}")
        yield num, wt, v


def _expect(num: int, wt: int, want: int, what: str) -> None:
    if wt != want:
        raise _Malformed(f"{what} (field {num}) has wire type {wt}, expected {want}")


def _text(buf: bytes, span: tuple[int, int]) -> str:
    return buf[span[0]:span[1]].decode("utf-8", errors="replace")


def _ints(buf: bytes, num: int, wt: int, v: Any, out: list[int], what: str) -> None:
    """Append a repeated int64 field's values, packed (LEN) or not (VARINT)."""
    if wt == 0:
        out.append(_signed64(v))
    elif wt == 2:
        pos, end = v
        while pos < end:
            x, pos = _varint(buf, pos, end)
            out.append(_signed64(x))
    else:
        raise _Malformed(f"{what} (field {num}) has wire type {wt}")


def _floats(buf: bytes, num: int, wt: int, v: Any, out: list[float], what: str) -> None:
    if wt == 5:
        out.append(struct.unpack("<f", v)[0])
    elif wt == 2:
        s, e = v
        if (e - s) % 4:
            raise _Malformed(f"{what} (field {num}): packed floats not a multiple of 4 bytes")
        out.extend(x for (x,) in struct.iter_unpack("<f", buf[s:e]))
    else:
        raise _Malformed(f"{what} (field {num}) has wire type {wt}")


def _clean_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _list_value(buf: bytes, span: tuple[int, int]) -> list:
    strs: list[str] = []
    ints: list[int] = []
    floats: list[float] = []
    bools: list[int] = []
    others = 0
    for num, wt, v in _fields(buf, *span):
        if num in (2, 7):
            _expect(num, wt, 2, "AttrDef.ListValue bytes")
            strs.append(_text(buf, v))
        elif num in (3, 12):
            _ints(buf, num, wt, v, ints, "AttrDef.ListValue ints")
        elif num == 4:
            _floats(buf, num, wt, v, floats, "AttrDef.ListValue floats")
        elif num == 5:
            _ints(buf, num, wt, v, bools, "AttrDef.ListValue bools")
        elif num in (8, 9, 10, 11):
            others += 1
    if strs:
        return strs
    if floats:
        return [_clean_float(x) for x in floats]
    if bools and not ints:
        return [bool(b) for b in bools]
    if ints:
        return ints
    return [f"<{others} nested values>"] if others else []


def _list_list_int(buf: bytes, span: tuple[int, int]) -> list[list[int]]:
    out: list[list[int]] = []
    for num, wt, v in _fields(buf, *span):
        if num == 1:
            _expect(num, wt, 2, "ListListInt.list_list_i")
            row: list[int] = []
            for n2, w2, v2 in _fields(buf, *v):
                if n2 == 1:
                    _ints(buf, n2, w2, v2, row, "ListInt.list_i")
            out.append(row)
    return out


def _attr_def(buf: bytes, span: tuple[int, int]) -> Any:
    value: Any = None
    for num, wt, v in _fields(buf, *span):
        if num == 1:
            _expect(num, wt, 2, "AttrDef.list")
            value = _list_value(buf, v)
        elif num in (2, 7):
            _expect(num, wt, 2, "AttrDef.s")
            value = _text(buf, v)
        elif num in (3, 15):
            _expect(num, wt, 0, "AttrDef.i")
            value = _signed64(v)
        elif num == 4:
            _expect(num, wt, 5, "AttrDef.f")
            value = _clean_float(struct.unpack("<f", v)[0])
        elif num == 5:
            _expect(num, wt, 0, "AttrDef.b")
            value = bool(v)
        elif num == 14:
            _expect(num, wt, 2, "AttrDef.list_list_int")
            value = _list_list_int(buf, v)
        elif num in (10, 11, 12, 13, 16):
            _expect(num, wt, 2, "AttrDef nested value")
            value = {10: "<func>", 11: "<tensor_desc>", 12: "<tensor>", 13: "<graph>",
                     16: "<list_list_float>"}[num]
    return value


_SKIP = object()


def _attr_entry(buf: bytes, span: tuple[int, int], wanted=None) -> tuple[str, Any]:
    """A ``map<string, AttrDef>`` entry: key (1), value (2). The value is decoded only when
    ``wanted(raw_key_bytes)`` (all when ``wanted`` is None); otherwise ``_SKIP`` comes back."""
    key = b""
    value_span = None
    for num, wt, v in _fields(buf, *span):
        if num == 1:
            _expect(num, wt, 2, "attr map key")
            key = buf[v[0]:v[1]]
        elif num == 2:
            _expect(num, wt, 2, "attr map value")
            value_span = v
    if wanted is not None and not wanted(key):
        return "", _SKIP
    text = key.decode("utf-8", errors="replace")
    return text, (_attr_def(buf, value_span) if value_span is not None else None)


# GE keeps a tensor's shape range among the descriptor's attributes as a list_list_int named "shape_range",
# one [low, high] row per dim, high -1 for unbounded (GE's graph library, ge_tensor.cc:
# TENSOR_UTILS_SHAPE_RANGE = "shape_range", serialised with the descriptor's other attributes by
# GeTensorDescAsProto). No real shape-range .om was available: the tests build files with that spelling
# (tests/standins/omfile.py), so this is verified against GE's source text only.
SHAPE_RANGE_ATTR = "shape_range"
_DESC_ATTRS = frozenset({b"format", b"origin_format", b"origin_shape", ORIGIN_NAME_ATTR.encode(),
                         ORIGIN_INDEX_ATTR.encode(), SHAPE_RANGE_ATTR.encode()})
_OP_ATTRS = frozenset(k.encode() for k in (*_KEEP_OP_ATTRS, ENGINE_ATTR))


def _op_attr_wanted(key: bytes) -> bool:
    return key in _OP_ATTRS or key.startswith(b"_pred_value_")


@dataclass
class _Desc:
    name: str = ""
    dtype: int = 0
    shape: list[int] = field(default_factory=list)
    layout: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    size: int = 0


def _tensor_desc(buf: bytes, span: tuple[int, int]) -> _Desc:
    d = _Desc()
    for num, wt, v in _fields(buf, *span):
        if num == 1:
            _expect(num, wt, 2, "TensorDescriptor.name")
            d.name = _text(buf, v)
        elif num == 2:
            _expect(num, wt, 0, "TensorDescriptor.dtype")
            d.dtype = v
        elif num == 3:
            _expect(num, wt, 2, "TensorDescriptor.shape")
            dims: list[int] = []
            for n2, w2, v2 in _fields(buf, *v):
                if n2 == 1:
                    _ints(buf, n2, w2, v2, dims, "ShapeDef.dim")
            if len(dims) > MAX_RANK:
                raise _Malformed(f"tensor descriptor with an absurd rank of {len(dims)}")
            d.shape = dims
        elif num == 4:
            _expect(num, wt, 2, "TensorDescriptor.layout")
            d.layout = _text(buf, v)
        elif num == 5:
            _expect(num, wt, 2, "TensorDescriptor.attr")
            k, val = _attr_entry(buf, v, _DESC_ATTRS.__contains__)
            if val is not _SKIP:
                d.attrs[k] = val
        elif num == 10:
            _expect(num, wt, 0, "TensorDescriptor.size")
            d.size = _signed64(v)
    return d


@dataclass
class _Op:
    name: str = ""
    type: str = ""
    id: int | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    input_desc: list[_Desc] = field(default_factory=list)
    output_desc: list[_Desc] = field(default_factory=list)
    # byte spans, decoded only for the ops whose descriptors or inputs are reported
    in_spans: list[tuple[int, int]] = field(default_factory=list)
    out_spans: list[tuple[int, int]] = field(default_factory=list)
    input_spans: list[tuple[int, int]] = field(default_factory=list)

    def decode_descs(self, buf: bytes) -> None:
        self.input_desc = [_tensor_desc(buf, sp) for sp in self.in_spans]
        self.output_desc = [_tensor_desc(buf, sp) for sp in self.out_spans]

    def inputs(self, buf: bytes) -> list[str]:
        return [_text(buf, sp) for sp in self.input_spans]


def _op_def(buf: bytes, span: tuple[int, int], all_descs: bool) -> _Op:
    op = _Op()
    for num, wt, v in _fields(buf, *span):
        if num == 1:
            _expect(num, wt, 2, "OpDef.name")
            op.name = _text(buf, v)
        elif num == 2:
            _expect(num, wt, 2, "OpDef.type")
            op.type = _text(buf, v)
        elif num == 5:
            _expect(num, wt, 2, "OpDef.input")
            op.input_spans.append(v)
        elif num == 21:
            _expect(num, wt, 0, "OpDef.id")
            op.id = _signed64(v)
        elif num == 10:
            _expect(num, wt, 2, "OpDef.attr")
            k, val = _attr_entry(buf, v, _op_attr_wanted)
            if val is not _SKIP:
                op.attrs[k] = val
        elif num == 33:
            _expect(num, wt, 2, "OpDef.input_desc")
            op.in_spans.append(v)
        elif num == 34:
            _expect(num, wt, 2, "OpDef.output_desc")
            op.out_spans.append(v)
    if all_descs or op.type in _DESC_OPS:
        op.decode_descs(buf)
    return op


def _graph_def(buf: bytes, span: tuple[int, int], budget: list[int],
               all_descs: bool) -> tuple[str, list[_Op]]:
    name = ""
    ops: list[_Op] = []
    for num, wt, v in _fields(buf, *span):
        if num == 1:
            _expect(num, wt, 2, "GraphDef.name")
            name = _text(buf, v)
        elif num == 6:
            _expect(num, wt, 2, "GraphDef.op")
            budget[0] -= 1
            if budget[0] < 0:
                raise _Malformed(f"more than {MAX_OPS} ops")
            ops.append(_op_def(buf, v, all_descs))
    return name, ops


# ---------------------------------------------------------------------------------------------------
# formats and dtypes

def format_text(value: Any) -> str:
    """Render a ge::Format (an int, possibly a packed word with sub-format/C0, or a name such as
    ``"FORMAT_NCHW"`` or ``"FRACTAL_Z:2"``) as text; formats not in the registry stay visible as
    ``ge_format:N`` or as written.

    >>> format_text(3), format_text(516), format_text("FORMAT_NCHW"), format_text(29 | 4 << 24)
    ('NC1HWC0', 'FRACTAL_Z:2', 'NCHW', 'FRACTAL_NZ[C0=8]')
    """
    if value is None or value == "":
        return "?"
    if isinstance(value, bool):
        return f"ge_format:{int(value)}"

    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit() and len(text) < 12:
            return format_text(int(text))
        try:
            return _word_text(formats.parse_format(text))
        except Exception:  # not a registry name (e.g. a GE-only format): show it as written
            return text[len("FORMAT_"):] if text.startswith("FORMAT_") else text
    if isinstance(value, int):
        try:
            return _word_text(formats.decode_format_word(value))
        except Exception:  # not in the registry: name it from the ge::Format table, if it is there
            names = {v: k for k, v in formats.GE_FORMATS.items()}
            if 0 <= value <= 0x0FFFFFFF and (value & 0xFF) in names:
                sub = (value >> 8) & 0xFFFF
                return names[value & 0xFF] + (f":{sub}" if sub else "") + \
                    (f"[C0bits={value >> 24}]" if value >> 24 else "")
            return f"ge_format:{value}"
    return "?"


def _word_text(word: Any) -> str:
    text = getattr(word.format, "name", str(word.format))
    if word.sub_format:
        text += f":{word.sub_format}"
    if word.c0:
        text += f"[C0={word.c0}]"
    return text


def _dtype_name(ge: int) -> str:
    return GE_PROTO_DTYPES.get(ge, f"ge_dtype:{ge}")


def _desc_format(d: _Desc) -> tuple[str, int | None]:
    word = d.attrs.get("format")
    if isinstance(word, int) and not isinstance(word, bool):
        return format_text(word), word
    if isinstance(word, str) and word:
        return format_text(word), None
    return format_text(d.layout) if d.layout else "?", None


def _tensor(d: _Desc, name: str, shape: list[int] | None = None) -> OmTensor:
    fmt, word = _desc_format(d)
    origin = d.attrs.get("origin_format")
    oshape = d.attrs.get("origin_shape")
    return OmTensor(
        name=name, dtype=_dtype_name(d.dtype), ge_dtype=d.dtype,
        shape=list(shape if shape is not None else d.shape), format=fmt, format_word=word,
        origin_format=format_text(origin) if origin not in (None, "") else None,
        origin_shape=list(oshape) if isinstance(oshape, list) and all(isinstance(x, int) for x in oshape)
        else None,
        size=d.size, shape_range=_shape_range(d.attrs.get(SHAPE_RANGE_ATTR), len(shape if shape is not None
                                                                                 else d.shape)))


def _shape_range(value: Any, rank: int) -> list[tuple[int, int]] | None:
    """``[[low, high], ...]`` with one row per dim (``0 <= low``, ``high == -1`` or ``low <= high``), else
    None: a malformed range is not guessed at."""
    if not isinstance(value, list) or len(value) != rank or rank == 0:
        return None
    out = []
    for row in value:
        if not (isinstance(row, list) and len(row) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in row)):
            return None
        lo, hi = row
        if lo < 0 or (hi != -1 and hi < lo):
            return None
        out.append((lo, hi))
    return out


def _int_list(v: Any) -> list[int] | None:
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    return None


def _origin(d: _Desc, position: int) -> OmOrigin | None:
    """The original tensor an output descriptor names, or None (attribute absent or unusable)."""
    name = d.attrs.get(ORIGIN_NAME_ATTR)
    if not isinstance(name, str) or not name:
        return None
    index = d.attrs.get(ORIGIN_INDEX_ATTR, position)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= MAX_ORIGIN_INDEX:
        index = position
    return OmOrigin(name, index)


def _original_names(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return list(value)
    return []   # present but not a list of names: treat as "no original node", never guess


def _om_op(op: _Op, graph: str, engine: str | None, buf: bytes) -> OmOp:
    return OmOp(name=op.name, type=op.type, graph=graph, engine=engine,
                input_formats=[_desc_format(d)[0] for d in op.input_desc],
                output_formats=[_desc_format(d)[0] for d in op.output_desc],
                input_shapes=[list(d.shape) for d in op.input_desc],
                output_shapes=[list(d.shape) for d in op.output_desc],
                attrs={k: (format_text(v) if k in ("src_format", "dst_format") else v)
                       for k, v in op.attrs.items() if k in _KEEP_OP_ATTRS},
                inputs=op.inputs(buf), original_names=_original_names(op.attrs.get(ORIGINAL_NAMES_ATTR)),
                output_origins=[_origin(d, i) for i, d in enumerate(op.output_desc)], id=op.id)


def _summarise(buf: bytes, span: tuple[int, int], keep_ops: bool = False) -> OmModelDef:
    name, custom = "", ""
    version = 0
    attrs: dict[str, Any] = {}
    graphs: list[tuple[str, list[_Op]]] = []
    budget = [MAX_OPS]
    for num, wt, v in _fields(buf, *span):
        if num == 1:
            _expect(num, wt, 2, "ModelDef.name")
            name = _text(buf, v)
        elif num == 2:
            _expect(num, wt, 0, "ModelDef.version")
            version = _signed64(v)
        elif num == 3:
            _expect(num, wt, 2, "ModelDef.custom_version")
            custom = _text(buf, v)
        elif num == 7:
            _expect(num, wt, 2, "ModelDef.graph")
            graphs.append(_graph_def(buf, v, budget, keep_ops))
        elif num == 11:
            _expect(num, wt, 2, "ModelDef.attr")
            k, val = _attr_entry(buf, v)
            attrs[k] = val

    main_ops = graphs[0][1] if graphs else []
    # inputs: Data ops of the main graph, by their `index` attr when present, else by appearance
    data = [op for op in main_ops if op.type in INPUT_OP_TYPES]
    keyed = [(op.attrs.get("index") if isinstance(op.attrs.get("index"), int) else None, k, op)
             for k, op in enumerate(data)]
    if all(idx is not None for idx, _, _ in keyed):
        keyed.sort(key=lambda t: (t[0], t[1]))
    inputs = []
    for _, _, op in keyed:
        d = op.output_desc[0] if op.output_desc else (op.input_desc[0] if op.input_desc else _Desc())
        origin = _int_list(op.attrs.get("_mbatch_origin_input_dims"))
        inputs.append(_tensor(d, op.name, origin))
    outputs: list[OmTensor] = []
    net = [op for op in main_ops if op.type == "NetOutput"]
    if net:
        names = model_out_names(attrs.get("attr_model_out_nodes_name"))
        edges = net[0].inputs(buf)
        for i, d in enumerate(net[0].input_desc):
            label = names[i] if i < len(names) else (d.name or (edges[i] if i < len(edges) else f"output_{i}"))
            outputs.append(_tensor(d, label))

    op_types: Counter[str] = Counter()
    engines: Counter[str] = Counter()
    layout_ops: list[OmOp] = []
    all_ops: list[OmOp] | None = [] if keep_ops else None
    dynamic_mode: str | None = None
    gears: list[list[int]] = []
    for gname, ops in graphs:
        for op in ops:
            op_types[op.type] += 1
            engine = op.attrs.get(ENGINE_ATTR)
            engine = engine if isinstance(engine, str) and engine else None
            engines[engine or "(not recorded)"] += 1
            if op.type in LAYOUT_OPS or all_ops is not None:
                brief = _om_op(op, gname, engine, buf)
                if op.type in LAYOUT_OPS:
                    layout_ops.append(brief)
                if all_ops is not None:
                    all_ops.append(brief)
            if not gears and isinstance(op.attrs.get("batch_num"), int):
                n = op.attrs["batch_num"]
                if not 0 < n <= MAX_GEARS:
                    raise _Malformed(f"op {op.name!r} has an absurd gear count batch_num={n}")
                found = [_int_list(op.attrs.get(f"_pred_value_{i}")) for i in range(n)]
                if all(g is not None for g in found):
                    gears = [list(g) for g in found]  # type: ignore[arg-type]
                    dtype = op.attrs.get("mbatch_dynamic_type")
                    dynamic_mode = DYNAMIC_TYPES.get(dtype) if isinstance(dtype, int) else None
                    if dynamic_mode is None:
                        dynamic_mode = "batch" if all(len(g) == 1 for g in gears) else "dims"
    if dynamic_mode is None and any(t.name == DYNAMIC_INPUT_NAME for t in inputs):
        dynamic_mode = "gears"
    if dynamic_mode is None and any(t.shape_range and any(lo != hi for lo, hi in t.shape_range) for t in inputs):
        dynamic_mode = "shape"
    return OmModelDef(name=name, version=version, custom_version=custom, graphs=[g for g, _ in graphs],
                      attrs={k: v for k, v in sorted(attrs.items())}, inputs=inputs, outputs=outputs,
                      dynamic_mode=dynamic_mode, gears=gears, op_count=sum(op_types.values()),
                      op_types=dict(op_types.most_common()), engines=dict(engines.most_common()),
                      layout_ops=layout_ops, ops=all_ops)


def model_out_names(value: Any) -> list[str]:
    """Output names from ``attr_model_out_nodes_name``, whose entries look like ``"node:0"``."""
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return [re.sub(r":\d+$", "", x) for x in value]
    return []


# ---------------------------------------------------------------------------------------------------
# the container

def _cstr(b: bytes) -> str:
    return bytes(b).split(b"\0", 1)[0].decode("utf-8", errors="replace")


def _parse_header(raw: bytes) -> OmHeader:
    magic, headsize, version = struct.unpack_from("<III", raw, 0)
    (length,) = struct.unpack_from("<I", raw, 76)
    is_encrypt, is_checksum, modeltype, genmode = raw[80], raw[81], raw[82], raw[83]
    (ops,) = struct.unpack_from("<I", raw, 116)
    (om_ir_version,) = struct.unpack_from("<I", raw, 152)
    if version >= MODEL_VERSION_2:
        (model_num,) = struct.unpack_from("<I", raw, 156)
        platform_version, platform_type = raw[160:180], raw[180]
        (model_length,) = struct.unpack_from("<Q", raw, 184)
        need_check, unknown = raw[192], raw[193]
    else:  # version 1.0 has no model_num: the platform fields sit 4 bytes earlier
        model_num, platform_version, platform_type = 1, raw[156:176], raw[176]
        model_length, need_check, unknown = 0, 0, 0
    major = version >> 28
    return OmHeader(
        magic=bytes(raw[:4]).decode("latin-1"), headsize=headsize, version=version,
        version_text=f"{major}.0" if version & 0x0FFFFFFF == 0 else f"0x{version:08X}",
        length=length, is_encrypt=is_encrypt, is_checksum=is_checksum, model_type=modeltype,
        model_type_name=MODEL_TYPES.get(modeltype, f"unknown ({modeltype})"), gen_mode=genmode,
        name=_cstr(raw[84:116]), ops=ops, om_ir_version=om_ir_version, model_num=model_num,
        platform_version=_cstr(platform_version), platform_type=platform_type,
        model_length=model_length, need_check_os_cpu_info=need_check, is_unknown_model=unknown,
        checksum_zero=not any(raw[12:76]))


def _err(path: str, what: str, hint: str | None = None) -> OmError:
    return OmError(f"{path}: {what}", hint=hint)


def is_om(path: str | os.PathLike) -> bool:
    """True when the file starts with the ATC ``.om`` magic ``IMOD`` (the name does not matter).

    >>> is_om(__file__)
    False
    """
    try:
        with open(path, "rb") as f:
            return f.read(4) == OM_MAGIC
    except OSError:
        return False


def read_om(path: str | os.PathLike, *, keep_ops: bool = False) -> OmModel:
    """Read an ``.om`` file: header, partition tables and a summary of each ModelDef.

    Raises :class:`OmError` (one line, exit 2) for anything that is not a well-formed ATC ``.om``:
    wrong magic, truncation, a table pointing outside the file, absurd counts, malformed protobuf.
    Encrypted files and foreign containers (PICO, OM2 zip) come back with ``variant`` set and
    nothing decoded. ``keep_ops=True`` also lists every op with its formats, input edges and ATC's
    fusion mapping (``models[i].ops``; used by ``runtime.check.against``).

    >>> om = read_om("model.om")                                  # doctest: +SKIP
    >>> om.header.version_text, [p.type_name for p in om.partitions][:2]   # doctest: +SKIP
    ('2.0', ['MODEL_DEF', 'WEIGHTS_DATA'])
    """
    spath = os.fspath(path)
    try:
        f = open(spath, "rb")
    except FileNotFoundError:
        raise _err(spath, "no such file", "check the path") from None
    except IsADirectoryError:
        raise _err(spath, "is a folder, not an .om file", "give the .om file itself") from None
    except OSError as e:
        raise _err(spath, f"cannot open ({e.strerror})") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(HEADER_SIZE)
        if raw[:4] in OTHER_MAGICS:
            return OmModel(path=spath, file_size=size, variant=OTHER_MAGICS[raw[:4]].split()[0],
                           header=None, partitions=[], models=[],
                           notes=[f"{OTHER_MAGICS[raw[:4]]}; not decoded"])
        if raw[:4] != OM_MAGIC:
            raise _err(spath, f"not an ATC .om (starts with {raw[:4]!r}, want b'IMOD')",
                       "pass the .om written by ATC")
        if len(raw) < HEADER_SIZE:
            raise _err(spath, f"truncated: {size} bytes, shorter than the 256-byte .om header")
        header = _parse_header(raw)
        if header.headsize != HEADER_SIZE:
            raise _err(spath, f"header size field is {header.headsize}, expected 256",
                       "the file is corrupt or from an unknown ATC version")
        if header.is_encrypt:
            return OmModel(path=spath, file_size=size, variant="encrypted", header=header,
                           partitions=[], models=[],
                           notes=["encrypted model (is_encrypt=1): partitions and ModelDef cannot be read "
                                  "without the key"])
        body = header.model_length or header.length
        if body != size - HEADER_SIZE:
            state = "truncated" if body > size - HEADER_SIZE else "has trailing bytes"
            raise _err(spath, f"{state}: the header says the body is {body} bytes, the file has "
                       f"{size - HEADER_SIZE} after the header",
                       "re-copy the file; GE rejects such files too (E10003)")
        if not 1 <= header.model_num <= MAX_MODELS:
            raise _err(spath, f"absurd model_num {header.model_num} in the header")
        wide = header.model_length != 0 or header.model_type == 3
        partitions, notes = _read_tables(f, spath, size, header.model_num, wide)
        models: list[OmModelDef] = []
        for mi in range(header.model_num):
            part = next((p for p in partitions if p.model_index == mi and p.type == 0), None)
            if part is None:
                notes.append(f"model {mi}: no MODEL_DEF partition ({header.model_type_name}); "
                             "partitions listed only")
                continue
            f.seek(part.offset)
            blob = f.read(part.size)
            if len(blob) != part.size:
                raise _err(spath, f"MODEL_DEF of model {mi} is cut short")
            try:
                models.append(_summarise(blob, (0, len(blob)), keep_ops))
            except _Malformed as e:
                raise _err(spath, f"malformed ModelDef protobuf in model {mi} at byte {part.offset}: {e}",
                           "the file is corrupt or not an ATC .om") from None
            except RecursionError:
                raise _err(spath, f"malformed ModelDef protobuf in model {mi}: nested too deeply") from None
    return OmModel(path=spath, file_size=size, variant="om", header=header, partitions=partitions,
                   models=models, notes=notes)


def _read_tables(f, path: str, size: int, model_num: int, wide: bool) -> tuple[list[OmPartition], list[str]]:
    entry, head, fmt = (24, 8, "<I4xQQ") if wide else (12, 4, "<III")
    off = HEADER_SIZE
    partitions: list[OmPartition] = []
    notes: list[str] = []
    for mi in range(model_num):
        if off + head > size:
            raise _err(path, f"partition table of model {mi} at byte {off} runs past the end of the file "
                       f"({size} bytes)")
        f.seek(off)
        (num,) = struct.unpack("<I", f.read(4))
        if num > MAX_PARTITIONS or off + head + entry * num > size:
            raise _err(path, f"absurd partition count {num} in the table of model {mi} at byte {off}",
                       "the file is corrupt or truncated")
        f.seek(off + head)
        table = f.read(entry * num)
        data_start = off + head + entry * num
        running = 0
        end = data_start
        seen: set[int] = set()
        for k in range(num):
            ptype, poff, psize = struct.unpack_from(fmt, table, entry * k)
            if ptype in seen:
                raise _err(path, f"partition type {ptype} appears twice in the table of model {mi}")
            seen.add(ptype)
            start = data_start + poff
            if start + psize > size:
                raise _err(path, f"partition {k} ({PARTITION_TYPES.get(ptype, ptype)}) of model {mi} spans "
                           f"bytes {start}..{start + psize}, past the end of the file ({size} bytes)")
            if poff != running:
                notes.append(f"model {mi}: partition {k} at offset {poff}, expected {running} from the "
                             "sizes (aligned layout?)")
            running += psize
            end = max(end, start + psize)
            partitions.append(OmPartition(mi, ptype, PARTITION_TYPES.get(ptype, f"UNKNOWN_{ptype}"),
                                          start, psize))
        off = max(end, data_start + running)
        if off > size:
            raise _err(path, f"the partitions of model {mi} end at byte {off}, past the end of the file "
                       f"({size} bytes)")
    if off != size:
        raise _err(path, f"the partitions end at byte {off} but the file is {size} bytes",
                   "the file is corrupt or has an unknown layout")
    return partitions, notes


def preflight_info(path: str | os.PathLike) -> OmPreflight:
    """The facts the ACL backend checks against the device before loading an ``.om``.

    >>> p = preflight_info("yolov3_dynamic_batch.om")   # doctest: +SKIP
    >>> p.soc_version, p.dynamic_mode, p.batch_gears    # doctest: +SKIP
    ('Ascend310P3', 'batch', [1, 2, 4, 8])
    """
    om = read_om(path)
    if om.variant not in ("om", "encrypted"):
        raise OmError(f"{om.path}: {om.notes[0] if om.notes else om.variant}",
                      hint="the ACL backend loads ATC .om files only")
    m = om.main
    if m is None:
        if om.variant == "encrypted":
            return OmPreflight(soc_version=None, dynamic_mode=None, batch_gears=[], dims_gears=[],
                               inputs=[], outputs=[], encrypted=True,
                               model_name=om.header.name if om.header else "")
        raise OmError(f"{om.path}: no MODEL_DEF partition, so its SoC and inputs are unknown",
                      hint="re-convert the model with ATC --mode=0")
    mode = m.dynamic_mode
    if mode is None and om.header is not None and (om.header.is_unknown_model == 1 or
                                                    (om.header.version >= MODEL_VERSION_2 and
                                                     om.header.model_num > 1)):
        mode = "shape"
    batch = [g[0] for g in m.gears] if mode == "batch" else []
    hw = [(g[0], g[1]) for g in m.gears if len(g) == 2] if mode == "hw" else []
    dims = [list(g) for g in m.gears] if mode == "dims" else []
    atc = m.attrs.get("atc_version")
    return OmPreflight(soc_version=om.soc_version, dynamic_mode=mode, batch_gears=batch, dims_gears=dims,
                       inputs=m.inputs, outputs=m.outputs, hw_gears=hw,
                       atc_version=atc if isinstance(atc, str) else None,
                       model_name=m.name or (om.header.name if om.header else ""))
