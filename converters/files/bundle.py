"""The offline bundle: what the device would hold, in one file.

A bundle is written by the built-in lowering (``npu-deploy convert --backend builtin``) and read by the
CPU emulator and ``npu-deploy inspect``. It is recognised by its first bytes (:data:`BUNDLE_MAGIC`),
never by its file name.

File layout (all integers little-endian)::

    0     header, 256 bytes
          0   magic            12 bytes  b"\\x89NPUBUNDL\\r\\n\\x1a"
          12  format version   u32       (BUNDLE_VERSION; newer versions are refused)
          16  blob offset, blob length, graph offset, graph length, manifest offset, manifest length  6×u64
          64  sha256(blob), sha256(graph), sha256(manifest)                                           3×32 bytes
          160 file size        u64
          168 sha256(header[0:168])                                                                  32 bytes
          200 zero padding to 256
    256   weight blob: pre-packed tensors, each at a 256-byte aligned offset (relative to the blob start,
          which is itself at 256), zero padding between tensors
    ...   lowered graph: ONNX ModelProto bytes (the pre-packed initializers removed)
    ...   manifest: UTF-8 JSON object

The header is written last (the file is streamed, then the header patched), and the whole file goes
through :func:`npu_deploy._io.atomic_path`, so a failed write leaves nothing behind. Reading checks the
header checksum, every section's bounds and checksum (the blob's only with ``verify=True``), the
manifest schema/version and every weight entry's bounds, alignment, dtype and size before anything is
used. Nothing in the file is executed: JSON, protobuf and raw numeric bytes only.

A bundle may come from a stranger, so reading also checks what its consumers will trust:

* :func:`validate_manifest` — every manifest field the emulator, ``inspect`` and the session read has
  the type and range they expect (table :data:`MANIFEST_FIELDS`; unknown extra keys are allowed);
* :func:`check_self_contained` — the lowered graph cannot make onnxruntime open a file or load code: no
  external-data reference anywhere (initializers, sparse initializers, node attributes, subgraphs), no
  model-local functions, no op outside :data:`GRAPH_DOMAINS`.

Either failure is a :class:`~npu_deploy.errors.BundleError` (exit 2). ``inspect`` reads with
``check=False`` and reports them as integrity problems instead.

Manifest keys: those of ``docs/internals.md`` (schema ``npu-deploy/bundle-manifest`` version 1), which the
caller provides, plus these the writer adds or the converter adds:

- ``schema``, ``schema_version`` (added by :func:`write_bundle`)
- ``weights``: list of weight-blob entries (added by :func:`write_bundle`), each ``{name, format,
  logical_shape, storage_shape, dtype, c0, groups, origin, offset, nbytes, onnx_shape}``; ``offset`` is
  relative to the blob start and a multiple of 256; ``dtype`` is the stored (device) dtype name;
  ``logical_shape`` is what ``formats.unpack`` takes, ``onnx_shape`` the initializer's shape (they
  differ for Conv1d weights, packed as ``[Cout, Cin, 1, K]``). Entries with format ``ND`` are
  initializers moved out of the graph unchanged.
- ``tensor_dtypes``: tensor name → device dtype name (converter)
- ``transdata_naive``: the naive plan's TransData list, ``transdata_naive_bytes`` its bytes (converter)
- ``tensor_formats``: activation name → device format; ``plan``: plan verdict and passes run;
  ``support``: op-support verdict and engine counts (converter)
- in ``inputs``/``outputs`` entries: ``device_dtype``; in ``inputs`` entries fed channels-last
  (``--input-format NHWC``/``NDHWC``): ``graph_format`` (``NCHW``/``NCDHW``, the lowered graph's layout)
  and ``graph_shape`` (its shape), while ``shape``/``device_shape`` are in the host order; in
  ``node_formats`` entries: ``c0``, ``folded``;
  in ``transdata`` entries: ``tensor``, ``producer``, ``consumers``, ``dst_bytes``, ``est_us``

Example:

>>> import numpy as np, onnx, tempfile, os
>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
>>> path = os.path.join(tempfile.mkdtemp(), "model.any-name")
>>> w = WeightEntry("w", "ND", (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3))
>>> write_bundle(path, {"soc": "Ascend310P3"}, helper.make_model(g), [w])
>>> is_bundle(path)
True
>>> with read_bundle(path) as b:
...     b.packed("w").tolist(), b.weights["w"].offset
([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], 0)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import mmap
import os
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import onnx

from npu_deploy._io import atomic_path
from npu_deploy._text import printable
from npu_deploy._version import __version__
from npu_deploy.converters import formats
# no tensor of a bundle may hold more bytes than the loader allows an ONNX tensor (more than any NPU's
# memory): checked before anything is allocated (a manifest shape [1,3,2**40,2**40] is refused here)
from npu_deploy.converters.files.onnx_model import MAX_TENSOR_BYTES
from npu_deploy.converters.files.weight_stream import StreamedWeight, stream_packed, write_chunks
from npu_deploy.errors import BundleError, ModelError
from npu_deploy._result import _jsonable as base

BUNDLE_MAGIC = b"\x89NPUBUNDL\r\n\x1a"
BUNDLE_VERSION = 1
MANIFEST_SCHEMA = "npu-deploy/bundle-manifest"
MANIFEST_VERSION = 1
ALIGNMENT = 256
HEADER_SIZE = 256

# magic, version, 6 x u64 section table, 3 sha256, file size
_HEADER = struct.Struct("<12sI6Q32s32s32sQ")
assert _HEADER.size == 168 and len(BUNDLE_MAGIC) == 12

# Stored dtypes a bundle may contain. A whitelist, so that no dtype string from the file can produce an
# object array or anything else numpy would interpret.
_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name)
    for name in ("float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                 "int64", "uint64", "bool")
}
try:  # bfloat16 comes with ml_dtypes (an onnx dependency)
    import ml_dtypes as _ml_dtypes

    _DTYPES["bfloat16"] = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    pass


def dtype_name(dtype: Any) -> str:
    """The bundle's name for a numpy dtype (``"float16"``, ``"bfloat16"``…); raises for unsupported ones."""
    dt = np.dtype(dtype)
    for name, known in _DTYPES.items():
        if known == dt:
            return name
    raise BundleError(f"dtype {dt} cannot be stored in a bundle",
                      hint=f"supported: {', '.join(sorted(_DTYPES))}")


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclasses.dataclass
class WeightEntry:
    """One tensor to store in the weight blob, already packed in its device format.

    ``data`` is the packed (storage-layout) array, or a callable returning it, called once when the
    writer reaches the entry so that weights can be packed and written one at a time. ``logical_shape``,
    ``format``, ``c0``, ``groups`` and ``origin`` are what ``formats.unpack`` needs to recover the
    logical tensor.

    >>> WeightEntry("conv.w", "FRACTAL_Z", (16, 3, 3, 3), np.zeros((9, 1, 16, 16), np.float16), c0=16).name
    'conv.w'
    """

    name: str
    format: str
    logical_shape: tuple[int, ...]
    data: np.ndarray | Callable[[], np.ndarray]
    c0: int | None = None
    groups: int = 1
    origin: str | None = None
    onnx_shape: tuple[int, ...] | None = None  # the initializer's shape when it differs (Conv1d: 3-D)


