"""Loading ONNX for conversion: checks, user shapes, gears, lazy weights, and clear errors."""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.errors import InputError, ModelError


def _save(tmp_path, nodes, inputs, outputs, inits=(), opset=17, name="m.onnx", **kw):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path, **kw)
    return path


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


@pytest.fixture
def dyn_model(tmp_path):
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
    return _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                 [_vi("x", ["N", "S", 4])], [_vi("z", ["N", "S", 3])], [w])


def test_fixed_shapes_and_node_names(dyn_model):
    m = load_model(dyn_model, input_shapes={"x": (2, 5, 4)})
    assert m.inputs[0].shape == (2, 5, 4) and m.inputs[0].dim_names == ("N", "S", None)
    assert m.shapes["y"] == (2, 5, 3) and m.shapes["z"] == (2, 5, 3)
    assert m.dtypes["z"] == np.float32
    assert m.gears == [] and m.dynamic_mode is None
    # unnamed nodes get unique names
    names = [n.name for n in m.graph.node]
    assert names == ["MatMul_0", "Relu_1"]
    np.testing.assert_array_equal(m.constant_array("w"), np.arange(12, dtype=np.float32).reshape(4, 3))


def test_dynamic_batch_gears(dyn_model):
    m = load_model(dyn_model, input_shapes={"x": (-1, 5, 4)}, dynamic_batch=[1, 4, 8])
    assert m.dynamic_mode == "batch"
    assert m.gears == [{"x": (1, 5, 4)}, {"x": (4, 5, 4)}, {"x": (8, 5, 4)}]
    assert m.shapes["z"] == (8, 5, 3)  # sizes at the largest gear
    assert m.inputs[0].shape == (-1, 5, 4)
    # the kept model leaves the gear dimension symbolic
    dim0 = m.graph.input[0].type.tensor_type.shape.dim[0]
    assert not dim0.HasField("dim_value") and dim0.dim_param == "N"


def test_dynamic_dims_gears(dyn_model):
    m = load_model(dyn_model, input_shapes={"x": (1, -1, 4)}, dynamic_dims="16;32")
    assert m.dynamic_mode == "dims" and m.gears == [{"x": (1, 16, 4)}, {"x": (1, 32, 4)}]
    with pytest.raises(InputError, match="has 2 values"):
        load_model(dyn_model, input_shapes={"x": (1, -1, 4)}, dynamic_dims="16,2")
    with pytest.raises(InputError, match="cannot be used together"):
        load_model(dyn_model, input_shapes={"x": (-1, -1, 4)}, dynamic_dims="1,2", dynamic_batch=[1, 2])


@pytest.mark.parametrize("kwargs,match", [
    ({}, r"input 'x' .* dynamic dimensions \[N,S,4\]"),
    ({"input_shapes": {"q": (1, 2, 4)}}, "names 'q', which is not an input"),
    ({"input_shapes": {"x": (1, 2)}}, "has rank 2, but input 'x' has rank 3"),
    ({"input_shapes": {"x": (1, 2, 5)}}, "dimension 2 is 5, but the model fixes it to 4"),
    ({"input_shapes": {"x": (-1, -1, 4)}, "dynamic_batch": [1, 2]}, "besides the batch"),
    ({"input_shapes": {"x": (2, 3, 4)}, "dynamic_batch": [1, 2]}, "no input has a dynamic batch"),
    ({"input_shapes": {"x": (-1, 3, 4)}, "dynamic_batch": [2, 2]}, "distinct positive"),
])
def test_shape_errors(dyn_model, kwargs, match):
    with pytest.raises(InputError, match=match):  # ModelError is an InputError: exit 2 either way
        load_model(dyn_model, **kwargs)


