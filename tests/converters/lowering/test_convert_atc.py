"""``convert(backend="atc"|"auto")`` wired to the ATC driver, against the stand-in ``tests/standins/atc``
(which enforces ATC's documented command line and output contract; no real ATC runs here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.lowering.convert import convert
from npu_deploy.errors import AtcError, DependencyError, ModelError

STANDIN = Path(__file__).resolve().parents[2] / "standins" / "atc"


@pytest.fixture
def model(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, 6])], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.fixture
def standin_env(tmp_path, monkeypatch):
    argv_file = tmp_path / "argv.json"
    monkeypatch.setenv("ATC_STANDIN_ARGV", str(argv_file))
    monkeypatch.setenv("ASCEND_PROCESS_LOG_PATH", str(tmp_path / "logs"))
    monkeypatch.delenv("ATC_STANDIN_MODE", raising=False)
    return argv_file


def test_atc_backend_builds_the_documented_command(model, tmp_path, standin_env):
    r = convert(model, tmp_path / "out.om", backend="atc", atc=STANDIN, input_shapes={"x": (-1, 3, 8, 8)},
                dynamic_batch=[1, 4], precision_mode="allow_mix_precision", enable_small_channel=True,
                atc_args=["--op_select_implmode=high_precision"])
    assert r.backend == "atc" and r.plan is None and bool(r)
    assert Path(r.output).read_bytes()[:4] == b"IMOD"
    argv = json.loads(standin_env.read_text())
    assert "--framework=5" in argv and "--soc_version=Ascend310P3" in argv
    assert "--input_shape=x:-1,3,8,8" in argv and "--dynamic_batch_size=1,4" in argv
    assert "--precision_mode=allow_mix_precision" in argv
    assert "--enable_small_channel=1" in argv and "--op_select_implmode=high_precision" in argv
    assert any(a.startswith("--output=") and not a.endswith(".om") for a in argv)


def test_auto_picks_atc_on_path_and_says_why(model, tmp_path, standin_env, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "atc").symlink_to(STANDIN)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    r = convert(model, tmp_path / "auto.om", input_shapes={"x": (1, 3, 8, 8)})
    assert r.backend == "atc" and "auto: ATC found at" in r.backend_reason


def test_auto_without_atc_is_builtin(model, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    r = convert(model, tmp_path / "b", input_shapes={"x": (1, 3, 8, 8)})
    assert r.backend == "builtin" and "ATC not found" in r.backend_reason
    with pytest.raises(DependencyError, match="ATC"):
        convert(model, tmp_path / "c.om", backend="atc", input_shapes={"x": (1, 3, 8, 8)})


def test_unsupported_ops_stop_before_atc_runs(tmp_path, standin_env):
    g = helper.make_graph([helper.make_node("DequantizeLinear", ["q", "s"], ["y"], name="dq")], "g",
                          [helper.make_tensor_value_info("q", TensorProto.INT8, [4]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    path = tmp_path / "q.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(ModelError, match="dq .DequantizeLinear"):
        convert(path, tmp_path / "q.om", backend="atc", atc=STANDIN)
    assert not standin_env.exists()  # ATC was never started


def test_atc_failure_is_exit_3(model, tmp_path, standin_env, monkeypatch, run_cli):
    monkeypatch.setenv("ATC_STANDIN_MODE", "fail_E19010")
    with pytest.raises(AtcError) as e:
        convert(model, tmp_path / "f.om", backend="atc", atc=STANDIN, input_shapes={"x": (1, 3, 8, 8)})
    assert e.value.exit_code == 3 and "E19010" in e.value.codes
    code, out, err = run_cli("convert", model, "-o", tmp_path / "f.om", "--backend", "atc", "--atc", STANDIN,
                             "--input-shape", "x:1,3,8,8")
    assert code == 3 and "E19010" in err and "Traceback" not in err
    assert not list(tmp_path.glob("f*.om"))


def test_aipp_config_reaches_atc_and_a_bad_one_is_refused(model, tmp_path, standin_env, run_cli):
    """--insert-op-conf passes the AIPP file to ATC as --insert_op_conf; ATC's refusal of a file without
    an aipp_op block comes back as exit 3 with ATC's code."""
    good = tmp_path / "aipp.cfg"
    good.write_text("aipp_op {\n  aipp_mode : static\n  input_format : RGB888_U8\n}\n")
    r = convert(model, tmp_path / "aipp.om", backend="atc", atc=STANDIN, input_shapes={"x": (1, 3, 8, 8)},
                insert_op_conf=good)
    assert Path(r.output).read_bytes()[:4] == b"IMOD"
    assert f"--insert_op_conf={good}" in json.loads(standin_env.read_text())
    bad = tmp_path / "bad.cfg"
    bad.write_text("not an aipp file\n")
    code, _, err = run_cli("convert", model, "-o", tmp_path / "bad.om", "--backend", "atc", "--atc", STANDIN,
                           "--input-shape", "x:1,3,8,8", "--insert-op-conf", bad)
    assert code == 3 and "E10001" in err and "Traceback" not in err
    assert not (tmp_path / "bad.om").exists()
