"""Generated model inputs: the one feed generator.

Every place that needs inputs nobody gave (``compare``, ``debug precision``, ``run --pure-data random``,
``profile run``, ``optimize``'s verification, the cost model's shape probe) calls
:func:`generate_inputs`; the callers differ only in the value ranges they ask for:

* shape: the given one, else the input's first gear, else its dynamic dims as 1;
* ``val_range`` (Polygraphy's ``--val-range``): floats uniform in [lo, hi), integers in [lo, hi];
  ``whole`` float inputs (pixel values) as whole numbers in [lo, hi]; booleans constant where
  [lo, hi] holds only 0 or only 1;
* without a range: integers that index an embedding table (:func:`index_ranges`) cover the table,
  other integers are 0 or 1 (masks, type ids); image-like floats (``N, C<=4, H, W``) are
  :func:`synthetic_images`, other floats standard normal; booleans random;
* one ``numpy.random.default_rng(seed)`` stream, one draw per input in the order given.

The inputs are described by any objects with ``name``, ``shape`` (``-1`` for a dynamic dimension),
``dtype`` and optionally ``gears`` (:class:`~npu_deploy.runtime.backend.TensorMeta`, or
:class:`InputSpec` read from an ONNX model with :func:`model_inputs`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Collection, Mapping, Sequence

import numpy as np
import onnx

from npu_deploy.errors import InputError


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """A model input as the generator needs it: name, shape (``-1`` dynamic), numpy dtype, gears."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    gears: tuple[tuple[int, ...], ...] = ()


_ONNX_INTS = (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
              onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64)


