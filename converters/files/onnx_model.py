"""Load and validate an ONNX model for conversion: checks, fixed shapes, dynamic gears, lazy weights.

``load_model`` does, in order: read the protobuf without external data; check every external-data
reference (file present, inside the model's folder, long enough), the graph's structure (dangling
inputs, cycles) and that graph inputs/outputs are tensors (not sequences/optionals: an NPU model
exchanges tensors only); run ``onnx.checker`` (full check — when its only failures lie inside the
function body of a *standard* op, an onnx schema issue such as ``MeanVarianceNormalization``'s in
onnx 1.23, the plain check runs instead and ``warnings`` says so); apply the user's input shapes
(``--input-shape``) and dynamic gears (``--dynamic-batch`` / ``--dynamic-dims``) and refuse dynamic
dimensions nothing fixes; infer every tensor's shape at the largest gear (ONNX shape inference, then —
for shapes computed in the graph, e.g. ``Shape → Reshape`` chains — onnxruntime runs of the model on
zeros and on ones; shapes the runs cannot agree on depend on input *values* and are listed in
``data_dependent``). Which opsets and domains ATC accepts is the support check's question, not
loading's: ``opset`` is 0 for a model importing only ``ai.onnx.ml``. Weights are never all loaded:
``constant_array`` reads one initializer (inline or external) or one ``Constant`` node value at a time,
``constant_view`` maps one without reading it; inline initializers of :data:`STRIP_BYTES` or more are
not even parsed into the protobuf (they are referred to where they lie in the ``.onnx``, as external
data is).

>>> import numpy as np, onnx, tempfile, os
>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
>>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
>>> onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
>>> m = load_model(path, input_shapes={"x": (2, 4)})
>>> m.inputs[0].shape, m.shapes["y"], m.opset
((2, 4), (2, 4), 17)
>>> load_model(path, dynamic_batch=[1, 8]).gears
[{'x': (1, 4)}, {'x': (8, 4)}]
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npu_deploy.converters.files.om import read_varint
from npu_deploy.errors import InputError, ModelError

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: ``shape`` uses -1 for a dynamic dimension, ``dim_names`` its symbol."""

    name: str
    dtype: np.dtype
    shape: Shape
    dim_names: tuple[str | None, ...]

    @property
    def is_dynamic(self) -> bool:
        return any(d < 0 for d in self.shape)


@dataclasses.dataclass(frozen=True)
class ConstantRef:
    """Where a constant tensor's value lives: a graph initializer or a ``Constant`` node's ``value``."""

    name: str
    dtype: np.dtype
    shape: Shape
    kind: str  # "initializer" | "constant_node"
    node_name: str | None = None
    external: bool = False

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclasses.dataclass
class LoadedModel:
    """A checked model: ``model`` has the user's shapes applied and shapes inferred (weights not loaded
    when they are external). ``shapes``/``dtypes`` give every tensor at the largest gear."""

    model: onnx.ModelProto
    path: Path
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    opset: int
    gears: list[dict[str, Shape]]
    dynamic_mode: str | None
    shapes: dict[str, Shape]
    dtypes: dict[str, np.dtype]
    constants: dict[str, ConstantRef]
    # every imported domain -> version ("" for ai.onnx); ``opset`` above is the ai.onnx one, 0 when the
    # model imports none (an ai.onnx.ml-only model: loadable, refused by the support check)
    opsets: dict[str, int] = dataclasses.field(default_factory=dict)
    # what loading had to work around, one line each (the converter's report carries them)
    warnings: list[str] = dataclasses.field(default_factory=list)
    # tensors whose shapes depend on input values (absent from ``shapes``; the plan keeps them in ND
    # and leaves them out of the memory plan)
    data_dependent: list[str] = dataclasses.field(default_factory=list)
    # values inside the graph that are not tensors (sequences, optionals): value name -> kind
    # ("sequence", "optional", "map"); they have no shape, and ``dtypes`` gives their element type
    non_tensors: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def graph(self) -> onnx.GraphProto:
        return self.model.graph

    def nbytes(self, name: str) -> int:
        """Logical bytes of tensor ``name`` at the largest gear."""
        return int(np.prod(self.shapes[name], dtype=np.int64)) * np.dtype(self.dtypes[name]).itemsize

    def constant_array(self, name: str) -> np.ndarray:
        """The value of constant ``name``, read now (external data is read from disk for this tensor
        only, bounds-checked)."""
        ref = self.constants[name]
        tensor = self._tensor_proto(ref)
        if ref.external:
            return _read_external(tensor, self.path.parent, ref)
        arr = numpy_helper.to_array(tensor)
        return arr.reshape(ref.shape)

    @contextlib.contextmanager
    def constant_view(self, name: str):
        """A read-only view of constant ``name`` without reading it all: yields ``(array, release)``.

        External data is memory-mapped (the file's size is checked first, so a truncated file is a
        ``ModelError``, never a bus error); ``release()`` drops the pages read so far from this
        process's memory (they stay in the page cache), so a caller reading the tensor in slices holds
        one slice at a time. An inline tensor is the protobuf's own bytes (one copy of this tensor:
        the protobuf runtime gives its bytes out as a new object); ``release()`` does nothing there.
        The view is valid inside the ``with`` block only."""
        ref = self.constants[name]
        tensor = self._tensor_proto(ref)
        if not ref.external or ref.nbytes == 0:
            yield self.constant_array(name), (lambda: None)
            return
        with _mapped_external(tensor, self.path.parent, ref) as (arr, release):
            yield arr, release

    def _tensor_proto(self, ref: ConstantRef) -> onnx.TensorProto:
        index = self.__dict__.get("_proto_index")
        if index is None:
            index = {t.name: t for t in self.model.graph.initializer}
            for n in self.model.graph.node:
                if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
                    index[n.output[0]] = n.attribute[0].t
            self.__dict__["_proto_index"] = index
        try:
            return index[ref.name]
        except KeyError:
            raise ModelError(f"{self.path}: constant {ref.name!r} vanished from the graph") from None


def _np_dtype(elem_type: int) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return np.dtype("V1")  # unknown element type; support checks report it