def test_every_gear_is_checked_not_only_the_largest(tmp_path):
    """Two inputs whose lengths must agree: a gear with x:4 and m:8 is refused at load, even when a
    larger gear is fine (only the largest was inferred before, so the bad gear failed at run time)."""
    path = _save(tmp_path, [helper.make_node("Add", ["x", "m"], ["y"])], [_vi("x", [1, "S"]), _vi("m", [1, "S"])],
                 [_vi("y", [1, "S"])])
    shapes = {"x": (1, -1), "m": (1, -1)}
    assert load_model(path, input_shapes=shapes, dynamic_dims="4,4;16,16").gears[0] == {"x": (1, 4), "m": (1, 4)}
    with pytest.raises(ModelError, match=r"shape inference failed at gear \{'x': \(1, 4\), 'm': \(1, 8\)\}"):
        load_model(path, input_shapes=shapes, dynamic_dims="4,8;16,16")
    # a batch gear smaller than the largest, against an output the model declares fixed
    r = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 4])], [_vi("y", [4, 4])],
              name="r.onnx")
    with pytest.raises(ModelError, match=r"at gear \{'x': \(1, 4\)\}"):
        load_model(r, input_shapes={"x": (-1, 4)}, dynamic_batch=[1, 4])


def test_error_messages_are_one_line(dyn_model):
    with pytest.raises(ModelError) as e:
        load_model(dyn_model)
    assert "\n" not in str(e.value) and "--input-shape" in str(e.value)


def test_not_onnx(tmp_path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelError, match="no such file"):
        load_model(missing)
    rnd = tmp_path / "random.onnx"
    rnd.write_bytes(np.random.default_rng(3).bytes(5000))
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(rnd)
    with pytest.raises(ModelError, match="is a folder"):
        load_model(tmp_path)


def test_truncated_protobuf(tmp_path, dyn_model):
    data = dyn_model.read_bytes()
    for cut in (len(data) // 2, len(data) - 3, 7):
        p = tmp_path / f"t{cut}.onnx"
        p.write_bytes(data[:cut])
        with pytest.raises(ModelError, match="not an ONNX model|invalid ONNX model|dangling|not produced"):
            load_model(p)


def test_external_data_streamed_and_checked(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    path = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [2, 64])], [_vi("y", [2, 32])],
                 [numpy_helper.from_array(w, "w")], save_as_external_data=True, all_tensors_to_one_file=True,
                 location="weights.bin", size_threshold=0)
    m = load_model(path)
    assert m.constants["w"].external
    # the protobuf holds no weight bytes: they are read on demand
    assert not m.graph.initializer[0].raw_data
    np.testing.assert_array_equal(m.constant_array("w"), w)
    data = tmp_path / "weights.bin"
    blob = data.read_bytes()
    data.write_bytes(blob[:100])
    with pytest.raises(ModelError, match="too short"):
        load_model(path)
    data.unlink()
    with pytest.raises(ModelError, match="external data file 'weights.bin' of tensor 'w' is missing"):
        load_model(path)


def test_shape_tensors_in_external_data_are_read_for_inference(tmp_path):
    """A save with size_threshold=0 also puts a Reshape's int64 target outside: valid ONNX, which the
    checker's shape inference (and so the load) used to refuse; the float weight stays external."""
    w = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    path = _save(tmp_path, [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])],
                 [_vi("x", [2, 4, 2])], [_vi("y", [2, 6])],
                 [numpy_helper.from_array(np.array([2, 8], np.int64), "s"), numpy_helper.from_array(w, "w")],
                 save_as_external_data=True, all_tensors_to_one_file=True, location="data.bin", size_threshold=0)
    m = load_model(path)
    assert m.shapes["r"] == (2, 8) and m.shapes["y"] == (2, 6)
    assert m.constants["w"].external and not m.constants["s"].external
    np.testing.assert_array_equal(m.constant_array("s"), [2, 8])
    np.testing.assert_array_equal(m.constant_array("w"), w)


def test_external_data_outside_folder_refused(tmp_path):
    t = numpy_helper.from_array(np.zeros((2, 2), np.float32), "w")
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    for k, v in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = k, v
    path = _save(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2, 2])], [_vi("y", [2, 2])], [t])
    with pytest.raises(ModelError, match="outside the model's folder"):
        load_model(path)


