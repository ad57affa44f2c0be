"""Op support per SoC: the ATC registry lookup, engines by dtype, plugin rules, opset range."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.lowering import support as S
from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.errors import InputError, ModelError

SHARED_DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "onnx-cann"


def _graph(nodes, inputs, outputs, inits=()):
    return helper.make_graph(nodes, "g", inputs, outputs, list(inits))


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _derive(registrations, split):
    """Independent re-derivation of converters/lowering/data/onnx_cann.json from the shared source data."""
    regs = {}
    for row in registrations:
        if row["src"] == "canndev_stp" or "::" in row["op"] or row["domain"].startswith("("):
            continue
        regs.setdefault(row["domain"], {}).setdefault(row["op"], {})[row["ver"]] = (row["cann"], sorted(row["subops"]))
    out = {}
    for domain, ops in regs.items():
        for op, by_ver in ops.items():
            ranges = []
            for v in sorted(by_ver):
                cann, subops = by_ver[v]
                if ranges and ranges[-1][1] == v - 1 and ranges[-1][2:] == [cann, subops]:
                    ranges[-1][1] = v
                else:
                    ranges.append([v, v, cann, subops])
            out.setdefault(domain, {})[op] = ranges
    engines = {}
    for row in split:
        def dts(x):
            return None if x is None else "dynamic" if isinstance(x, str) else sorted(x[1])
        engines.setdefault(row["soc"], {})[row["cann"]] = {"onnx": row["onnx"], "aicore": dts(row["aicore"]),
                                                           "aicpu": dts(row["aicpu"])}
    return out, engines


@pytest.mark.shared_data
def test_packaged_table_matches_the_source_data():
    regs, engines = _derive(json.loads((SHARED_DATA / "registrations.json").read_text()),
                            json.loads((SHARED_DATA / "aicpu_split_2022.json").read_text()))
    data = S._data()
    assert data["registrations"] == regs
    assert data["engines"] == engines


def test_opset_range_from_reference():
    # reference §0: standard ops are registered for opsets 8-18, none at 19+
    assert S.supported_opset_range() == (8, 18)
    S.check_opset(11)
    with pytest.raises(ModelError, match=r"opset 19 is outside the range ATC parses \(8-18\)"):
        S.check_opset(19)
    with pytest.raises(ModelError, match="opset 7"):
        S.check_opset(7)


@pytest.mark.parametrize("op,opset,attrs,cann", [
    ("MatMul", 17, {}, "BatchMatMulV2"),          # §2 table
    ("Squeeze", 12, {}, "Squeeze"),
    ("Squeeze", 13, {}, "SqueezeV3"),
    ("Div", 17, {}, "RealDiv"),
    ("Softmax", 13, {"axis": -1}, "SoftmaxV2"),
    ("And", 17, {}, "LogicalAnd"),
    ("Gather", 17, {}, "GatherV2"),
    ("ReduceMean", 12, {}, "ReduceMean"),
])
def test_cann_op_mapping(op, opset, attrs, cann):
    n = helper.make_node(op, ["a", "b"] if op in ("MatMul", "Div", "And", "Gather") else ["a"], ["y"],
                         name="n", **attrs)
    r = S.check_graph(_graph([n], [_vi("a", [2, 2])], [_vi("y", [2, 2])]), {"": opset}, "Ascend310P3")
    assert r.node("n").cann_op == cann
    assert r.node("n").key == f"ai.onnx::{opset}::{op}"


@pytest.mark.parametrize("op,opset,why", [
    ("Loop", 17, "no ATC parser registered for ai.onnx::17::Loop"),
    ("ReduceL1", 18, "ai.onnx::18::ReduceL1"),      # max opset 17
    ("MaxUnpool", 10, "ai.onnx::10::MaxUnpool"),    # no opset-10 registration
    ("QuantizeLinear", 13, "E16002"),
])
def test_unregistered(op, opset, why):
    n = helper.make_node(op, ["a"], ["y"], name="n")
    r = S.check_graph(_graph([n], [_vi("a", [2])], [_vi("y", [2])]), {"": opset}, "Ascend310P3")
    assert r.node("n").engine == S.UNSUPPORTED and why in r.node("n").detail
    assert not r


@pytest.mark.parametrize("op,dtype,engine", [
    ("Abs", "float32", S.AI_CORE), ("Abs", "int64", S.AI_CPU),          # §2: int64 only on AI CPU
    ("Div", "float16", S.AI_CORE), ("Div", "int32", S.AI_CPU),          # RealDiv AI Core is float only
    ("Cast", "float64", S.AI_CPU), ("Cast", "int64", S.AI_CORE),
    ("Add", "float32", S.AI_CORE), ("Add", "int64", S.AI_CPU),          # dynamic op-info: int64 -> AI CPU
])
def test_engine_by_dtype(op, dtype, engine):
    ins = ["a", "b"] if op in ("Div", "Add") else ["a"]
    attrs = {"to": TensorProto.FLOAT} if op == "Cast" else {}
    n = helper.make_node(op, ins, ["y"], name="n", **attrs)
    r = S.check_graph(_graph([n], [_vi("a", [4])], [_vi("y", [4])]), {"": 17}, "Ascend310P3",
                      dtypes={"a": dtype, "b": dtype})
    assert r.node("n").engine == engine, r.node("n")


def test_fusion_needs_constant_inputs():
    # TopK's CANN op is AI CPU only; a constant k lets the TopKD fusion pass put it on AI Core (§5.3)
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    n1 = helper.make_node("TopK", ["a", "k"], ["v1", "i1"], name="const_k")
    n2 = helper.make_node("TopK", ["a", "kk"], ["v2", "i2"], name="runtime_k")
    g = _graph([n1, n2], [_vi("a", [8]), _vi("kk", [1], TensorProto.INT64)],
               [_vi("v1", [2]), _vi("v2", [2])], [k])
    r = S.check_graph(g, {"": 17}, "Ascend310P3", dtypes={"a": "float32"})
    assert r.node("const_k").engine == S.AI_CORE and "TopKD" in r.node("const_k").detail
    assert r.node("runtime_k").engine == S.AI_CPU


def test_plugin_rules_and_domains():
    nodes = [helper.make_node("ArgMax", ["a"], ["y1"], name="argmax_last", select_last_index=1),
             helper.make_node("ArgMax", ["a"], ["y2"], name="argmax_ok"),
             helper.make_node("NPURmsNorm", ["a", "a"], ["y3"], name="rms", domain="npu"),
             helper.make_node("Foo", ["a"], ["y4"], name="custom", domain="com.example")]
    g = _graph(nodes, [_vi("a", [4])], [_vi("y1", [1])])
    r = S.check_graph(g, {"": 17, "npu": 1}, "Ascend910B1", dtypes={"a": "float32"})
    assert r.node("argmax_last").engine == S.UNSUPPORTED and "select_last_index" in r.node("argmax_last").detail
    assert r.node("argmax_ok").engine != S.UNSUPPORTED
    assert r.node("rms").cann_op == "RmsNorm"
    assert "E19999" in r.node("custom").detail
    with pytest.raises(ModelError) as e:
        r.raise_if_unsupported("m.onnx")
    msg = str(e.value)
    assert "2 node(s)" in msg and "argmax_last" in msg and "custom" in msg and "\n" not in msg


def test_precision_moves_fp16_only_ops_to_ai_core():
    # MaxPoolV3 has float16-only AI Core op-info on 310P: float32 lands there only when ATC may cast
    n = helper.make_node("MaxPool", ["a"], ["y"], name="pool", kernel_shape=[2, 2])
    g = _graph([n], [_vi("a", [1, 4, 8, 8])], [_vi("y", [1, 4, 4, 4])])
    keep = S.check_graph(g, {"": 17}, "Ascend310P3", dtypes={"a": "float32"}, precision_mode="must_keep_origin_dtype")
    fp16 = S.check_graph(g, {"": 17}, "Ascend310P3", dtypes={"a": "float32"}, precision_mode="force_fp16")
    assert keep.node("pool").engine == S.AI_CPU and fp16.node("pool").engine == S.AI_CORE


def test_unknown_soc():
    with pytest.raises(InputError, match="unknown SoC 'Tesla'"):
        S.soc_family("Tesla")
    assert S.soc_family("Ascend310P3") == "ascend310p" and S.soc_family("Ascend910B4") == "ascend910"


def test_report_round_trip():
    n = helper.make_node("Relu", ["a"], ["y"], name="relu")
    r = S.check_graph(_graph([n], [_vi("a", [2])], [_vi("y", [2])]), {"": 17}, "Ascend310P3")
    back = S.SupportReport.load(r.to_json())
    assert back.nodes == r.nodes and bool(back) and back.verdict() == r.verdict()


@pytest.mark.realmodel
@pytest.mark.parametrize("name,shapes", [
    ("minilm", {"input_ids": (1, 16), "attention_mask": (1, 16)}),
    ("silero_vad", {"input": (2, 576)}),
])
@pytest.mark.slow
def test_real_models_fully_supported(real_model, name, shapes):
    m = load_model(real_model(name), input_shapes=shapes)
    r = S.check_support(m, "Ascend310P3")
    assert bool(r) and len(r.nodes) == len(m.graph.node)
    # every node is mapped to a CANN op from the registry
    assert all(n.cann_op for n in r.nodes)
    if name == "minilm":
        # the Shape/Gather/Concat chains on int64 are folded at compile time for fixed shapes
        assert sum(n.folded for n in r.nodes) > 100
        assert r.node(next(n.name for n in m.graph.node if n.op_type == "MatMul")).engine == S.AI_CORE


def test_ai_onnx_ml_only_model_refused_by_the_support_check(tmp_path):
    # loading accepts it (the lowering can run it); ATC parses ai.onnx models only: the support check
    # and therefore convert() refuse it, in one line
    import onnx

    from npu_deploy import convert

    g = _graph([helper.make_node("Binarizer", ["x"], ["y"], name="bin", domain="ai.onnx.ml")],
               [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    path = tmp_path / "ml.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)], ir_version=8), path)
    loaded = load_model(path)
    with pytest.raises(ModelError, match=r"ml.onnx: the model imports no ai.onnx opset \(domains: ai.onnx.ml 1\)"):
        S.check_support(loaded, "Ascend310P3")
    with pytest.raises(ModelError, match="imports no ai.onnx opset") as e:
        convert(str(path), output=str(tmp_path / "ml.bundle"), backend="builtin")
    assert "\n" not in str(e.value) and not (tmp_path / "ml.bundle").exists()


def test_sequence_output_refused_by_convert(tmp_path):
    import onnx

    from npu_deploy import convert

    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [1, 4])
    g = _graph([helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0)], [_vi("x", [3, 4])], [seq])
    path = tmp_path / "seq.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(ModelError, match="graph output 'seq' is a sequence, not a tensor") as e:
        convert(str(path), output=str(tmp_path / "seq.bundle"), backend="builtin")
    assert "\n" not in str(e.value) and not (tmp_path / "seq.bundle").exists()