def _external_info(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def _external_span(t: onnx.TensorProto, base: Path) -> tuple[Path, int, int]:
    """The data file, byte offset and byte length of ``t``'s external data: offset and length are
    integers, the length is the one the tensor's dims and type give, the offset is not negative."""
    info = _external_info(t)
    file = _external_file(base, info.get("location", ""), t.name)
    dtype = _np_dtype(t.data_type)
    nbytes = int(np.prod(tuple(t.dims), dtype=np.int64)) * dtype.itemsize
    try:
        offset = int(info.get("offset", 0))
        length = int(info.get("length", nbytes))
    except ValueError:
        raise ModelError(f"external data of {t.name!r}: offset {info.get('offset')!r} / length "
                         f"{info.get('length')!r} are not whole numbers", hint="re-export the model") from None
    if length != nbytes:
        raise ModelError(f"external data of {t.name!r}: length {length} does not match its shape "
                         f"{list(t.dims)} of {dtype} ({nbytes} bytes)", hint="re-export the model")
    if offset < 0:
        raise ModelError(f"external data of {t.name!r}: negative offset {offset}", hint="re-export the model")
    return file, offset, nbytes


def _read_external(t: onnx.TensorProto, base: Path, ref: ConstantRef) -> np.ndarray:
    file, offset, _ = _external_span(t, base)
    out = np.empty(ref.shape, dtype=ref.dtype)
    with open(file, "rb") as f:
        f.seek(offset)
        got = f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
    if got != ref.nbytes:
        raise ModelError(f"external data of {t.name!r} in {file} is truncated ({got} of {ref.nbytes} bytes)",
                         hint="copy the complete data file next to the model")
    return out


@contextlib.contextmanager
def _mapped_external(t: onnx.TensorProto, base: Path, ref: ConstantRef):
    """``(array, release)`` over the external data of ``t``, memory-mapped read-only (see
    :meth:`LoadedModel.constant_view`); the same checks as :func:`_read_external`."""
    file, offset, _ = _external_span(t, base)
    with open(file, "rb") as f:
        # checked on the open file: a mapping past the end would be a bus error when read, not an exception
        size = os.fstat(f.fileno()).st_size
        if size < offset + ref.nbytes:
            raise ModelError(f"external data of {t.name!r} in {file} is truncated "
                             f"({max(size - offset, 0)} of {ref.nbytes} bytes)",
                             hint="copy the complete data file next to the model")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(f.fileno(), offset - start + ref.nbytes, access=mmap.ACCESS_READ, offset=start)
    try:
        arr = np.frombuffer(mm, dtype=ref.dtype, count=int(np.prod(ref.shape, dtype=np.int64)),
                            offset=offset - start).reshape(ref.shape)

        def release() -> None:
            # MADV_DONTNEED on a read-only file mapping: the pages leave this process (RSS), the page
            # cache keeps them; a later read faults them in again
            if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)

        yield arr, release
        del arr
    finally:
        try:
            mm.close()
        except BufferError:  # a view escaped the with block: the mapping closes when it is collected
            pass


def _external_file(base: Path, location: str, tensor: str) -> Path:
    if not location or os.path.isabs(location):
        raise ModelError(f"tensor {tensor!r}: external data location {location!r} must be a relative path",
                         hint="keep external data files next to the model")
    file = (base / location).resolve()
    if base.resolve() not in file.parents:
        raise ModelError(f"tensor {tensor!r}: external data location {location!r} points outside the "
                         f"model's folder", hint="keep external data files next to the model")
    return file


def _parse_dynamic_dims(dynamic_dims) -> list[tuple[int, ...]]:
    if dynamic_dims is None:
        return []
    if isinstance(dynamic_dims, str):
        out = []
        for gear in dynamic_dims.split(";"):
            if gear.strip():
                try:
                    out.append(tuple(int(v) for v in gear.split(",")))
                except ValueError:
                    raise InputError(f"--dynamic-dims: {gear!r} is not a comma-separated list of integers",
                                     hint='example: --dynamic-dims "1,224;4,448"') from None
        return out
    return [tuple(int(v) for v in g) for g in dynamic_dims]


def load_model(path: str | os.PathLike, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
               dynamic_batch: Sequence[int] | None = None, dynamic_dims=None,
               check: bool = True, out_nodes: str | None = None,
               output_type: str | None = None) -> LoadedModel:
    """Load, check and shape an ONNX model (see the module docstring). Raises ``ModelError`` /
    ``InputError`` (exit 2) with one line naming the file, tensor or input and the flag to use.
    ``out_nodes`` / ``output_type``: ATC's ``--out_nodes`` / ``--output_type``, applied to the graph
    right after reading it (:mod:`npu_deploy.converters.files.output_edit`)."""
    p = Path(path)
    model = _read_model(p)
    _check_external(model, p)
    inlined = _inline_small_external(model, p)
    _check_structure(model.graph, p)
    check_initializer_sizes(model.graph, p)
    if out_nodes or output_type:  # ATC's --out_nodes / --output_type: the same graph for both backends
        from npu_deploy.converters.files.output_edit import edit_outputs

        model = edit_outputs(model, out_nodes=out_nodes, output_type=output_type)
    _check_io_types(model.graph, p)
    warnings: list[str] = []
    if check:
        try:
            _full_check(model, p, inlined)
        except onnx.checker.ValidationError as e:
            # onnx.checker is stricter than the runtimes (e.g. a graph output type without `shape`):
            # a model onnxruntime loads is converted, with a warning; otherwise it is refused
            if not _onnxruntime_loads(p):
                raise ModelError(f"{p}: invalid ONNX model: {_first_line(e)}",
                                 hint="fix the export (onnx.checker rejects it)") from None
            warnings.append(f"onnx.checker rejects the model ({_first_line(e)[:160]}), but onnxruntime loads "
                            f"it: converted anyway; fix the export to be safe with other tools")
        except Exception as e:  # shape-inference errors raised by full_check
            ops = _standard_body_failures(model, e)
            if not ops:
                raise ModelError(f"{p}: invalid ONNX model: {_first_line(e)}",
                                 hint="fix the export (onnx.checker rejects it)") from None
            try:  # the model's own graph passed inference; still run the structural checker
                with _checker_path(model, p) as checked:
                    onnx.checker.check_model(checked, full_check=False)
            except Exception as e2:
                raise ModelError(f"{p}: invalid ONNX model: {_first_line(e2)}",
                                 hint="fix the export (onnx.checker rejects it)") from None
            warnings.append(_body_warning(ops))
    opset = _opset(model)
    name_nodes(model.graph)

    init_names = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in init_names]
    input_shapes = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    known = [i.name for i in graph_inputs]
    for name, shape in input_shapes.items():
        if name not in known:
            raise ModelError(f"--input-shape names {name!r}, which is not an input of {p.name}",
                             hint=f"inputs are: {', '.join(known)}")
    base, fixed = _fixed_input_shapes(graph_inputs, input_shapes, p)

    gears, mode = _gears(fixed, dynamic_batch, _parse_dynamic_dims(dynamic_dims))
    for i in graph_inputs:
        if any(d < 0 for d in fixed[i.name]) and not gears:
            shape, names = base[i.name]
            example = ",".join(str(d) if d >= 0 else "?" for d in fixed[i.name])
            err = ModelError(f"input {i.name!r} of {p.name} has dynamic dimensions {_fmt(shape, names)}",
                             hint=f"fix them with --input-shape \"{i.name}:{example}\" with each ? replaced "
                                  f"by a size, or give gears with --dynamic-batch / --dynamic-dims")
            err.dynamic_input = (i.name, example)  # callers without these flags word their own hint
            raise err

    # The model as the bundle keeps it: user shapes applied, gear dims left symbolic.
    for i in graph_inputs:
        _set_shape(i, fixed[i.name], base[i.name][1])
    try:
        inferred = _infer_shapes(model, warnings)
    except Exception as e:
        raise ModelError(f"{p}: shape inference failed with the given input shapes: {_first_line(e)}",
                         hint="check --input-shape values") from None

    itemsize = {i.name: _np_dtype(i.type.tensor_type.elem_type).itemsize for i in graph_inputs}
    for gear in gears or [fixed]:  # before anything is sized or run at these shapes
        for name, shape in gear.items():
            _check_size(p, f"input {name!r}" + (f" at gear {dict(gear)}" if gears else ""), shape, itemsize[name])
    largest = max(gears, key=lambda g: sum(int(np.prod(s)) for s in g.values())) if gears else fixed
    for gear in gears:  # the largest is inferred below (_all_shapes); every other gear must infer too
        if gear is not largest:
            _check_gear(inferred, p, gear)
    shapes, dtypes, unknown, why, non_tensors = _all_shapes(inferred, p, largest, warnings)
    for name, shape in shapes.items():
        _check_size(p, f"tensor {name!r}", shape, np.dtype(dtypes.get(name, np.uint8)).itemsize)
    if unknown:
        warnings.append(f"{len(unknown)} tensor(s) have data-dependent shapes (e.g. {unknown[0]!r}; {why}): "
                        f"kept in ND, memory not planned for them (sized at run time, as ATC's dynamic shape "
                        f"mode would need)")
    constants = _constants(inferred)
    inputs = [_info(i, fixed[i.name], base[i.name][1]) for i in graph_inputs]
    outputs = []
    for o in inferred.graph.output:
        s, names = _vi_shape(o)
        outputs.append(TensorInfo(o.name, _np_dtype(o.type.tensor_type.elem_type), s, names))
    return LoadedModel(inferred, p, inputs, outputs, opset, gears, mode, shapes, dtypes, constants,
                       opsets=_opsets(model), warnings=warnings, data_dependent=unknown,
                       non_tensors=non_tensors)


