"""``npu-deploy inspect`` through the real entry point: text, --json, flags, exit codes, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.standins.omfile import build_om, build_om_bytes, tensor, transdata


def _om(tmp_path, name="m.om", **kw):
    base = dict(inputs=[tensor("x", "float16", [1, 3, 16, 16], "NCHW")],
                outputs=[tensor("y", "float16", [1, 10])],
                ops=[transdata("trans_TransData_1", "NCHW", "NC1HWC0", [1, 3, 16, 16])],
                atc_cmdline="atc --model=m.onnx --framework=5 --soc_version=Ascend310P3")
    base.update(kw)
    return build_om(tmp_path / name, **base)


def test_om_text_and_json(tmp_path, run_cli):
    path = _om(tmp_path, table="64")
    out_json = tmp_path / "report.json"
    code, out, err = run_cli("inspect", path, "--json", out_json, "--layers")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1].startswith(".om for Ascend310P3") and "1 TransData" in lines[-1]
    assert any("NCHW -> NC1HWC0" in line for line in lines)
    assert any(line.split()[:2] == ["header", "version"] for line in lines)
    assert "ATC command" in out and "--soc_version=Ascend310P3" in out
    assert "op formats:" in out
    d = json.loads(out_json.read_text())
    assert d["schema"] == "npu-deploy/inspect" and d["kind"] == "om" and d["ok"] is True
    assert d["verdict"] == lines[-1]
    assert d["om"]["header"]["model_length"] == path.stat().st_size - 256


@pytest.mark.parametrize("data,message", [
    (b"IMOD" + bytes(10), "truncated"),
    (b"\x00" * 300, "not an ONNX model"),
])
def test_bad_files_one_line_exit_2(tmp_path, run_cli, data, message):
    p = tmp_path / "bad.om"
    p.write_bytes(data)
    out_json = tmp_path / "r.json"
    code, out, err = run_cli("inspect", p, "--json", out_json)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("npu-deploy: error:") and message in err
    assert "Traceback" not in err and not out_json.exists()
    assert list(tmp_path.iterdir()) == [p]  # no partial output left behind


def test_corrupt_partition_table_exit_2(tmp_path, run_cli):
    data = bytearray(build_om_bytes(table="64", inputs=[tensor("x")], outputs=[tensor("y")]))
    data[256 + 8 + 16:256 + 8 + 24] = (1 << 40).to_bytes(8, "little")  # MODEL_DEF size far past the end
    p = tmp_path / "bad.om"
    p.write_bytes(bytes(data))
    code, _, err = run_cli("inspect", p)
    assert code == 2 and "past the end of the file" in err and err.count("\n") == 1
    code, _, err = run_cli("--debug", "inspect", p)
    assert code == 2 and "Traceback" in err  # tracebacks only with --debug


def test_missing_file(tmp_path, run_cli):
    code, _, err = run_cli("inspect", tmp_path / "nope.onnx")
    assert code == 2 and "no such file" in err


def _onnx(tmp_path, external=False):
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="unit-test")
    p = tmp_path / "model.bin"  # the name says nothing: content decides
    if external:
        onnx.save(m, str(p), save_as_external_data=True, location="w.data", size_threshold=0)
    else:
        onnx.save(m, str(p))
    return p


def test_onnx_text_ops_and_soc(tmp_path, run_cli):
    p = _onnx(tmp_path)
    code, out, err = run_cli("inspect", p, "--ops")
    assert code == 0, err
    assert "producer" in out and "unit-test" in out and "[batch,3]" in out
    assert out.splitlines()[-1].startswith("ONNX model: 1 input, 1 output, 1 nodes")
    code, out, err = run_cli("inspect", p, "--soc", "Ascend310P3", "--input-shape", "x:2,3", "--ops")
    assert code == 0, err
    assert "on Ascend310P3:" in out and "AI Core" in out
    code, _, err = run_cli("inspect", p, "--soc", "Ascend310P3", "--input-shape", "x:2")
    assert code == 2 and err.count("\n") == 1


def test_onnx_missing_external_data_is_check_failure(tmp_path, run_cli):
    p = _onnx(tmp_path, external=True)
    assert run_cli("inspect", p)[0] == 0
    (tmp_path / "w.data").unlink()
    out_json = tmp_path / "r.json"
    code, out, _ = run_cli("inspect", p, "--json", out_json)
    assert code == 1
    assert "problem: external data file 'w.data' is missing" in out
    assert json.loads(out_json.read_text())["ok"] is False


def test_soc_with_om_is_usage_error(tmp_path, run_cli):
    code, _, err = run_cli("inspect", _om(tmp_path), "--soc", "Ascend310P3")
    assert code == 2 and "--soc applies to ONNX" in err


def test_control_characters_from_the_file_are_escaped(tmp_path, run_cli):
    path = _om(tmp_path, soc_version="Ascend\x1b[31m310P3\r\nFAKE", model_name="m\nname")
    code, out, _ = run_cli("inspect", path)
    assert code == 0
    assert "\x1b" not in out and "\r" not in out
    assert "Ascend\\x1b[31m310P3\\x0d\\x0aFAKE" in out
    assert out.splitlines()[-1].startswith(".om for Ascend\\x1b")


@pytest.mark.realmodel
def test_inspect_before_and_after_converting_with_the_atc_standin(tmp_path, run_cli, real_model, monkeypatch):
    """ONNX in, `.om` out of the ATC stand-in (tests/standins/atc), both inspected through the CLI."""
    from pathlib import Path

    standin = Path(__file__).resolve().parents[1] / "standins" / "atc"
    monkeypatch.setenv("ASCEND_PROCESS_LOG_PATH", str(tmp_path / "logs"))
    monkeypatch.delenv("ATC_STANDIN_MODE", raising=False)
    src = real_model("ppocr_cls")
    code, out, err = run_cli("inspect", src, "--json", tmp_path / "before.json")
    assert code == 0, err
    from npu_deploy.converters.lowering.convert import convert

    om_path = tmp_path / "cls.om"
    convert(src, om_path, backend="atc", atc=standin, soc="Ascend910B",
            input_shapes={"x": (-1, 3, 48, 192)}, dynamic_batch=[1, 8])
    code, out, err = run_cli("inspect", om_path, "--json", tmp_path / "after.json")
    assert code == 0, err
    before = json.loads((tmp_path / "before.json").read_text())
    after = json.loads((tmp_path / "after.json").read_text())
    assert after["kind"] == "om" and after["om"]["soc_version"] == "Ascend910B"
    assert after["om"]["dynamic"] == {"mode": "batch", "gears": [[1], [8]]}
    assert "--dynamic_batch_size=1,8" in after["om"]["atc_cmdline"]
    # the model's own inputs first (in index order), then GE's gear input
    assert [i["name"] for i in after["inputs"]] == [i["name"] for i in before["inputs"]] + \
        ["ascend_mbatch_shape_data"]
    assert after["inputs"][0]["shape"] == [-1, 3, 48, 192]
    assert [o["name"] for o in after["outputs"]] == [o["name"] for o in before["outputs"]]
    assert out.splitlines()[-1] == after["verdict"]
