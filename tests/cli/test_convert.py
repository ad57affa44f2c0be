"""``npu-deploy convert`` through the real entry point: happy paths and every kind of bad input.

Bad input: the documented exit code, one line on stderr, no traceback, no output file left behind.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.files.bundle import is_bundle, read_bundle

STANDIN_ATC = Path(__file__).resolve().parents[1] / "standins" / "atc"


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _save(path, nodes, inputs, outputs, inits=(), opset=17, **kw):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path, **kw)
    return path


@pytest.fixture
def small(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    return _save(tmp_path / "small.onnx",
                 [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["c"], ["r"], name="relu"),
                  helper.make_node("Reshape", ["r", "shape"], ["y"], name="flat")],
                 [_vi("x", ["N", 3, 8, 8])], [_vi("y", ["N", 512])],
                 [w, numpy_helper.from_array(np.array([-1, 512], np.int64), "shape")])


def _one_line_error(code, out, err, expected_code):
    assert code == expected_code, (code, out, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("npu-deploy: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_convert_builtin_prints_plan_and_writes_exactly_the_given_path(run_cli, small, tmp_path):
    out = tmp_path / "model.weird-ext"
    rep = tmp_path / "report.json"
    code, stdout, err = run_cli("convert", small, "-o", out, "--backend", "builtin", "--input-shape", "x:2,3,8,8",
                                "--report", rep, "--explain")
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("model")] == ["model.weird-ext"]
    assert is_bundle(out)
    assert "TransData: naive" in stdout and "optimised" in stdout and "estimated" in stdout
    assert "memory arena" in stdout and "lower bound" in stdout and "no reuse" in stdout
    assert "TransData kept, and why:" in stdout and "Reshape" in stdout
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("converted small.onnx") and "estimated FormatTrans share" in last
    d = json.loads(rep.read_text())
    assert d["schema"] == "npu-deploy/convert-result" and d["backend"] == "builtin"
    assert d["plan"]["schema"] == "npu-deploy/plan-report" and d["plan"]["cost"]["estimated"] is True
    with read_bundle(out) as b:
        assert b.manifest["inputs"][0]["shape"] == [2, 3, 8, 8]


def test_convert_dynamic_batch_quiet(run_cli, small, tmp_path):
    out = tmp_path / "b"
    code, stdout, err = run_cli("convert", small, "-o", out, "--backend", "builtin", "--input-shape",
                                "x:-1,3,8,8", "--dynamic-batch", "1,4", "-q", "--precision-mode",
                                "must_keep_origin_dtype")
    assert code == 0, err
    assert len(stdout.strip().splitlines()) == 1
    with read_bundle(out) as b:
        assert b.manifest["dynamic"]["gears"] == [{"x": [1, 3, 8, 8]}, {"x": [4, 3, 8, 8]}]
        assert b.manifest["precision_mode"] == "must_keep_origin_dtype"


def _bad_models(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "bad"
    d.mkdir()
    out = {}
    p = d / "random.onnx"
    p.write_bytes(np.random.default_rng(5).bytes(3000))
    out["random"] = p
    good = _save(d / "good.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])])
    data = good.read_bytes()
    (d / "trunc.onnx").write_bytes(data[: len(data) * 2 // 3])
    out["truncated"] = d / "trunc.onnx"
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    _save(d / "ext.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [_vi("x", [2, 4])],
          [_vi("y", [2, 4])], [w], save_as_external_data=True, location="ext.data", size_threshold=0)
    (d / "ext.data").unlink()
    out["missing external data"] = d / "ext.onnx"
    out["cycle"] = _save(d / "cycle.onnx", [helper.make_node("Relu", ["b"], ["a"], name="r1"),
                                           helper.make_node("Relu", ["a"], ["b"], name="r2")],
                         [_vi("x", [2])], [_vi("b", [2])])
    out["dangling"] = _save(d / "dangling.onnx", [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
                            [_vi("x", [2])], [_vi("y", [2])])
    out["unsupported"] = _save(d / "unsup.onnx", [
        helper.make_node("Relu", ["x"], ["a"], name="fine"),
        helper.make_node("Hardmax", ["a"], ["b"], name="hm"),  # supported
        helper.make_node("Einsum", ["b", "b"], ["c"], name="ein", equation="i,i->i"),
        helper.make_node("DequantizeLinear", ["q", "s"], ["dq"], name="dq1"),
        helper.make_node("QuantizeLinear", ["dq", "s"], ["q2"], name="q1"),
        helper.make_node("ArgMax", ["a"], ["am"], name="am_last", select_last_index=1)],
        [_vi("x", [4]), _vi("q", [4], TensorProto.INT8), _vi("s", [])],
        [_vi("c", [4]), _vi("q2", [4], TensorProto.UINT8), _vi("am", [1], TensorProto.INT64)], opset=18)
    out["opset 21"] = _save(d / "o21.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r")],
                            [_vi("x", [2])], [_vi("y", [2])], opset=21)
    return out


@pytest.mark.parametrize("case,pattern", [
    ("random", "not an ONNX model"),
    ("truncated", "not an ONNX model|invalid ONNX model"),
    ("missing external data", "external data file 'ext.data' of tensor 'w' is missing"),
    ("cycle", "cycle through node"),
    ("dangling", "reads 'ghost'"),
    ("unsupported", r"3 node\(s\) ATC cannot convert for Ascend310P3: dq1 .*q1 .*am_last"),
    ("opset 21", r"opset 21 is outside the range ATC parses \(8-18\)"),
])
def test_bad_models(run_cli, tmp_path, case, pattern):
    import re

    model = _bad_models(tmp_path)[case]
    out = tmp_path / "out.bundle"
    code, stdout, err = run_cli("convert", model, "-o", out, "--backend", "builtin")
    line = _one_line_error(code, stdout, err, 2)
    assert re.search(pattern, line), line
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.bundle")]


def test_missing_file(run_cli, tmp_path):
    code, out, err = run_cli("convert", tmp_path / "none.onnx", "-o", tmp_path / "o")
    assert "none.onnx: no such file" in _one_line_error(code, out, err, 2)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,pattern", [
    ((), r"input 'x' of small.onnx has dynamic dimensions \[N,3,8,8\].*--input-shape"),
    (("--input-shape", "y:1,3,8,8"), "names 'y', which is not an input of small.onnx.*inputs are: x"),
    (("--input-shape", "x:1,3,8"), "has rank 3, but input 'x' has rank 4"),
    (("--input-shape", "x:1,3,8,8", "--precision-mode", "must_keep_origin_dtype", "--keep-dtype", "nope"),
     "--keep-dtype names node 'nope'"),
    (("--input-shape", "x:1,3,8,8", "--soc", "Banana9000"), "unknown SoC 'Banana9000'"),
])
def test_bad_shapes_and_options(run_cli, small, tmp_path, args, pattern):
    import re

    out = tmp_path / "o.bundle"
    code, stdout, err = run_cli("convert", small, "-o", out, "--backend", "builtin", *args)
    assert re.search(pattern, _one_line_error(code, stdout, err, 2))
    assert not out.exists()


def test_unwritable_output(run_cli, small, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for target, pattern in ((tmp_path / "no" / "such" / "dir" / "m.bundle", "does not exist"),
                            (blocker / "m.bundle", "does not exist"),
                            (tmp_path, "is a folder")):
        code, stdout, err = run_cli("convert", small, "-o", target, "--backend", "builtin",
                                    "--input-shape", "x:1,3,8,8")
        assert pattern in _one_line_error(code, stdout, err, 2)
    if os.geteuid() != 0:  # root writes anywhere: the permission case only means something otherwise
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        code, stdout, err = run_cli("convert", small, "-o", ro / "m.bundle", "--input-shape", "x:1,3,8,8")
        assert "not writable" in _one_line_error(code, stdout, err, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "small.onnx"] + (["ro"] if os.geteuid() else [])


def test_output_or_report_on_the_input_model_is_refused_and_the_model_kept(run_cli, small, tmp_path, monkeypatch):
    before = small.read_bytes()
    monkeypatch.chdir(tmp_path)
    for args in (("-o", "./small.onnx"), ("-o", tmp_path / "small.onnx"), ("--report", "small.onnx"),
                 ("-o", "m.bundle", "--report", "./m.bundle")):
        code, stdout, err = run_cli("convert", "small.onnx", "--backend", "builtin", "--input-shape", "x:1,3,8,8",
                                    *args)
        assert "overwrite" in _one_line_error(code, stdout, err, 2) or "replace" in err
    assert small.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.onnx"]


def test_atc_only_options_are_not_dropped_silently_by_the_builtin_backend(run_cli, small, tmp_path):
    code, stdout, err = run_cli("convert", small, "-o", tmp_path / "m.bundle", "--backend", "builtin",
                                "--input-shape", "x:1,3,8,8", "--atc-arg", "--log=info", "--timeout", "5")
    assert code == 0, err
    assert "warning: --atc-arg, --timeout only apply to the ATC backend" in err
    code, stdout, err = run_cli("convert", small, "-o", tmp_path / "n.bundle", "--backend", "builtin",
                                "--input-shape", "x:1,3,8,8")
    assert code == 0 and "warning" not in err


def test_atc_backend_missing_is_environment_error(run_cli, small, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    code, stdout, err = run_cli("convert", small, "-o", tmp_path / "m.om", "--backend", "atc",
                                "--input-shape", "x:1,3,8,8")
    assert "ATC" in _one_line_error(code, stdout, err, 3)


def test_debug_shows_traceback(run_cli, tmp_path):
    code, out, err = run_cli("--debug", "convert", tmp_path / "none.onnx")
    assert code == 2 and "Traceback" in err


@pytest.mark.realmodel
def test_real_model_through_the_cli(run_cli, real_model, tmp_path):
    out, rep = tmp_path / "vad", tmp_path / "vad.json"
    code, stdout, err = run_cli("convert", real_model("silero_vad"), "-o", out, "--backend", "builtin",
                                "--input-shape", "input:2,576", "--report", rep)
    assert code == 0, err
    assert "op support: Ascend310P3, opset 18" in stdout and "weights pre-packed: 6" in stdout
    d = json.loads(rep.read_text())
    assert d["plan"]["transdata_count"] < d["plan"]["transdata_naive_count"]
    with read_bundle(out) as b:
        assert {w.format for w in b.weights.values()} >= {"FRACTAL_Z"}


def test_report_lists_every_planned_transdata_with_its_endpoints(run_cli, tmp_path, example_onnx):
    """The issue asks for the ONNX node names of every planned TransData in the report: the terminal
    lists them (all of them when few), and --report holds the full list."""
    import json as _json

    src = example_onnx
    code, out, err = run_cli("convert", src, "-o", tmp_path / "e.bundle", "--backend", "builtin",
                             "--report", tmp_path / "r.json")
    assert code == 0, err
    report = _json.loads((tmp_path / "r.json").read_text())
    planned = report["plan"]["transdata"]
    assert 0 < len(planned) <= 8
    for t in planned:
        line = next(line for line in out.splitlines() if line.strip().startswith(t["name"] + ":"))
        assert f"{t['src_format']} -> {t['dst_format']}" in line
        for consumer in t["consumers"]:
            assert consumer in line
