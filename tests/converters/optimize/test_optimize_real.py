"""`optimize` on the real models: every applied rewrite verified on onnxruntime (outputs match the
untouched model, computed here independently of optimize), measured by the built-in planner."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npu_deploy.converters import optimize as opt
from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.options import ConvertOptions

pytestmark = pytest.mark.realmodel


def _run(model_or_path, feeds):
    data = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) else str(model_or_path)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def _transdata(path, shapes):
    return pipeline.lower(path, None, ConvertOptions(backend="builtin", input_shapes=shapes),
                          until="plan from ONNX").plan.report.transdata_count


def test_silero_vad_rules_keep_outputs(real_model, tmp_path):
    src = real_model("silero_vad")
    out = tmp_path / "vad.opt.onnx"
    res = opt.optimize(src, out, input_shapes={"input": (1, 576)}, keep_all=True)
    assert res and out.is_file()
    names = {a.rule for a in res.applied()}
    assert {"conv1d-to-conv2d", "reflect-pad", "split-large-kernel-conv"} <= names
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    assert not [n for n in m.graph.node if n.op_type == "Pad"]
    # no Conv left with a 1-D kernel (every conv weight is 4-D)
    inits = {t.name: t for t in m.graph.initializer}
    assert all(len(inits[n.input[1]].dims) == 4 for n in m.graph.node if n.op_type == "Conv")
    rng = np.random.default_rng(1)
    feeds = {"input": rng.standard_normal((1, 576)).astype(np.float32),
             "h": np.zeros((1, 1, 128), np.float32), "c": np.zeros((1, 1, 128), np.float32)}
    for a, b in zip(_run(src, feeds), _run(m, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
    # measured per application, and the plan of the written file agrees with the report
    assert _transdata(out, {"input": (1, 576)}) == res.after["transdata"]


def test_silero_vad_conv1d_region_reduces_planned_transdata(real_model, tmp_path):
    # the planner lowers Conv1d as a 2-D kernel with H = 1 (as ATC's plugin does), so conv1d-to-conv2d
    # alone keeps the count; what leaves NC1HWC0 in silero is the Slice of the STFT conv's output,
    # which fold-channel-slice removes: together the Conv1d region runs in NC1HWC0 end to end
    src = real_model("silero_vad")
    shapes = {"input": (1, 576)}
    res, m = opt.optimize_model(onnx.load(src), rules=["conv1d-to-conv2d"], input_shapes=shapes)
    assert res.applied_count() == 2 and res.after["transdata"] == res.before["transdata"]
    res, m = opt.optimize_model(onnx.load(src), rules=["fold-channel-slice", "conv1d-to-conv2d"], input_shapes=shapes)
    assert res.after["transdata"] < res.before["transdata"]
    onnx.save(m, tmp_path / "m.onnx")  # the oracle: the planner run on the written file, not the report
    assert _transdata(tmp_path / "m.onnx", shapes) < _transdata(src, shapes)


def test_keep_if_faster_keeps_only_what_pays(real_model):
    m = onnx.load(real_model("silero_vad"))
    res, out = opt.optimize_model(m, input_shapes={"input": (1, 576)}, keep_if_faster=True)
    assert res.after["est_us"] <= res.before["est_us"]
    for a in res.applied():
        if a.before is not None:
            assert a.after["est_us"] < a.before["est_us"]
    assert any(a.status == "not faster" for a in res.applications)


@pytest.mark.slow
def test_minilm_int64_leaves_the_ai_cpu(real_model):
    src = real_model("minilm")
    res, m = opt.optimize_model(onnx.load(src), rules=["narrow-int64"],
                                input_shapes={"input_ids": (1, 16), "attention_mask": (1, 16)})
    assert res.before["ai_cpu"] > 0 and res.after["ai_cpu"] == 0
    rng = np.random.default_rng(2)
    feeds = {"input_ids": rng.integers(0, 30000, (1, 16)).astype(np.int64),
             "attention_mask": np.ones((1, 16), np.int64)}
    for a, b in zip(_run(src, feeds), _run(m, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)


def test_ppocr_cls_rewrites_verified(real_model):
    src = real_model("ppocr_cls")
    res, m = opt.optimize_model(onnx.load(src), input_shapes={"x": (1, 3, 48, 192)})
    assert res and res.applied_count() >= 1
    onnx.checker.check_model(m, full_check=True)
    x = np.random.default_rng(3).random((1, 3, 48, 192), dtype=np.float32)
    np.testing.assert_allclose(_run(m, {"x": x})[0], _run(src, {"x": x})[0], rtol=1e-3, atol=1e-5)
