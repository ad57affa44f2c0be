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
import hashlib
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import onnx

from npu_deploy.errors import BundleError, ModelError

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
    from npu_deploy._result import _jsonable as base

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
    entry is written, and its array is released right after, so at most one packed weight is held.
    ``path`` is used exactly as given (no extension is added).
    """
    from npu_deploy._io import atomic_path

    if not isinstance(manifest, dict):
        raise BundleError("bundle manifest must be a dict")
    dest = Path(path)
    with atomic_path(dest) as tmp:
        try:
            with open(tmp, "wb") as f:
                _write_stream(f, manifest, graph, weights)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise BundleError(f"cannot write bundle {dest}: {e.strerror or e}",
                              hint="check free disk space and permissions") from e


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
        arr = np.ascontiguousarray(arr)
        name_dt = dtype_name(arr.dtype)
        info = WeightInfo(entry.name, str(entry.format), tuple(int(d) for d in entry.logical_shape),
                          tuple(int(d) for d in arr.shape), _DTYPES[name_dt],
                          None if entry.c0 is None else int(entry.c0), int(entry.groups), entry.origin,
                          pos, int(arr.nbytes),
                          None if entry.onnx_shape is None else tuple(int(d) for d in entry.onnx_shape))
        mv = memoryview(arr.reshape(-1).view(np.uint8))
        blob_hash.update(mv)
        f.write(mv)
        pad = _align(arr.nbytes) - arr.nbytes
        if pad:
            zeros = b"\0" * pad
            blob_hash.update(zeros)
            f.write(zeros)
        pos += arr.nbytes + pad
        infos.append(info)
        del arr, mv
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
        from npu_deploy.converters import formats

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


def read_bundle(path: str | os.PathLike, *, verify: bool = True) -> Bundle:
    """Open and validate a bundle. ``verify=False`` skips only the weight blob's checksum (large files).

    Raises :class:`~npu_deploy.errors.BundleError` (exit 2) for anything wrong: missing file, wrong
    magic, newer version, bad checksum, out-of-bounds or misaligned sections or weights.
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
        if dt_name not in _DTYPES:
            raise BundleError(f"{where}: unsupported dtype {dt_name!r}")
        dt = _DTYPES[dt_name]
        if not (isinstance(offset, int) and isinstance(nbytes, int)) or offset < 0 or nbytes < 0:
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
        if any(d < 0 for d in logical):
            raise BundleError(f"{where}: negative logical dimension in {logical}")
        if c0 is not None and (not isinstance(c0, int) or c0 <= 0):
            raise BundleError(f"{where}: bad c0 {c0!r}")
        if not isinstance(groups, int) or groups < 1:
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