@pytest.mark.parametrize("key, value, match", [("offset", "1e3", "not whole numbers"),
                                               ("length", "abc", "not whole numbers"),
                                               ("length", "12", "length 12 does not match its shape"),
                                               ("offset", "-4", "negative offset")])
def test_external_data_fields_that_lie_are_refused_at_load(tmp_path, key, value, match):
    """Untrusted offset/length strings: one ModelError at load, not a ValueError or a late failure."""
    t = numpy_helper.from_array(np.zeros((2, 2), np.float32), "w")
    (tmp_path / "w.bin").write_bytes(bytes(64))
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    fields = {"location": "w.bin", "offset": "0", "length": "16", key: value}
    for k, v in fields.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    path = _save(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2, 2])], [_vi("y", [2, 2])], [t])
    with pytest.raises(ModelError, match=match):
        load_model(path)


def test_large_inline_weight_whose_bytes_disagree_with_its_dims_is_refused_at_load(tmp_path):
    """A >= 1 MiB initializer read in place (not parsed) is checked against its dims as a parsed one is."""
    w = numpy_helper.from_array(np.zeros((512, 1024), np.float32), "w")   # 2 MiB of raw data
    del w.dims[:]
    w.dims.extend([500, 1024])                                          # dims say 2,048,000 bytes
    path = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [1, 500])],
                 [_vi("y", [1, 1024])], [w])
    with pytest.raises(ModelError):
        load_model(path)


def test_cycle_and_dangling(tmp_path):
    cyc = _save(tmp_path, [helper.make_node("Relu", ["b"], ["a"], name="r1"),
                           helper.make_node("Relu", ["a"], ["b"], name="r2")],
                [_vi("x", [2])], [_vi("b", [2])], name="cyc.onnx")
    with pytest.raises(ModelError, match="cycle through node.s. r1, r2"):
        load_model(cyc)
    dang = _save(tmp_path, [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
                 [_vi("x", [2])], [_vi("y", [2])], name="dang.onnx")
    with pytest.raises(ModelError, match="node 'add' reads 'ghost'.*dangling"):
        load_model(dang)


def test_checker_rejects_bad_attribute(tmp_path):
    # a declared output shape that contradicts the op: onnx.checker's full check catches it
    w = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")
    path = _save(tmp_path, [helper.make_node("Conv", ["x", "w"], ["y"])],
                 [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 9, 9])], [w])
    with pytest.raises(ModelError, match="invalid ONNX model"):
        load_model(path)


def test_constant_nodes_are_constants(tmp_path):
    c = helper.make_node("Constant", [], ["k"], name="const_k",
                         value=numpy_helper.from_array(np.full((2,), 3.0, np.float32)))
    path = _save(tmp_path, [c, helper.make_node("Mul", ["x", "k"], ["y"], name="mul")],
                 [_vi("x", [2])], [_vi("y", [2])])
    m = load_model(path)
    assert m.constants["k"].kind == "constant_node" and m.constants["k"].node_name == "const_k"
    np.testing.assert_array_equal(m.constant_array("k"), [3.0, 3.0])


@pytest.mark.realmodel
def test_value_dependent_shapes_resolved(real_model):
    # PP-OCR rec computes Reshape targets with Shape/Slice/Concat: ONNX inference leaves them unknown,
    # the loader resolves every tensor; the oracle is onnxruntime run on the same input
    import onnxruntime as ort

    path = real_model("ppocr_rec")
    m = load_model(path, input_shapes={"x": (1, 3, 48, 320)})
    outs = [o for n in m.graph.node for o in n.output if o]
    assert all(o in m.shapes for o in outs)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.zeros((1, 3, 48, 320), np.float32)})[0]
    assert m.shapes[sess.get_outputs()[0].name] == y.shape


