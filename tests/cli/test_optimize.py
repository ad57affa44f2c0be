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


def _planned(path, shapes):
    from npu_deploy.converters.lowering import pipeline
    from npu_deploy.converters.lowering.options import ConvertOptions

    r = pipeline.lower(path, None, ConvertOptions(backend="builtin", input_shapes=shapes), until="plan from ONNX").plan.report
    return r.transdata_count, r.cost["total_us"]


def _same_outputs(a, b, shapes):
    import onnxruntime as ort

    rng = np.random.default_rng(5)
    feeds = {"input": rng.standard_normal(shapes["input"]).astype(np.float32),
             "h": np.zeros((1, 1, 128), np.float32), "c": np.zeros((1, 1, 128), np.float32)}
    for x, y in zip(*(ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds) for p in (a, b))):
        np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-4)


@pytest.mark.realmodel
def test_help_example_on_silero_keeps_only_what_does_not_make_the_estimate_worse(run_cli, real_model, tmp_path):
    # the `optimize --help` example on the real model: two split-large-kernel-conv applications in one step
    # (the second carries no figures of its own) used to crash the report with a TypeError (exit 4), and the
    # default kept rewrites that took the estimate from TransData 6 -> 7, 93 -> 127 us
    src, out, shapes = real_model("silero_vad"), tmp_path / "o.onnx", {"input": (1, 576)}
    code, text, err = run_cli("optimize", src, "-o", out, "--input-shape", "input:1,576")
    assert code == 0 and "Traceback" not in err, err
    td0, us0 = _planned(src, shapes)
    td1, us1 = _planned(out, shapes)  # the oracle: the planner run on the two files, not the report
    assert td1 <= td0 and us1 <= us0
    assert "worse          split-large-kernel-conv" in text and "(--all keeps it)" in text
    assert "estimated slower and dropped" in text.strip().splitlines()[-1]
    _same_outputs(src, out, shapes)


@pytest.mark.realmodel
def test_all_keeps_every_verified_rewrite_on_silero(run_cli, real_model, tmp_path):
    src, out, shapes = real_model("silero_vad"), tmp_path / "o.onnx", {"input": (1, 576)}
    code, text, err = run_cli("optimize", src, "-o", out, "--input-shape", "input:1,576", "--all")
    assert code == 0 and "Traceback" not in err, err
    assert "verified and measured together with" in text and "  worse  " not in text
    m = onnx.load(out)
    inits = {t.name: t for t in m.graph.initializer}
    assert all(inits[n.input[1]].dims[-1] <= 192 for n in m.graph.node if n.op_type == "Conv")  # large kernels split
    assert _planned(out, shapes)[1] > _planned(src, shapes)[1]  # what the default would have dropped
    _same_outputs(src, out, shapes)
    code, _, err = run_cli("optimize", src, "-o", tmp_path / "o2.onnx", "--input-shape", "input:1,576", "--all",
                           "--keep-if-faster")
    assert code == 2 and "--all" in err and not (tmp_path / "o2.onnx").exists()
