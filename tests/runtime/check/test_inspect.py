"""``inspect``: kind detection by content, ONNX facts against onnx itself, `.om` fixtures, JSON schema."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.runtime.check.inspect import InspectReport, detect_kind, inspect, render_text
from npu_deploy.errors import InputError, ModelError, OmError
from tests.standins.omfile import build_om, op, tensor, transdata

REAL = ["ppocr_det", "ppocr_rec", "ppocr_cls", "silero_vad", "minilm"]


def _dims(vi):
    return [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]


@pytest.mark.realmodel
@pytest.mark.parametrize("name", REAL)
def test_real_models_as_onnx(real_model, name):
    path = real_model(name)
    r = inspect(path)
    m = onnx.load(str(path))  # independent oracle: the onnx package, weights loaded
    g = m.graph
    assert r.kind == "onnx" and r and r.problems == []
    assert r.op_types == dict(Counter(n.op_type for n in g.node))
    assert r.op_count == len(g.node)
    inits = {t.name for t in g.initializer}
    assert [i["name"] for i in r.inputs] == [i.name for i in g.input if i.name not in inits]
    assert [i["shape"] for i in r.inputs] == [_dims(i) for i in g.input if i.name not in inits]
    assert [o["name"] for o in r.outputs] == [o.name for o in g.output]
    assert [o["shape"] for o in r.outputs] == [_dims(o) for o in g.output]
    for i, vi in zip(r.inputs, [i for i in g.input if i.name not in inits]):
        assert np.dtype(i["dtype"]) == helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        params = [d.dim_param or None for d in vi.type.tensor_type.shape.dim]
        assert i["dim_names"] == params
    d = r.onnx
    assert d["initializer_bytes"] == sum(numpy_helper.to_array(t).nbytes for t in g.initializer)
    assert d["constant_node_bytes"] == sum(numpy_helper.to_array(a.t).nbytes for n in g.node
                                           if n.op_type == "Constant" for a in n.attribute if a.name == "value")
    assert d["opsets"] == {o.domain: o.version for o in m.opset_import}
    assert d["producer_name"] == m.producer_name and d["ir_version"] == m.ir_version
    assert d["external_data"] == []
    text = render_text(r)
    assert text.splitlines()[-1] == r.verdict()
    assert f"{len(g.node)} nodes" in r.verdict()


@pytest.mark.realmodel
def test_real_model_facts_from_testing_md(real_model):
    # the documented facts of shared/testing.md
    vad = inspect(real_model("silero_vad"))
    assert [(i["name"], i["shape"]) for i in vad.inputs] == [("input", [-1, 576]), ("h", [1, 1, 128]),
                                                            ("c", [1, 1, 128])]
    assert vad.inputs[0]["dim_names"] == ["seq_len", None]
    assert "LSTM" in vad.op_types
    cls = inspect(real_model("ppocr_cls"))
    assert cls.op_types["Conv"] == 53
    minilm = inspect(real_model("minilm"))
    assert minilm.op_types["MatMul"] == 24
    assert {i["dtype"] for i in minilm.inputs} == {"int64"}


def _tiny_onnx(path, *, external: bool = False):
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
                           helper.make_node("Relu", ["y"], ["z"], name="relu")], "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="unit")
    if external:
        onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location="tiny.weights", size_threshold=0)
    else:
        onnx.save(m, str(path))
    return path


def test_detection_is_by_content_not_name(tmp_path):
    onnx_as_om = _tiny_onnx(tmp_path / "really_onnx.om")
    om_as_onnx = build_om(tmp_path / "really_om.onnx", inputs=[tensor("x")], outputs=[tensor("y")])
    assert detect_kind(onnx_as_om) == "onnx" and inspect(onnx_as_om).kind == "onnx"
    assert detect_kind(om_as_onnx) == "om" and inspect(om_as_onnx).kind == "om"
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"hello, this is not a model\n" * 10)
    with pytest.raises(ModelError, match="not an ONNX model, offline bundle or .om"):
        inspect(junk)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(ModelError):
        inspect(empty)
    with pytest.raises(InputError, match="no such file"):
        inspect(tmp_path / "missing.onnx")
    with pytest.raises(InputError, match="folder"):
        inspect(tmp_path)


def test_onnx_external_data_listed_and_checked(tmp_path):
    path = _tiny_onnx(tmp_path / "ext.onnx", external=True)
    r = inspect(path)
    assert r and r.onnx["external_data"] == [{"file": "tiny.weights", "tensors": 1, "bytes": 48, "exists": True}]
    assert r.onnx["initializer_bytes"] == 48
    assert [i["name"] for i in r.inputs] == ["x"] and r.inputs[0]["dim_names"] == ["N", None]
    (tmp_path / "tiny.weights").write_bytes(b"\0" * 10)        # too short
    r = inspect(path)
    assert not r and "10 bytes, tensors need 48" in r.problems[0]
    (tmp_path / "tiny.weights").unlink()
    r = inspect(path)
    assert not r and "missing" in r.problems[0] and "integrity problem" in r.verdict()
    # a location escaping the model folder is a problem, never read
    m = onnx.load(str(path), load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../outside.bin"
    onnx.save(m, str(tmp_path / "escape.onnx"))
    r = inspect(tmp_path / "escape.onnx")
    assert "outside the model's folder" in r.problems[0]


def test_onnx_with_ops_and_soc_support(tmp_path):
    path = _tiny_onnx(tmp_path / "m.onnx")
    r = inspect(path, ops=True)
    assert [(n["name"], n["op_type"]) for n in r.onnx["nodes"]] == [("mm", "MatMul"), ("relu", "Relu")]
    r = inspect(path, soc="Ascend310P3", ops=True, input_shapes={"x": (2, 3)})
    soc = r.onnx["soc"]
    assert soc["soc"] == "Ascend310P3"
    assert sum(soc["support"].values()) == 2 and soc["unsupported"] == []
    assert {n["engine"] for n in r.onnx["nodes"]} <= {"AI Core", "AI CPU"}
    assert "Ascend310P3" in r.verdict()


def test_soc_only_for_onnx(tmp_path):
    om = build_om(tmp_path / "m.om", inputs=[tensor("x")], outputs=[tensor("y")])
    with pytest.raises(InputError, match="--soc applies to ONNX"):
        inspect(om, soc="Ascend310P3")


def test_plan_options_without_soc_are_refused_not_ignored(tmp_path):
    path = _tiny_onnx(tmp_path / "m.onnx")
    for kw, opt in (({"precision_mode": "must_keep_origin_dtype"}, "--precision-mode"),
                    ({"input_shapes": {"x": (2, 3)}}, "--input-shape"), ({"dynamic_batch": [1, 2]}, "--dynamic-batch")):
        with pytest.raises(InputError, match=f"{opt} applies only with --soc"):
            inspect(path, **kw)
    assert inspect(path, soc="Ascend310P3", precision_mode="must_keep_origin_dtype", input_shapes={"x": (2, 3)})


def _bundle_of(tmp_path, name, nodes, inputs, outputs, inits=()):
    import npu_deploy

    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / f"{name}.onnx")
    return npu_deploy.convert(tmp_path / f"{name}.onnx", output=tmp_path / f"{name}.bundle", backend="builtin").output


def test_legal_bundles_pass_the_integrity_checks(tmp_path):
    """Scalars (device shape []), zero-size tensors (0 bytes), a weight that is a graph output and a
    weight read only inside an If branch are all legal: no integrity problem for them."""
    vi = helper.make_tensor_value_info
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(2, 2), "w")
    then_g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"])], "then", [],
                               [vi("t", TensorProto.FLOAT, [2, 2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["e"])], "else", [],
                               [vi("e", TensorProto.FLOAT, [2, 2])])
    cases = {
        "scalar": ([helper.make_node("Mul", ["x", "x"], ["y"])], [vi("x", TensorProto.FLOAT, [])],
                   [vi("y", TensorProto.FLOAT, [])], []),
        "empty": ([helper.make_node("Relu", ["x"], ["y"])], [vi("x", TensorProto.FLOAT, [0, 4])],
                  [vi("y", TensorProto.FLOAT, [0, 4])], []),
        "weight_out": ([helper.make_node("Relu", ["x"], ["y"])], [vi("x", TensorProto.FLOAT, [2, 2])],
                       [vi("y", TensorProto.FLOAT, [2, 2]), vi("w", TensorProto.FLOAT, [2, 2])], [w]),
        "if_branch": ([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                      [vi("x", TensorProto.FLOAT, [2, 2]), vi("c", TensorProto.BOOL, [])],
                      [vi("y", TensorProto.FLOAT, [2, 2])], [w]),
    }
    for name, (nodes, ins, outs, inits) in cases.items():
        r = inspect(_bundle_of(tmp_path, name, nodes, ins, outs, inits))
        assert r.kind == "bundle" and r.problems == [] and bool(r), (name, r.problems)


@pytest.mark.parametrize("header_version,table", [(1, "tiny"), (2, "tiny"), (2, "64")])
def test_om_report(tmp_path, header_version, table):
    path = build_om(tmp_path / "m.om", header_version=header_version, table=table, soc_version="Ascend910B",
                    atc_version="8.0.RC2", atc_cmdline="atc --model=m.onnx --framework=5",
                    inputs=[tensor("x", "float16", [1, 3, 8, 8], "NCHW")],
                    outputs=[tensor("y", "float32", [1, 10])],
                    ops=[transdata("td0", "NCHW", "NC1HWC0", [1, 3, 8, 8], out_shape=[1, 1, 8, 8, 16]),
                         op("c", "Conv2D"), op("c2", "Conv2D", engine="AIcpu"),
                         op("cast", "Cast", input_desc=[tensor("a", "float16", [1, 10])],
                            output_desc=[tensor("b", "float32", [1, 10])])])
    r = inspect(path, ops=True)
    o = r.om
    assert r.kind == "om" and r and o["variant"] == "om"
    assert o["header"]["version_text"] == f"{header_version}.0"
    assert o["soc_version"] == "Ascend910B" and o["atc_version"] == "8.0.RC2"
    assert o["atc_cmdline"] == "atc --model=m.onnx --framework=5"
    assert [p["type_name"] for p in o["partitions"]] == ["MODEL_DEF", "WEIGHTS_DATA", "TBE_KERNELS", "TASK_INFO"]
    assert r.op_types == {"Conv2D": 2, "Data": 1, "TransData": 1, "Cast": 1, "NetOutput": 1}
    assert o["engines"]["AIcpu"] == 1 and o["engines"]["AIcoreEngine"] == 3
    assert [(x["name"], x["src_format"], x["dst_format"]) for x in r.layout_ops] == [
        ("td0", "NCHW", "NC1HWC0"), ("cast", "ND", "ND")]
    assert [x["name"] for x in o["ops"]] == ["x", "td0", "c", "c2", "cast", "Node_Output"]
    assert r.verdict() == (".om for Ascend910B (ATC 8.0.RC2): 1 input, 1 output, 6 ops, 1 TransData; "
                           "integrity OK")


def test_om_variants_reported_not_guessed(tmp_path):
    enc = build_om(tmp_path / "enc.om", is_encrypt=1, inputs=[tensor("x")], outputs=[tensor("y")])
    r = inspect(enc)
    assert r.om["variant"] == "encrypted" and r.inputs == [] and "encrypted" in r.verdict()
    pico = tmp_path / "p.om"
    pico.write_bytes(b"PICO" + bytes(400))
    r = inspect(pico)
    assert r.om["variant"] == "PICO" and "not decoded" in r.verdict()
    bad = tmp_path / "bad.om"
    bad.write_bytes(build_om(tmp_path / "ok.om", inputs=[tensor("x")], outputs=[tensor("y")]).read_bytes()[:-3])
    with pytest.raises(OmError, match="truncated"):
        inspect(bad)


def test_json_schema_round_trip(tmp_path):
    path = build_om(tmp_path / "d.om", inputs=[tensor("x", "float32", [-1, 4])], outputs=[tensor("y")],
                    dynamic_batch=[1, 2, 4])
    r = inspect(path, layers=True)
    out = tmp_path / "r.json"
    r.to_json(out)
    d = json.loads(out.read_text())
    assert d["schema"] == "npu-deploy/inspect" and d["schema_version"] == 1
    assert d["ok"] is True and d["verdict"] == r.verdict()
    required = {"path", "kind", "file_size", "inputs", "outputs", "op_count", "op_types", "layout_ops",
                "problems", "notes", "onnx", "bundle", "om"}
    assert required <= set(d)
    assert d["om"]["dynamic"] == {"mode": "batch", "gears": [[1], [2], [4]]}
    assert d["inputs"][0]["shape"] == [-1, 4]
    back = InspectReport.load(out)
    assert back.to_dict() == r.to_dict()
    newer = dict(d, schema_version=2)
    with pytest.raises(InputError, match="newer"):
        InspectReport.load(newer)
    # ONNX kind
    onnx_path = _tiny_onnx(tmp_path / "m.onnx")
    d = json.loads(inspect(onnx_path).to_json())
    assert d["kind"] == "onnx" and d["om"] is None and d["onnx"]["opsets"] == {"": 17}


def test_text_is_aligned_and_ends_with_verdict(tmp_path):
    path = build_om(tmp_path / "m.om", inputs=[tensor("a_long_input_name", "float16", [1, 3]), tensor("b")],
                    outputs=[tensor("y")])
    r = inspect(path)
    text = render_text(r)
    lines = text.splitlines()
    assert lines[-1] == r.verdict()
    i = lines.index("inputs:")
    header, row1, row2 = lines[i + 1:i + 4]
    assert header.index("dtype") == row1.index("float16") == row2.index("float16")


@pytest.mark.realmodel
def test_real_model_on_soc_with_plan(real_model):
    path = real_model("ppocr_cls")
    r = inspect(path, soc="Ascend310P3", input_shapes={"x": (1, 3, 48, 192)}, layers=True, ops=True)
    g = onnx.load(str(path), load_external_data=False).graph
    soc = r.onnx["soc"]
    assert soc["planner"] == "built-in" and soc["precision_mode"] == "force_fp16"
    assert soc["unsupported"] == [] and soc["support"]["unsupported"] == 0
    n_const = sum(1 for n in g.node if n.op_type == "Constant")
    assert 0 < sum(soc["support"].values()) <= len(g.node) - n_const
    # the planned TransData: fewer than the naive plan, each a real change on a tensor of the graph
    assert soc["transdata_count"] == len(r.layout_ops) <= soc["transdata_naive_count"]
    tensors = {i.name for i in g.input} | {o for n in g.node for o in n.output}
    for t in r.layout_ops:
        assert t["src_format"] != t["dst_format"] and t["tensor"] in tensors
    assert 0 <= soc["formattrans_share"] < 1
    # per-node layouts: every ONNX node, with its op type; convolutions run on NC1HWC0 activations
    nf = soc["node_formats"]
    assert len(nf) == len(g.node)
    assert Counter(v["op_type"] for v in nf.values()) == Counter(n.op_type for n in g.node)
    convs = [k for k, v in nf.items() if v["op_type"] == "Conv"]
    assert len(convs) == 53 and all(nf[c]["input_formats"][0] == "NC1HWC0" for c in convs)
    # the --ops list is matched to the plan's node names (the file's nodes are unnamed)
    nodes = r.onnx["nodes"]
    assert [n["op_type"] for n in nodes] == [n.op_type for n in g.node]
    assert {n["planned_name"] for n in nodes} == set(nf)
    assert {n["engine"] for n in nodes if n["op_type"] == "Conv"} == {"AI Core"}
    text = render_text(r, layers=True)
    assert "node formats:" in text and "NCHW -> NC1HWC0" in text
    assert "TransData planned" in r.verdict()