def test_input_without_shape(tmp_path):
    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [vi], [_vi("y", ["a", "b"])])
    # onnx.checker requires the field, onnxruntime does not: the useful error is the missing shape
    with pytest.raises(ModelError, match="input 'x' of m.onnx declares no shape"):
        load_model(path)
    with pytest.raises(ModelError, match="input 'x' of m.onnx declares no shape"):
        load_model(path, check=False)
    m = load_model(path, input_shapes={"x": (3, 5)})
    assert m.shapes["y"] == (3, 5) and any("onnx.checker rejects" in w for w in m.warnings)
    m = load_model(path, input_shapes={"x": (3, 5)}, check=False)
    assert m.inputs[0].shape == (3, 5) and m.shapes["y"] == (3, 5)


# ------------------------------------------------------------------ what loading no longer refuses

def _lower_and_run(path, feeds, **load_kw):
    """load → support report (not enforced) → plan → bundle → emulator, as the lowering backend does."""
    from npu_deploy.converters.files.bundle import read_bundle
    from npu_deploy.converters.files.bundle import write_plan_bundle
    from npu_deploy.converters.lowering.planner import plan
    from npu_deploy.converters.lowering.support import check_graph
    from npu_deploy.runtime.emulator import EmulatorBackend

    m = load_model(path, **load_kw)
    opsets = {o.domain: o.version for o in m.model.opset_import}
    support = check_graph(m.graph, opsets, "Ascend310P3", dtypes=m.dtypes, static_shapes=dict(m.shapes),
                          precision_mode="must_keep_origin_dtype")
    p = plan(m, soc="Ascend310P3", precision_mode="must_keep_origin_dtype", support=support)
    out = path.with_suffix(".bundle")
    write_plan_bundle(out, m, p, support=support)
    with read_bundle(out) as b:
        graph_opsets = {o.domain: o.version for o in b.graph.opset_import}
        manifest = b.manifest
    with EmulatorBackend(out) as be:
        got = be.run(None, feeds)
    return m, support, p, graph_opsets, manifest, got


def _ml_model(tmp_path):
    g = helper.make_graph([helper.make_node("Binarizer", ["x"], ["y"], name="bin", domain="ai.onnx.ml",
                                            threshold=0.5)], "g", [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    path = tmp_path / "ml.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)], ir_version=8), path)
    return path


def test_ai_onnx_ml_only_model_lowers_and_runs(tmp_path):
    # loading does not judge domains (the support check does): load + plan + bundle + emulator work
    x = np.array([[0.1, 0.6, 0.5], [2.0, -1.0, 0.51]], np.float32)
    m, support, p, graph_opsets, manifest, got = _lower_and_run(_ml_model(tmp_path), {"x": x})
    assert m.opset == 0 and m.opsets == {"ai.onnx.ml": 1}
    assert support.node("bin").engine == "unsupported" and "ai.onnx.ml::1::Binarizer" in support.node("bin").detail
    assert p.tensor_formats["y"] == "ND"
    assert graph_opsets == {"ai.onnx.ml": 1}  # the bundle keeps every imported domain
    assert manifest["source_model"]["opsets"] == {"ai.onnx.ml": 1}
    np.testing.assert_array_equal(got[0], (x > 0.5).astype(np.float32))


def test_sequence_and_optional_io_refused(tmp_path):
    seq_out = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [1, 4])
    path = _save(tmp_path, [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0)],
                 [_vi("x", [3, 4])], [seq_out], name="seq.onnx")
    with pytest.raises(ModelError, match="graph output 'seq' is a sequence, not a tensor") as e:
        load_model(path)
    assert "\n" not in str(e.value)
    opt_in = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    path = _save(tmp_path, [helper.make_node("OptionalGetElement", ["o"], ["y"])], [opt_in], [_vi("y", [2])],
                 opset=18, name="opt.onnx")
    with pytest.raises(ModelError, match="graph input 'o' is an optional, not a tensor"):
        load_model(path)


