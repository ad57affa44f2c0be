"""Installed op info (``converters/lowering/opinfo.py``) against a stand-in written from the documented keys.

No CANN here: the stand-in ``aic-<soc>-ops-info.json`` files below are ours, written from the key names
the reading guide documents (``input<i>.{name,dtype,format,paramType}``, ``dynamicFormat``, ``heavyOp``,
``opFile``, ``op.pattern``); Huawei's files are never copied. Every expected TransData count is worked
out by hand in the test's comment, not read from the planner.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.converters.lowering import opinfo, ops
from npu_deploy.converters.lowering import support as S
from npu_deploy.converters.lowering.planner import plan
from npu_deploy.errors import InputError

LAYOUT = "built-in/op_impl/ai_core/tbe/config"


def _col(name: str, dtypes: str, formats: str) -> dict:
    return {"name": name, "dtype": dtypes, "format": formats, "paramType": "required"}


def _opp(tmp: Path, soc_dir: str = "ascend310p", ops: dict | None = None, extra: dict | None = None) -> Path:
    """An opp folder with one SoC's op info: ``ops`` in the main file, ``extra`` in an OpDef file."""
    d = tmp / "opp" / LAYOUT / soc_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / f"aic-{soc_dir}-ops-info.json").write_text(json.dumps(ops or {}), encoding="utf-8")
    if extra is not None:
        (d / f"aic-{soc_dir}-ops-info-nn.json").write_text(json.dumps(extra), encoding="utf-8")
    return tmp / "opp"


def _relu(dtypes: str, formats: str) -> dict:
    return {"Relu": {"input0": _col("x", dtypes, formats), "output0": _col("y", dtypes, formats),
                     "opFile": {"value": "relu"}, "op": {"pattern": "formatAgnostic"}}}


