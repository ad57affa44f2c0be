"""Verification: inputs in realistic ranges, running every tensor on onnxruntime, the ONNX checks,
comparing outputs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from npu_deploy.converters.files import feeds as feeds_mod
from npu_deploy.errors import InputError, ModelError


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


def _graph_tensors(g: onnx.GraphProto, where: str = ""):
    """(kind, name, TensorProto) of every tensor stored in ``g`` and its subgraphs: initializers and
    Constant values."""
    for t in g.initializer:
        yield f"{where}initializer", t.name, t
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and n.op_type == "Constant":
                yield f"{where}Constant", n.output[0] if n.output else n.name, a.t
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _graph_tensors(sub, f"{where}{n.op_type} {n.name!r} body: ")


def check_tensor_data(model: onnx.ModelProto, source: str) -> None:
    """Refuse (``ModelError``) a stored tensor whose data does not fill its dims: ``onnx.checker``
    accepts one (e.g. dims [32, 3, 3, 1] over 864 values), and every later read of it would fail."""
    for kind, name, t in _graph_tensors(model.graph):
        if t.data_location == TensorProto.EXTERNAL:
            continue
        try:
            numpy_helper.to_array(t)
        except Exception as e:  # numpy's and onnx's own decoding errors, whatever their class
            raise ModelError(f"{source}: {kind} {name!r} with dims {list(t.dims)} does not match its data "
                             f"({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})",
                             hint="the file is damaged or was edited by hand: export the model again") from None


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
    import onnxruntime as ort  # heavy, and only needed once a model runs

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
