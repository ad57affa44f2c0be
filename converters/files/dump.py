"""ACL operator dump files, read and written: one file per executed op, its input and output tensors
in the device format and storage shape the op saw (``../shared/reference/accuracy-debug.md`` §2-3).

A dump file is ``uint64 header_len`` (little-endian), a ``toolkit.dumpdata.DumpData`` protobuf of
``header_len`` bytes, then the raw bytes of every input in order and every output, each exactly its
``size``. The protobuf schema is built here as a descriptor (no ``.proto`` compiled at install) and read
by the protobuf runtime that onnx already brings; unknown fields are ignored, so newer dumps read too.
Every size is checked against the file before any slice: a damaged file is one :class:`DumpError`
(exit 2) naming the file and the field.

>>> from npu_deploy.converters.files.dump import read_dump              # doctest: +SKIP
>>> d = read_dump("dump/Add.add_1.5.1.1682067845380164")           # doctest: +SKIP
>>> d.op_type, [t.format for t in d.outputs], d.outputs[0].logical().shape   # doctest: +SKIP
('Add', ['FRACTAL_NZ'], (8, 20))

Folder layout of an offline-model dump: ``{dump_path}/{time}/{device_id}/{model_name}/{model_id}/
{iteration}/`` holds the files, named ``{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp_us}`` with
``/`` in names written ``_``; a name too long for the file system is replaced by a random one and listed
in ``mapping.csv`` (rows: new name, original name). :func:`dump_run_folder` builds the path,
:func:`write_dump_folder` / :func:`read_dump_folder` write and read one iteration folder.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import os
import re
import secrets
import struct
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from npu_deploy._io import atomic_write, make_output_folder
from npu_deploy.converters import formats
from npu_deploy.errors import FormatError, InputError

__all__ = ["DT", "DumpError", "DumpTensor", "DumpFile", "read_dump", "write_dump", "dump_file_name",
           "write_dump_folder", "read_dump_folder", "dump_run_folder", "find_dump_folders", "dt_number",
           "looks_like_dump", "parse_tensor_choice", "pick_tensor", "onnx_output_indices", "MAPPING_CSV"]


class DumpError(InputError):
    """A dump file or folder cannot be read: truncated, sizes beyond the file, unknown dtype or format
    (exit 2). The message names the file and the field."""


# --------------------------------------------------------------------------------------- the enums
DT: dict[int, np.dtype] = {
    1: np.dtype(np.float32), 2: np.dtype(np.float16), 3: np.dtype(np.int8), 4: np.dtype(np.uint8),
    5: np.dtype(np.int16), 6: np.dtype(np.uint16), 7: np.dtype(np.int32), 8: np.dtype(np.int64),
    9: np.dtype(np.uint32), 10: np.dtype(np.uint64), 11: np.dtype(np.bool_), 12: np.dtype(np.float64),
}
"""Dump ``OutputDataType`` number -> numpy dtype (reference §2; ``DT_INT4`` = 28 has no numpy type).
These are the dump proto's own numbers, not aclDataType (DT_FLOAT16 is 2 here, ACL_FLOAT16 is 1)."""
DT[27] = formats.normalize_dtype("bfloat16")  # ml_dtypes, a dependency of onnx and of npu-deploy

_DT_NAMES = {0: "DT_UNDEFINED", 1: "DT_FLOAT", 2: "DT_FLOAT16", 3: "DT_INT8", 4: "DT_UINT8", 5: "DT_INT16",
             6: "DT_UINT16", 7: "DT_INT32", 8: "DT_INT64", 9: "DT_UINT32", 10: "DT_UINT64", 11: "DT_BOOL",
             12: "DT_DOUBLE", 27: "DT_BF16", 28: "DT_INT4"}
_DT_BY_DTYPE = {v: k for k, v in DT.items()}

MAPPING_CSV = "mapping.csv"
_NAME_MAX = 255          # bytes in one file name (NAME_MAX on Linux)
_MAX_DIM = 1 << 48       # a device dimension beyond this is a damaged file, not a tensor
_MAX_RANK = 32
_NOT_DUMPS = (".csv", ".json", ".npy", ".npz", ".txt", ".log", ".part")
_FILE_NAME = re.compile(r"^(?P<type>[^.]+)\.(?P<name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)$", re.S)