def _read_model(p: Path) -> onnx.ModelProto:
    """The ONNX model in the file ``p``, read by our own code (onnx's open refuses a non-UTF-8 name);
    a missing file, a folder, a device or pipe, or bytes that are not a model: one ModelError."""
    if not p.exists():
        raise ModelError(f"{p}: no such file", hint="check the model path")
    if p.is_dir():
        raise ModelError(f"{p}: is a folder, not an ONNX file")
    if not p.is_file():  # /dev/zero, a FIFO: a read that never ends
        raise ModelError(f"{p}: is not a regular file (a device, pipe or socket)", hint="give an .onnx file")
    try:
        with open(p, "rb") as f:  # our own read: onnx's open refuses a non-UTF-8 file name
            # a link to a file elsewhere (a download cache's blobs): the references would point out of
            # the model's folder, which external data may not; such a model is read whole
            stripped = _without_large_raw_data(f, p.name) if p.resolve().parent == p.parent.resolve() else None
            model = onnx.load_model_from_string(f.read() if stripped is None else stripped)
    except OSError as e:
        raise ModelError(f"{p}: cannot read ({e.strerror})") from None
    except Exception as e:  # protobuf DecodeError, or onnx's own errors
        raise ModelError(f"{p}: not an ONNX model (protobuf parse failed: {str(e).splitlines()[0][:120]})",
                         hint="check the file is a complete .onnx export") from None
    if not model.HasField("graph") or model.ir_version <= 0:
        raise ModelError(f"{p}: not an ONNX model (no graph or IR version)",
                         hint="check the file is a complete .onnx export")
    return model


STRIP_BYTES = 1 << 20
"""Inline ``raw_data`` of an initializer at least this large is left in the file: the model is read
with an external-data reference to where the bytes lie in the ``.onnx`` itself (see
:func:`_without_large_raw_data`)."""

# element types whose raw bytes are the little-endian numpy array (what constant_view maps)
_RAW_TYPES = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13}


def _put_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """``(field, wire_type, field_start, value_start, value_end)`` of each field in ``buf[start:end]``
    (protobuf wire format), every length bounds-checked; groups (wire types 3/4) are refused."""
    pos = start
    while pos < end:
        first = pos
        tag, pos = read_varint(buf, pos, end)
        field, wt = tag >> 3, tag & 7
        if wt == 0:
            _, after = read_varint(buf, pos, end)
        elif wt == 1:
            after = pos + 8
        elif wt == 5:
            after = pos + 4
        elif wt == 2:
            n, pos = read_varint(buf, pos, end)
            after = pos + n
        else:
            raise ValueError(f"wire type {wt}")
        if after > end:
            raise ValueError("field runs past its message")
        yield field, wt, first, pos, after
        pos = after


def _entry(key: str, value: str) -> bytes:
    body = b"\x0a" + _put_varint(len(key.encode())) + key.encode() + b"\x12" + _put_varint(len(value.encode())) \
        + value.encode()
    return b"\x6a" + _put_varint(len(body)) + body  # field 13 (external_data), length-delimited


def _strip_tensor(buf, start: int, end: int, location: str) -> bytes | None:
    raw = None
    dtype = location_kind = None
    external = False
    for field, wt, first, vs, ve in _fields(buf, start, end):
        if field == 9 and wt == 2:
            if raw is not None:  # repeated raw_data (the last one wins in protobuf): left to the parser
                return None
            raw = (first, vs, ve)
        elif field == 2 and wt == 0:
            dtype = read_varint(buf, vs, ve)[0]
        elif field == 14 and wt == 0:
            location_kind = read_varint(buf, vs, ve)[0]
        elif field == 13:
            external = True
    if raw is None or raw[2] - raw[1] < STRIP_BYTES or dtype not in _RAW_TYPES or external or location_kind:
        return None
    first, vs, ve = raw
    return (bytes(buf[start:first]) + bytes(buf[ve:end]) + _entry("location", location) +
            _entry("offset", str(vs)) + _entry("length", str(ve - vs)) + b"\x70\x01")  # data_location EXTERNAL


def _strip_graph(buf, start: int, end: int, location: str) -> bytes | None:
    parts, done, last = [], False, start
    for field, wt, first, vs, ve in _fields(buf, start, end):
        if field == 5 and wt == 2:  # initializer
            t = _strip_tensor(buf, vs, ve, location)
            if t is not None:
                parts += [bytes(buf[last:first]), b"\x2a", _put_varint(len(t)), t]
                last, done = ve, True
    if not done:
        return None
    parts.append(bytes(buf[last:end]))
    return b"".join(parts)


def _without_large_raw_data(f, location: str) -> bytes | None:
    """The model file's bytes with every initializer's inline ``raw_data`` of :data:`STRIP_BYTES` or
    more replaced by an external-data reference to those same bytes in the file itself (location: the
    file's own name), or ``None`` when there is none (or the file does not parse as protobuf here: the
    normal read then reports it). The file is memory-mapped; only the messages around the weights are
    copied, so the protobuf in memory holds no large weight (they are read one at a time, as external
    data is)."""
    size = os.fstat(f.fileno()).st_size
    try:
        location.encode("utf-8")
    except UnicodeEncodeError:  # a protobuf string must be UTF-8: such a file is read whole
        return None
    if size < STRIP_BYTES:
        return None
    with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
        try:
            parts, done, last = [], False, 0
            for field, wt, first, vs, ve in _fields(mm, 0, size):
                if field == 7 and wt == 2:  # ModelProto.graph
                    g = _strip_graph(mm, vs, ve, location)
                    if g is not None:
                        parts += [mm[last:first], b"\x3a", _put_varint(len(g)), g]
                        last, done = ve, True
            if not done:
                return None
            parts.append(mm[last:size])
            return b"".join(parts)
        except ValueError:
            return None