def test_standard_function_body_failure_is_excused(tmp_path):
    # onnx 1.23's MeanVarianceNormalization body reads @axes into a Constant; with the default axes the
    # reference is not substituted and strict inference fails inside the body, not in the model
    mvn = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], name="mvn")
    path = _save(tmp_path, [mvn], [_vi("x", [2, 3, 4, 4])], [_vi("y", [2, 3, 4, 4])], opset=13)
    with pytest.raises(Exception, match="Constant"):
        onnx.checker.check_model(str(path), full_check=True)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    m, _, p, _, _, got = _lower_and_run(path, {"x": x})
    assert m.shapes["y"] == (2, 3, 4, 4)
    assert len(m.warnings) == 1 and "MeanVarianceNormalization" in m.warnings[0]
    assert m.warnings[0] in p.report.notes
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True))
    np.testing.assert_allclose(got[0], (x - mean) / (std + 1e-9), rtol=1e-4, atol=1e-5)


def test_function_body_excuse_does_not_cover_the_models_own_errors(tmp_path):
    # the same MVN, followed by a Conv whose declared output contradicts the op: still refused
    w = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")
    path = _save(tmp_path, [helper.make_node("MeanVarianceNormalization", ["x"], ["n"]),
                            helper.make_node("Conv", ["n", "w"], ["y"])],
                 [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 9, 9])], [w], opset=13)
    with pytest.raises(ModelError, match="invalid ONNX model"):
        load_model(path)
    # an MVN given a wrong input type: the node's own error (not its body's) is not excused either
    path = _save(tmp_path, [helper.make_node("MeanVarianceNormalization", ["x"], ["y"])],
                 [_vi("x", [1, 3, 8, 8], TensorProto.INT32)], [_vi("y", [1, 3, 8, 8], TensorProto.INT32)],
                 opset=13, name="int.onnx")
    with pytest.raises(ModelError, match="invalid ONNX model"):
        load_model(path)


def test_data_dependent_shapes_stay_dynamic(tmp_path):
    # a Reshape whose target is an input's *value*: no run on stand-in values can give its shape
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"]),
             helper.make_node("Neg", ["y"], ["z"])]
    path = _save(tmp_path, nodes, [_vi("x", [2, 3]), _vi("s", [2], TensorProto.INT64)], [_vi("z", ["a", "b"])])
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    m, _, p, _, manifest, got = _lower_and_run(path, {"x": x, "s": np.array([3, 2], np.int64)})
    assert sorted(m.data_dependent) == ["y", "z"] and "y" not in m.shapes and m.dtypes["y"] == np.float32
    assert m.shapes["r"] == (2, 3)
    assert any("2 tensor(s) have data-dependent shapes" in n and "memory not planned" in n for n in p.report.notes)
    assert p.tensor_formats["y"] == "ND" and p.tensor_formats["z"] == "ND"
    assert set(p.memory.offsets) >= {"r"} and not {"y", "z"} & set(p.memory.offsets)
    assert manifest["outputs"][0]["shape"] == [-1, -1]
    np.testing.assert_array_equal(got[0], -np.maximum(x, 0).reshape(3, 2))


# ------------------------------------------------------------------------------------------------
# Loader bugs of issue 9 (each failed on the loader before the fix; the old behaviour is named)
# ------------------------------------------------------------------------------------------------

def _onnx_data(*parts):
    import os

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", *parts)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7])
def test_internal_sequences_with_tensor_io_load_and_plan(k):
    """onnx's simple test_sequence_model*: sequences inside, tensors at the edges (before: ValueError
    in the shape run, exit 4). The sequences are not tensors: no shape, no format, element dtype."""
    from npu_deploy.converters.lowering.planner import plan

    path = _onnx_data("simple", f"test_sequence_model{k}", "model.onnx")
    m = load_model(path)
    ref = onnx.shape_inference.infer_shapes(onnx.load(path))
    seqs = {vi.name for vi in ref.graph.value_info if vi.type.HasField("sequence_type")}
    assert seqs and set(m.non_tensors) == seqs and set(m.non_tensors.values()) == {"sequence"}
    assert not seqs & set(m.shapes)
    for o in m.graph.output:
        assert o.name in m.shapes
    p = plan(m)
    assert not seqs & set(p.tensor_formats) and not seqs & set(p.tensor_dtypes)


