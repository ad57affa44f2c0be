"""Pack/unpack as ONNX subgraphs (converters.formats.graph) against the format core, byte for byte.

Oracle: ``formats.pack`` / ``formats.unpack`` (themselves checked against an index-loop oracle in
test_formats_oracle.py); the subgraphs are run by onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from npu_deploy.converters.formats import graph as format_graph
from npu_deploy.converters import formats

CASES = [
    ("NC1HWC0", (1, 3, 5, 7), "float16", {}),
    ("NC1HWC0", (2, 35, 4, 3), "float32", {}),
    ("NC1HWC0", (2, 35, 4, 3), "int8", {}),
    ("NC1HWC0", (64,), "float16", {}),                  # rank expansion (1-D is C)
    ("NC1HWC0_C04", (1, 3, 6, 6), "float16", {}),
    ("NDC1HWC0", (1, 20, 2, 3, 3), "float16", {}),
    ("FRACTAL_NZ", (20, 35), "float16", {}),
    ("FRACTAL_NZ", (2, 3, 33, 17), "float32", {}),
    ("FRACTAL_NZ", (40,), "float16", {}),                 # 1-D is a row
    ("FRACTAL_NZ", (1, 32, 384), "float16", {}),
    ("FRACTAL_Z", (32, 3, 3, 3), "float16", {}),
    ("FRACTAL_Z", (64, 128), "float16", {}),              # FC weight [K, N]
    ("FRACTAL_Z_C04", (16, 3, 3, 3), "float16", {}),
    ("FRACTAL_Z_3D", (16, 5, 2, 3, 3), "float16", {}),
    ("NHWC", (1, 3, 4, 5), "float32", {}),
    ("HWCN", (6, 3, 2, 2), "float32", {}),
]


def _run(nodes, inits, x: np.ndarray):
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("src", elem, list(x.shape))],
                          [helper.make_tensor_value_info("dst", elem, None)], inits)
    del g.output[0].type.tensor_type.shape.dim[:]
    g.output[0].type.tensor_type.ClearField("shape")
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"src": x})[0]


@pytest.mark.parametrize("fmt,shape,dtype,kw", CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2]}"
                                                             for c in CASES])
def test_subgraphs_match_the_format_core(fmt, shape, dtype, kw):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    nodes, inits = format_graph.pack_nodes(fmt, shape, dtype, "src", "dst", **kw)
    packed = _run(nodes, inits, x)
    ref = formats.pack(x, fmt, **kw)
    assert packed.shape == ref.shape and packed.dtype == ref.dtype
    np.testing.assert_array_equal(packed, ref)
    nodes, inits = format_graph.unpack_nodes(fmt, shape, dtype, "src", "dst", **kw)
    back = _run(nodes, inits, np.ascontiguousarray(ref))
    np.testing.assert_array_equal(back, x)


@pytest.mark.parametrize("opset", [9, 10])
def test_old_opsets_use_attribute_forms(opset):
    x = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    nodes, inits = format_graph.pack_nodes("NC1HWC0", x.shape, x.dtype, "src", "dst", opset=opset)
    assert any(n.op_type == "Pad" and any(a.name == "pads" for a in n.attribute) for n in nodes)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("src", 1, list(x.shape))],
                          [helper.make_tensor_value_info("dst", 1, list(formats.storage_shape("NC1HWC0", x.shape, x.dtype)))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=4)
    out = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"src": x})[0]
    np.testing.assert_array_equal(out, formats.pack(x, "NC1HWC0"))


def test_reinterpret_reads_the_bytes_in_order():
    x = np.arange(10, dtype=np.float32)
    nodes, inits = format_graph.reinterpret_nodes("src", (10,), (3, 4), "dst")
    out = _run(nodes, inits, x)
    np.testing.assert_array_equal(out, np.concatenate([x, [0, 0]]).reshape(3, 4))
    nodes, inits = format_graph.reinterpret_nodes("src", (10,), (2, 3), "dst")
    np.testing.assert_array_equal(_run(nodes, inits, x), x[:6].reshape(2, 3))


@pytest.mark.parametrize("fmt,shape,kw", [("C1HWNCoC0", (16, 16, 1, 1), {}),
                                          ("FRACTAL_Z", (16, 2, 3, 3), {"groups": 8})])
def test_diagonal_layouts_are_refused(fmt, shape, kw):
    # grouped FRACTAL_Z places each group's block on a diagonal: weights of that kind are unpacked
    # by the format core in numpy when a bundle is loaded, never in the graph
    from npu_deploy.errors import FormatError

    with pytest.raises(FormatError, match="diagonal"):
        format_graph.pack_nodes(fmt, shape, "float16", "a", "b", **kw)