@dataclasses.dataclass(frozen=True)
class WeightInfo:
    """Where and how one packed tensor is stored in a bundle's weight blob (``offset`` is blob-relative)."""

    name: str
    format: str
    logical_shape: tuple[int, ...]
    storage_shape: tuple[int, ...]
    dtype: np.dtype
    c0: int | None
    groups: int
    origin: str | None
    offset: int
    nbytes: int
    onnx_shape: tuple[int, ...] | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "format": self.format, "logical_shape": list(self.logical_shape),
                "storage_shape": list(self.storage_shape), "dtype": dtype_name(self.dtype), "c0": self.c0,
                "groups": self.groups, "origin": self.origin, "offset": self.offset, "nbytes": self.nbytes,
                "onnx_shape": list(self.onnx_shape if self.onnx_shape is not None else self.logical_shape)}


def _jsonable(obj: Any) -> Any:
    return base(obj)


def is_bundle(path: str | os.PathLike) -> bool:
    """True when ``path`` is a file that starts with the bundle magic bytes (whatever its name).

    >>> is_bundle(__file__)
    False
    """
    try:
        with open(path, "rb") as f:
            return f.read(len(BUNDLE_MAGIC)) == BUNDLE_MAGIC
    except OSError:
        return False


def write_bundle(path: str | os.PathLike, manifest: dict, graph: onnx.ModelProto,
                 weights: Iterable[WeightEntry]) -> None:
    """Write a bundle to ``path`` atomically (temp file in the same folder, renamed on success).

    Weights are written one at a time in iteration order; a callable ``data`` is called only when its
    entry is written, and its array is released right after, so at most one packed weight is held. A
    ``data`` that gives a :class:`~npu_deploy.converters.files.weight_stream.StreamedWeight` is written
    (and checksummed) a chunk at a time: what the converter does, holding one slice of one weight.
    ``path`` is used exactly as given (no extension is added). A graph that is not self-contained
    (:func:`check_self_contained`) is refused before anything is written; a failed write (disk full)
    is an ``OutputError`` (exit 3) and leaves nothing behind.
    """
    if not isinstance(manifest, dict):
        raise BundleError("bundle manifest must be a dict")
    check_self_contained(graph)
    dest = Path(path)
    # an OSError (disk full, read-only file system) becomes atomic_path's OutputError (exit 3)
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as f:
            _write_stream(f, manifest, graph, weights)
            f.flush()
            os.fsync(f.fileno())


def _write_stream(f, manifest: dict, graph: onnx.ModelProto, weights: Iterable[WeightEntry]) -> None:
    f.write(b"\0" * HEADER_SIZE)
    blob_hash = hashlib.sha256()
    infos: list[WeightInfo] = []
    seen: set[str] = set()
    pos = 0  # within the blob
    for entry in weights:
        if entry.name in seen:
            raise BundleError(f"weight {entry.name!r} appears twice in the bundle")
        seen.add(entry.name)
        arr = entry.data() if callable(entry.data) else entry.data
        if not isinstance(arr, StreamedWeight):
            arr = np.ascontiguousarray(arr)
        name_dt = dtype_name(arr.dtype)
        info = WeightInfo(entry.name, str(entry.format), tuple(int(d) for d in entry.logical_shape),
                          tuple(int(d) for d in arr.shape), _DTYPES[name_dt],
                          None if entry.c0 is None else int(entry.c0), int(entry.groups), entry.origin,
                          pos, int(arr.nbytes),
                          None if entry.onnx_shape is None else tuple(int(d) for d in entry.onnx_shape))
        if isinstance(arr, StreamedWeight):  # packed and written a slice at a time (converters.files.weight_stream)
            write_chunks(f, arr, blob_hash.update)
        else:
            mv = memoryview(arr.reshape(-1).view(np.uint8))
            blob_hash.update(mv)
            f.write(mv)
            del mv
        pad = _align(arr.nbytes) - arr.nbytes
        if pad:
            zeros = b"\0" * pad
            blob_hash.update(zeros)
            f.write(zeros)
        pos += arr.nbytes + pad
        infos.append(info)
        del arr
    blob_len = pos

    try:
        graph_bytes = graph.SerializeToString()
    except ValueError as e:  # protobuf refuses > 2 GiB
        raise ModelError(f"the lowered graph is too large to serialise ({e})",
                         hint="large initializers should be pre-packed into the weight blob") from e
    graph_off = HEADER_SIZE + blob_len
    f.write(graph_bytes)

    full = dict(_jsonable(manifest))
    full["schema"] = MANIFEST_SCHEMA
    full["schema_version"] = MANIFEST_VERSION
    full["weights"] = [i.to_dict() for i in infos]
    manifest_bytes = json.dumps(full, allow_nan=False, ensure_ascii=False, sort_keys=False).encode("utf-8")
    man_off = graph_off + len(graph_bytes)
    f.write(manifest_bytes)
    size = man_off + len(manifest_bytes)

    head = _HEADER.pack(BUNDLE_MAGIC, BUNDLE_VERSION, HEADER_SIZE, blob_len, graph_off, len(graph_bytes),
                        man_off, len(manifest_bytes), blob_hash.digest(),
                        hashlib.sha256(graph_bytes).digest(), hashlib.sha256(manifest_bytes).digest(), size)
    head += hashlib.sha256(head).digest()
    f.seek(0)
    f.write(head.ljust(HEADER_SIZE, b"\0"))
    f.seek(0, os.SEEK_END)