def dt_number(dtype: Any) -> int:
    """The dump ``OutputDataType`` number of a numpy dtype.

    >>> dt_number("float16"), dt_number(np.int64)
    (2, 8)
    """
    dt = formats.normalize_dtype(dtype)
    if dt not in _DT_BY_DTYPE:
        raise FormatError(f"dtype {dt.name} has no dump data type",
                          hint="known: " + ", ".join(d.name for d in DT.values()))
    return _DT_BY_DTYPE[dt]


# ------------------------------------------------------------------------------------ the protobuf
@lru_cache(maxsize=None)
def _messages() -> dict[str, type]:
    """The ``toolkit.dumpdata`` message classes, from a descriptor built here (reference §2), in a
    private pool so that nobody else's registration of the same names can clash with it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="npu_deploy/toolkit_dumpdata.proto",
                                             package="toolkit.dumpdata", syntax="proto3")

    def enum(name: str, values: dict[int, str]) -> None:
        e = fdp.enum_type.add(name=name)
        for number, label in sorted(values.items()):
            e.value.add(name=label, number=number)

    enum("OutputDataType", _DT_NAMES)
    fmt_values = {v: f"FORMAT_{k}" for k, v in formats.GE_FORMATS.items()}
    enum("OutputFormat", fmt_values if 0 in fmt_values else {0: "FORMAT_NCHW", **fmt_values})
    enum("BufferType", {0: "L1"})

    def message(name: str, fields: Sequence[tuple]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, *rest in fields:
            label = F.LABEL_REPEATED if rest and rest[-1] == "repeated" else F.LABEL_OPTIONAL
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if ftype in (F.TYPE_MESSAGE, F.TYPE_ENUM):
                f.type_name = ".toolkit.dumpdata." + rest[0]

    E, M = F.TYPE_ENUM, F.TYPE_MESSAGE
    message("Shape", [("dim", 1, F.TYPE_UINT64, "repeated")])
    message("OriginalOp", [("name", 1, F.TYPE_STRING), ("output_index", 2, F.TYPE_UINT32),
                           ("data_type", 3, E, "OutputDataType"), ("format", 4, E, "OutputFormat")])
    message("OpOutput", [("data_type", 1, E, "OutputDataType"), ("format", 2, E, "OutputFormat"),
                         ("shape", 3, M, "Shape"), ("original_op", 4, M, "OriginalOp"),
                         ("data", 5, F.TYPE_BYTES), ("size", 6, F.TYPE_UINT64),
                         ("original_shape", 7, M, "Shape"), ("sub_format", 8, F.TYPE_INT32)])
    message("OpInput", [("data_type", 1, E, "OutputDataType"), ("format", 2, E, "OutputFormat"),
                        ("shape", 3, M, "Shape"), ("data", 4, F.TYPE_BYTES), ("size", 5, F.TYPE_UINT64),
                        ("original_shape", 6, M, "Shape"), ("sub_format", 7, F.TYPE_INT32)])
    message("OpBuffer", [("buffer_type", 1, E, "BufferType"), ("data", 2, F.TYPE_BYTES),
                         ("size", 3, F.TYPE_UINT64)])
    message("DumpData", [("version", 1, F.TYPE_STRING), ("dump_time", 2, F.TYPE_UINT64),
                         ("output", 3, M, "OpOutput", "repeated"), ("input", 4, M, "OpInput", "repeated"),
                         ("buffer", 5, M, "OpBuffer", "repeated"), ("op_name", 6, F.TYPE_STRING)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"toolkit.dumpdata.{name}"))
            for name in ("DumpData", "OpInput", "OpOutput", "OriginalOp", "Shape")}


# ------------------------------------------------------------------------------------- the tensors
@dataclass
class DumpTensor:
    """One tensor of a dump: the raw bytes as an array of ``dtype`` in the device (storage) ``shape``
    and ``format``, with the logical ``original_shape`` to convert back to (:meth:`logical`).

    >>> x = np.arange(6, dtype=np.float16).reshape(2, 3)
    >>> t = DumpTensor.from_logical(x, "FRACTAL_NZ")
    >>> t.shape, bool((t.logical() == x).all())
    ((1, 1, 16, 16), True)
    """

    data: np.ndarray
    dtype: np.dtype
    format: str
    shape: tuple[int, ...]
    original_shape: tuple[int, ...]
    sub_format: int = 0
    original_name: str | None = None
    original_index: int | None = None
    original_format: str | None = None   # OriginalOp.format: the logical layout (NCHW, NHWC, ND...)

    @classmethod
    def from_logical(cls, x: np.ndarray, fmt: str = "ND", *, c0: int | None = None,
                     origin: str | None = None, **kw: Any) -> "DumpTensor":
        """A tensor laid out in ``fmt`` from its logical array (through the format core)."""
        x = np.asarray(x)
        f = formats.get_format(fmt)
        data = x if f.is_plain and origin is None else formats.pack(x, f.name, c0=c0, origin=origin)
        return cls(data=data, dtype=x.dtype, format=f.name, shape=tuple(data.shape),
                   original_shape=tuple(x.shape), original_format=origin, **kw)

    @classmethod
    def from_executed(cls, t: Any, *, output_index: int | None = None) -> "DumpTensor":
        """A tensor from an emulator ``ExecutedTensor`` (its device buffer as it lay in memory)."""
        st = t.stored
        data = np.ascontiguousarray(t.data)
        storage = tuple(int(d) for d in st.storage)
        logical = tuple(int(d) for d in st.shape)
        f = formats.get_format(st.format)
        if data.size != math.prod(storage) and f.is_plain and not getattr(st, "origin", None):
            # a plain buffer whose recorded shape is not its data's (a shape the planner did not know):
            # the bytes are what the device held, so they are dumped with their own shape
            storage = logical = tuple(data.shape)
        if data.shape != storage:
            data = data.reshape(storage)
        return cls(data=data, dtype=data.dtype, format=f.name, shape=storage,
                   original_shape=logical,
                   original_name=t.tensor if output_index is not None else None,
                   original_index=output_index, original_format=getattr(st, "origin", None) or None)

    @property
    def origin(self) -> str | None:
        """The layout :meth:`logical` returns the tensor in, when it is not the format's default
        (``origin_of(format)``): e.g. ``"NHWC"`` for an NC1HWC0 tensor of an NHWC model."""
        f = formats.get_format(self.format)
        origin = self.original_format
        same_shape = tuple(self.shape) == tuple(self.original_shape)
        if origin is None or formats.get_format(origin).name in (f.name, "ND") or (f.is_plain and same_shape):
            # the logical layout only matters when it reorders axes: ND, the device layout itself, or a
            # plain buffer already in its original shape (ACL writes NCHW = 0 for 2-D tensors too) need none
            return None
        return formats.get_format(origin).name

    def logical(self) -> np.ndarray:
        """The tensor in its logical layout and ``original_shape``, through the format core (padding
        dropped; NZ storage ``(..., N1, M1, M0, N0)`` back to ``(..., M, N)``)."""
        f = formats.get_format(self.format)
        origin = self.origin
        if f.is_plain and origin is None and tuple(self.shape) == tuple(self.original_shape):
            return self.data.reshape(self.original_shape)
        kw: dict[str, Any] = {}
        if self.sub_format > 0 and f.name in ("FRACTAL_Z", "FRACTAL_Z_3D"):
            kw["groups"] = int(self.sub_format)
        if origin is not None:
            kw["origin"] = origin
        return formats.unpack(self.data, f.name, self.original_shape, **kw)


@dataclass
class DumpFile:
    """One dump file: the op (type and name from the file name and the header), its tensors."""

    path: Path
    op_type: str
    op_name: str
    task_id: int
    stream_id: int
    timestamp: int
    version: str
    dump_time: int
    inputs: list[DumpTensor]
    outputs: list[DumpTensor]


# -------------------------------------------------------------------------------------- file names
def dump_file_name(op_type: str, op_name: str, task_id: int, stream_id: int, timestamp_us: int) -> str:
    """``{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp_us}`` with ``/`` written ``_``.

    >>> dump_file_name("Conv2D", "backbone/conv1", 3, 1, 1682067845380164)
    'Conv2D.backbone_conv1.3.1.1682067845380164'
    """
    def clean(s: str) -> str:
        return str(s).replace("/", "_").replace("\x00", "_")

    return f"{clean(op_type)}.{clean(op_name)}.{int(task_id)}.{int(stream_id)}.{int(timestamp_us)}"


def _parse_file_name(name: str) -> tuple[str, str, int, int, int] | None:
    m = _FILE_NAME.match(name)
    if m is None:
        return None
    return m["type"], m["name"], int(m["task"]), int(m["stream"]), int(m["ts"])


def dump_run_folder(dump_path: str | os.PathLike, model_name: str, *, when: float | None = None,
                    device_id: int = 0, model_id: int = 1, iteration: int = 0) -> Path:
    """The offline-model dump folder ``{dump_path}/{time}/{device_id}/{model_name}/{model_id}/{iteration}``
    (``time`` as ``YYYYMMDDhhmmss``, UTC), not created.

    >>> dump_run_folder("/d", "resnet/50", when=0).as_posix()
    '/d/19700101000000/0/resnet_50/1/0'
    """
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(time.time() if when is None else when))
    name = str(model_name).replace("/", "_").replace("\x00", "_") or "model"
    return Path(dump_path) / stamp / str(int(device_id)) / name / str(int(model_id)) / str(int(iteration))


def looks_like_dump(path: str | os.PathLike) -> bool:
    """True when ``path`` is named like an operator dump (``Type.name.task.stream.timestamp`` or
    ``*.dump``) or its first bytes are a plausible header length followed by a ``DumpData`` header
    with tensors. Used to tell dumps from models and arrays; reading it may still fail (damaged)."""
    p = Path(path)
    if p.suffix.lower() == ".dump" or _parse_file_name(p.name) is not None:
        return True
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            (header_len,) = struct.unpack("<Q", head)
            if not 0 < header_len <= min(size - 8, 64 << 20):
                return False
            raw = f.read(header_len)
    except OSError:
        return False
    msg = _messages()["DumpData"]()
    try:
        msg.ParseFromString(raw)
    except Exception:  # not protobuf: not a dump
        return False
    return bool(len(msg.input) or len(msg.output))


def parse_tensor_choice(text: str) -> tuple[str, int]:
    """``"input:0"`` / ``"output:1"`` (also ``in:0``, ``out:1``, ``output`` = ``output:0``) ->
    ``("inputs"|"outputs", index)``.

    >>> parse_tensor_choice("output:1"), parse_tensor_choice("in:0")
    (('outputs', 1), ('inputs', 0))
    """
    m = re.fullmatch(r"\s*(input|in|output|out)\s*(?::\s*(\d+))?\s*", str(text), re.I)
    if m is None:
        raise InputError(f"--tensor {text!r}: expected input:N or output:N", hint="example: --tensor output:0")
    side = "inputs" if m.group(1).lower().startswith("in") else "outputs"
    return side, int(m.group(2) or 0)


def pick_tensor(d: DumpFile, choice: str) -> DumpTensor:
    """The tensor of ``d`` that ``choice`` (``input:0`` / ``output:1``) names; InputError listing
    what the file holds when there is no such tensor."""
    side, index = parse_tensor_choice(choice)
    tensors = getattr(d, side)
    if index >= len(tensors):
        have = f"{len(d.inputs)} input(s) and {len(d.outputs)} output(s)"
        raise InputError(f"{d.path}: no {side[:-1]} {index}; the dump holds {have}",
                         hint="pick one with --tensor input:N or output:N (counting from 0)")
    return tensors[index]


# ----------------------------------------------------------------------------------------- reading
def _where(path: Path, field: str) -> str:
    return f"{path}: dump field {field}"


@functools.lru_cache(maxsize=256)
def _format_word(value: int) -> tuple[str, int]:
    """(format name, sub-format) of a format word: a dump repeats a few words over thousands of tensors."""
    fw = formats.decode_format_word(value)
    return fw.format.name, fw.sub_format


def _enum_format(path: Path, field: str, value: int, sub_format: int) -> tuple[str, int]:
    try:
        name, word_sub = _format_word(int(value))
    except FormatError as e:
        raise DumpError(f"{_where(path, field)}: {e.message}",
                        hint="the file is damaged or from a newer CANN; known formats are listed in "
                             "../shared/reference/accuracy-debug.md") from None
    return name, int(sub_format) or word_sub


def _enum_dtype(path: Path, field: str, value: int) -> np.dtype:
    if value in DT:
        return DT[value]
    label = _DT_NAMES.get(value)
    why = "4-bit packed elements have no numpy type" if value == 28 else \
        f"{label} has no numpy type here" if label else "unknown data type"
    raise DumpError(f"{_where(path, field)} = {value}: {why}",
                    hint="known: " + ", ".join(f"{_DT_NAMES[k]}={k}" for k in DT))


def _dims(path: Path, field: str, shape_msg: Any) -> tuple[int, ...]:
    dims = tuple(shape_msg.dim)  # protobuf uint64: already Python ints
    if len(dims) > _MAX_RANK:
        raise DumpError(f"{_where(path, field)}: rank {len(dims)} (at most {_MAX_RANK})",
                        hint="the file is damaged")
    if dims and max(dims) >= _MAX_DIM:
        for d in dims:
            if d < _MAX_DIM:
                continue
            shown = d - (1 << 64) if d >= 1 << 63 else d
            raise DumpError(f"{_where(path, field)}: dimension {shown} is out of range",
                            hint="the file is damaged")
    return dims


def _tensor_meta(path: Path, field: str, msg: Any, is_output: bool) -> dict:
    dtype = _enum_dtype(path, f"{field}.data_type", msg.data_type)
    fmt, sub = _enum_format(path, f"{field}.format", msg.format, msg.sub_format)
    shape = _dims(path, f"{field}.shape", msg.shape)
    original = _dims(path, f"{field}.original_shape", msg.original_shape) \
        if msg.HasField("original_shape") else shape
    need = math.prod(shape) * dtype.itemsize
    embedded = len(msg.data)
    size = int(msg.size)
    if embedded:
        if size and size != embedded:
            raise DumpError(f"{_where(path, field + '.size')} = {size:,} but the embedded data holds "
                            f"{embedded:,} bytes", hint="the file is damaged")
        size = embedded
    if size != need:
        raise DumpError(f"{_where(path, field + '.size')} = {size:,} bytes but shape {list(shape)} of "
                        f"{dtype.name} needs {need:,}", hint="the file is damaged or was cut short")
    meta = dict(dtype=dtype, format=fmt, sub_format=sub, shape=shape, original_shape=original,
                size=size, embedded=bool(embedded))
    if is_output and msg.HasField("original_op"):
        op = msg.original_op
        meta["original_name"] = op.name or None
        meta["original_index"] = int(op.output_index)
        if op.format:
            try:
                meta["original_format"] = formats.decode_format_word(int(op.format)).format.name
            except FormatError:
                meta["original_format"] = None  # informational only: the logical layout falls back to the default
    return meta


def read_dump(path: str | os.PathLike, *, file_name: str | None = None) -> DumpFile:
    """Read one dump file. ``file_name`` (default: the path's own name) is the name to take op type,
    task, stream and timestamp from (``read_dump_folder`` passes the original one of a ``mapping.csv``
    entry). Raises :class:`DumpError` (exit 2) naming the file and the field when it is damaged."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            return _read_open(p, f, size, file_name)
    except DumpError:
        raise
    except IsADirectoryError:
        raise DumpError(f"{p} is a folder, not a dump file", hint="give one dump file") from None
    except OSError as e:
        raise DumpError(f"cannot read dump file {p}: {e.strerror or e}", hint="check the path") from None


def _read_open(p: Path, f: Any, size: int, file_name: str | None) -> DumpFile:
    if size < 8:
        raise DumpError(f"{_where(p, 'header_len')}: the file holds {size} bytes, fewer than the 8-byte "
                        f"header length", hint="the file is empty or cut short")
    (header_len,) = struct.unpack("<Q", f.read(8))
    if header_len > size - 8:
        raise DumpError(f"{_where(p, 'header_len')} = {header_len:,} but only {size - 8:,} bytes follow",
                        hint="the file is damaged, cut short, or not an ACL operator dump")
    raw = f.read(header_len)
    msg = _messages()["DumpData"]()
    try:
        msg.ParseFromString(raw)
    except Exception as e:  # protobuf's DecodeError (and RecursionError on hostile nesting)
        raise DumpError(f"{_where(p, 'DumpData')}: the {header_len:,}-byte header is not a DumpData protobuf "
                        f"({str(e).splitlines()[0][:100] if str(e) else type(e).__name__})",
                        hint="the file is damaged or not an ACL operator dump") from None
    metas = [_tensor_meta(p, f"input[{i}]", m, False) for i, m in enumerate(msg.input)]
    metas += [_tensor_meta(p, f"output[{i}]", m, True) for i, m in enumerate(msg.output)]
    raw_total = sum(m["size"] for m in metas if not m["embedded"])
    if 8 + header_len + raw_total > size:
        raise DumpError(f"{_where(p, 'size')}: the tensors need {raw_total:,} bytes after the header but "
                        f"{size - 8 - header_len:,} are there", hint="the file is cut short or damaged")
    n_in = len(msg.input)
    tensors = []
    for i, meta in enumerate(metas):
        src = (msg.input[i] if i < n_in else msg.output[i - n_in])
        if meta["embedded"]:
            buf = np.frombuffer(bytearray(src.data), np.uint8)
        else:
            buf = np.empty(meta["size"], np.uint8)  # filled by readinto: no zeroing, no second copy
            if f.readinto(memoryview(buf)) != meta["size"]:
                field = f"input[{i}]" if i < n_in else f"output[{i - n_in}]"
                raise DumpError(f"{_where(p, field + '.size')}: the file ended before the tensor's "
                                f"{meta['size']:,} bytes (it changed while it was read)", hint="read it again")
        data = buf.view(meta["dtype"]).reshape(meta["shape"])
        tensors.append(DumpTensor(data=data, dtype=meta["dtype"], format=meta["format"], shape=meta["shape"],
                                  original_shape=meta["original_shape"], sub_format=meta["sub_format"],
                                  original_name=meta.get("original_name"),
                                  original_index=meta.get("original_index"),
                                  original_format=meta.get("original_format")))
    parsed = _parse_file_name(file_name if file_name is not None else p.name)
    op_type, name_from_file, task, stream, ts = parsed if parsed else ("", p.name, 0, 0, 0)
    return DumpFile(path=p, op_type=op_type, op_name=msg.op_name or name_from_file, task_id=task,
                    stream_id=stream, timestamp=ts, version=msg.version, dump_time=int(msg.dump_time),
                    inputs=tensors[:n_in], outputs=tensors[n_in:])


# ----------------------------------------------------------------------------------------- writing
def _encode(op_name: str, inputs: Sequence[DumpTensor], outputs: Sequence[DumpTensor], version: str,
            dump_time: int) -> tuple[bytes, list[bytes]]:
    M = _messages()
    msg = M["DumpData"](version=str(version), dump_time=int(dump_time), op_name=str(op_name))
    blobs = []
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for i, t in enumerate(tensors):
            data = np.ascontiguousarray(t.data)
            dtype = np.dtype(t.dtype)
            if data.dtype != dtype:
                raise FormatError(f"dump {kind}[{i}]: data is {data.dtype.name} but dtype says {dtype.name}")
            if tuple(data.shape) != tuple(t.shape):
                data = data.reshape(tuple(t.shape))
            f = formats.get_format(t.format)
            entry = (msg.output if kind == "output" else msg.input).add(
                data_type=dt_number(dtype), format=f.ge, size=data.nbytes, sub_format=int(t.sub_format))
            entry.shape.dim.extend(int(d) for d in t.shape)
            entry.original_shape.dim.extend(int(d) for d in t.original_shape)
            entry.original_shape.SetInParent()  # a scalar's empty original shape is still "present"
            if kind == "output" and (t.original_name is not None or t.original_index is not None):
                op = entry.original_op
                op.name = str(t.original_name or "")
                op.output_index = int(t.original_index or 0)
                op.data_type = dt_number(dtype)
                op.format = formats.get_format(t.original_format).ge if t.original_format else \
                    formats.get_format(formats.origin_of(f.name)).ge
            blobs.append(data.tobytes())
    return msg.SerializeToString(), blobs


def write_dump(path: str | os.PathLike, *, op_name: str, inputs: Sequence[DumpTensor],
               outputs: Sequence[DumpTensor], version: str = "2.0", dump_time: int = 0) -> None:
    """Write one dump file (atomically: complete or absent).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / dump_file_name("Relu", "relu_1", 1, 0, 10)
    >>> x = np.array([[-1.0, 2.0]], np.float32)
    >>> write_dump(p, op_name="relu_1", inputs=[DumpTensor.from_logical(x)],
    ...            outputs=[DumpTensor.from_logical(np.maximum(x, 0), original_name="y", original_index=0)])
    >>> read_dump(p).outputs[0].logical().tolist(), read_dump(p).op_type
    ([[0.0, 2.0]], 'Relu')
    """
    header, blobs = _encode(op_name, inputs, outputs, version, dump_time)
    with atomic_write(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for b in blobs:
            f.write(b)


def onnx_output_indices(model: Any) -> dict[str, int]:
    """ONNX tensor name -> its output index in the node that produces it, for an ``onnx.ModelProto``
    or ``GraphProto`` (subgraph bodies included): the ``OriginalOp.output_index`` of a dump.

    >>> from onnx import helper
    >>> onnx_output_indices(helper.make_graph([helper.make_node("LSTM", ["x", "w", "r"], ["", "y_h"])],
    ...                                       "g", [], []))
    {'y_h': 1}
    """
    graph = getattr(model, "graph", model)
    index: dict[str, int] = {}
    todo = [graph]
    while todo:
        g = todo.pop()
        for node in g.node:
            for k, name in enumerate(node.output):
                if name:
                    index.setdefault(name, k)
            for a in node.attribute:
                todo.extend([a.g] if a.HasField("g") else [])
                todo.extend(a.graphs)
    return index


def _output_indices(ops: Sequence[Any]) -> dict[str, int]:
    """Without the graph: each tensor's position among its producing op's listed outputs (TransData
    outputs keep the index of the tensor they carry: the same logical tensor in another format)."""
    index: dict[str, int] = {}
    for op in ops:
        if op.op_type == "TransData":
            continue
        for i, t in enumerate(op.outputs):
            index.setdefault(t.tensor, i)
    return index


def write_dump_folder(folder: str | os.PathLike, ops: Iterable[Any], *, start_us: int | None = None,
                      stream_id: int = 0, output_index: dict[str, int] | None = None) -> list[Path]:
    """Write every executed op (``npu_deploy.runtime.emulator.ExecutedOp``, in execution order) as one
    dump file in ``folder`` (created), named as ACL names them. Task ids count from 1 in execution
    order; timestamps are ``start_us`` (default: now) plus the op's position, so that files sort in
    execution order. Outputs carry ``OriginalOp`` = the ONNX tensor name and its output index
    (``output_index``: tensor -> index, from :func:`onnx_output_indices` of the model; default: the
    position among the op's outputs, which differs when a node leaves an earlier output unnamed).
    Names longer than the file system allows get a random name, listed in ``mapping.csv``. Refuses a
    folder that already holds dump files (two runs would mix). Returns the files written, in
    execution order."""
    folder = make_output_folder(folder)
    with os.scandir(folder) as it:
        if any(_is_dump_candidate(e) for e in it):
            raise InputError(f"{folder} already holds dump files: writing another run there would mix the two",
                             hint="dump into an empty folder")
    ops = list(ops)
    start = int(time.time() * 1e6) if start_us is None else int(start_us)
    index = {**_output_indices(ops), **(output_index or {})}
    written: list[Path] = []
    mapping: list[tuple[str, str]] = []
    taken = {e.name for e in os.scandir(folder)}
    for k, op in enumerate(ops):
        name = dump_file_name(op.op_type, op.name, k + 1, stream_id, start + k)
        if len(name.encode("utf-8", "surrogateescape")) > _NAME_MAX:
            new = f"{start + k}{secrets.token_hex(6)}"
            while new in taken:
                new = f"{start + k}{secrets.token_hex(6)}"
            mapping.append((new, name))
            name = new
        taken.add(name)
        inputs = [DumpTensor.from_executed(t) for t in op.inputs]
        outputs = [DumpTensor.from_executed(t, output_index=index.get(t.tensor, i))
                   for i, t in enumerate(op.outputs)]
        path = folder / name
        write_dump(path, op_name=op.name, inputs=inputs, outputs=outputs, dump_time=start + k)
        written.append(path)
    if mapping:
        old = _read_mapping(folder) if (folder / MAPPING_CSV).is_file() else {}
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        for row in list(old.items()) + mapping:
            w.writerow(row)
        with atomic_write(folder / MAPPING_CSV, "w", encoding="utf-8", newline="") as f:
            f.write(buf.getvalue())
    return written


# -------------------------------------------------------------------------------- reading a folder
def _read_mapping(folder: Path) -> dict[str, str]:
    path = folder / MAPPING_CSV
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise DumpError(f"cannot read {path}: {e.strerror or e}") from None
    mapping: dict[str, str] = {}
    for line_no, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 2:
            raise DumpError(f"{path}:{line_no}: expected 'new name,original name', got {len(row)} column",
                            hint="the mapping file is damaged")
        mapping[row[0].strip()] = row[1].strip()
    return mapping


def _is_dump_candidate(entry: os.DirEntry) -> bool:
    name = entry.name
    return (not name.startswith(".") and not name.lower().endswith(_NOT_DUMPS)
            and entry.is_file(follow_symlinks=True))


def find_dump_folders(root: str | os.PathLike) -> list[Path]:
    """Every folder at or below ``root`` that directly holds dump files (an iteration folder), sorted."""
    root = Path(root)
    found = []
    for dirpath, dirnames, _ in os.walk(root):
        dirnames.sort()
        with os.scandir(dirpath) as it:
            if any(_is_dump_candidate(e) for e in it):
                found.append(Path(dirpath))
    return sorted(found)


def read_dump_folder(folder: str | os.PathLike) -> list[DumpFile]:
    """Read every dump file of one iteration folder, sorted by (timestamp, task id). ``folder`` may also
    be a dump root (``dump_path`` or any level below) holding exactly one iteration folder. Names from
    ``mapping.csv`` give random-named files their original op type and name; statistics (``.csv``) and
    other non-dump files are skipped."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DumpError(f"{folder}: not a folder of dump files", hint="give the dump folder (or one dump file)")
    folders = find_dump_folders(folder)
    if not folders:
        raise DumpError(f"{folder}: no dump files found in it or below",
                        hint="give the folder that run --dump or ACL wrote")
    if len(folders) > 1:
        shown = ", ".join(str(f) for f in folders[:3]) + (" ..." if len(folders) > 3 else "")
        raise DumpError(f"{folder}: holds {len(folders)} dump folders ({shown})",
                        hint="give one iteration folder")
    leaf = folders[0]
    mapping = _read_mapping(leaf) if (leaf / MAPPING_CSV).is_file() else {}
    with os.scandir(leaf) as it:
        names = sorted(e.name for e in it if _is_dump_candidate(e))
    dumps = [read_dump(leaf / n, file_name=mapping.get(n)) for n in names]
    dumps.sort(key=lambda d: (d.timestamp, d.task_id, d.path.name))
    return dumps