def model_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph inputs of ``model`` that are not initializers, as :class:`InputSpec` (symbolic or
    unknown dims as ``-1``).

    >>> from onnx import TensorProto, helper
    >>> g = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])], [])
    >>> model_inputs(helper.make_model(g))
    [InputSpec(name='x', shape=(-1, 3), dtype=dtype('float32'), gears=())]
    """
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (KeyError, TypeError, ValueError):
            raise InputError(f"input {vi.name!r}: element type {tt.elem_type} has no numpy dtype",
                             hint="give the input as a file") from None
        out.append(InputSpec(vi.name, dims, dtype))
    return out


def generate_inputs(metas: Sequence[Any], *, seed: int = 0,
                    shapes: Mapping[str, Sequence[int]] | None = None,
                    val_range: Mapping[str, tuple[float, float]] | None = None,
                    index_ranges: Mapping[str, int] | None = None,
                    whole: Collection[str] = ()) -> dict[str, np.ndarray]:
    """Random inputs for ``metas`` (objects with ``name``, ``shape``, ``dtype``, optional ``gears``).

    ``val_range``: ``{name: (lo, hi)}`` (``""`` for every input not named), Polygraphy's
    ``--val-range``: floats uniform in [lo, hi), integers in [lo, hi]; float inputs named in ``whole``
    take whole numbers in [lo, hi] (pixel values). Without one: integers that index an embedding table
    (``index_ranges``: input name → table size, see :func:`index_ranges`) cover the whole table, other
    integers are 0 or 1 (masks, type ids); image-like floats (``N, C<=4, H, W``) are
    :func:`synthetic_images`, other floats standard normal (inputs in [0, 1) leave PP-OCR det's output
    at about 0 everywhere, where any target passes); booleans random. Dynamic dims come from
    ``shapes``, else the first gear, else 1.

    >>> x = generate_inputs([InputSpec("x", (-1, 3), np.dtype("float32"))], seed=0)["x"]
    >>> x.shape, x.dtype.name
    ((1, 3), 'float32')
    >>> ids = generate_inputs([InputSpec("ids", (1, 4096), np.dtype("int64"))], index_ranges={"ids": 30522})["ids"]
    >>> int(ids.min()) >= 0 and int(ids.max()) < 30522 and int(ids.max()) > 20000
    True
    """
    rng = np.random.default_rng(seed)
    ranges = dict(val_range or {})
    tables = dict(index_ranges or {})
    out = {}
    for m in metas:
        dtype = np.dtype(m.dtype)
        if shapes and m.name in shapes:
            shape = tuple(int(d) for d in shapes[m.name])
        elif getattr(m, "gears", None):
            shape = tuple(m.gears[0])
        else:
            shape = tuple(d if d >= 0 else 1 for d in m.shape)
        span = ranges.get(m.name, ranges.get(""))
        if span is not None:
            lo, hi = float(span[0]), float(span[1])
        if dtype.kind == "f" or dtype.name == "bfloat16":
            if span is None:
                a = synthetic_images(shape, rng) if _image_like(shape) else rng.standard_normal(shape)
            elif m.name in whole:
                a = rng.integers(math.ceil(lo), math.floor(hi), size=shape, endpoint=True)
            else:
                a = rng.uniform(lo, hi, size=shape)
            a = a.astype(dtype)
        elif dtype.kind in "iu":
            if span is not None:
                info = np.iinfo(dtype)
                a = rng.integers(max(math.ceil(lo), info.min), min(math.floor(hi), info.max), size=shape,
                                 endpoint=True)
            else:
                a = rng.integers(0, max(int(tables.get(m.name, 2)), 1), size=shape)
            a = a.astype(dtype)
        elif dtype.kind == "b":  # random, or one value where the range holds only 0 or only 1
            a = np.full(shape, lo >= 1) if span is not None and (lo >= 1 or hi < 1) else rng.random(shape) < 0.5
        else:
            raise InputError(f"input {m.name!r}: cannot generate data of dtype {dtype}",
                             hint="give the input with --input NAME=FILE.npy")
        out[m.name] = np.asarray(a, dtype=dtype)  # a 0-d draw is a numpy scalar; onnxruntime wants arrays
    return out


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _image_like(shape: tuple[int, ...]) -> bool:
    return len(shape) == 4 and shape[1] in (1, 3, 4) and shape[2] >= 8 and shape[3] >= 8


def synthetic_images(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Normalised images with structure: a light page with dark, striped blocks (text lines, edges)
    and a little noise, normalised as ImageNet/PaddleOCR preprocessing does. A detector sees text in
    them and a classifier edges, so outputs span their range instead of sitting at about 0.

    >>> x = synthetic_images((2, 3, 32, 64), np.random.default_rng(0))
    >>> x.shape, bool(x.min() < -1.5 and x.max() > 1.5)
    ((2, 3, 32, 64), True)
    """
    n, c, h, w = shape
    out = np.empty(shape, np.float64)
    for b in range(n):
        page = np.full((h, w), rng.uniform(0.75, 0.95))
        for _ in range(max(2, h * w // 2000)):
            bh, bw = int(rng.integers(max(2, h // 32), max(3, h // 10) + 1)), int(rng.integers(max(4, w // 8), max(5, w // 2) + 1))
            r, col = int(rng.integers(0, max(1, h - bh))), int(rng.integers(0, max(1, w - bw)))
            page[r:r + bh, col:col + bw] = rng.uniform(0.0, 0.25)
            page[r:r + bh, col:col + bw:int(rng.integers(2, 5))] = page[0, 0]  # gaps between strokes
        page += rng.normal(0.0, 0.03, page.shape)
        for k in range(c):
            mean, std = (IMAGENET_MEAN[k], IMAGENET_STD[k]) if c == 3 else (0.5, 0.25)
            out[b, k] = (page - mean) / std
    return out


# ops an index may pass through on its way to a Gather and stay the same index
_INDEX_PASSTHROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand"}


def index_ranges(model: str | os.PathLike | onnx.ModelProto) -> dict[str, int]:
    """``{input name: table size}`` for integer graph inputs that index a constant table: the input
    (through Cast / Unsqueeze / Reshape …) is the indices of a ``Gather`` whose data is an initializer
    (an embedding), so valid values are ``0 .. size - 1`` along the gather axis. Token ids in MiniLM
    index a 30522-row table; ``token_type_ids`` a 2-row one. ``model``: a path or a loaded model.
    """
    m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    g = m.graph
    inits = {t.name: list(t.dims) for t in g.initializer}
    consumers: dict[str, list] = {}
    for n in g.node:
        for k, i in enumerate(n.input):
            consumers.setdefault(i, []).append((n, k))
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t is not None:
                    inits[n.output[0]] = list(a.t.dims)
    ints = [i.name for i in g.input if i.type.tensor_type.elem_type in _ONNX_INTS]
    out: dict[str, int] = {}
    for name in ints:
        seen, todo, sizes = set(), [name], []
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            for n, k in consumers.get(t, []):
                if n.op_type == "Gather" and k == 1 and n.input[0] in inits:
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                    dims = inits[n.input[0]]
                    if dims and -len(dims) <= axis < len(dims):
                        sizes.append(int(dims[axis]))
                elif n.op_type in _INDEX_PASSTHROUGH and k == 0:
                    todo.extend(o for o in n.output if o)
        if sizes:
            out[name] = min(sizes)  # valid for every table it indexes
    return out