class Bundle:
    """A bundle opened for reading (returned by :func:`read_bundle`). Use as a context manager.

    ``manifest`` is the JSON manifest, ``graph`` the lowered ``onnx.ModelProto``, ``weights`` maps names
    to :class:`WeightInfo`. ``packed(name)`` is a read-only view into the memory-mapped blob;
    ``unpack(name)`` the logical tensor (through ``formats.unpack``).
    """

    def __init__(self, path: Path, manifest: dict, graph: onnx.ModelProto, weights: dict[str, WeightInfo],
                 mm: mmap.mmap | None, blob_offset: int, version: int):
        self.path = path
        self.manifest = manifest
        self.graph = graph
        self.weights = weights
        self.version = version
        self._mm = mm
        self._blob_offset = blob_offset

    def packed(self, name: str) -> np.ndarray:
        """The stored (packed, device-layout) array of weight ``name``: a read-only view of the file."""
        info = self._info(name)
        if self._mm is None:
            raise BundleError(f"bundle {self.path} is closed")
        if info.nbytes == 0:
            return np.zeros(info.storage_shape, info.dtype)
        arr = np.frombuffer(self._mm, dtype=info.dtype, count=info.nbytes // info.dtype.itemsize,
                            offset=self._blob_offset + info.offset)
        return arr.reshape(info.storage_shape)

    def unpack(self, name: str) -> np.ndarray:
        """The original tensor of weight ``name``: unpacked from its device format and reshaped to the
        ONNX initializer's shape (``onnx_shape``), in the stored dtype."""
        info = self._info(name)
        phys = self.packed(name)
        target = info.onnx_shape if info.onnx_shape is not None else info.logical_shape
        if info.format == "ND":
            return np.array(phys.reshape(target))
        kwargs: dict[str, Any] = {"groups": info.groups}
        if info.c0 is not None:
            kwargs["c0"] = info.c0
        if info.origin is not None:
            kwargs["origin"] = info.origin
        return np.asarray(formats.unpack(phys, info.format, info.logical_shape, **kwargs)).reshape(target)

    def _info(self, name: str) -> WeightInfo:
        try:
            return self.weights[name]
        except KeyError:
            raise BundleError(f"bundle {self.path} has no weight named {name!r}") from None

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                # numpy views returned by packed() are still alive; the map is released with them.
                pass
            self._mm = None

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Bundle({str(self.path)!r}, weights={len(self.weights)})"


# ---------------------------------------------------------------------------------------------------
# self-containment of the lowered graph

#: Op domains a bundle's graph may use: what the built-in lowering produces (it keeps the model's
#: standard ops). Everything else is refused: onnxruntime contrib ops (``com.microsoft``: e.g.
#: ``EPContext`` reads a cache file named in an attribute, ``PythonOp`` runs Python code),
#: preview/training domains, custom domains that would need a custom-op library.
GRAPH_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")

# model metadata onnxruntime acts on: with ORT_LOAD_CONFIG_FROM_MODEL=1 it takes session options from
# "ort_config" (profiling among them, which writes files)
_ACTIVE_METADATA = ("ort_config",)


def check_self_contained(graph: onnx.ModelProto) -> None:
    """Refuse a lowered graph that could make onnxruntime read anything outside the bundle.

    Raises :class:`~npu_deploy.errors.BundleError` (one line, naming the tensor or node) for:

    * any tensor whose data lives in an external file: initializers, sparse initializers (values and
      indices), tensor attributes of any node (``Constant`` values included), in the main graph and in
      every subgraph (``If``/``Loop``/``Scan`` bodies), recursively;
    * model-local functions (``model.functions``) and training information: the lowering produces
      neither, and a function body would be a second graph to police;
    * any node outside :data:`GRAPH_DOMAINS` (custom-op libraries, onnxruntime contrib ops);
    * model metadata that onnxruntime turns into session options (``ort_config``).

    No standard (``ai.onnx``) or ``ai.onnx.ml`` op opens a file or runs code, so string tensors and
    string attributes are data, whatever they look like (a path-like string is not refused: nothing in
    those domains would open it). Called by :func:`write_bundle` (the converter never writes what the
    reader would refuse) and by :func:`read_bundle`.

    >>> from onnx import helper, TensorProto
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r", domain="my.ops")], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> check_self_contained(helper.make_model(g))
    Traceback (most recent call last):
    ...
    npu_deploy.errors.BundleError: lowered graph: node 'r' (Relu) is in op domain 'my.ops'; a bundle may only hold ai.onnx and ai.onnx.ml ops (re-convert the model with npu-deploy; do not run bundles from unknown sources)
    """
    hint = "re-convert the model with npu-deploy; do not run bundles from unknown sources"
    if len(graph.functions):
        f = graph.functions[0]
        raise BundleError(f"lowered graph: defines the function {_quote(f.domain)}:{_quote(f.name)}; a bundle "
                          f"may not carry functions", hint=hint)
    if len(graph.training_info):
        raise BundleError("lowered graph: carries training information; a bundle may not", hint=hint)
    for prop in graph.metadata_props:
        if prop.key in _ACTIVE_METADATA:
            raise BundleError(f"lowered graph: metadata {_quote(prop.key)} holds onnxruntime session options; "
                              f"a bundle may not", hint=hint)
    stack: list[tuple[onnx.GraphProto, str]] = [(graph.graph, "lowered graph")]
    while stack:
        g, where = stack.pop()
        for t in g.initializer:
            _check_tensor_inline(t, f"{where}: initializer {_quote(t.name)}", hint)
        for sp in g.sparse_initializer:
            for part, t in (("values", sp.values), ("indices", sp.indices)):
                _check_tensor_inline(t, f"{where}: sparse initializer {_quote(sp.values.name)} ({part})", hint)
        for i, n in enumerate(g.node):
            node = f"node {_quote(n.name or f'#{i}')} ({printable(n.op_type[:64])})"
            if n.domain not in GRAPH_DOMAINS:
                raise BundleError(f"{where}: {node} is in op domain {_quote(n.domain)}; a bundle may only hold "
                                  f"ai.onnx and ai.onnx.ml ops", hint=hint)
            for a in n.attribute:
                at = f"{where}: {node} attribute {_quote(a.name)}"
                if a.HasField("t"):
                    _check_tensor_inline(a.t, at, hint)
                for t in a.tensors:
                    _check_tensor_inline(t, at, hint)
                for sp in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                    _check_tensor_inline(sp.values, at, hint)
                    _check_tensor_inline(sp.indices, at, hint)
                for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    stack.append((sg, f"{where} > {node} body {_quote(sg.name)}"))