def test_checker_rejection_that_onnxruntime_loads_warns_and_continues(tmp_path):
    """A graph output whose type has no `shape`: onnx.checker (IR 10) rejects it, onnxruntime loads it."""
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1, 4])], [_vi("y", None)])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(str(path), full_check=True)
    m = load_model(path)
    assert m.shapes["y"] == (1, 4)
    assert any("onnx.checker rejects" in w and "onnxruntime loads" in w for w in m.warnings)


def test_checker_rejection_onnxruntime_also_refuses_is_an_input_error(tmp_path):
    o = onnx.ValueInfoProto(name="y")
    o.type.tensor_type.SetInParent()  # no elem_type: neither onnx nor onnxruntime takes it
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1, 4])], [o])
    with pytest.raises(ModelError, match="invalid ONNX model: .*elem_type"):
        load_model(path)


@pytest.mark.parametrize("where", ["model", "user", "gear", "inferred"])
def test_dimensions_beyond_any_device_are_bad_input(tmp_path, where):
    """2^40 elements (before: converted, then a MemoryError at run time, exit 4)."""
    big = 1 << 40
    if where == "inferred":  # Expand to a huge constant shape: found by inference, not declared
        shape = numpy_helper.from_array(np.array([big, 4], np.int64), "shape")
        path = _save(tmp_path, [helper.make_node("Expand", ["x", "shape"], ["y"])], [_vi("x", [1, 4])],
                     [_vi("y", [big, 4])], [shape])
        kw = {}
    else:
        path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])],
                     [_vi("x", [big, 4] if where == "model" else ["N", 4])], [_vi("y", [big if where == "model"
                                                                                         else "N", 4])])
        kw = {"model": {}, "user": {"input_shapes": {"x": (big, 4)}},
              "gear": {"input_shapes": {"x": (-1, 4)}, "dynamic_batch": [1, big]}}[where]
    with pytest.raises(ModelError, match="over 128 GiB: more than any Ascend device's memory") as e:
        load_model(path, **kw)
    assert "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_zero_d_tensors_keep_their_rank(tmp_path):
    """A 0-d index (initializer and Constant node): shapes and values stay 0-d, Gather drops the axis."""
    idx = numpy_helper.from_array(np.array(1, np.int64), "i")
    const = helper.make_node("Constant", [], ["j"], value=numpy_helper.from_array(np.array(2, np.int64)))
    path = _save(tmp_path, [const, helper.make_node("Gather", ["x", "i"], ["a"], axis=1),
                            helper.make_node("Gather", ["x", "j"], ["b"], axis=1),
                            helper.make_node("Add", ["a", "b"], ["y"])],
                 [_vi("x", [1, 3, 4])], [_vi("y", [1, 4])], [idx])
    m = load_model(path)
    assert m.shapes["i"] == () and m.shapes["j"] == ()
    assert m.constant_array("i").shape == () and m.constant_array("j").shape == ()
    assert m.shapes["a"] == m.shapes["y"] == (1, 4)