def _fixed_input_shapes(graph_inputs, input_shapes: dict, p: Path) -> tuple[dict, dict]:
    """Each graph input's declared (shape, dim names), and its shape with the user's ``--input-shape``
    applied (checked against the model: rank, fixed dimensions)."""
    base = {i.name: _vi_shape(i) for i in graph_inputs}
    fixed: dict[str, Shape] = {}
    for i in graph_inputs:
        shape, names = base[i.name]
        shapeless = not i.type.tensor_type.HasField("shape")
        if shapeless and i.name not in input_shapes:
            raise ModelError(f"input {i.name!r} of {p.name} declares no shape",
                             hint=f"give it with --input-shape \"{i.name}:d0,d1,...\"")
        if shapeless:
            dims = i.type.tensor_type.shape.dim
            for _ in input_shapes[i.name]:
                dims.add()
            shape = (-1,) * len(input_shapes[i.name])
            names = (None,) * len(shape)
            base[i.name] = (shape, names)
        if i.name in input_shapes:
            user = input_shapes[i.name]
            if len(user) != len(shape):
                raise ModelError(f"--input-shape {i.name}:{','.join(map(str, user))} has rank {len(user)}, "
                                 f"but input {i.name!r} has rank {len(shape)} {_fmt(shape, names)}",
                                 hint=f"give {len(shape)} dimensions")
            for k, (u, d) in enumerate(zip(user, shape)):
                if d >= 0 and u >= 0 and u != d:
                    raise ModelError(f"--input-shape {i.name}: dimension {k} is {u}, but the model fixes it "
                                     f"to {d} {_fmt(shape, names)}", hint="use the model's value")
            shape = user
        fixed[i.name] = shape
    return base, fixed


# No Ascend device holds a tensor larger than its memory (64 GiB HBM on a 910B; 128 GiB bounds every
# device): such a shape is the model's (or the user's) mistake, refused at load, not a crash at run time.
MAX_TENSOR_BYTES = 1 << 37


def _check_size(p: Path, what: str, shape: Sequence[int], itemsize: int) -> None:
    n = 1
    for d in shape:
        n *= max(int(d), 1)
        if n * max(itemsize, 1) > MAX_TENSOR_BYTES:
            dims = ",".join(str(int(d)) for d in shape)
            raise ModelError(f"{p.name}: {what} has shape [{dims}], over {MAX_TENSOR_BYTES >> 30} GiB: more "
                             f"than any Ascend device's memory", hint="check the model's dimensions and --input-shape")