def _check_tensor_inline(t: onnx.TensorProto, where: str, hint: str) -> None:
    if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data):
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        raise BundleError(f"{where} keeps its data in an external file ({_quote(loc)}); a bundle must hold all "
                          f"its data", hint=hint)


def _quote(text: str, limit: int = 80) -> str:
    text = str(text)
    return repr(printable(text[:limit] + ("..." if len(text) > limit else "")))


# ---------------------------------------------------------------------------------------------------
# manifest validation (table-driven: a new manifest key is one line in MANIFEST_FIELDS)

_Check = Callable[[Any, str], None]
_DIM_MAX = 1 << 62  # a bound, not a limit: no real tensor has a dimension near it


class _Bad(Exception):
    """A manifest value that is not what a consumer reads (``where`` is the JSON path)."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")


def _show(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=False, default=str) if not isinstance(v, str) else repr(v)
    return printable(text if len(text) <= 40 else text[:37] + "...")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(lo: int | None = None, hi: int | None = None) -> _Check:
    top = "2**62" if hi == _DIM_MAX else str(hi)
    rng = f" >= {lo}" if lo is not None and hi is None else f" in {lo}..{top}" if lo is not None else ""

    def check(v: Any, where: str) -> None:
        if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise _Bad(where, f"must be an integer{rng}, not {_show(v)}")
    return check


def _number(v: Any, where: str) -> None:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
        raise _Bad(where, f"must be a finite number >= 0, not {_show(v)}")


def _str(v: Any, where: str) -> None:
    if not isinstance(v, str):
        raise _Bad(where, f"must be a string, not {_show(v)}")


def _bool(v: Any, where: str) -> None:
    if not isinstance(v, bool):
        raise _Bad(where, f"must be true or false, not {_show(v)}")


def _anything(v: Any, where: str) -> None:
    return None


def _opt(check: _Check) -> _Check:
    def opt(v: Any, where: str) -> None:
        if v is not None:
            check(v, where)
    return opt


def _list(item: _Check, *, unique_names: bool = False) -> _Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, list):
            raise _Bad(where, f"must be a list, not {_show(v)}")
        seen: set[str] = set()
        for i, x in enumerate(v):
            item(x, f"{where}[{i}]")
            if unique_names:
                if x["name"] in seen:
                    raise _Bad(f"{where}[{i}].name", f"{_show(x['name'])} appears twice")
                seen.add(x["name"])
    return check


def _map(value: _Check) -> _Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise _Bad(where, f"must be an object, not {_show(v)}")
        for k, x in v.items():  # JSON object keys are always strings
            value(x, f"{where}[{_show(k)}]")
    return check


def _obj(fields: dict[str, _Check], required: tuple[str, ...] = ()) -> _Check:
    """A JSON object whose known keys pass their check; unknown extra keys are allowed."""
    def check(v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise _Bad(where, f"must be an object, not {_show(v)}")
        for k in required:
            if k not in v:
                raise _Bad(where, f"has no {k!r}")
        for k, c in fields.items():
            if k in v:
                c(v[k], f"{where}.{k}")
    return check


@functools.lru_cache(maxsize=1024)  # a manifest names a handful of formats thousands of times
def _known_format(name: str) -> bool:
    try:
        formats.get_format(name)
    except Exception:
        return False
    return True


def _format(v: Any, where: str) -> None:
    _str(v, where)
    if not _known_format(v):
        raise _Bad(where, f"unknown format {_show(v)}")


# every dtype an ONNX tensor can have (numpy / ml_dtypes names): what graph inputs and outputs may be
_IO_DTYPES = frozenset(_DTYPES) | {"complex64", "complex128", "object", "int4", "uint4", "int2", "uint2",
                                   "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                                   "float8_e8m0fnu", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"}


def _dtype(v: Any, where: str) -> None:
    if not (isinstance(v, str) and v in _IO_DTYPES):
        raise _Bad(where, f"unknown dtype {_show(v)}")


_shape = _list(_int(-1, _DIM_MAX))          # logical: -1 is a dynamic axis
_concrete_shape = _list(_int(0, _DIM_MAX))
_names = _list(_str)

_IO_ENTRY = _obj({
    "name": _str, "shape": _shape, "dtype": _dtype, "format": _opt(_format), "device_format": _opt(_format),
    "device_shape": _opt(_shape), "c0": _opt(_int(1, 1024)), "nbytes": _opt(_int(0)),
    "device_dtype": _opt(_dtype), "graph_format": _opt(_format), "graph_shape": _opt(_shape),
}, required=("name", "shape", "dtype"))

_TRANSDATA = _obj({
    "name": _opt(_str), "tensor": _opt(_str), "producer": _opt(_str), "consumers": _opt(_names),
    "onnx_nodes": _opt(_names), "src_format": _format, "dst_format": _format, "shape": _opt(_shape),
    "dtype": _opt(_dtype), "c0": _opt(_int(1, 1024)), "bytes": _opt(_int(0)), "dst_bytes": _opt(_int(0)),
    "est_us": _opt(_number), "reason": _opt(_str), "after": _opt(_str),
}, required=("src_format", "dst_format"))

_NODE_FORMAT = _obj({
    # a node's absent optional inputs/outputs have no format (null)
    "op_type": _opt(_str), "engine": _opt(_str), "input_formats": _opt(_list(_opt(_format))),
    "output_formats": _opt(_list(_opt(_format))),
    "dtype": _opt(_dtype), "c0": _opt(_int(1, 1024)), "folded": _opt(_bool),
})


_TENSOR_PLAN = _obj({
    "format": _format, "dtype": _dtype, "shape": _shape, "storage_shape": _opt(_concrete_shape),
    "c0": _opt(_int(1, 1024)), "nbytes": _opt(_int(0)),
}, required=("format", "dtype", "shape"))


def _gear(v: Any, where: str) -> None:
    _map(_concrete_shape)(v, where)


#: What every consumer (emulator, inspect, session) reads from a manifest, key by key. Keys not listed
#: are allowed and left alone; a listed key may be absent (consumers have defaults) but, when present,
#: must have this shape.
MANIFEST_FIELDS: dict[str, _Check] = {
    "producer": _opt(_str),
    "producer_version": _opt(_str),
    "soc": _opt(_str),
    "precision_mode": _opt(_str),
    "input_format": _opt(_format),
    "inputs": _opt(_list(_IO_ENTRY, unique_names=True)),
    "outputs": _opt(_list(_IO_ENTRY, unique_names=True)),
    "dynamic": _opt(_obj({"mode": _opt(_str), "gears": _opt(_list(_gear))})),
    "memory": _opt(_obj({k: _opt(_int(0)) for k in ("arena_bytes", "lower_bound_bytes", "no_reuse_bytes",
                                                   "alignment")})),
    "transdata": _opt(_list(_TRANSDATA)),
    "transdata_naive": _opt(_list(_TRANSDATA)),
    "transdata_naive_count": _opt(_int(0)),
    "transdata_naive_bytes": _opt(_int(0)),
    "node_formats": _opt(_map(_NODE_FORMAT)),
    "tensor_formats": _opt(_map(_format)),
    "tensor_dtypes": _opt(_map(_dtype)),
    "fused_tensors": _opt(_names),
    "tensors": _opt(_map(_obj({"format": _format, "dtype": _dtype, "shape": _opt(_shape),
                               "storage_shape": _opt(_concrete_shape), "c0": _opt(_int(1, 1024)),
                               "nbytes": _opt(_int(0))}, required=("format", "dtype")))),
    "input_format": _opt(_str),
    "tensors": _opt(_map(_TENSOR_PLAN)),
    "cost": _opt(_obj({"estimated": _opt(_bool), "soc": _opt(_str), "total_us": _opt(_number),
                       "formattrans_share": _opt(_number), "est_us": _opt(_map(_number))})),
    "plan": _opt(_obj({"verdict": _opt(_str), "passes": _opt(_list(_anything))})),
    "support": _opt(_obj({"verdict": _opt(_str), "counts": _opt(_map(_int(0)))})),
    "source_model": _anything,
    "aipp": _opt(_obj({"fields": _map(_anything), "source": _opt(_str), "input": _opt(_str),
                       "raw_layout": _opt(_str), "result_size": _opt(_list(_int(1, 1 << 16)))},
                      required=("fields",))),   # converters/lowering/aipp.py: AippConfig.to_manifest()
}


def validate_manifest(manifest: dict) -> None:
    """Check every manifest field a consumer reads (types and ranges); raise
    :class:`~npu_deploy.errors.BundleError` naming the first bad field. Unknown extra keys are allowed;
    the ``weights`` list is checked against the blob by :func:`read_bundle`.

    >>> validate_manifest({"inputs": [{"name": "x", "shape": [1, -1], "dtype": "float32"}]})
    >>> validate_manifest({"inputs": [{"name": "x", "shape": [1, -2], "dtype": "float32"}]})
    Traceback (most recent call last):
    ...
    npu_deploy.errors.BundleError: manifest field inputs[0].shape[1]: must be an integer in -1..2**62, not -2 (re-convert the model)
    """
    if not isinstance(manifest, dict):
        raise BundleError("manifest is not a JSON object", hint="re-convert the model")
    for key, check in MANIFEST_FIELDS.items():
        if key in manifest:
            try:
                check(manifest[key], key)
            except _Bad as e:
                raise BundleError(f"manifest field {e}", hint="re-convert the model") from None


#: JSON nesting a manifest may have (ours nests 5 deep): deeper is a crafted file, refused before anything
#: walks it recursively
MANIFEST_MAX_DEPTH = 32
_ONNX_ELEM_TYPES = frozenset(v for v in onnx.TensorProto.DataType.values() if v != onnx.TensorProto.UNDEFINED)


def _depth_ok(obj: Any, limit: int) -> bool:
    """True when ``obj`` (parsed JSON) nests at most ``limit`` lists/objects deep (iterative walk)."""
    stack = [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            if d > limit:
                return False
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


def _elem_name(elem: int) -> str:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name


def _entry_bytes(e: dict) -> int:
    """The largest byte count a manifest input/output entry claims (shape, device shape or nbytes)."""
    try:
        item = np.dtype(e.get("dtype") or "float32").itemsize
    except TypeError:
        item = 1
    nbytes = e.get("nbytes")
    most = nbytes if _is_int(nbytes) else 0
    for key in ("shape", "device_shape", "graph_shape"):
        dims = e.get(key)
        if isinstance(dims, list) and dims and all(_is_int(d) for d in dims):
            most = max(most, _prod(tuple(max(d, 1) for d in dims)) * item)
    return most


def check_graph(graph: onnx.ModelProto, manifest: dict) -> None:
    """Check the lowered graph against itself and the manifest, for what a run would otherwise die on
    half-way: every element type an ONNX type, every graph output and node input produced (by a node,
    a graph input, an initializer or the weight blob; the lowered graph need not be in topological order), the manifest's input/output dtypes those of the graph, no tensor
    larger than :data:`MAX_TENSOR_BYTES`. Raises :class:`BundleError` naming the first problem.
    ``inspect`` and every reader with ``check=True`` run it."""
    g = graph.graph
    for kind, vis in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        for vi in vis:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type not in _ONNX_ELEM_TYPES:
                raise BundleError(f"graph {kind} {_quote(vi.name)} has element type "
                                  f"{vi.type.tensor_type.elem_type}, which is no ONNX type", hint="re-convert the model")
    for t in g.initializer:
        if t.data_type not in _ONNX_ELEM_TYPES:
            raise BundleError(f"graph initializer {_quote(t.name)} has element type {t.data_type}, which is no "
                              "ONNX type", hint="re-convert the model")
    known = {vi.name for vi in g.input} | {t.name for t in g.initializer} | {""}
    weights = manifest.get("weights")
    known.update(w["name"] for w in (weights if isinstance(weights, list) else ())
                 if isinstance(w, dict) and isinstance(w.get("name"), str))  # in the blob
    known.update(o for n in g.node for o in n.output)
    for n in g.node:
        for t in n.input:
            if t not in known:
                raise BundleError(f"graph node {_quote(n.name or n.op_type)} reads {_quote(t)}, which nothing "
                                  "produces", hint="re-convert the model")
    for vi in g.output:
        if not vi.name or vi.name not in known:  # "" is an absent optional input, never an output
            raise BundleError(f"graph output {_quote(vi.name)} has no producer", hint="re-convert the model")
    graph_io = {vi.name: vi for vi in (*g.input, *g.output)}
    for side in ("inputs", "outputs"):  # run after validate_manifest, or beside it (inspect): types not assumed
        entries = manifest.get(side)
        for k, e in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                continue
            vi = graph_io.get(e.get("name"))
            if vi is not None and vi.type.HasField("tensor_type"):
                want = _elem_name(vi.type.tensor_type.elem_type)
                if e.get("dtype") != want:
                    raise BundleError(f"manifest {side}[{k}] ({_quote(e.get('name'))}) says dtype "
                                      f"{_show(e.get('dtype'))}, the graph says {want}", hint="re-convert the model")
            if _entry_bytes(e) > MAX_TENSOR_BYTES:
                raise BundleError(f"manifest {side}[{k}] ({_quote(e.get('name'))}) claims {_entry_bytes(e):,} bytes, "
                                  f"more than any NPU holds ({MAX_TENSOR_BYTES:,})", hint="re-convert the model")


def read_bundle(path: str | os.PathLike, *, verify: bool = True, check: bool = True) -> Bundle:
    """Open and validate a bundle. ``verify=False`` skips only the weight blob's checksum (large files).

    Raises :class:`~npu_deploy.errors.BundleError` (exit 2) for anything wrong: missing file, wrong
    magic, newer version, bad checksum, out-of-bounds or misaligned sections or weights, a manifest
    field of the wrong type or range (:func:`validate_manifest`), a graph that is not self-contained
    (:func:`check_self_contained`: external data, functions, foreign op domains).

    ``check=False`` skips those last two checks, for a caller that runs them itself and reports what
    they find (``inspect``); nothing may run a bundle read that way.
    """
    p = Path(path)
    try:
        f = open(p, "rb")
    except FileNotFoundError:
        raise BundleError(f"{p}: no such file", hint="check the path") from None
    except IsADirectoryError:
        raise BundleError(f"{p}: is a folder, not a bundle file") from None
    except OSError as e:
        raise BundleError(f"{p}: cannot open ({e.strerror})") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER_SIZE)
        if head[:len(BUNDLE_MAGIC)] != BUNDLE_MAGIC:
            raise BundleError(f"{p}: not an npu-deploy bundle (wrong magic bytes)",
                              hint="convert the model with 'npu-deploy convert --backend builtin'")
        if len(head) < HEADER_SIZE:
            raise BundleError(f"{p}: truncated bundle header ({len(head)} of {HEADER_SIZE} bytes)")
        (_, version, blob_off, blob_len, graph_off, graph_len, man_off, man_len, blob_sha, graph_sha,
         man_sha, file_size) = _HEADER.unpack_from(head)
        if version > BUNDLE_VERSION or version < 1:
            raise BundleError(f"{p}: bundle format version {version} is not supported "
                              f"(this npu-deploy reads version {BUNDLE_VERSION})",
                              hint="upgrade npu-deploy or re-convert the model")
        if hashlib.sha256(head[:_HEADER.size]).digest() != head[_HEADER.size:_HEADER.size + 32]:
            raise BundleError(f"{p}: bundle header checksum mismatch (file corrupted)",
                              hint="re-convert the model")
        if file_size != size:
            raise BundleError(f"{p}: bundle is {size} bytes but its header says {file_size} "
                              f"(truncated or appended to)", hint="re-convert the model")
        sections = [("weight blob", blob_off, blob_len), ("graph", graph_off, graph_len),
                    ("manifest", man_off, man_len)]
        end = HEADER_SIZE
        for label, off, length in sections:
            if off != end or off + length > size:
                raise BundleError(f"{p}: {label} section out of bounds (offset {off}, length {length}, "
                                  f"file {size} bytes)", hint="re-convert the model")
            end = off + length
        if blob_off % ALIGNMENT:
            raise BundleError(f"{p}: weight blob is not {ALIGNMENT}-byte aligned")
        if end != size:
            raise BundleError(f"{p}: {size - end} unexpected bytes after the manifest")

        f.seek(man_off)
        man_bytes = f.read(man_len)
        if hashlib.sha256(man_bytes).digest() != man_sha:
            raise BundleError(f"{p}: manifest checksum mismatch (file corrupted)", hint="re-convert the model")
        f.seek(graph_off)
        graph_bytes = f.read(graph_len)
        if hashlib.sha256(graph_bytes).digest() != graph_sha:
            raise BundleError(f"{p}: graph checksum mismatch (file corrupted)", hint="re-convert the model")
        if verify:
            f.seek(blob_off)
            h = hashlib.sha256()
            remaining = blob_len
            while remaining:
                chunk = f.read(min(remaining, 1 << 24))
                if not chunk:
                    break
                h.update(chunk)
                remaining -= len(chunk)
            if remaining or h.digest() != blob_sha:
                raise BundleError(f"{p}: weight blob checksum mismatch (file corrupted)",
                                  hint="re-convert the model")

        try:
            manifest = json.loads(man_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BundleError(f"{p}: manifest is not valid JSON ({e})") from None
        except RecursionError:
            manifest = None
        if manifest is None or not _depth_ok(manifest, MANIFEST_MAX_DEPTH):
            raise BundleError(f"{p}: manifest nests deeper than {MANIFEST_MAX_DEPTH} levels (not one npu-deploy "
                              "writes)", hint="re-convert the model")
        if not isinstance(manifest, dict):
            raise BundleError(f"{p}: manifest is not a JSON object")
        if manifest.get("schema") != MANIFEST_SCHEMA:
            raise BundleError(f"{p}: manifest schema is {manifest.get('schema')!r}, expected {MANIFEST_SCHEMA!r}")
        mver = manifest.get("schema_version")
        if not isinstance(mver, int) or mver > MANIFEST_VERSION or mver < 1:
            raise BundleError(f"{p}: manifest schema version {mver!r} is not supported "
                              f"(this npu-deploy reads version {MANIFEST_VERSION})", hint="upgrade npu-deploy")
        weights = _parse_weights(p, manifest.get("weights"), blob_len)

        graph = onnx.ModelProto()
        try:
            graph.ParseFromString(graph_bytes)
        except Exception as e:  # protobuf's DecodeError
            raise BundleError(f"{p}: lowered graph is not a valid ONNX model ({e})") from None
        if check:
            try:
                validate_manifest(manifest)
                check_self_contained(graph)
                check_graph(graph, manifest)
            except BundleError as e:
                raise BundleError(f"{p}: {e.message}", hint=e.hint) from None

        mm = None
        if blob_len:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return Bundle(p, manifest, graph, weights, mm, blob_off, version)


def _parse_weights(p: Path, raw: Any, blob_len: int) -> dict[str, WeightInfo]:
    if not isinstance(raw, list):
        raise BundleError(f"{p}: manifest has no 'weights' list")
    out: dict[str, WeightInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for i, w in enumerate(raw):
        where = f"{p}: weight entry {i}"
        if not isinstance(w, dict):
            raise BundleError(f"{where} is not an object")
        try:
            name = w["name"]
            fmt = w["format"]
            logical = _int_tuple(w["logical_shape"])
            storage = _int_tuple(w["storage_shape"])
            dt_name = w["dtype"]
            offset, nbytes = w["offset"], w["nbytes"]
            c0, groups, origin = w.get("c0"), w.get("groups", 1), w.get("origin")
            onnx_shape = _int_tuple(w["onnx_shape"]) if w.get("onnx_shape") is not None else None
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{where}: missing or malformed field ({e})") from None
        if not isinstance(name, str) or not isinstance(fmt, str):
            raise BundleError(f"{where}: name and format must be strings")
        where = f"{p}: weight {name!r}"
        if name in out:
            raise BundleError(f"{where} appears twice")
        if not isinstance(dt_name, str) or dt_name not in _DTYPES:
            raise BundleError(f"{where}: unsupported dtype {dt_name!r}")
        dt = _DTYPES[dt_name]
        if not (_is_int(offset) and _is_int(nbytes)) or offset < 0 or nbytes < 0:
            raise BundleError(f"{where}: offset/nbytes must be non-negative integers")
        if offset % ALIGNMENT:
            raise BundleError(f"{where}: offset {offset} is not {ALIGNMENT}-byte aligned")
        if offset + nbytes > blob_len:
            raise BundleError(f"{where}: bytes {offset}..{offset + nbytes} lie outside the "
                              f"{blob_len}-byte weight blob")
        count = 1
        for d in storage:
            count *= d
        if count * dt.itemsize != nbytes:
            raise BundleError(f"{where}: storage shape {storage} of {dt_name} is {count * dt.itemsize} bytes, "
                              f"entry says {nbytes}")
        if any(d < 0 for d in logical) or any(d < 0 for d in storage):
            raise BundleError(f"{where}: negative dimension in {logical} / {storage}")
        if fmt == "ND" and _prod(storage) != _prod(onnx_shape if onnx_shape is not None else logical):
            raise BundleError(f"{where}: stored as ND {storage} but its shape is "
                              f"{onnx_shape if onnx_shape is not None else logical}")
        try:
            _format(fmt, "format")
        except _Bad:
            raise BundleError(f"{where}: unknown format {_show(fmt)}") from None
        if c0 is not None and (not _is_int(c0) or c0 <= 0):
            raise BundleError(f"{where}: bad c0 {c0!r}")
        if not _is_int(groups) or groups < 1:
            raise BundleError(f"{where}: bad groups {groups!r}")
        if origin is not None and not isinstance(origin, str):
            raise BundleError(f"{where}: bad origin {origin!r}")
        if onnx_shape is not None and _prod(onnx_shape) != _prod(logical):
            raise BundleError(f"{where}: onnx_shape {onnx_shape} and logical shape {logical} differ in size")
        spans.append((offset, offset + nbytes, name))
        out[name] = WeightInfo(name, fmt, logical, storage, dt, c0, groups, origin, offset, nbytes, onnx_shape)
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise BundleError(f"{p}: weights {an!r} and {bn!r} overlap in the weight blob")
    return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _int_tuple(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in v):
        raise ValueError(f"{v!r} is not a list of integers")
    return tuple(v)


def iter_weight_infos(bundle: Bundle) -> Iterator[WeightInfo]:
    """Weight entries in blob order."""
    return iter(sorted(bundle.weights.values(), key=lambda w: w.offset))


# ------------------------------------------------------------------------------------------------
# The bundle of a planned model (built-in backend): what convert writes
# ------------------------------------------------------------------------------------------------

def write_plan_bundle(path: str | os.PathLike, loaded, p, *, support=None,
                      progress: Callable[[str, float | None], None] | None = None) -> None:
    """Write the offline bundle of a planned model: manifest, lowered graph, and the weight blob
    (pre-packed weights in their device format, other initializers as ND), streamed one at a time."""
    say = progress or (lambda stage, fraction=None: None)
    entries, moved, removed_nodes = _weight_entries(loaded, p, say)
    graph = lowered_graph(loaded, moved, removed_nodes)
    manifest = build_manifest(loaded, p, support=support)
    write_bundle(path, manifest, graph, entries)


def _weight_entries(loaded, p, say) -> tuple[Iterator, set[str], set[str]]:
    packed = {w.name: w for w in p.weights}
    moved: set[str] = set()
    removed_nodes: set[str] = set()
    plan_list = []
    for t in loaded.model.graph.initializer:
        if t.data_type == onnx.TensorProto.STRING:
            continue
        try:
            dtype_name(loaded.constants[t.name].dtype)
        except Exception:
            continue
        moved.add(t.name)
        plan_list.append(t.name)
    for name, w in packed.items():
        ref = loaded.constants[name]
        if ref.kind == "constant_node":
            moved.add(name)
            removed_nodes.add(ref.node_name)
            plan_list.append(name)
    total = len(plan_list)

    def entries():
        for k, name in enumerate(plan_list):
            say(f"writing weights ({k + 1}/{total})", (k + 1) / max(total, 1))
            w = packed.get(name)
            ref = loaded.constants[name]
            if w is None:
                yield WeightEntry(name, "ND", ref.shape, _reader(loaded, name, None))
                continue
            yield WeightEntry(name, w.format, w.logical_shape, _packer(loaded, w), c0=w.c0,
                                     groups=w.groups, origin=w.origin,
                                     onnx_shape=w.onnx_shape if w.onnx_shape != w.logical_shape else None)

    return entries(), moved, removed_nodes


def _reader(loaded, name: str, dtype) -> Callable[[], StreamedWeight]:
    """An initializer moved to the blob unchanged (ND), read and written a slice at a time."""
    def read() -> StreamedWeight | np.ndarray:
        ref = loaded.constants[name]
        if not ref.external:  # inline: the protobuf's copy is in memory already, and keeps its own dtype
            arr = loaded.constant_array(name)
            return arr if dtype is None else arr.astype(dtype)
        return stream_packed(lambda: loaded.constant_view(name), "ND", ref.shape,
                             ref.dtype if dtype is None else dtype)

    return read


def _packer(loaded, w) -> Callable[[], StreamedWeight]:
    """A planned weight: cast to its device dtype and packed in its device format, a slice at a time
    (:mod:`~npu_deploy.converters.files.weight_stream`: the same bytes as packing it whole)."""
    def pack() -> StreamedWeight:
        return stream_packed(lambda: loaded.constant_view(w.name), w.format, tuple(w.logical_shape), w.dtype,
                             c0=w.c0, groups=w.groups, origin=w.origin)

    return pack


def lowered_graph(loaded, moved: set[str], removed_nodes: set[str]) -> onnx.ModelProto:
    """The bundle's graph: the original semantics, dtypes and opset, with the user's shapes applied,
    without the initializers (and ``Constant`` nodes) that moved to the weight blob. Built field by
    field so that large inline initializers are never copied."""
    src = loaded.model
    m = onnx.ModelProto()
    m.ir_version = src.ir_version
    m.producer_name = "npu-deploy"
    m.producer_version = __version__
    m.domain = src.domain
    m.model_version = src.model_version
    m.doc_string = src.doc_string
    m.opset_import.extend(src.opset_import)
    m.metadata_props.extend(src.metadata_props)
    m.functions.extend(src.functions)
    g, sg = m.graph, src.graph
    g.name = sg.name
    g.doc_string = sg.doc_string
    g.node.extend(n for n in sg.node if n.name not in removed_nodes)
    g.input.extend(i for i in sg.input if i.name not in moved)
    g.output.extend(sg.output)
    g.value_info.extend(sg.value_info)
    g.initializer.extend(t for t in sg.initializer if t.name not in moved)
    g.sparse_initializer.extend(sg.sparse_initializer)
    return m


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(1 << 18)  # one buffer reused (f.read(n) would allocate n bytes per call)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _text_name(name: str) -> str:
    """A file name as manifest text: bytes that are not UTF-8 (kept by Python as surrogates) shown as
    ``\\xNN`` escapes, so that the manifest stays valid JSON in UTF-8."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def build_manifest(loaded, p, *, support=None) -> dict:
    """The bundle manifest: the plan's own record (:meth:`Plan.to_manifest`) plus where it came from."""
    origin = getattr(loaded, "aipp_source", None) or loaded.path  # AIPP: the user's model, not the prepended copy
    source = {"name": _text_name(origin.name), "path": _text_name(str(origin)), "sha256": _sha256(origin),
              "opset": loaded.opset, "ir_version": loaded.model.ir_version,
              "opsets": {o.domain or "ai.onnx": int(o.version) for o in loaded.model.opset_import}}
    manifest = p.to_manifest(support=support, source_model=source)
    if getattr(loaded, "aipp", None):
        manifest["aipp"] = loaded.aipp
    return manifest
