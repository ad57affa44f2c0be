"""Small hand-built bundles for runtime tests (independent of the converter).

``make_bundle`` writes a bundle from an ONNX model: chosen initializers are removed from the graph and
stored packed in a device format through ``formats.pack``; the manifest is written from the arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npu_deploy.converters import formats
from npu_deploy.converters.files.bundle import WeightEntry, write_bundle


def io_entry(name, shape, dtype="float32", fmt="ND", device_format=None, c0=None) -> dict[str, Any]:
    device_format = device_format or fmt
    dev_shape = list(shape)
    if device_format != fmt and all(d >= 0 for d in shape):
        kw = {"c0": c0} if c0 else {}
        dev_shape = list(formats.storage_shape(device_format, tuple(shape), np.dtype(dtype), **kw))
    n = int(np.prod([max(d, 1) for d in dev_shape])) * np.dtype(dtype).itemsize
    return {"name": name, "shape": list(shape), "dtype": dtype, "format": fmt, "device_format": device_format,
            "device_shape": dev_shape, "c0": c0, "nbytes": n}


def make_bundle(path: Path, model: onnx.ModelProto, *, inputs: list[dict], outputs: list[dict],
                packed: dict[str, tuple[str, dict]] | None = None, store_dtype: dict[str, str] | None = None,
                precision_mode: str = "must_keep_origin_dtype", tensor_dtypes: dict | None = None,
                node_formats: dict | None = None, transdata: list | None = None, cost: dict | None = None,
                dynamic: dict | None = None, soc: str = "Ascend310P3") -> Path:
    """``packed``: initializer name → (device format, pack kwargs); ``store_dtype``: name → stored dtype."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    packed = packed or {}
    store_dtype = store_dtype or {}
    keep, entries = [], []
    for init in model.graph.initializer:
        if init.name not in packed and init.name not in store_dtype:
            keep.append(init)
            continue
        arr = numpy_helper.to_array(init)
        if init.name in store_dtype:
            arr = arr.astype(store_dtype[init.name])
        fmt, kw = packed.get(init.name, ("ND", {}))
        data = arr if fmt == "ND" else formats.pack(arr, fmt, **kw)
        entries.append(WeightEntry(init.name, fmt, tuple(arr.shape), data, c0=kw.get("c0"),
                                   groups=kw.get("groups", 1), origin=kw.get("origin")))
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    manifest = {"producer": "tests", "producer_version": "0", "soc": soc, "precision_mode": precision_mode,
                "inputs": inputs, "outputs": outputs, "dynamic": dynamic or {"mode": None, "gears": []},
                "memory": {"arena_bytes": 0, "lower_bound_bytes": 0, "no_reuse_bytes": 0, "alignment": 256},
                "transdata": transdata or [], "transdata_naive_count": len(transdata or []),
                "node_formats": node_formats or {}, "cost": cost or {"estimated": True, "est_us": {}},
                "tensor_dtypes": tensor_dtypes or {}, "source_model": "test"}
    write_bundle(path, manifest, model, entries)
    return path


def conv_model(c_in=3, c_out=8, hw=6, batch: int | str = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x[N,c_in,hw,hw] → Conv(W, B) → Relu → y; weights seeded."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c_out).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", 1, [batch, c_in, hw, hw])],
                          [helper.make_tensor_value_info("y", 1, [batch, c_out, hw, hw])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), {"W": w, "B": b}
