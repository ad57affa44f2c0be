"""ATC's --out_nodes / --output_type on an ONNX graph (converters.files.output_edit), checked against an
independent cut (onnx.utils.Extractor) and onnxruntime on real models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from npu_deploy.converters.files.output_edit import edit_outputs
from npu_deploy.errors import InputError


def _run(model, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return {o.name: v for o, v in zip(s.get_outputs(), s.run(None, feeds))}


@pytest.mark.realmodel
def test_out_nodes_cut_like_onnx_extractor_and_output_type_casts(real_model):
    path = real_model("ppocr_cls")
    model = onnx.load(str(path))
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    node = convs[20]
    cut = edit_outputs(model, out_nodes=f"{node.name}:0")
    assert [o.name for o in cut.graph.output] == [node.output[0]]
    assert len(cut.graph.node) < len(model.graph.node)
    fixed = onnx.shape_inference.infer_shapes(model)
    oracle = onnx.utils.Extractor(fixed).extract_model([i.name for i in model.graph.input], [node.output[0]])
    x = np.random.default_rng(0).standard_normal((1, 3, 48, 192)).astype(np.float32)
    got = _run(cut, {"x": x})[node.output[0]]
    want = _run(oracle, {"x": x})[node.output[0]]
    np.testing.assert_array_equal(got, want)
    half = edit_outputs(model, out_nodes=node.output[0], output_type="FP16")  # an ONNX tensor name works too
    h = _run(half, {"x": x})[node.output[0]]
    assert h.dtype == np.float16
    np.testing.assert_array_equal(h, want.astype(np.float16))


def test_per_output_type_and_bad_spellings():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="r"),
                           helper.make_node("Neg", ["a"], ["b"], name="n"),
                           helper.make_node("Abs", ["a"], ["c"], name="ab")], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    e = edit_outputs(m, out_nodes="n:0;ab:0", output_type="n:0:INT32")
    out = _run(e, {"x": np.array([-1.5, 0.0, 2.7], np.float32)})
    assert out["b"].dtype == np.int32 and out["c"].dtype == np.float32
    np.testing.assert_array_equal(out["b"], np.array([0, 0, -2], np.int32))
    for kw, msg in [({"out_nodes": "ghost:0"}, "no node 'ghost'"), ({"out_nodes": "n:3"}, "has 1 output"),
                    ({"output_type": "FP8"}, "not an ATC output type"),
                    ({"out_nodes": "n:0", "output_type": "ab:0:FP16"}, "not one of the graph's outputs")]:
        with pytest.raises(InputError, match=msg):
            edit_outputs(m, **kw)
    assert edit_outputs(m) is m