@pytest.mark.parametrize("name", ["light_resnet50", "light_zfnet512"])
@pytest.mark.slow
def test_ir3_models_with_unused_initializers_run(name, tmp_path):
    """The onnx wheel's IR-3 CNNs carry an initializer no node reads (also a graph input, as IR 3 wants):
    they convert and the bundle runs like onnxruntime on the original."""
    import shutil

    path = str(shutil.copy(_onnx_data("light", f"{name}.onnx"), tmp_path / f"{name}.onnx"))
    raw = onnx.load(path, load_external_data=False)
    used = {i for n in raw.graph.node for i in n.input}
    assert raw.ir_version == 3 and [t.name for t in raw.graph.initializer if t.name not in used]
    import onnxruntime as ort
    from pathlib import Path

    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    m, _, p, _, _, got = _lower_and_run(Path(path), {"gpu_0/data_0": x})  # convert + bundle + emulator
    assert [i.name for i in m.inputs] == ["gpu_0/data_0"]
    assert m.shapes[m.graph.output[0].name] == (1, 1000)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"gpu_0/data_0": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def _if_on_value(tmp_path, else_nodes, else_out):
    """y = If(sr == 16000) then Relu(x) else <else_nodes>: the branch depends on an input value."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t_out"], name="t_relu")], "then", [],
                               [_vi("t_out", None)])
    else_g = helper.make_graph(else_nodes, "else", [], [_vi(else_out, None)])
    k = helper.make_node("Constant", [], ["k16"], value=numpy_helper.from_array(np.array(16000, np.int64)))
    nodes = [k, helper.make_node("Equal", ["sr", "k16"], ["c"], name="is16k"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
             helper.make_node("Neg", ["y"], ["z"], name="after")]
    return _save(tmp_path, nodes, [_vi("x", [2, 4]), _vi("sr", [], TensorProto.INT64)], [_vi("z", None)])


def test_shapes_after_an_if_on_input_values_do_not_assume_the_zeros_branch(tmp_path):
    """The branches give different shapes ([2, 4] vs [4, 4]): zeros (sr = 0) take the else branch,
    and the old loader took its shape for the model's. Now each branch is run: they disagree, so the
    shapes after the If are data-dependent (sized at run time), and each branch's own tensors keep
    the shape their branch gives."""
    path = _if_on_value(tmp_path, [helper.make_node("Concat", ["x", "x"], ["e_out"], name="e_cat", axis=0)],
                        "e_out")
    m = load_model(path)
    assert "y" not in m.shapes and "z" not in m.shapes
    assert {"y", "z"} <= set(m.data_dependent)
    assert m.shapes["t_out"] == (2, 4) and m.shapes["e_out"] == (4, 4)


def test_a_branch_that_cannot_run_at_these_shapes_is_named_and_the_other_decides(tmp_path):
    # the else branch reshapes x to [3, -1] (8 elements cannot), with a target computed from sr so that
    # onnxruntime cannot see it when loading: zeros take this branch, and the run fails
    k = lambda name, v: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(  # noqa: E731
        np.array(v, np.int64)))
    else_nodes = [k("three", [3, -1]), k("zero_i", 0), k("ax0", [0]),
                  helper.make_node("Mul", ["sr", "zero_i"], ["sr0"], name="e_mul"),
                  helper.make_node("Unsqueeze", ["sr0", "ax0"], ["sr1"], name="e_unsq"),
                  helper.make_node("Add", ["three", "sr1"], ["to3"], name="e_add"),
                  helper.make_node("Reshape", ["x", "to3"], ["e_out"], name="e_reshape")]
    path = _if_on_value(tmp_path, else_nodes, "e_out")
    m = load_model(path)
    assert m.shapes["y"] == m.shapes["z"] == (2, 4)
    assert any("If branch: its else_branch cannot run" in w for w in m.warnings)
    assert "e_out" in m.data_dependent


def test_node_names_are_unique_across_bodies(tmp_path):
    body = lambda out: helper.make_graph([helper.make_node("Relu", ["x"], [out], name="same")], "b", [],  # noqa: E731
                                         [_vi(out, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="same", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="cmp"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=body("a"), else_branch=body("b"))]
    path = _save(tmp_path, nodes, [_vi("x", [2, 2])], [_vi("y", [2, 2])],
                 [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    m = load_model(path)
    names = [m.graph.node[0].name] + [n.name for a in m.graph.node[2].attribute for n in a.g.node]
    assert names[0] == "same" and len(set(names)) == 3
