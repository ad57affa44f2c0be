"""`npu-deploy optimize` through the real entry point."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper


def _model(path):
    g = helper.make_graph([helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT),
                           helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
                           helper.make_node("Transpose", ["b"], ["y"], perm=[1, 0])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_list(run_cli):
    code, out, _ = run_cli("optimize", "--list")
    assert code == 0
    for name in ("conv1d-to-conv2d", "narrow-int64", "split-qkv-matmul", "reflect-pad"):
        assert name in out
    assert "off" in out  # rules off by default are marked


def test_optimize_writes_model_table_json_and_verdict(run_cli, tmp_path):
    src = _model(tmp_path / "m.onnx")
    code, out, err = run_cli("optimize", src, "-o", tmp_path / "o.onnx", "--json", tmp_path / "r.json", "--explain")
    assert code == 0, err
    m = onnx.load(tmp_path / "o.onnx")
    assert [n.op_type for n in m.graph.node] == ["Identity"]  # the output keeps its name
    assert "merge-casts" in out and "TransData" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("2 rewrites, TransData") and last.endswith("outputs match")
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["schema"] == "npu-deploy/optimize-result" and d["verdict"] == last


def test_rules_and_skip(run_cli, tmp_path):
    src = _model(tmp_path / "m.onnx")
    code, out, _ = run_cli("optimize", src, "-o", tmp_path / "o.onnx", "--rules", "merge-casts")
    assert code == 0 and out.strip().splitlines()[-1].startswith("1 rewrite,")
    code, out, _ = run_cli("optimize", src, "-o", tmp_path / "o2.onnx", "--skip", "merge-casts,cancel-transpose-reshape")
    assert code == 0 and out.strip().splitlines()[-1].startswith("0 rewrites")


def test_inputs_file(run_cli, tmp_path):
    src = _model(tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.ones((2, 3), np.float32))
    code, _, err = run_cli("optimize", src, "-o", tmp_path / "o.onnx", "--inputs", tmp_path / "in.npz")
    assert code == 0, err
    np.savez(tmp_path / "bad.npz", z=np.ones((2, 3), np.float32))
    code, _, err = run_cli("optimize", src, "-o", tmp_path / "o2.onnx", "--inputs", tmp_path / "bad.npz")
    assert code == 2 and "lacks input 'x'" in err and not (tmp_path / "o2.onnx").exists()


@pytest.mark.parametrize("args, msg", [
    (["--rules", "nope"], "unknown rule 'nope'"),
    (["--atol", "-1"], "--atol -1.0 must be finite"),
])
def test_bad_usage(run_cli, tmp_path, args, msg):
    src = _model(tmp_path / "m.onnx")
    code, _, err = run_cli("optimize", src, "-o", tmp_path / "o.onnx", *args)
    assert code == 2 and msg in err and "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_refuses_overwriting_the_input_and_junk(run_cli, tmp_path):
    src = _model(tmp_path / "m.onnx")
    before = src.read_bytes()
    code, _, err = run_cli("optimize", src, "-o", src)
    assert code == 2 and "overwrite" in err and src.read_bytes() == before
    junk = tmp_path / "j.onnx"
    junk.write_bytes(b"garbage")
    code, _, err = run_cli("optimize", junk, "-o", tmp_path / "o.onnx")
    assert code == 2 and "not an ONNX model" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.onnx").exists()
