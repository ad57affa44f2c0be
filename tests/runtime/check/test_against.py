"""``inspect MODEL.om --against MODEL.onnx``: ATC's TransData against the built-in plan.

Two kinds of material:

* the real ATC ``.om`` files of ``shared/data/om`` (TensorFlow origin): the ATC-side listing is checked
  against facts read from the files independently (a protobuf decode with the builder's message class),
  and an unrelated ONNX model must be refused with "no op maps to this model";
* an ONNX model written here and an ``.om`` built with ``tests/standins/omfile.py`` that says where "ATC"
  put its TransData, so the agreed / planned-only / ATC-only sets are known in advance.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.runtime.check.against import AgainstReport, against, atc_transdata, op_mapping
from npu_deploy.converters.files.om import read_om
from npu_deploy.errors import InputError, ModelError, OmError
from tests.conftest import SHARED_DATA
from tests.converters.files.test_om import _oracle_modeldef
from tests.fuzzing import examples
from tests.standins.omfile import build_om, op, tensor, transdata

OM_DIR = SHARED_DATA / "om"
REAL = ["hh_om.om", "ddnet_out.om", "a3c_pong_model_v2.om"]


def _real(name: str) -> Path:
    p = OM_DIR / name
    if not p.exists():
        pytest.skip(f"{p} not present")
    return p


def _proto_ops(path: Path):
    return list(_oracle_modeldef(path.read_bytes()).graph[0].op)


# ---------------------------------------------------------------------------------------------------
# real .om files: the ATC side

@pytest.mark.shared_data
@pytest.mark.parametrize("name", REAL)
def test_real_om_lists_every_transdata_with_its_formats(name):
    path = _real(name)
    proto = [o for o in _proto_ops(path) if o.type == "TransData"]
    listed = atc_transdata(read_om(path, keep_ops=True))
    assert [t.name for t in listed] == [o.name for o in proto]
    for t, o in zip(listed, proto):
        assert (t.src_format, t.dst_format) == (o.attr["src_format"].s.decode(), o.attr["dst_format"].s.decode())
        assert t.in_shape == list(o.input_desc[0].shape.dim) and t.out_shape == list(o.output_desc[0].shape.dim)
        assert t.inserted  # every TransData of these files was added by ATC (empty original-name list)


@pytest.mark.shared_data
def test_real_om_transdata_counts_match_sources():
    # SOURCES.md: ddnet_out.om has 48 TransData
    assert len(atc_transdata(read_om(_real("ddnet_out.om"), keep_ops=True))) == 48


@pytest.mark.shared_data
@pytest.mark.parametrize("name", REAL)
def test_real_om_transdata_origin_is_the_producers_mapped_output(name):
    """Where the producer names the original tensor directly, the listing must say that tensor."""
    path = _real(name)
    ops = _proto_ops(path)
    by_name = {o.name: o for o in ops}
    listed = {t.name: t for t in atc_transdata(read_om(path, keep_ops=True))}
    checked = 0
    for o in ops:
        if o.type != "TransData":
            continue
        src, _, k = next(e for e in o.input if e and not e.endswith(":-1")).rpartition(":")
        p, k = by_name[src], int(k)
        d = p.output_desc[k].attr if k < len(p.output_desc) else {}
        if "_datadump_origin_name" in d:
            want = (d["_datadump_origin_name"].s.decode(), d["_datadump_origin_output_index"].i)
        elif p.type == "Data":
            want = (p.name, 0)
        elif "_datadump_original_op_names" not in p.attr:
            want = (p.name, k)
        else:
            continue  # an op ATC inserted (Cast, TransData): the listing walks further up
        assert (listed[o.name].origin, listed[o.name].origin_output) == want, o.name
        checked += 1
    assert checked >= 2
    assert all(t.origin is not None for t in listed.values())


@pytest.mark.shared_data
def test_real_om_walks_through_inserted_ops():
    # read off a3c_pong_model_v2.om: trans_TransData_1 <- trans_Cast_0 <- Data "s";
    # trans_TransData_13 <- trans_TransData_11 <- the fused conv3 op, whose output is W_0/conv3/Relu:0
    listed = {t.name: t for t in atc_transdata(read_om(_real("a3c_pong_model_v2.om"), keep_ops=True))}
    assert (listed["trans_TransData_1"].origin, listed["trans_TransData_1"].src_format) == ("s", "NHWC")
    assert "trans_Cast_0" in listed["trans_TransData_1"].via
    assert listed["trans_TransData_13"].origin == "W_0/conv3/Relu"
    assert (listed["trans_TransData_13"].src_format, listed["trans_TransData_13"].dst_format) == ("ND", "FRACTAL_NZ")


@pytest.mark.shared_data
def test_real_om_op_mapping_matches_the_fusion_attribute():
    path = _real("a3c_pong_model_v2.om")
    ops = _proto_ops(path)
    mapping = {m.op: m for m in op_mapping(read_om(path, keep_ops=True))}
    assert len(mapping) == len(ops)
    for o in ops:
        m = mapping[o.name]
        if "_datadump_original_op_names" in o.attr:
            assert m.original == [s.decode() for s in o.attr["_datadump_original_op_names"].list.s]
            assert m.inserted == (not m.original)
        else:
            assert m.original == [o.name] and not m.inserted
    assert mapping["W_0/conv1/Conv2DW_0/conv1/Relu"].original == [
        "W_0/conv1/Conv2D", "W_0/conv1/BiasAdd", "W_0/conv1/Relu"]


@pytest.mark.shared_data
@pytest.mark.parametrize("name", REAL)
def test_real_om_against_unrelated_onnx_is_one_clear_line(name, run_cli, example_onnx, tmp_path):
    out = tmp_path / "diff.json"
    code, stdout, stderr = run_cli("inspect", _real(name), "--against", example_onnx, "--json", out)
    assert code == 2
    assert "no op maps to this model" in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------
# a pair built here: known agreed / planned-only / ATC-only sets

def _onnx(path: Path, batch: int | str = 1) -> Path:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w2")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
         helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16, 8, 8])], [w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _om(path: Path, *, round_trip: bool = True, output_back: bool = False, n: int = 1,
        soc: str | None = "Ascend310P3", atc_cmdline: str | None = None, extra_ops=()) -> Path:
    """"ATC" converts x to NC1HWC0, fuses conv1+relu1, (round_trip) sends r1 to NCHW and back, runs
    conv2 (no mapping attribute: the node itself) and (output_back) converts y back to NCHW."""
    five = [n, 1, 8, 8, 16]
    ops = [transdata("trans_TransData_0", "NCHW", "NC1HWC0", [n, 3, 8, 8], out_shape=five, inputs=["x:0"],
                     original_names=[]),
           op("w1_const", "Const", output_desc=[tensor("w", "float16", [9, 1, 16, 16], "FRACTAL_Z")],
              original_names=[]),
           op("conv1relu1", "Conv2D", inputs=["trans_TransData_0:0", "w1_const:0"],
              input_desc=[tensor("a", "float16", five, "NC1HWC0")],
              output_desc=[tensor("b", "float16", five, "NC1HWC0", origin=("relu1", 0))],
              original_names=["conv1", "relu1"])]
    last = "conv1relu1:0"
    if round_trip:
        ops += [transdata("trans_TransData_2", "NC1HWC0", "NCHW", five, out_shape=[n, 16, 8, 8],
                          inputs=[last], original_names=[]),
                transdata("trans_TransData_3", "NCHW", "NC1HWC0", [n, 16, 8, 8], out_shape=five,
                          inputs=["trans_TransData_2:0"], original_names=[])]
        last = "trans_TransData_3:0"
    ops.append(op("conv2", "Conv2D", inputs=[last, "w1_const:0"],
                  input_desc=[tensor("c", "float16", five, "NC1HWC0")],
                  output_desc=[tensor("d", "float16", five, "NC1HWC0")]))
    out = tensor("conv2", "float16", five, "NC1HWC0", source="conv2:0")
    if output_back:
        ops.append(transdata("trans_TransData_9", "NC1HWC0", "NCHW", five, out_shape=[n, 16, 8, 8],
                             inputs=["conv2:0"], original_names=[]))
        out = tensor("conv2", "float16", [n, 16, 8, 8], "NCHW", source="trans_TransData_9:0")
    ops += list(extra_ops)
    return build_om(path, soc_version=soc, atc_cmdline=atc_cmdline,
                    inputs=[tensor("x", "float32", [n, 3, 8, 8], "NCHW")], outputs=[out], ops=ops)


def _set(entries):
    return sorted((d.tensor, d.src_format, d.dst_format) for d in entries)


def test_pair_known_sets(tmp_path):
    r = against(_om(tmp_path / "m.om"), _onnx(tmp_path / "m.onnx"))
    assert r.soc == "Ascend310P3"
    assert _set(r.agreed) == [("x", "NCHW", "NC1HWC0")]
    assert _set(r.planned_only) == [("y", "NC1HWC0", "NCHW")]
    assert _set(r.atc_only) == [("r1", "NC1HWC0", "NCHW"), ("r1", "NCHW", "NC1HWC0")]
    assert r.verdict() == "ATC 3 TransData, plan 2: 1 agreed, 1 planned only, 2 ATC only"
    assert not r
    # the op map: the fused op carries both ONNX nodes, conv2 is itself, the rest ATC inserted
    ops = {m.op: m for m in r.ops}
    assert ops["conv1relu1"].onnx_nodes == ["conv1", "relu1"] and ops["conv2"].onnx_nodes == ["conv2"]
    assert ops["trans_TransData_2"].inserted and ops["w1_const"].inserted
    assert r.onnx_nodes_not_in_om == []
    by = {t.name: t for t in r.atc_transdata}
    assert by["trans_TransData_3"].tensor == "r1" and "trans_TransData_2" in by["trans_TransData_3"].via


def test_pair_that_agrees_is_truthy(tmp_path):
    r = against(_om(tmp_path / "m.om", round_trip=False, output_back=True), _onnx(tmp_path / "m.onnx"))
    assert _set(r.agreed) == [("x", "NCHW", "NC1HWC0"), ("y", "NC1HWC0", "NCHW")]
    assert not r.planned_only and not r.atc_only and r
    assert [(d.atc, d.plan) for d in r.agreed if d.tensor == "y"][0][0] == "trans_TransData_9"


def test_pair_cli_terminal_and_json(tmp_path, run_cli):
    om, model, out = _om(tmp_path / "m.om"), _onnx(tmp_path / "m.onnx"), tmp_path / "diff.json"
    code, stdout, stderr = run_cli("inspect", om, "--against", model, "--json", out, "--ops")
    assert code == 0, stderr
    lines = stdout.strip().splitlines()
    assert lines[-1] == "ATC 3 TransData, plan 2: 1 agreed, 1 planned only, 2 ATC only"
    assert any("conv1relu1 [Conv2D]: conv1, relu1" in ln for ln in lines)
    d = json.loads(out.read_text())
    assert d["schema"] == "npu-deploy/against" and d["ok"] is False
    assert d["counts"] == {"atc": 3, "plan": 2, "agreed": 1, "planned_only": 1, "atc_only": 2}
    assert sorted((e["status"], e["tensor"], e["src_format"], e["dst_format"]) for e in d["diff"]) == [
        ("ATC only", "r1", "NC1HWC0", "NCHW"), ("ATC only", "r1", "NCHW", "NC1HWC0"),
        ("agreed", "x", "NCHW", "NC1HWC0"), ("planned only", "y", "NC1HWC0", "NCHW")]
    again = AgainstReport.load(out)
    assert again.verdict() == lines[-1] and _set(again.atc_only) == [("r1", "NC1HWC0", "NCHW"),
                                                                       ("r1", "NCHW", "NC1HWC0")]


def test_fail_on_diff(tmp_path, run_cli):
    model = _onnx(tmp_path / "m.onnx")
    assert run_cli("inspect", _om(tmp_path / "a.om"), "--against", model, "--fail-on-diff")[0] == 1
    same = _om(tmp_path / "b.om", round_trip=False, output_back=True)
    assert run_cli("inspect", same, "--against", model, "--fail-on-diff")[0] == 0
    code, _, err = run_cli("inspect", same, "--fail-on-diff")
    assert code == 2 and "--against" in err


def test_shapes_and_precision_come_from_the_om(tmp_path):
    om = _om(tmp_path / "m.om", n=2, atc_cmdline="atc --model=m.onnx --framework=5 --output=m "
                                                  "--soc_version=Ascend310P3 --precision_mode=must_keep_origin_dtype")
    r = against(om, _onnx(tmp_path / "m.onnx", batch="N"))
    assert r.input_shapes == {"x": [2, 3, 8, 8]}
    assert r.precision_mode == "must_keep_origin_dtype"
    assert [td["shape"] for td in r.plan_transdata if td["tensor"] == "x"] == [[2, 3, 8, 8]]
    assert _set(r.agreed) == [("x", "NCHW", "NC1HWC0")]


def test_unmapped_transdata_is_atc_only_without_a_tensor(tmp_path):
    extra = [transdata("trans_TransData_7", "ND", "FRACTAL_NZ", [16, 16], inputs=["w1_const:0"],
                       original_names=[])]
    r = against(_om(tmp_path / "m.om", extra_ops=extra), _onnx(tmp_path / "m.onnx"))
    un = [d for d in r.atc_only if d.tensor is None]
    assert [(d.atc, d.src_format, d.dst_format) for d in un] == [("trans_TransData_7", "ND", "FRACTAL_NZ")]
    t = next(t for t in r.atc_transdata if t.name == "trans_TransData_7")
    assert t.origin is None and "no data input" in t.via


def test_names_from_the_file_are_escaped(tmp_path, run_cli):
    extra = [transdata("trans_\x1b[2J_evil", "NC1HWC0", "NCHW", [1, 1, 8, 8, 16], out_shape=[1, 16, 8, 8],
                       inputs=["conv2:0"], original_names=[])]
    code, stdout, _ = run_cli("inspect", _om(tmp_path / "m.om", extra_ops=extra), "--against",
                              _onnx(tmp_path / "m.onnx"))
    assert code == 0 and "\x1b" not in stdout and "trans_\\x1b[2J_evil" in stdout


# ---------------------------------------------------------------------------------------------------
# bad input: one line, exit 2, nothing written

def test_file_not_an_om(tmp_path, run_cli):
    model, out = _onnx(tmp_path / "m.onnx"), tmp_path / "o.json"
    code, _, err = run_cli("inspect", model, "--against", model, "--json", out)
    assert code == 2 and "not an ATC .om" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    with pytest.raises(OmError, match="no such file"):
        against(tmp_path / "missing.om", model)


def test_against_not_onnx(tmp_path, run_cli):
    bad = tmp_path / "notes.onnx"
    bad.write_text("not a model\n")
    code, _, err = run_cli("inspect", _om(tmp_path / "m.om"), "--against", bad)
    assert code == 2 and "not an ONNX model" in err and "Traceback" not in err
    with pytest.raises(ModelError):
        against(tmp_path / "m.om", bad)


def test_soc_missing_or_conflicting(tmp_path, run_cli):
    model = _onnx(tmp_path / "m.onnx")
    nosoc = _om(tmp_path / "nosoc.om", soc=None)
    code, _, err = run_cli("inspect", nosoc, "--against", model)
    assert code == 2 and "does not record its SoC" in err
    assert run_cli("inspect", nosoc, "--against", model, "--soc", "Ascend310P3")[0] == 0
    with pytest.raises(InputError, match="built for Ascend310P3, not Ascend910B1"):
        against(_om(tmp_path / "m.om"), model, soc="Ascend910B1")


# ---------------------------------------------------------------------------------------------------
# a real model with an "ATC-like" .om written here: real names, fusion and scale

_ACT = ("Relu", "Clip", "HardSigmoid")


def _atc_like_om(graph, path: Path, shapes: dict, *, convert: dict) -> tuple[Path, dict]:
    """An .om in which every ONNX node is an op of its own name, Conv(+BatchNormalization)(+activation)
    chains are fused as ATC does (``_datadump_original_op_names`` + the output's origin), Constants are
    folded away, and a TransData is inserted before the consumers of each tensor in ``convert``
    (tensor -> list of (src, dst)). Returns the path and {TransData name: tensor it was put on}."""
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    fused_into: dict[str, list] = {}
    taken: set[str] = set()
    for n in graph.node:
        if n.op_type != "Conv" or n.name in taken:
            continue
        chain = [n]
        for want in (("BatchNormalization",), _ACT):
            nxt = consumers.get(chain[-1].output[0], [])
            if len(nxt) == 1 and nxt[0].op_type in want:
                chain.append(nxt[0])
        if len(chain) > 1:
            fused_into[n.name] = chain
            taken.update(c.name for c in chain[1:])
    source = {i.name: f"{i.name}:0" for i in graph.input}
    placed: dict[str, str] = {}
    ops = []

    def insert_transdata(t):
        for src, dst in convert.get(t, []):
            name = f"trans_TransData_{len(placed)}"
            ops.append(transdata(name, src, dst, list(shapes.get(t, [1])), inputs=[source[t]], original_names=[]))
            placed[name] = t
            source[t] = f"{name}:0"

    for i in graph.input:
        insert_transdata(i.name)
    for n in graph.node:
        if n.op_type == "Constant" or n.name in taken:
            continue
        chain = fused_into.get(n.name, [n])
        last = chain[-1]
        name = "".join(c.name for c in chain) if len(chain) > 1 else n.name
        ins = [source[i] for i in n.input if i in source]
        if len(chain) > 1:
            outs = [tensor(f"{name}_o", "float16", list(shapes.get(last.output[0], [1])), "NC1HWC0",
                           origin=(last.name, 0))]
            ops.append(op(name, "Conv2D", inputs=ins, output_desc=outs, original_names=[c.name for c in chain]))
        else:
            outs = [tensor(f"{name}_o{k}", "float16", list(shapes.get(o, [1])), "ND") for k, o in enumerate(n.output)]
            ops.append(op(name, n.op_type, inputs=ins, output_desc=outs))
        for k, o in enumerate(last.output):
            source[o] = f"{name}:{k}"
        for o in last.output:
            insert_transdata(o)
    outputs = [tensor(o.name, "float16", list(shapes.get(o.name, [1])), "ND", source=source[o.name])
               for o in graph.output]
    x = graph.input[0].name
    p = build_om(path, soc_version="Ascend310P3", inputs=[tensor(x, "float32", list(shapes[x]), "NCHW")],
                 outputs=outputs, ops=ops)
    return p, placed


@pytest.mark.realmodel
def test_real_model_against_an_atc_like_om(real_model, tmp_path, run_cli):
    from npu_deploy.converters.files.onnx_model import load_model

    model = real_model("ppocr_cls")
    loaded = load_model(model, input_shapes={"x": (1, 3, 48, 192)})
    g = loaded.graph
    # the first Relu closes a Conv+BatchNormalization+Relu chain that the .om fuses, and feeds a Conv only
    relu = next(n for n in g.node if n.op_type == "Relu")
    rt = relu.output[0]
    assert {n.op_type for n in g.node if rt in n.input} == {"Conv"}
    pool = [n for n in g.node if n.op_type == "GlobalAveragePool"][-1].output[0]
    convert = {"x": [("NCHW", "NC1HWC0")],
               # a round trip the plan has no reason for: the tensor only feeds device ops in NC1HWC0
               rt: [("NC1HWC0", "NCHW"), ("NCHW", "NC1HWC0")],
               pool: [("NC1HWC0", "NCHW")]}
    om, placed = _atc_like_om(g, tmp_path / "cls.om", loaded.shapes, convert=convert)
    r = against(om, model)
    assert r.input_shapes == {"x": [1, 3, 48, 192]}
    # every "ATC" TransData is found on the tensor it was put on, through the fused ops' mapping
    assert {t.name: t.tensor for t in r.atc_transdata} == placed
    fused = [m for m in r.ops if len(m.onnx_nodes) > 1]
    assert fused and all(m.onnx_nodes[0] in {n.name for n in g.node if n.op_type == "Conv"} for m in fused)
    # the diff conserves both sides
    c = r.counts()
    assert c["plan"] == len(r.plan_transdata) and c["atc"] == len(placed)
    assert ("x", "NCHW", "NC1HWC0") in _set(r.agreed)
    assert relu.name in next(m for m in r.ops if m.op.endswith(relu.name)).onnx_nodes
    assert _set([d for d in r.atc_only if d.tensor == rt]) == [(rt, "NC1HWC0", "NCHW"), (rt, "NCHW", "NC1HWC0")]
    code, stdout, _ = run_cli("inspect", om, "--against", model)
    assert code == 0 and stdout.strip().splitlines()[-1] == r.verdict()


# ---------------------------------------------------------------------------------------------------
# hostile graphs: cycles, dangling edges, odd attributes never crash the walk

_FUZZ = dict(max_examples=examples(40), deadline=None, database=None)


@pytest.mark.slow
def test_walk_survives_random_graphs(tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    names = [f"n{k}" for k in range(6)]
    spec = st.lists(st.tuples(st.sampled_from(["TransData", "Cast", "Relu", "Data", "Const"]),
                              st.lists(st.sampled_from(names + ["ghost", ""]), max_size=3).map(
                                  lambda xs: [x if not x else f"{x}:{len(x) % 3 - 1}" for x in xs]),
                              st.sampled_from([None, [], ["a", "b"]]),
                              st.booleans()), min_size=1, max_size=6)

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture], **_FUZZ)
    @given(spec)
    def run(ops):
        built = [op(names[k], t, inputs=ins, original_names=orig,
                    output_desc=[tensor(f"o{k}", "float16", [1], "ND", origin=("a", 0) if mark else None)])
                 for k, (t, ins, orig, mark) in enumerate(ops)]
        path = build_om(tmp_path / "f.om", inputs=[], outputs=[], ops=built)
        listed = atc_transdata(read_om(path, keep_ops=True))
        assert [t.name for t in listed] == [names[k] for k, o in enumerate(ops) if o[0] == "TransData"]
        assert all(t.via for t in listed)

    run()


@pytest.mark.shared_data
@pytest.mark.slow
def test_mutated_real_om_gives_only_om_errors(tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    path = _real("a3c_pong_model_v2.om")
    seed = path.read_bytes()
    md = next(p for p in read_om(path).partitions if p.type == 0)   # mutate the ModelDef, not the weights

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture], **_FUZZ)
    @given(st.lists(st.tuples(st.integers(md.offset, md.offset + md.size - 1), st.integers(0, 255)),
                    min_size=1, max_size=8))
    def run(flips):
        data = bytearray(seed)
        for pos, val in flips:
            data[pos] = val
        p = tmp_path / "m.om"
        p.write_bytes(bytes(data))
        try:
            model = read_om(p, keep_ops=True)
            op_mapping(model)
            atc_transdata(model)
        except OmError:
            pass

    run()


def test_precision_mode_the_planner_does_not_take_is_noted(tmp_path):
    om = _om(tmp_path / "m.om", atc_cmdline="atc --model=m.onnx --framework=5 --precision_mode=force_fp32")
    r = against(om, _onnx(tmp_path / "m.onnx"))
    assert r.precision_mode == "force_fp16"
    assert any("--precision_mode=force_fp32" in n for n in r.notes)
    assert against(om, tmp_path / "m.onnx", precision_mode="must_keep_origin_dtype").precision_mode == \
        "must_keep_origin_dtype"


def test_om_shapes_that_do_not_fit_the_model_say_where_they_came_from(tmp_path, run_cli):
    om = _om(tmp_path / "m.om", n=2)            # the .om says x is [2,3,8,8]; the model fixes batch 1
    code, _, err = run_cli("inspect", om, "--against", _onnx(tmp_path / "m.onnx"))
    assert code == 2 and "the input shapes of" in err and "x:2,3,8,8" in err
    assert len(err.strip().splitlines()) == 1


def _flatten_onnx(path: Path) -> Path:
    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((512, 64)).astype(np.float32), "w2")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Flatten", ["c1"], ["f"], name="flat"),
         helper.make_node("MatMul", ["f", "w2"], ["y"], name="fc")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_conversion_folded_across_a_view_op_agrees(tmp_path):
    """As in a3c_pong_model_v2.om: ATC drops the Flatten and converts the conv output straight to
    FRACTAL_NZ [1,512]; the plan converts the Flatten's output. Same data, same formats: agreed."""
    ops = [transdata("trans_TransData_0", "NCHW", "NC1HWC0", [1, 3, 8, 8], out_shape=[1, 1, 8, 8, 16],
                     inputs=["x:0"], original_names=[]),
           op("conv1", "Conv2D", inputs=["trans_TransData_0:0"],
              output_desc=[tensor("c", "float16", [1, 2, 4, 4, 16], "NC1HWC0")]),
           transdata("trans_TransData_2", "NC1HWC0", "NCHW", [1, 2, 4, 4, 16], out_shape=[1, 32, 4, 4],
                     inputs=["conv1:0"], original_names=[]),
           transdata("trans_TransData_3", "NCHW", "FRACTAL_NZ", [1, 32, 4, 4], out_shape=[32, 1, 16, 16],
                     inputs=["trans_TransData_2:0"], original_names=[]),
           op("fc", "MatMulV2", inputs=["trans_TransData_3:0"],
              output_desc=[tensor("m", "float16", [4, 1, 16, 16], "FRACTAL_NZ")]),
           transdata("trans_TransData_5", "FRACTAL_NZ", "ND", [4, 1, 16, 16], out_shape=[1, 64],
                     inputs=["fc:0"], original_names=[])]
    om = build_om(tmp_path / "f.om", soc_version="Ascend310P3", inputs=[tensor("x", "float32", [1, 3, 8, 8], "NCHW")],
                  outputs=[tensor("fc", "float16", [1, 64], "ND", source="trans_TransData_5:0")], ops=ops)
    r = against(om, _flatten_onnx(tmp_path / "f.onnx"))
    assert _set(r.agreed) == [("c1", "NC1HWC0", "NCHW"), ("c1", "NCHW", "FRACTAL_NZ"), ("x", "NCHW", "NC1HWC0"),
                              ("y", "FRACTAL_NZ", "ND")]
    folded = next(d for d in r.agreed if d.dst_format == "FRACTAL_NZ")
    assert (folded.atc, folded.plan) == ("trans_TransData_3", next(
        t["name"] for t in r.plan_transdata if t["tensor"] == "f")) and "the plan converts f" in folded.reason
    assert r and not r.planned_only and not r.atc_only


def test_json_never_overwrites_the_model(tmp_path, run_cli):
    model = _onnx(tmp_path / "m.onnx")
    before = model.read_bytes()
    code, _, err = run_cli("inspect", _om(tmp_path / "m.om"), "--against", model, "--json", model)
    assert code == 2 and model.read_bytes() == before and len(err.strip().splitlines()) == 1


def test_dynamic_batch_om_is_planned_at_its_largest_gear(tmp_path):
    five = [-1, 1, 8, 8, 16]
    ops = [transdata("trans_TransData_0", "NCHW", "NC1HWC0", [-1, 3, 8, 8], out_shape=five, inputs=["x:0"],
                     original_names=[]),
           op("conv1relu1", "Conv2D", inputs=["trans_TransData_0:0"],
              output_desc=[tensor("b", "float16", five, "NC1HWC0", origin=("relu1", 0))],
              original_names=["conv1", "relu1"]),
           op("conv2", "Conv2D", inputs=["conv1relu1:0"], output_desc=[tensor("d", "float16", five, "NC1HWC0")])]
    om = build_om(tmp_path / "dyn.om", soc_version="Ascend310P3", dynamic_batch=[1, 2, 4],
                  inputs=[tensor("x", "float32", [-1, 3, 8, 8], "NCHW")],
                  outputs=[tensor("conv2", "float16", five, "NC1HWC0", source="conv2:0")], ops=ops)
    r = against(om, _onnx(tmp_path / "m.onnx", batch="N"))
    assert r.input_shapes == {"x": [-1, 3, 8, 8]}
    assert [td["shape"] for td in r.plan_transdata if td["tensor"] == "x"] == [[4, 3, 8, 8]]
    assert any("gears (batch): 1 2 4" in n for n in r.notes)
    assert _set(r.agreed) == [("x", "NCHW", "NC1HWC0")] and _set(r.planned_only) == [("y", "NC1HWC0", "NCHW")]


def test_transdata_in_a_subgraph_resolves_within_its_graph_first(tmp_path):
    ops = [op("a", "Relu", output_desc=[tensor("o", "float16", [1], "ND", origin=("main_a", 0))],
              original_names=["main_a"]),
           op("a", "Relu", graph=1, output_desc=[tensor("o", "float16", [1], "ND", origin=("sub_a", 0))],
              original_names=["sub_a"]),
           op("b", "Relu", graph=1, output_desc=[tensor("o", "float16", [1], "ND", origin=("sub_b", 0))],
              original_names=["sub_b"]),
           transdata("t_sub", "ND", "FRACTAL_NZ", [16, 16], inputs=["a:0"], graph=1, original_names=[]),
           transdata("t_cross", "ND", "FRACTAL_NZ", [16, 16], inputs=["b:0"], original_names=[])]
    path = build_om(tmp_path / "s.om", inputs=[tensor("x")], outputs=[tensor("y")], ops=ops)
    got = {t.name: t.origin for t in atc_transdata(read_om(path, keep_ops=True))}
    assert got == {"t_sub": "sub_a", "t_cross": "sub_b"}


# ---------------------------------------------------------------------------------------------------
# files without the fusion attributes: ops mapped by ATC 7.6's naming conventions (reference §8)

def _enet_onnx(path: Path) -> Path:
    """Conv → BatchNormalization → PRelu → ConvTranspose → Resize, named as torch.onnx names nodes."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("w", f(8, 3, 3, 3)), ("scale", f(8)), ("bias", f(8)), ("mean", f(8)), ("var", np.abs(f(8)) + 1),
        ("slope", np.full((8, 1, 1), 0.25, np.float32)), ("wt", f(8, 4, 2, 2)),
        ("roi", np.array([], np.float32)), ("scales", np.array([1, 1, 2, 2], np.float32))]]
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="/enc/conv/Conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"],
                          name="/enc/bn/BatchNormalization"),
         helper.make_node("PRelu", ["b", "slope"], ["p"], name="/enc/prelu/PRelu"),
         helper.make_node("ConvTranspose", ["p", "wt"], ["u"], name="/dec/up/ConvTranspose", strides=[2, 2]),
         helper.make_node("Resize", ["u", "roi", "scales"], ["out"], name="/dec/Resize", mode="linear")],
        "enet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 64, 64])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _enet_om(path: Path, *, extra_ops=()) -> Path:
    """What ATC 7.6 writes for :func:`_enet_onnx` on Ascend310B4: no op carries a mapping attribute; the
    input is cast then converted, the output converted then cast back, BN and PRelu fused."""
    from tests.standins.omfile import fused_name, inserted_name, output_name, partitioned_name

    conv, resize = partitioned_name("/enc/conv/Conv", "Conv2D", 0), partitioned_name("/dec/Resize",
                                                                                      "ResizeBilinearV2", 5)
    bn = fused_name("/enc/bn/BatchNormalization", "BNInferenceD", "/enc/prelu/PRelu")
    x4, x5 = [1, 3, 16, 16], [1, 1, 16, 16, 16]
    o4, o5 = [1, 4, 64, 64], [1, 1, 64, 64, 16]

    def compute(name, type_, src, shape):
        return op(name, type_, inputs=[src], input_desc=[tensor("i", "float16", shape, "NC1HWC0")],
                  output_desc=[tensor("o", "float16", shape, "NC1HWC0")])

    ops = [op(inserted_name("Cast", 2), "Cast", inputs=["x:0"], input_desc=[tensor("i", "float32", x4, "NCHW")],
              output_desc=[tensor("o", "float16", x4, "NCHW")]),
           transdata(inserted_name("TransData", 3), "NCHW", "NC1HWC0", x4, out_shape=x5,
                     inputs=[inserted_name("Cast", 2) + ":0"]),
           compute(conv, "Conv2D", inserted_name("TransData", 3) + ":0", [1, 1, 16, 16, 16]),
           compute(bn, "BNInferenceD", conv + ":0", [1, 1, 16, 16, 16]),
           compute("/dec/up/ConvTranspose", "Conv2DTransposeD", bn + ":0", [1, 1, 32, 32, 16]),
           compute(resize, "ResizeBilinearV2", "/dec/up/ConvTranspose:0", o5),
           transdata(inserted_name("TransData", 1111), "NC1HWC0", "NCHW", o5, out_shape=o4, inputs=[resize + ":0"]),
           op(inserted_name("Cast", 1112), "Cast", inputs=[inserted_name("TransData", 1111) + ":0"],
              input_desc=[tensor("i", "float16", o4, "NCHW")], output_desc=[tensor("o", "float32", o4, "NCHW")]),
           *extra_ops]
    return build_om(path, soc_version="Ascend310B4", inputs=[tensor("x", "float32", x4, "NCHW")],
                    outputs=[tensor(output_name(resize, 0, "out"), "float32", o4, "NCHW",
                                    source=inserted_name("Cast", 1112) + ":0")], ops=ops)


def test_file_without_mapping_attributes_maps_by_names(tmp_path):
    r = against(_enet_om(tmp_path / "enet.om"), _enet_onnx(tmp_path / "enet.onnx"))
    assert _set(r.agreed) == [("out", "NC1HWC0", "NCHW"), ("x", "NCHW", "NC1HWC0")]
    assert not r.planned_only and not r.atc_only and r
    ops = {m.op: m for m in r.ops}
    assert ops["PartitionedCall_/enc/conv/Conv_Conv2D_0"].onnx_nodes == ["/enc/conv/Conv"]
    assert ops["/enc/bn/BatchNormalization_BNInferenceD/enc/prelu/PRelu"].onnx_nodes == [
        "/enc/bn/BatchNormalization", "/enc/prelu/PRelu"]
    assert ops["/dec/up/ConvTranspose"].onnx_nodes == ["/dec/up/ConvTranspose"]
    assert ops["trans_Cast_2"].inserted and ops["trans_TransData_1111"].inserted
    assert r.op_map_coverage == 1.0 and r.onnx_nodes_not_in_om == []
    by = {t.name: t for t in r.atc_transdata}
    assert by["trans_TransData_3"].tensor == "x" and "trans_Cast_2" in by["trans_TransData_3"].via
    assert by["trans_TransData_1111"].tensor == "out"


def test_coverage_counts_unmapped_compute_ops(tmp_path, run_cli):
    stray = op("AutomaticBufferFusionOp_77", "Add", input_desc=[tensor("i", "float16", [1], "ND")],
               output_desc=[tensor("o", "float16", [1], "ND")])
    om = _enet_om(tmp_path / "enet.om", extra_ops=[stray])
    out = tmp_path / "r.json"
    code, stdout, stderr = run_cli("inspect", om, "--against", _enet_onnx(tmp_path / "enet.onnx"), "--json", out)
    assert code == 0, stderr
    d = json.loads(out.read_text())
    assert d["op_map_coverage"] == 0.8      # 4 of the 5 compute ops (Cast/TransData inserted, Data, NetOutput)
    assert d["counts"]["agreed"] == 2 and d["counts"]["atc_only"] == 0
    assert "80% of the compute ops mapped" in stdout


def test_name_map_conventions():
    from npu_deploy.runtime.check.against import NameMap
    from tests.standins.omfile import function_graph_name, output_name

    nodes = {"Conv_1": ["a"], "Conv_12": ["b"], "Relu": ["c"], "/m/Sub": ["d"]}
    m = NameMap(nodes)
    assert m.nodes("Conv_12") == ["Conv_12"]
    assert m.nodes("PartitionedCall_Conv_12_Conv2D_3") == ["Conv_12"]        # not Conv_1
    assert m.nodes(function_graph_name("/m/Sub", 1, 4)) == ["/m/Sub"]
    assert m.nodes(output_name("PartitionedCall_Conv_1_Conv2D_0", 0, "b")) == ["Conv_12"]   # producer of b
    assert m.nodes("trans_TransData_7") == [] and m.nodes("Conv_123") == []
    assert m.nodes("Conv_1_BNInferenceDRelu") == ["Conv_1", "Relu"]


@pytest.mark.shared_data
def test_real_atc76_pair_agrees():
    """Every .om in shared data beside an .onnx of the same stem (the ATC 7.6 Ascend310B4 pair)."""
    pairs = [(p, p.with_suffix(".onnx")) for p in sorted(OM_DIR.glob("*.om")) if p.with_suffix(".onnx").exists()]
    if not pairs:
        pytest.skip(f"no .om with its .onnx in {OM_DIR}")
    for om, model in pairs:
        r = against(om, model)
        assert r, r.verdict()
        assert r.counts()["agreed"] >= 1 and r.op_map_coverage >= 0.9, (om, r.op_map_coverage)


def test_mapping_attribute_wins_over_the_name(tmp_path):
    """An op carrying _datadump_original_op_names is mapped by it, whatever its name says."""
    odd = op("PartitionedCall_conv2_Conv2D_0", "Conv2D", original_names=["conv1"],
             input_desc=[tensor("i", "float16", [1], "ND")], output_desc=[tensor("o", "float16", [1], "ND")])
    r = against(_om(tmp_path / "m.om", extra_ops=[odd]), _onnx(tmp_path / "m.onnx"))
    m = {x.op: x for x in r.ops}["PartitionedCall_conv2_Conv2D_0"]
    assert m.onnx_nodes == ["conv1"] and m.mapped_by == "attribute"
    assert {x.op: x for x in r.ops}["conv2"].mapped_by == "name"
