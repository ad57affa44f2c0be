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


# ------------------------------------------------------------------------------------------------
# The one "same layout?" / "plain?" predicate (graph.same_format, graph.is_plain)

from npu_deploy.converters.formats.graph import is_plain, same_format  # noqa: E402

# (a, b, same, same at the host/device boundary): facts about the layouts, written out by hand
SAME_LAYOUT_FACTS = [
    ("ND", "ND", True, True),
    ("NCHW", "ND", True, True),            # the ONNX tensor's own axis order, whatever the name
    ("NCDHW", "NCHW", True, True),
    ("NC", "ND", True, True),
    ("nchw", "FORMAT_NCHW", True, True),   # spelling: case and GE's FORMAT_ prefix
    (None, "ND", True, True),              # no format given is ND
    ("NHWC", "NHWC", True, True),
    ("NHWC", "NCHW", False, False),        # channels-last: converting costs a transpose
    ("NCHW", "NHWC", False, False),
    ("NHWC", "ND", False, True),           # an ND side takes the plain bytes as they are
    ("ND", "HWCN", False, True),
    ("NDHWC", "NCDHW", False, False),
    ("NC1HWC0", "NC1HWC0", True, True),
    ("NC1HWC0", "ND", False, False),       # blocked and padded: never the same as a plain layout
    ("ND", "FRACTAL_NZ", False, False),
    ("FRACTAL_Z", "NCHW", False, False),
    ("NC1HWC0", "NC1HWC0_C04", False, False),
]


@pytest.mark.parametrize("a, b, same, boundary", SAME_LAYOUT_FACTS)
def test_same_format_facts(a, b, same, boundary):
    assert same_format(a, b) is same and same_format(b, a) is same
    assert same_format(a, b, nd_matches_plain=True) is boundary
    assert same_format(b, a, nd_matches_plain=True) is boundary


def test_is_plain_is_the_registry_s_and_same_format_is_an_equivalence():
    from npu_deploy.converters import formats

    names = sorted(formats.FORMATS)
    for n in names:
        assert is_plain(n) is bool(formats.get_format(n).is_plain), n
        assert is_plain(n.lower()) is is_plain(n) and is_plain(f"FORMAT_{n}") is is_plain(n)
    assert not is_plain("NO_SUCH_FORMAT") and not same_format("NO_SUCH_FORMAT", "ND", nd_matches_plain=True)
    # without the boundary rule: reflexive, symmetric, transitive over every registry name
    for a in names:
        assert same_format(a, a)
        for b in names:
            assert same_format(a, b) == same_format(b, a)
            if same_format(a, b):
                assert all(same_format(a, c) == same_format(b, c) for c in names), (a, b)