def _conv_relu_conv(tmp: Path) -> Path:
    """x [1,16,8,8] -> Conv 3x3 -> Relu -> Conv 3x3 -> y."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32), "w2")
    g = helper.make_graph([
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], [w1, w2])
    path = tmp / "crc.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(opinfo.ENV, raising=False)


def test_nd_only_relu_stays_nd_and_costs_two_more_transdata(tmp_path, no_env):
    model = load_model(_conv_relu_conv(tmp_path))
    # built-in: Relu follows conv1's NC1HWC0: TransData x NCHW->5HD and y 5HD->NCHW only = 2
    base = plan(model, soc="Ascend310P3", precision_mode="force_fp16")
    assert len(base.transdata) == 2
    # the stand-in lists Relu in ND only: conv1 -> (5HD->NCHW) -> relu -> (NCHW->5HD) -> conv2: 2 + 2 = 4
    opp = _opp(tmp_path, ops=_relu("float16,float", "ND,ND"))
    p = plan(model, soc="Ascend310P3", precision_mode="force_fp16", op_info=opp)
    assert len(p.transdata) == 4
    assert p.node_formats["relu"].input_formats == ["NCHW"]
    assert any("installed op info: Relu input0 (x) lists ND for float16" in t.reason for t in p.transdata), \
        p.explain()
    assert any("installed op info for Ascend310P3: 1 ops" in n for n in p.report.notes)


def test_columns_are_per_dtype(tmp_path, no_env):
    model = load_model(_conv_relu_conv(tmp_path))
    # Relu takes NC1HWC0 in float16 but only ND in float32
    opp = _opp(tmp_path, ops=_relu("float16,float", "NC1HWC0,ND"))
    fp16 = plan(model, soc="Ascend310P3", precision_mode="force_fp16", op_info=opp)
    fp32 = plan(model, soc="Ascend310P3", precision_mode="must_keep_origin_dtype", op_info=opp)
    assert len(fp16.transdata) == 2          # as the built-in table: Relu in NC1HWC0
    assert len(fp32.transdata) == 4          # Relu in ND: one conversion out of conv1 and one back


def test_fixed_format_op_listed_nd_only_falls_back_to_nd(tmp_path, no_env):
    # x [1,16,8,8] -> MaxPool 2x2 -> Conv. Built-in: MaxPoolV3 NC1HWC0, conv NC1HWC0: x NCHW->5HD, y 5HD->NCHW = 2.
    # MaxPoolV3 listed ND only: MaxPool reads x as is, its output NCHW->5HD for the conv, y back = 2 as well,
    # but the first TransData moves from x to the pool's output
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 16, 1, 1)).astype(np.float32), "w")
    g = helper.make_graph([
        helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w"], ["y"], name="conv")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], [w])
    path = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = load_model(path)
    base = plan(model, soc="Ascend310P3")
    assert [t.tensor for t in base.transdata] == ["x", "y"]
    opp = _opp(tmp_path, ops={"MaxPoolV3": {"input0": _col("x", "float16", "ND"), "output0": _col("y", "float16", "ND")}})
    p = plan(model, soc="Ascend310P3", op_info=opp)
    assert [t.tensor for t in p.transdata] == ["p", "y"]
    assert p.node_formats["pool"].input_formats == ["NCHW"]


def test_dynamic_format_and_unlisted_dtype_do_not_narrow(tmp_path, no_env):
    model = load_model(_conv_relu_conv(tmp_path))
    dyn = {"Relu": {**_relu("float16", "ND")["Relu"], "dynamicFormat": {"flag": "true"}}}
    p = plan(model, soc="Ascend310P3", op_info=_opp(tmp_path / "a", ops=dyn))
    assert len(p.transdata) == 2   # columns chosen at compile time: the file does not bound them
    # only int32 listed: float16 is an engine question, not a format one; the built-in table decides
    p = plan(model, soc="Ascend310P3", op_info=_opp(tmp_path / "b", ops=_relu("int32", "ND")))
    assert len(p.transdata) == 2


def test_opdef_file_is_read_and_main_file_wins(tmp_path, no_env):
    opp = _opp(tmp_path, ops=_relu("float16", "NC1HWC0"), extra={**_relu("float16", "ND"),
                                                                   "MatMulV3": {"input0": _col("x1", "float16", "ND")}})
    info = opinfo.load_op_info(opp, "Ascend310P3")
    assert [f.name for f in info.files] == ["aic-ascend310p-ops-info.json", "aic-ascend310p-ops-info-nn.json"]
    assert info.entry("Relu").formats_for(0, "float16") == {"NC1HWC0"}
    assert info.entry("MatMulV3").formats_for(0, "float16") == {"ND"}


def test_missing_soc_folder_falls_back_with_a_note(tmp_path, no_env):
    model = load_model(_conv_relu_conv(tmp_path))
    opp = _opp(tmp_path, ops=_relu("float16,float", "ND,ND"))   # ascend310p only
    base = plan(model, soc="Ascend910B3")
    p = plan(model, soc="Ascend910B3", op_info=opp)
    assert [t.to_manifest() for t in p.transdata] == [t.to_manifest() for t in base.transdata]
    note = [n for n in p.report.notes if "op info" in n]
    assert note == [f"op info (--op-info {opp}) has no folder for ascend910b (found: ascend310p): the built-in "
                    f"op table is used for Ascend910B3"]


def test_env_var_is_read_and_absent_means_built_in(tmp_path, monkeypatch):
    model = load_model(_conv_relu_conv(tmp_path))
    monkeypatch.delenv(opinfo.ENV, raising=False)
    base = plan(model, soc="Ascend310P3")
    assert not any("op info" in n for n in base.report.notes)
    monkeypatch.setenv(opinfo.ENV, str(_opp(tmp_path, ops=_relu("float16,float", "ND,ND"))))
    assert len(plan(model, soc="Ascend310P3").transdata) == 4
    # an env var naming a folder without op info: a note, the built-in table
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(opinfo.ENV, str(empty))
    p = plan(model, soc="Ascend310P3")
    assert len(p.transdata) == 2 and any("holds no aic-<soc>-ops-info.json" in n for n in p.report.notes)


@pytest.mark.parametrize("text, where", [
    ("{not json", "line 1"),
    ("[]", "(top level)"),
    (json.dumps({"Relu": []}), "Relu: an object expected"),
    (json.dumps({"Relu": {"input0": _col("x", "float16,float", "ND")}}), "Relu.input0.format: 1 formats for 2 dtypes"),
    (json.dumps({"Relu": {"input0": {"name": "x", "dtype": 3, "format": "ND"}}}), "Relu.input0.dtype"),
    (json.dumps({"Relu": {"input0": _col("x", "float16", "ND"), "dynamicFormat": {"flag": "maybe"}}}),
     "Relu.dynamicFormat: flag 'maybe'"),
])
def test_bad_file_names_file_and_key(tmp_path, no_env, text, where):
    opp = _opp(tmp_path)
    f = opp / LAYOUT / "ascend310p" / "aic-ascend310p-ops-info.json"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as e:
        opinfo.load_op_info(opp, "Ascend310P3")
    assert str(f) in str(e.value) and where in str(e.value)
    assert e.value.exit_code == 2


def test_folder_without_op_info_is_bad_input(tmp_path, no_env):
    with pytest.raises(InputError, match="no aic-<soc>-ops-info.json under it"):
        opinfo.resolve(tmp_path, "Ascend310P3")
    with pytest.raises(InputError, match="no such folder"):
        opinfo.resolve(tmp_path / "nope", "Ascend310P3")


@pytest.mark.parametrize("sub", ["opp", f"opp/{LAYOUT}", f"opp/{LAYOUT}/ascend310p"])
def test_layouts_accepted(tmp_path, no_env, sub):
    _opp(tmp_path, ops=_relu("float16", "ND"))
    info, notes = opinfo.resolve(tmp_path / sub, "Ascend310P1")
    assert info is not None and info.entry("Relu") is not None and info.folder.name == "ascend310p"


def test_cli_bad_file_exit_2_one_line_no_bundle(tmp_path, no_env, run_cli):
    model = _conv_relu_conv(tmp_path)
    opp = _opp(tmp_path, ops={"Relu": {"input0": _col("x", "float16,float", "ND")}})
    out = tmp_path / "m.bundle"
    code, stdout, stderr = run_cli("convert", model, "--backend", "builtin", "--op-info", opp, "-o", out, "-q",
                                   "--no-preflight")
    assert code == 2
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "aic-ascend310p-ops-info.json" in lines[0] and "Relu.input0.format" in lines[0]
    assert "Traceback" not in stderr and not out.exists()


def test_cli_op_info_changes_the_plan(tmp_path, no_env, run_cli):
    model = _conv_relu_conv(tmp_path)
    opp = _opp(tmp_path, ops=_relu("float16,float", "ND,ND"))
    code, stdout, _ = run_cli("convert", model, "--backend", "builtin", "--op-info", opp, "-o",
                              tmp_path / "m.bundle", "--no-preflight")
    assert code == 0
    assert "4 TransData planned" in stdout and "c1 NC1HWC0 -> NCHW" in stdout, stdout
    assert "note: installed op info for Ascend310P3" in stdout
    # the bundle the narrowed plan wrote runs on the emulator and matches onnxruntime
    code, stdout, stderr = run_cli("compare", model, tmp_path / "m.bundle")
    assert code == 0, stdout + stderr


def test_op_row_shows_installed_columns(tmp_path, no_env):
    info = opinfo.load_op_info(_opp(tmp_path, ops=_relu("float16,float", "NC1HWC0,ND")), "Ascend310P3")
    r = S.op_row("Relu", "Ascend310P3", op_info=info, dtypes=("float16", "float32", "int8"))
    assert r.formats == {"float16": {"NC1HWC0"}, "float32": {"ND"}, "int8": None}
    assert "  installed op info: float16 NC1HWC0, float32 ND, int8 not bounded" in r.lines()


def test_optimize_measures_with_the_op_info(tmp_path, no_env, run_cli):
    """optimize --op-info: the plans that judge each rewrite use the installed columns."""
    from npu_deploy.converters.optimize.driver import optimize_model

    m = onnx.load(_conv_relu_conv(tmp_path))
    base, _ = optimize_model(m)
    narrowed, _ = optimize_model(m, op_info=_opp(tmp_path, ops=_relu("float16,float", "ND,ND")))
    assert base.before["transdata"] == 2 and narrowed.before["transdata"] == 4   # as planned above
    bad = _opp(tmp_path / "bad", ops={"Relu": {"input0": _col("x", "float16,float", "ND")}})
    code, _, stderr = run_cli("optimize", tmp_path / "crc.onnx", "-o", tmp_path / "o.onnx", "--op-info", bad)
    assert code == 2 and "Relu.input0.format" in stderr and not (tmp_path / "o.onnx").exists()


def _matmul_chain(tmp: Path) -> Path:
    """x [32, 64] -> MatMul W1 [64, 64] -> Relu -> MatMul W2 [64, 48] -> y (m, k, n multiples of 16)."""
    rng = np.random.default_rng(2)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 48)).astype(np.float32), "w2")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                           helper.make_node("Relu", ["a"], ["r"], name="relu"),
                           helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 48])], [w1, w2])
    path = tmp / "mm.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _bmm(heavy: str, formats: str = "FRACTAL_NZ,ND") -> dict:
    n = len(formats.split(","))
    dt = ",".join(["float16"] * n)
    return {"BatchMatMulV2": {"input0": _col("x1", dt, formats), "input1": _col("x2", dt, formats),
                              "output0": _col("y", dt, formats), "heavyOp": {"flag": heavy}}}


def test_installed_heavy_op_flag_replaces_the_soc_trait(tmp_path, no_env):
    model = load_model(_matmul_chain(tmp_path))
    # built-in: BatchMatMulV2 is heavy on 310P: x ND->NZ, y NZ->ND = 2; on 910B not heavy, aligned: 0
    assert len(plan(model, soc="Ascend310P3").transdata) == 2
    assert len(plan(model, soc="Ascend910B3").transdata) == 0
    # an install whose 310P op info says heavyOp false: the aligned chain stays ND, 0 TransData
    p = plan(model, soc="Ascend310P3", op_info=_opp(tmp_path / "a", ops=_bmm("false")))
    assert p.transdata == [] and p.node_formats["mm1"].input_formats[0] == "ND"
    # one whose 910B op info says heavyOp true: NZ as on 310P, 2 TransData
    p = plan(model, soc="Ascend910B3", op_info=_opp(tmp_path / "b", soc_dir="ascend910b", ops=_bmm("true")))
    assert len(p.transdata) == 2 and all("installed op info heavyOp" in t.reason for t in p.transdata)
    # heavy, but the columns list ND only: the format columns win, the chain stays ND
    p = plan(model, soc="Ascend310P3", op_info=_opp(tmp_path / "c", ops=_bmm("true", "ND")))
    assert p.transdata == []


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_model_nd_only_relu_and_an_install_that_agrees(tmp_path, no_env, real_model):
    """PP-OCR cls (53 Conv, 15 Relu) on Ascend310P3. Built-in: 4 TransData, every Relu in NC1HWC0.

    Relu listed ND only, predicted by hand from the graph: each Relu's producer is a BatchNormalization
    (6) or an Add of two NC1HWC0 Conv branches (9: moving the Add to ND would convert both its inputs
    instead of its one output), and its readers are Convs (or a GlobalAveragePool and a Mul in that
    pool's NC1HWC0 format): every Relu costs one conversion out of NC1HWC0 and one back, 4 + 2 x 15 = 34.
    An install whose columns list every format for every op of the model changes nothing.
    """
    path = real_model("ppocr_cls")
    model = load_model(path, input_shapes={"x": (1, 3, 48, 192)})
    g = model.model.graph
    prod = {o: n for n in g.node for o in n.output}
    relus = [n for n in g.node if n.op_type == "Relu"]
    assert len(relus) == 15 and {prod[n.input[0]].op_type for n in relus} == {"BatchNormalization", "Add"}
    base = plan(model, soc="Ascend310P3")
    assert len(base.transdata) == 4
    assert {tuple(base.node_formats[n.name].input_formats) for n in relus} == {("NC1HWC0",)}
    p = plan(model, soc="Ascend310P3", op_info=_opp(tmp_path / "nd", ops=_relu("float16,float", "ND,ND")))
    assert len(p.transdata) == 4 + 2 * 15
    assert {tuple(p.node_formats[n.name].input_formats) for n in relus} == {("NCHW",)}
    every = "NC1HWC0,NC1HWC0_C04,FRACTAL_Z,FRACTAL_NZ,ND,NCHW"
    k = len(every.split(","))
    cols = _col("x", ",".join(["float16"] * k + ["float"] * k), ",".join([every] * 2))
    agree = {ops.cann_op(t): {"input0": cols} for t in {n.op_type for n in g.node}}
    same = plan(model, soc="Ascend310P3", op_info=_opp(tmp_path / "all", ops=agree))
    assert [t.to_manifest() for t in same.transdata] == [t.to_manifest() for t in base.transdata]
    assert {k: v.to_manifest() for k, v in same.node_formats.items()} == \
        {k: v.to_manifest() for k, v in base.node_formats.items()}


def test_small_channel_conv_without_c04_column_falls_back_to_nc1hwc0(tmp_path, no_env):
    # x [1,3,16,16] -> Conv 3x3 (Cin 3): --enable-small-channel plans NC1HWC0_C04 and a FRACTAL_Z_C04 weight;
    # an install whose Conv2D lists NC1HWC0 only for float16: NC1HWC0 input and an ordinary FRACTAL_Z weight
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [w])
    path = tmp_path / "c.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = load_model(path)
    base = plan(model, soc="Ascend310P3", enable_small_channel=True)
    assert base.node_formats["conv"].input_formats[0] == "NC1HWC0_C04" and base.weights[0].format == "FRACTAL_Z_C04"
    conv = {"Conv2D": {"input0": _col("x", "float16", "NC1HWC0"), "input1": _col("filter", "float16", "FRACTAL_Z")}}
    p = plan(model, soc="Ascend310P3", enable_small_channel=True, op_info=_opp(tmp_path, ops=conv))
    assert p.node_formats["conv"].input_formats[0] == "NC1HWC0" and p.weights[0].format == "FRACTAL_Z"


def test_atc_backend_notes_that_it_ignores_op_info():
    from npu_deploy.converters.lowering.options import ConvertOptions

    notes = ConvertOptions(backend="atc", op_info="/opt/opp").for_backend("atc", "requested")
    assert notes == ["--op-info applies to the built-in lowering; ATC reads the op info of its own CANN install "
                     "($ASCEND_OPP_PATH)"]
    assert ConvertOptions(backend="builtin", op_info="/opt/opp").for_backend("builtin", "requested") == []


def test_a_shape_range_convert_reads_the_op_info_once(tmp_path, no_env, monkeypatch):
    """Both ends of a range are planned; the installed files are read for the first, not again."""
    import npu_deploy
    reads = []
    real = opinfo.load_op_info
    monkeypatch.setattr(opinfo, "load_op_info", lambda *a, **k: reads.append(a) or real(*a, **k))
    opp = _opp(tmp_path, ops=_relu("float16,float", "ND,ND"))
    m = onnx.load(_conv_relu_conv(tmp_path))
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"       # a dynamic batch
    onnx.save(m, tmp_path / "dyn.onnx")
    res = npu_deploy.convert(tmp_path / "dyn.onnx", output=tmp_path / "r.bundle", backend="builtin",
                             soc="Ascend310P3", input_shapes={"x": "1~4,16,8,8"}, op_info=opp)
    assert len(res.plan["transdata"]) == 4 and len(reads) == 1, reads
