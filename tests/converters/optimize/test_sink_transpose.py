"""Rule ``sink-transpose`` on models built here (the NHWC detour between two Convs and its variants) and
on the real models: oracles are onnxruntime on the untouched model and the planner run on the written
file (not the optimize report)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters import optimize as opt
from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.options import ConvertOptions

RNG = np.random.default_rng(0)


def _detour(mid, consts=(), exit_perm=(0, 3, 1, 2), out_shape=(1, 16, 32, 32)):
    """Conv -> Transpose(0,2,3,1) -> ``mid`` nodes (reading "t1", ending in "m") -> Transpose(exit_perm) -> Conv."""
    inits = [numpy_helper.from_array(RNG.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
             numpy_helper.from_array(RNG.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1, "w2")]
    inits += [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c1"], ["t1"], name="to_nhwc", perm=[0, 2, 3, 1]), *mid,
             helper.make_node("Transpose", ["m"], ["t2"], name="back", perm=list(exit_perm))]
    out = "t2"
    if list(exit_perm) == [0, 3, 1, 2]:
        nodes.append(helper.make_node("Conv", ["t2", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]))
        out = "y"
    g = helper.make_graph(nodes, "detour", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(out_shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _transdata(path, shapes=None):
    return pipeline.lower(path, None, ConvertOptions(backend="builtin", input_shapes=shapes or {}),
                          until="plan from ONNX").plan.report.transdata_count


def _same(a, b, feeds):
    for x, y in zip(_run(a, feeds), _run(b, feeds)):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)


X = {"x": RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)}


def test_nhwc_detour_between_two_convs_leaves_no_transpose_and_fewer_transdata(run_cli, tmp_path):
    m = _detour([helper.make_node("Sigmoid", ["t1"], ["s"], name="sig"),
                 helper.make_node("Mul", ["s", "scale"], ["m"], name="mul")], [("scale", RNG.standard_normal(16))])
    onnx.save(m, tmp_path / "m.onnx")
    code, out, err = run_cli("optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx")
    assert code == 0, err
    assert "applied        sink-transpose at to_nhwc: TransData 4 -> 2" in out
    o = onnx.load(tmp_path / "o.onnx")
    assert [n.op_type for n in o.graph.node] == ["Conv", "Sigmoid", "Mul", "Conv"]
    assert _transdata(tmp_path / "m.onnx") == 4 and _transdata(tmp_path / "o.onnx") == 2
    _same(m, o, X)


@pytest.mark.parametrize("mid, consts", [
    # swish: the region is a DAG (Mul reads t1 twice), a broadcast Add constant of full rank and a scalar one
    ([helper.make_node("Sigmoid", ["t1"], ["s"]), helper.make_node("Mul", ["t1", "s"], ["a"]),
      helper.make_node("Add", ["a", "b"], ["d"]), helper.make_node("Sub", ["k", "d"], ["m"])],
     [("b", RNG.standard_normal((1, 1, 32, 16))), ("k", 0.5)]),
    # a scalar-parameter op (Clip's bounds stay scalars), PRelu's slope per channel, Where with a constant mask
    ([helper.make_node("Clip", ["t1", "lo", "hi"], ["c"]), helper.make_node("PRelu", ["c", "slope"], ["p"]),
      helper.make_node("Where", ["mask", "p", "zero"], ["m"])],
     [("lo", -0.5), ("hi", 0.7), ("slope", RNG.random(16)), ("zero", np.zeros(16))]),
])
def test_region_variants_keep_the_numbers(mid, consts):
    extra = [numpy_helper.from_array(RNG.random((32, 1)) < 0.5, "mask")] if any(n.op_type == "Where" for n in mid) \
        else []
    m = _detour(mid, consts)
    m.graph.initializer.extend(extra)
    res, o = opt.optimize_model(m, rules=["sink-transpose"], keep_all=True)
    assert res.applied_count() == 1, [(a.status, a.reason) for a in res.applications]
    assert "Transpose" not in [n.op_type for n in o.graph.node]
    onnx.checker.check_model(o, full_check=True)
    _same(m, o, X)


def test_an_exit_that_is_not_the_inverse_composes_into_one_transpose():
    m = _detour([helper.make_node("Relu", ["t1"], ["m"])], exit_perm=(0, 3, 2, 1), out_shape=(1, 16, 32, 32))
    res, o = opt.optimize_model(m, rules=["sink-transpose"], keep_all=True)
    assert res.applied_count() == 1
    tr = [n for n in o.graph.node if n.op_type == "Transpose"]
    assert len(tr) == 1 and list(helper.get_attribute_value(tr[0].attribute[0])) == [0, 1, 3, 2]
    _same(m, o, X)


@pytest.mark.parametrize("mid, consts, why", [
    ([helper.make_node("Softmax", ["t1"], ["m"], axis=-1)], [], "Softmax"),
    ([helper.make_node("Add", ["t1", "x2"], ["m"])], [], "computed outside the region"),
])
def test_regions_it_cannot_sink_through_are_explained_and_left(mid, consts, why):
    m = _detour(mid, consts)
    if why == "computed outside the region":
        m.graph.node.insert(0, helper.make_node("Transpose", ["x"], ["x3"], perm=[0, 2, 3, 1]))
        m.graph.node.insert(1, helper.make_node("ReduceMean", ["x3"], ["x2"], axes=[3], keepdims=1))
        m = onnx.shape_inference.infer_shapes(m)
    res, o = opt.optimize_model(m, rules=["sink-transpose"], keep_all=True)
    assert res.applied_count() == 0
    assert any(a.status == "not applicable" and why in a.reason for a in res.applications), res.applications
    assert [n.op_type for n in o.graph.node] == [n.op_type for n in m.graph.node]


REAL = [("silero_vad", {"input": (1, 576)}), ("ppocr_cls", {"x": (1, 3, 48, 192)}),
        ("ppocr_det", {"x": (1, 3, 64, 64)}), ("ppocr_rec", {"x": (1, 3, 48, 160)}),
        ("minilm", {"input_ids": (1, 16), "attention_mask": (1, 16)})]


@pytest.mark.slow
@pytest.mark.realmodel
@pytest.mark.parametrize("name, shapes", REAL, ids=[r[0] for r in REAL])
def test_real_models_keep_their_outputs(real_model, name, shapes):
    src = onnx.load(real_model(name))
    feeds = opt.realistic_feeds(src, shapes, seed=4)
    res, o = opt.optimize_model(src, rules=["sink-transpose"], feeds=feeds, keep_all=True)
    assert res
    for x, y in zip(_run(src, feeds), _run(o, feeds)):  # the oracle: onnxruntime on the untouched model
        np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-4)


def test_transposes_without_perm_reverse_the_axes_and_cancel():
    m = _detour([helper.make_node("Relu", ["t1"], ["m"])])
    for n in m.graph.node:
        if n.op_type == "Transpose":
            del n.attribute[:]  # the default: axes reversed, its own inverse
    res, o = opt.optimize_model(m, rules=["sink-transpose"], keep_all=True)
    assert res.applied_count() == 1 and "Transpose" not in [n.op_type for n in o.graph.node]
    _same(m, o, X)
