"""Sessions on models with dynamic input dimensions, as an onnxruntime user meets them (issue 24).

``InferenceSession("model.onnx")`` on a symbolic batch opens, reports the dims as onnxruntime does,
lowers each new input shape on first use and keeps a bounded least-recently-used cache of them.
"""

from __future__ import annotations

import io
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy import InferenceSession
from npu_deploy.errors import InputError
from npu_deploy.runtime.session import SHAPE_CACHE_KEY, ShapeCache


def small_cnn(path, batch="batch"):
    """Conv 3→8 (3×3) + Relu + global pool + Gemm 8→4 on ``[batch, 3, 16, 16]``."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b")
    fw = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32) * 0.5, "fw")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fw"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], [w, b, fw])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def dyn_onnx(tmp_path):
    return small_cnn(tmp_path / "dyn.onnx")


def _x(batch, seed=0, hw=(16, 16)):
    return np.random.default_rng(seed).standard_normal((batch, 3, *hw)).astype(np.float32)


def test_an_onnxruntime_users_dynamic_batch_code_runs_unchanged(dyn_onnx):
    ref = ort.InferenceSession(str(dyn_onnx), providers=["CPUExecutionProvider"])
    sess = InferenceSession(str(dyn_onnx))  # failed before: "has dynamic dimensions [batch,3,16,16]"
    try:
        inp = sess.get_inputs()[0]
        assert [tuple(i.shape) for i in sess.get_inputs()] == [tuple(i.shape) for i in ref.get_inputs()]
        assert inp.shape[0] == "batch" and sess.get_outputs()[0].shape[0] == "batch"
        for batch in (1, 3):
            x = _x(batch, seed=batch)
            (y,) = sess.run(None, {inp.name: x})
            (r,) = ref.run(None, {ref.get_inputs()[0].name: x})
            assert y.shape == r.shape == (batch, 4)
            np.testing.assert_allclose(y, r, rtol=1e-2, atol=1e-2)  # force_fp16 by default, as ATC
        assert isinstance(sess.backend, ShapeCache) and sess.backend.conversions == 2
    finally:
        sess.close()


def test_shapes_are_kept_in_a_bounded_lru_cache(dyn_onnx):
    with InferenceSession(dyn_onnx, shape_cache_size=2) as s:
        for b in (1, 3, 1, 2, 1):  # 2 evicts 3 (least recently used), 1 stays
            s.run(None, {"x": _x(b)})
        assert s.backend.conversions == 3
        assert s.backend.cached_shapes() == [{"x": (2, 3, 16, 16)}, {"x": (1, 3, 16, 16)}]
        s.run(None, {"x": _x(3)})  # evicted: converted again
        assert s.backend.conversions == 4
    so = ort.SessionOptions()
    so.add_session_config_entry(SHAPE_CACHE_KEY, "1")
    with InferenceSession(dyn_onnx, sess_options=so) as s:
        for b in (1, 2, 1):
            s.run(None, {"x": _x(b)})
        assert s.backend.conversions == 3 and len(s.backend.cached_shapes()) == 1
    with pytest.raises(InputError, match="shape_cache_size=0 must be a whole number >= 1"):
        InferenceSession(dyn_onnx, shape_cache_size=0)


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_first_run_of_a_shape_says_once_on_a_terminal_and_never_elsewhere(dyn_onnx, monkeypatch):
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    with InferenceSession(dyn_onnx) as s:
        for b in (2, 2, 2):
            s.run(None, {"x": _x(b)})
    lines = [ln for ln in tty.getvalue().splitlines() if "new input shape" in ln]
    assert len(lines) == 1 and "x:2,3,16,16" in lines[0] and "converted in" in lines[0], tty.getvalue()
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    with InferenceSession(dyn_onnx) as s:
        s.run(None, {"x": _x(1)})
    assert "new input shape" not in pipe.getvalue()


def test_a_range_given_at_open_time_bounds_the_shapes(dyn_onnx):
    with InferenceSession(dyn_onnx, input_shapes={"x": "1~4,3,16,16"}) as s:
        assert "shape range" in s.conversion and not isinstance(s.backend, ShapeCache)  # planned once
        assert s.run(None, {"x": _x(4)})[0].shape == (4, 4) and s.run(None, {"x": _x(1)})[0].shape == (1, 4)
        with pytest.raises(InputError, match=r"input 'x'.*outside the range 1~4,3,16,16"):
            s.run(None, {"x": _x(5)})
        with pytest.raises(InputError, match=r"input 'x'.*16"):  # the fixed dims stay checked
            s.run(None, {"x": _x(2, hw=(8, 8))})
    with InferenceSession(dyn_onnx, input_shapes={"x": "1~-1,3,16,16"}) as s:  # unbounded: shape by shape
        assert isinstance(s.backend, ShapeCache)
        assert s.run(None, {"x": _x(6)})[0].shape == (6, 4)


def test_gears_given_at_open_time_are_one_conversion(dyn_onnx):
    with InferenceSession(dyn_onnx, input_shapes={"x": (-1, 3, 16, 16)}, dynamic_batch=[1, 4]) as s:
        assert not isinstance(s.backend, ShapeCache)
        assert s.gears() == [{"x": (1, 3, 16, 16)}, {"x": (4, 3, 16, 16)}]
        assert s.run(None, {"x": _x(3)})[0].shape == (3, 4)  # padded to gear 4, cropped back
        with pytest.raises(InputError, match="fit no gear"):
            s.run(None, {"x": _x(5)})


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_ppocr_cls_with_dynamic_batch(real_model):
    path = real_model("ppocr_cls")  # x: [None, 3, '?', '?'] as exported by PaddleOCR
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with InferenceSession(str(path)) as s:
        assert [list(i.shape[1:]) for i in s.get_inputs()] == [list(i.shape[1:]) for i in ref.get_inputs()]
        for batch in (1, 3):
            x = np.random.default_rng(batch).random((batch, 3, 48, 192), dtype=np.float32)
            (y,) = s.run(None, {"x": x})
            (r,) = ref.run(None, {"x": x})
            assert y.shape == r.shape == (batch, 2)
            np.testing.assert_allclose(y, r, atol=2e-2)
            assert (y.argmax(1) == r.argmax(1)).all()
        assert s.backend.conversions == 2