def _onnxruntime_loads(p: Path) -> bool:
    """Whether onnxruntime accepts the model file (graph optimisations off: only loading is tested)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    try:
        ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


_TAG = "__npu_deploy_check_"


def _standard_body_failures(model: onnx.ModelProto, error: BaseException) -> list[str]:
    """When strict shape inference fails *only inside the function bodies of standard ops* (onnx's
    own schemas, not the model's graph), the op types concerned; otherwise ``[]``.

    onnx 1.23 fails for instance on ``MeanVarianceNormalization`` with the default ``axes``: its
    schema body holds ``Constant <value_ints = @axes>`` and the default is not substituted for the
    reference, so the body's Constant has no value. That is onnx's bug, not the model's; the model's
    own nodes are still checked (the full check reports every failing node, each tagged here, and a
    node's own input types are checked against its schema). ``error`` is the original failure:
    anything other than inference errors is never excused."""
    if "Inference error(s)" not in str(error):
        return []
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for k, n in enumerate(m.graph.node):
        n.name = f"{_TAG}{k}"
    try:
        onnx.checker.check_model(m, full_check=True)
        return []  # not reproducible on the tagged copy: do not guess
    except onnx.checker.ValidationError:
        return []
    except Exception as e:
        text = str(e)
    import re

    header = re.compile(r"\(op_type:[^,()]*, node name: " + _TAG + r"(\d+)\): ")
    parts = header.split(text)
    # parts: [prefix, index, error, index, error, ...]; the prefix must be only the aggregate header
    if len(parts) < 3 or parts[0].strip() != "[ShapeInferenceError] Inference error(s):":
        return []
    local = {(f.domain, f.name) for f in model.functions}
    opset = _opset(model)
    types = _value_types(m)
    ops = []
    for index, err in zip(parts[1::2], parts[2::2]):
        n = model.graph.node[int(index)]
        if n.domain not in ("", "ai.onnx") or ("", n.op_type) in local or ("ai.onnx", n.op_type) in local:
            return []
        try:
            schema = onnx.defs.get_schema(n.op_type, opset, "")
        except Exception:
            return []
        if not (schema.has_function or schema.has_context_dependent_function):
            return []
        # nested: the error comes from a node of the op's function body, not from the node itself
        if not err.startswith("[ShapeInferenceError] Inference error(s): (op_type:"):
            return []
        if types is None or not _inputs_match_schema(types, n, schema):
            return []
        ops.append(n.op_type)
    return sorted(set(ops))


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto] | None:
    """Every value's type after non-strict inference (``None`` when even that fails)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return None
    types = {vi.name: vi.type for vi in [*inferred.graph.input, *inferred.graph.value_info,
                                          *inferred.graph.output]}
    for t in inferred.graph.initializer:
        types[t.name] = helper.make_tensor_type_proto(t.data_type, None)
    return types


def _inputs_match_schema(types: Mapping[str, onnx.TypeProto], node: onnx.NodeProto, schema) -> bool:
    """The node's own input types against its schema's type constraints: the check a failing function
    body can hide (inference stops inside the body before reaching the node's real problem)."""
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    formals = list(schema.inputs)
    for k, name in enumerate(node.input):
        if not name or not formals or name not in types:
            continue
        formal = formals[min(k, len(formals) - 1)]
        t = types[name]
        if not t.HasField("tensor_type") or not t.tensor_type.elem_type:
            continue
        have = f"tensor({helper.tensor_dtype_to_string(t.tensor_type.elem_type).split('.')[-1].lower()})"
        want = allowed.get(formal.type_str, {formal.type_str})
        if have not in want:
            return False
    return True


def _body_warning(ops: Sequence[str]) -> str:
    return (f"onnx's shape inference fails inside the standard function body of {', '.join(ops)} (an onnx "
            f"schema issue, not the model's graph): checked without full_check, shapes completed by running "
            f"the model")


def _infer_shapes(model: onnx.ModelProto, warnings: list[str]) -> onnx.ModelProto:
    """Strict ONNX shape inference; non-strict only when the sole failures are inside standard ops'
    function bodies (see ``_standard_body_failures``), with a warning added."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as e:
        ops = _standard_body_failures(model, e)
        if not ops:
            raise
        w = _body_warning(ops)
        if w not in warnings:
            warnings.append(w)
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)


def name_nodes(graph: onnx.GraphProto, seen: set[str] | None = None) -> None:
    """Give every node a unique name (``<op_type>_<index>`` for unnamed ones), unique across the
    whole model, If/Loop/Scan bodies included: reports and the bundle manifest key nodes by name.
    Names carry no semantics in ONNX. Top-level nodes are named first, so theirs never change
    because of a body."""
    seen = set() if seen is None else seen
    for k, n in enumerate(graph.node):
        name = n.name or f"{n.op_type}_{k}"
        while name in seen:
            name = f"{name}_{k}"
        n.name = name
        seen.add(name)
    for n in graph.node:
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                name_nodes(g, seen)


def _first_line(e: BaseException) -> str:
    """The error text as one line (checker messages span several lines), at most 300 characters."""
    text = " ".join(t.strip() for t in str(e).strip().splitlines() if t.strip()) or type(e).__name__
    return text[:300]


_TYPED_FIELD = {onnx.TensorProto.FLOAT: "float_data", onnx.TensorProto.DOUBLE: "double_data",
                onnx.TensorProto.INT64: "int64_data", onnx.TensorProto.UINT64: "uint64_data",
                onnx.TensorProto.INT32: "int32_data", onnx.TensorProto.FLOAT16: "int32_data",
                onnx.TensorProto.BFLOAT16: "int32_data", onnx.TensorProto.INT8: "int32_data",
                onnx.TensorProto.UINT8: "int32_data", onnx.TensorProto.INT16: "int32_data",
                onnx.TensorProto.UINT16: "int32_data", onnx.TensorProto.BOOL: "int32_data",
                onnx.TensorProto.UINT32: "uint64_data"}


def check_initializer_sizes(graph: onnx.GraphProto, p: Path) -> None:
    """Every inline initializer holds as many values as its dims say (``onnx.checker`` does not check
    it; numpy's reshape would fail later with "cannot reshape array"). Sub-byte and string types are
    left to their readers; external data is checked where it is read."""
    for t in graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or t.data_type not in _TYPED_FIELD:
            continue
        want = 1
        for d in t.dims:
            want *= int(d)
        if t.raw_data:
            item = _np_dtype(t.data_type).itemsize
            have, unit = len(t.raw_data) / item, f"{len(t.raw_data)} bytes of raw data"
        else:
            have = len(getattr(t, _TYPED_FIELD[t.data_type]))
            unit = f"{have} values"
        if have != want and not (want == 0 and have == 0):
            dims = ",".join(str(int(d)) for d in t.dims)
            raise ModelError(f"{p.name}: initializer {t.name!r} has dims [{dims}] ({want} values) but holds {unit}",
                             hint="fix the export: the tensor's dims and data disagree")


def _check_structure(graph: onnx.GraphProto, p: Path) -> None:
    """Dangling inputs and cycles, named (onnx.checker reports both as "not topologically sorted")."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    known |= {t.values.name for t in graph.sparse_initializer}
    produced: dict[str, int] = {}
    for k, n in enumerate(graph.node):
        for o in n.output:
            if o:
                produced[o] = k
    for k, n in enumerate(graph.node):
        for i in n.input:
            if i not in known and i not in produced:
                name = n.name or f"{n.op_type} #{k}"
                raise ModelError(f"{p.name}: node {name!r} reads {i!r}, which no node, graph input or "
                                 f"initializer provides (dangling input)", hint="fix the export")
    for o in graph.output:
        if o.name not in known and o.name not in produced:
            raise ModelError(f"{p.name}: graph output {o.name!r} is not produced by any node",
                             hint="fix the export")
    # Kahn's algorithm over node dependencies: what remains is on (or behind) a cycle.
    deps = [{produced[i] for i in n.input if i in produced and i not in known} for n in graph.node]
    users: dict[int, list[int]] = {}
    for k, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(k)
    count = [len(d) for d in deps]
    ready = [k for k, c in enumerate(count) if c == 0]
    done = 0
    while ready:
        k = ready.pop()
        done += 1
        for u in users.get(k, []):
            count[u] -= 1
            if count[u] == 0:
                ready.append(u)
    if done != len(graph.node):
        stuck = [graph.node[k].name or f"{graph.node[k].op_type} #{k}" for k, c in enumerate(count) if c > 0]
        raise ModelError(f"{p.name}: the graph has a cycle through node(s) {', '.join(stuck[:5])}"
                         + (f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""),
                         hint="fix the export: an ONNX graph must be acyclic")


def _opset(model: onnx.ModelProto) -> int:
    """The ai.onnx opset, 0 when the model imports only other domains (e.g. ai.onnx.ml). Whether ATC
    can take such a model is the support check's question (``support.check_opset``), not loading's."""
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 0


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}


_VALUE_KINDS = {"sequence_type": "a sequence", "optional_type": "an optional", "map_type": "a map",
                "sparse_tensor_type": "a sparse tensor"}


def _check_io_types(graph: onnx.GraphProto, p: Path) -> None:
    """An offline NPU model (ATC .om, our bundle) exchanges dense tensors only (ACL datasets hold
    tensors): refuse graph inputs/outputs typed as sequences, optionals, maps or sparse tensors."""
    init_names = {t.name for t in graph.initializer}
    for kind, values in (("input", [i for i in graph.input if i.name not in init_names]),
                         ("output", list(graph.output))):
        for vi in values:
            which = vi.type.WhichOneof("value")
            if which in _VALUE_KINDS:
                raise ModelError(f"{p.name}: graph {kind} {vi.name!r} is {_VALUE_KINDS[which]}, not a tensor: an "
                                 f"NPU model exchanges tensors only",
                                 hint="keep sequences/optionals inside the graph (e.g. ConcatFromSequence "
                                      "before the output)")


def _check_external(model: onnx.ModelProto, p: Path) -> None:
    tensors: Iterable[onnx.TensorProto] = list(model.graph.initializer)
    for n in model.graph.node:
        if n.op_type == "Constant":
            tensors = [*tensors, *(a.t for a in n.attribute if a.type == onnx.AttributeProto.TENSOR)]
    for t in tensors:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = _external_info(t)
        file = _external_file(p.parent, info.get("location", ""), t.name)
        if not file.is_file():
            raise ModelError(f"{p.name}: external data file {info.get('location')!r} of tensor {t.name!r} "
                             f"is missing", hint=f"copy it next to the model ({p.parent})")
        _, offset, nbytes = _external_span(t, p.parent)
        need = offset + nbytes
        if file.stat().st_size < need:
            raise ModelError(f"{p.name}: external data file {file.name} is too short for tensor {t.name!r} "
                             f"(needs {need} bytes, has {file.stat().st_size})",
                             hint="copy the complete data file next to the model")


_INT_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
              onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16, onnx.TensorProto.UINT8,
              onnx.TensorProto.BOOL)


def _full_check(model: onnx.ModelProto, p: Path, inlined: bool) -> None:
    """``onnx.checker``'s full check. When shape tensors were read in from external data, the file's copy
    would make its shape inference fail on them: check the structure on the file (external data is
    resolved next to it), then run the same strict inference on the model in memory."""
    with _checker_path(model, p) as path:
        if not inlined:
            onnx.checker.check_model(path, full_check=True)
            return
        onnx.checker.check_model(path, full_check=False)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


@contextlib.contextmanager
def _checker_path(model: onnx.ModelProto, p: Path):
    """A path to ``p`` that onnx's checker binding accepts. It takes only names that are valid UTF-8;
    a file named otherwise (``m\\xff.onnx``, read by our own code) is checked through links with plain
    names in a temporary folder: one to the model, one to each external data file it names."""
    name = str(p)
    own = _reads_itself(model, p)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        if not own:
            yield name
            return
    with tempfile.TemporaryDirectory(prefix="npu-deploy-check-") as tmp:
        link = Path(tmp) / "model.onnx"
        if own:  # read without its large weights (_read_model): the checker gets that protobuf, not the file
            link = Path(tmp) / "__npu_deploy_checked__.onnx"
            link.write_bytes(model.SerializeToString())
            # its weights' location is the model file itself; the checker wants a regular file of that
            # name (no symlink) and never reads it: an empty stand-in (the bounds are _check_external's)
            (Path(tmp) / p.name).touch()
        else:
            link.symlink_to(p.resolve())
        for t in _external_tensors(model):
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if not loc or os.path.isabs(loc) or ".." in Path(loc).parts:
                continue   # refused by the external-data check before this point
            dst = Path(tmp) / loc
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.symlink_to((p.parent / loc).resolve())
        yield str(link)


def _reads_itself(model: onnx.ModelProto, p: Path) -> bool:
    """Whether some tensor's external data is the model file itself (large inline weights left in
    place by :func:`_read_model`)."""
    return any(e.key == "location" and e.value == p.name for t in model.graph.initializer
               if t.data_location == onnx.TensorProto.EXTERNAL for e in t.external_data)


def _external_tensors(model: onnx.ModelProto):
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield t
    for n in model.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_location == onnx.TensorProto.EXTERNAL:
                yield a.t


def _inline_small_external(model: onnx.ModelProto, p: Path) -> bool:
    """Read small integer tensors kept in external data (Reshape targets, Slice bounds, axes: what a
    save with ``size_threshold=0`` puts outside) into the model: ONNX shape inference reads their
    values and cannot read external data. Weights stay external. True when any was read."""
    tensors: list[onnx.TensorProto] = list(model.graph.initializer)
    for n in model.graph.node:
        if n.op_type == "Constant":
            tensors += [a.t for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    done = False
    for t in tensors:
        if t.data_location != onnx.TensorProto.EXTERNAL or t.data_type not in _INT_TYPES:
            continue
        shape = tuple(int(d) for d in t.dims)
        if int(np.prod(shape, dtype=np.int64)) > 4096:
            continue
        ref = ConstantRef(t.name, _np_dtype(t.data_type), shape, "initializer", external=True)
        arr = _read_external(t, p.parent, ref)
        t.raw_data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
        done = True
    return done


def _vi_shape(vi: onnx.ValueInfoProto) -> tuple[Shape, tuple[str | None, ...]]:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return (), ()
    dims, names = [], []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
            names.append(None)
        else:
            dims.append(-1)
            names.append(d.dim_param or None)
    return tuple(dims), tuple(names)


def _fmt(shape: Shape, names: Sequence[str | None]) -> str:
    parts = [str(d) if d >= 0 else (names[k] if k < len(names) and names[k] else "?")
             for k, d in enumerate(shape)]
    return "[" + ",".join(parts) + "]"


def _set_shape(vi: onnx.ValueInfoProto, shape: Shape, names: Sequence[str | None]) -> None:
    dims = vi.type.tensor_type.shape.dim
    for k, (d, v) in enumerate(zip(dims, shape)):
        if v >= 0:
            d.Clear()
            d.dim_value = v
        elif not d.dim_param:
            d.Clear()
            d.dim_param = (names[k] if k < len(names) and names[k] else f"{vi.name}_dim{k}")


def _gears(fixed: dict[str, Shape], batch: Sequence[int] | None,
           dims: list[tuple[int, ...]]) -> tuple[list[dict[str, Shape]], str | None]:
    if batch and dims:
        raise InputError("--dynamic-batch and --dynamic-dims cannot be used together",
                         hint="choose one (ATC accepts only one dynamic mode)")
    if batch:
        batch = [int(b) for b in batch]
        if any(b <= 0 for b in batch) or len(set(batch)) != len(batch):
            raise InputError(f"--dynamic-batch {','.join(map(str, batch))}: gears must be distinct positive "
                             f"integers")
        for name, shape in fixed.items():
            if any(d < 0 for d in shape[1:]):
                raise ModelError(f"input {name!r} has dynamic dimensions besides the batch "
                                 f"{_fmt(shape, ())}: --dynamic-batch covers only dimension 0",
                                 hint=f"fix the others with --input-shape \"{name}:-1,...\"")
        if not any(s and s[0] < 0 for s in fixed.values()):
            raise InputError("--dynamic-batch given, but no input has a dynamic batch dimension",
                             hint="mark it with -1 in --input-shape (e.g. x:-1,3,224,224)")
        return [{n: ((b,) + s[1:] if s and s[0] < 0 else s) for n, s in fixed.items()} for b in batch], "batch"
    if dims:
        slots = [(n, k) for n, s in fixed.items() for k, d in enumerate(s) if d < 0]
        if not slots:
            raise InputError("--dynamic-dims given, but no input dimension is -1",
                             hint="mark the dynamic dimensions with -1 in --input-shape")
        gears = []
        for g in dims:
            if len(g) != len(slots):
                raise InputError(f"--dynamic-dims gear {','.join(map(str, g))} has {len(g)} values, but the "
                                 f"input shapes have {len(slots)} dynamic (-1) dimensions")
            if any(v <= 0 for v in g):
                raise InputError(f"--dynamic-dims gear {','.join(map(str, g))}: values must be positive")
            gear = {n: list(s) for n, s in fixed.items()}
            for (n, k), v in zip(slots, g):
                gear[n][k] = v
            gears.append({n: tuple(s) for n, s in gear.items()})
        return gears, "dims"
    return [], None


def _check_gear(model: onnx.ModelProto, p: Path, gear: Mapping[str, Shape]) -> None:
    """Strict shape inference at ``gear``, so a gear the model cannot run (a fixed Reshape, two inputs
    whose dims must agree) is refused at conversion, not found at run time. Float weight bytes are
    dropped from the copy: inference reads their dims, not their values."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.data_type in _FLOAT_TYPES and len(t.raw_data) > 4096:
            t.ClearField("raw_data")
    init_names = {t.name for t in m.graph.initializer}
    for i in m.graph.input:
        if i.name in gear and i.name not in init_names:
            _set_shape(i, gear[i.name], ())
    try:
        _infer_shapes(m, [])
    except Exception as e:
        raise ModelError(f"{p}: shape inference failed at gear {dict(gear)}: {_first_line(e)}",
                         hint="check --input-shape / gear values") from None


_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                onnx.TensorProto.DOUBLE)


def _info(vi: onnx.ValueInfoProto, shape: Shape, names: Sequence[str | None]) -> TensorInfo:
    return TensorInfo(vi.name, _np_dtype(vi.type.tensor_type.elem_type), tuple(shape), tuple(names))


def _concrete(vi: onnx.ValueInfoProto) -> Shape | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def _all_shapes(model: onnx.ModelProto, p: Path, gear: Mapping[str, Shape], warnings: list[str] | None = None
                ) -> tuple[dict[str, Shape], dict[str, np.dtype], list[str], str | None, dict[str, str]]:
    """Every tensor's concrete shape and dtype at ``gear`` (ONNX inference, then onnxruntime), the
    tensors whose shapes depend on input values (left out of the shapes) and why, and the values
    that are not tensors (name -> kind)."""
    init_names = {t.name for t in model.graph.initializer}
    if all(gear.get(i.name) == _concrete(i) for i in model.graph.input if i.name not in init_names):
        m = model  # already inferred at these shapes
    else:
        m = onnx.ModelProto()
        m.CopyFrom(model)
        for i in m.graph.input:
            if i.name in gear and i.name not in init_names:
                _set_shape(i, gear[i.name], ())
        try:
            m = _infer_shapes(m, [])
        except Exception as e:
            raise ModelError(f"{p}: shape inference failed at gear {dict(gear)}: {_first_line(e)}",
                             hint="check --input-shape / gear values") from None
    shapes: dict[str, Shape] = {}
    dtypes: dict[str, np.dtype] = {}
    # values that are not tensors (sequences, optionals, maps inside the graph): no shape to find
    others = {vi.name for vi in [*m.graph.value_info, *m.graph.output]
              if vi.type.WhichOneof("value") not in (None, "tensor_type")}
    for vi in [*m.graph.input, *m.graph.value_info, *m.graph.output]:
        if vi.name in others:
            elem = _element_type(vi.type)
            if elem:
                dtypes[vi.name] = _np_dtype(elem)
            continue
        dt = vi.type.tensor_type.elem_type
        if dt:
            dtypes[vi.name] = _np_dtype(dt)
        s = _concrete(vi)
        if s is not None:
            shapes[vi.name] = s
    for t in m.graph.initializer:
        shapes[t.name] = tuple(int(d) for d in t.dims)
        dtypes[t.name] = _np_dtype(t.data_type)
    for n in m.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    shapes[n.output[0]] = tuple(int(d) for d in a.t.dims)
                    dtypes[n.output[0]] = _np_dtype(a.t.data_type)
    # inside If/Loop/Scan bodies: what inference found there (the planner plans bodies too)
    for body in _bodies(m.graph):
        sub_others = {vi.name for vi in [*body.value_info, *body.output]
                      if vi.type.WhichOneof("value") not in (None, "tensor_type")}
        others |= sub_others
        for vi in [*body.input, *body.value_info, *body.output]:
            if vi.name in sub_others:
                continue
            if vi.type.tensor_type.elem_type:
                dtypes.setdefault(vi.name, _np_dtype(vi.type.tensor_type.elem_type))
            s = _concrete(vi)
            if s is not None:
                shapes.setdefault(vi.name, s)
        for t in body.initializer:
            shapes.setdefault(t.name, tuple(int(d) for d in t.dims))
            dtypes.setdefault(t.name, _np_dtype(t.data_type))
        for n in body.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
                shapes.setdefault(n.output[0], tuple(int(d) for d in n.attribute[0].t.dims))
                dtypes.setdefault(n.output[0], _np_dtype(n.attribute[0].t.data_type))
    missing = [o for n in m.graph.node for o in n.output
               if o and o not in others and (o not in shapes or o not in dtypes)]
    branch_missing: dict[tuple[str, str], list[str]] = {}
    ifs = [n for n in m.graph.node if n.op_type == "If" and n.input and _value_dependent(m.graph, n.input[0])]
    for n in ifs[:_MAX_BRANCH_RUNS]:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                branch_missing[(n.name, a.name)] = [o for b in a.g.node for o in b.output
                                                    if o and o not in others and o not in shapes]
    unknown: list[str] = []
    why = None
    if missing or any(branch_missing.values()):
        why = _shapes_by_running(model, p, gear, missing, shapes, dtypes, branch_missing, warnings)
    if why is not None:
        unknown = [o for o in missing if o not in shapes]
    # body tensors nothing could size (Loop/Scan bodies, branches that cannot run here): sized at run
    # time, like data-dependent ones
    in_bodies = [o for body in _bodies(m.graph) for n in body.node for o in n.output
                 if o and o not in others and o not in shapes]
    if in_bodies and why is None:
        why = "inside If/Loop/Scan bodies that no run could size at these input shapes"
    unknown += in_bodies
    kinds = {vi.name: vi.type.WhichOneof("value").replace("_type", "")
             for g in [m.graph, *_bodies(m.graph)] for vi in [*g.value_info, *g.output] if vi.name in others}
    return shapes, dtypes, unknown, why, kinds


def _bodies(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """Every If/Loop/Scan body below ``graph``, nested ones included."""
    out: list[onnx.GraphProto] = []
    for n in graph.node:
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for g in subs:
                out.append(g)
                out.extend(_bodies(g))
    return out


def _element_type(t: onnx.TypeProto) -> int:
    """The tensor element type inside a sequence/optional type (0 when unknown)."""
    while True:
        which = t.WhichOneof("value")
        if which == "tensor_type":
            return int(t.tensor_type.elem_type)
        if which == "sequence_type":
            t = t.sequence_type.elem_type
        elif which == "optional_type":
            t = t.optional_type.elem_type
        else:
            return 0


def _shapes_by_running(model: onnx.ModelProto, p: Path, gear: Mapping[str, Shape], missing: list[str],
                       shapes: dict[str, Shape], dtypes: dict[str, np.dtype],
                       branch_missing: Mapping[tuple[str, str], list[str]] | None = None,
                       warnings: list[str] | None = None) -> str | None:
    """Shapes ONNX inference leaves open (Shape → Gather → Reshape chains): run the model on zeros,
    then on ones, and keep the shapes both runs agree on.

    A shape that changes with the input *values* (a Reshape target read from an input, a TopK ``k``)
    is not a property of the model: when a run fails (zeros or ones are not valid there) or the two
    runs disagree, those tensors stay out of ``shapes`` and the reason is returned (``None`` when every
    missing shape was found). Their dtypes are kept. Two agreeing runs are evidence, not proof; the
    emulator and ATC's dynamic mode size such tensors at run time either way.

    An ``If`` whose condition depends on input values (silero-vad's ``sr``) takes on zeros whichever
    branch zeros select, which says nothing of the other. So each branch of such an ``If`` is also run
    on its own (inlined in place of the ``If``; ``branch_missing``: (If node, branch attribute) → the
    branch's own tensors to find). A tensor after the ``If`` keeps a shape only when every run that
    could execute agrees on it; a branch that cannot run at these shapes is named in ``warnings``."""
    base = _run_shapes(model, p, gear, missing, must_load=True)
    runs = [base]
    branch_missing = dict(branch_missing or {})
    for (node_name, branch), own in branch_missing.items():
        variant = _inline_branch(model, node_name, branch)
        got = _run_shapes(variant, p, gear, missing + own) if variant is not None else ({}, {}, "not inlinable")
        runs.append(got)
        if not got[0] and got[2] and warnings is not None:
            warnings.append(f"If {node_name}: its {branch} cannot run at input shapes {dict(gear)} ({got[2]}): "
                            f"its tensors are sized at run time; "
                            f"shapes after the If come from the runs that could")
        for name in own:  # the branch's own tensors: only this run sees them
            if name in got[0] and name not in shapes:
                shapes[name] = got[0][name]
            if name in got[1]:
                dtypes.setdefault(name, got[1][name])
    why = None
    for name in missing:
        seen = {r[0][name] for r in runs if name in r[0]}
        for r in runs:
            if name in r[1]:
                dtypes[name] = r[1][name]
                break
        if len(seen) == 1:
            shapes[name] = seen.pop()
        elif seen:
            why = why or "the branches of an If on input values give different shapes"
        else:
            why = why or next((r[2] for r in runs if r[2]), "runs on zeros and on ones give different shapes")
    return why


def _run_shapes(model: onnx.ModelProto, p: Path, gear: Mapping[str, Shape], wanted: list[str], *,
                must_load: bool = False) -> tuple[dict[str, Shape], dict[str, np.dtype], str | None]:
    """Run ``model`` on zeros and on ones with ``wanted`` as extra outputs: (the shapes both runs agree
    on, dtypes seen, why some were not found or None). A model onnxruntime cannot load is a
    ``ModelError`` when ``must_load``, else a failed run."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer):
        onnx.external_data_helper.load_external_data_for_model(m, str(p.parent))
    have = {o.name for o in m.graph.output}
    for name in wanted:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
            have.add(name)
    init_names = {t.name for t in m.graph.initializer}
    specs = {i.name: (gear[i.name], _np_dtype(i.type.tensor_type.elem_type))
             for i in m.graph.input if i.name not in init_names}
    try:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 4
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
    except Exception as e:
        if not must_load:
            return {}, {}, f"onnxruntime cannot load it: {_first_line(e)[:100]}"
        raise ModelError(f"{p}: cannot determine the shapes of {len(wanted)} tensors (e.g. {wanted[0]!r}) "
                         f"at input shapes {dict(gear)}: {_first_line(e)}",
                         hint="check --input-shape values") from None
    runs = []
    why = None
    for fill in (np.zeros, np.ones):
        try:
            runs.append(sess.run(names, {k: fill(s, dtype=dt) for k, (s, dt) in specs.items()}))
        except Exception as e:
            text = _first_line(e).split("Status Message:")[-1].strip()
            why = f"the run on {fill.__name__} fails: {text[:160]}"
            if not runs:
                return {}, {}, why
            break
    want = set(wanted)
    found: dict[str, Shape] = {}
    dts: dict[str, np.dtype] = {}
    for k, name in enumerate(names):
        if name not in want or not isinstance(runs[0][k], np.ndarray):
            continue  # not asked for, or a sequence/optional value: not a tensor, it has no shape
        v0 = runs[0][k]
        dts[name] = v0.dtype
        if len(runs) == 2 and isinstance(runs[1][k], np.ndarray) and runs[1][k].shape == v0.shape:
            found[name] = tuple(int(d) for d in v0.shape)
        elif why is None:
            why = "runs on zeros and on ones give different shapes"
    return found, dts, why


def _inline_branch(model: onnx.ModelProto, node_name: str, branch: str) -> onnx.ModelProto | None:
    """A copy of ``model`` with the top-level ``If`` ``node_name`` replaced by its ``branch`` body
    (then its outputs copied to the If's by Identity nodes). Names are unique model-wide (ONNX's SSA
    rule), so the body's nodes read outer tensors as they are."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    found = False
    for n in m.graph.node:
        if n.name == node_name and n.op_type == "If":
            body = next((a.g for a in n.attribute if a.name == branch and a.type == onnx.AttributeProto.GRAPH), None)
            if body is None or len(body.output) != len(n.output):
                return None
            nodes.extend(body.node)
            nodes.extend(helper.make_node("Identity", [b.name], [o], name=f"{node_name}__{branch}__out{k}")
                         for k, (b, o) in enumerate(zip(body.output, n.output)) if o)
            m.graph.initializer.extend(body.initializer)
            m.graph.value_info.extend(body.value_info)
            found = True
        else:
            nodes.append(n)
    if not found:
        return None
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def _value_dependent(graph: onnx.GraphProto, name: str) -> bool:
    """Whether tensor ``name`` of ``graph`` depends on graph input *values* (not only on shapes)."""
    producer = {o: n for n in graph.node for o in n.output if o}
    inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    todo, seen = [name], set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in inputs:
            return True
        n = producer.get(t)
        if n is None or n.op_type in ("Shape", "Size", "Constant"):
            continue  # an initializer, an outer value, or a value computed from shapes only
        todo.extend(i for i in n.input if i)
    return False


# At most this many value-dependent top-level If nodes get one run per branch (each is a full run).
_MAX_BRANCH_RUNS = 8


def _constants(model: onnx.ModelProto) -> dict[str, ConstantRef]:
    out: dict[str, ConstantRef] = {}
    for t in model.graph.initializer:
        out[t.name] = ConstantRef(t.name, _np_dtype(t.data_type), tuple(int(d) for d in t.dims), "initializer",
                                  external=t.data_location == onnx.TensorProto.EXTERNAL)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR \
                and n.attribute[0].name == "value":
            t = n.attribute[0].t
            out[n.output[0]] = ConstantRef(n.output[0], _np_dtype(t.data_type), tuple(int(d) for d in t.dims),
                                           "constant_node", node_name=n.name,
                                           external=t.data_location == onnx.TensorProto.EXTERNAL)
    return out


# ------------------------------------------------------------------ shape ranges (ATC >= 8.5: "x:1~4,3,224,224")
#: a dimension's inclusive range ``(low, high)``; ``high == -1`` leaves it unbounded above (ATC's ``1~-1``)
DimRange = tuple[int, int]


def parse_dim(text: Any, *, where: str = "--input-shape") -> int | DimRange:
    """One dimension: ``3``, ``-1`` / ``?`` (dynamic) or a range ``1~4`` (ATC's spelling since CANN 8.5).

    >>> parse_dim("1~4"), parse_dim("8"), parse_dim("-1")
    ((1, 4), 8, -1)
    """
    if isinstance(text, (tuple, list)) and len(text) == 2:
        lo, hi = (int(v) for v in text)
    else:
        s = str(text).strip()
        if s == "?":
            return -1
        lo_s, sep, hi_s = s.partition("~")
        try:
            if not sep:
                v = int(s)
                if v < -1:
                    raise ValueError
                return v
            lo, hi = int(lo_s), int(hi_s)
        except ValueError:
            raise InputError(f"{where}: {s!r} is not a dimension (an integer, -1, or a range LOW~HIGH)",
                             hint='example: --input-shape "x:1~4,3,224,224"') from None
    if lo < 1 or (hi != -1 and hi < lo):
        raise InputError(f"{where}: range {lo}~{hi} is not LOW~HIGH with 1 <= LOW <= HIGH (or HIGH -1)",
                         hint='example: --input-shape "x:1~4,3,224,224"')
    return (lo, hi)


def split_ranges(input_shapes: Mapping[str, Sequence[Any]] | None
                 ) -> tuple[dict[str, Shape] | None, dict[str, tuple[DimRange | None, ...]]]:
    """``{name: dims}`` whose dims may be ranges → (the shapes with -1 for each range, ``{name: per-dim
    range or None}`` for the inputs that have one).

    >>> split_ranges({"x": ["1~4", 3, 16, 16], "y": (2, 5)})
    ({'x': (-1, 3, 16, 16), 'y': (2, 5)}, {'x': ((1, 4), None, None, None)})
    """
    if input_shapes is None:
        return None, {}
    shapes: dict[str, Shape] = {}
    ranges: dict[str, tuple[DimRange | None, ...]] = {}
    for name, dims in input_shapes.items():
        if isinstance(dims, str):
            dims = [p for p in dims.strip().strip("[]()").split(",") if p.strip()]
        parsed = [parse_dim(d, where=f"input {name!r}") for d in dims]
        shapes[name] = tuple(-1 if isinstance(d, tuple) else d for d in parsed)
        if any(isinstance(d, tuple) for d in parsed):
            ranges[name] = tuple(d if isinstance(d, tuple) else None for d in parsed)
    return shapes, ranges


def fmt_range_shape(shape: Sequence[int], ranges: Sequence[DimRange | None] = ()) -> str:
    """``(-1, 3)`` with ``((1, 4), None)`` → ``"1~4,3"`` (ATC's spelling).

    >>> fmt_range_shape((-1, 3, 16), ((1, 4), None, None))
    '1~4,3,16'
    """
    ranges = list(ranges) + [None] * (len(shape) - len(ranges))
    return ",".join(f"{r[0]}~{r[1]}" if r else str(d) for d, r in zip(shape, ranges))


def declared_io(path: str | os.PathLike) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The graph's declared inputs (initializers excluded) and outputs, read without external data or
    checks: what a session on a dynamic model reports before anything is converted."""
    p = Path(path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:
        raise ModelError(f"{p}: not a readable ONNX model ({_first_line(e)})") from None
    inits = {t.name for t in model.graph.initializer}

    def info(vi: onnx.ValueInfoProto) -> TensorInfo:
        shape, names = _vi_shape(vi)
        return TensorInfo(vi.name, _np_dtype(vi.type.tensor_type.elem_type), shape, names)

    return ([info(vi) for vi in model.graph.input if vi.name not in inits],
            [info(vi) for vi in model.graph.output])
