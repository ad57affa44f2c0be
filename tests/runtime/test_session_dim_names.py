"""``get_inputs()`` / ``get_outputs()`` name dynamic dims exactly as onnxruntime does: the
``dim_param`` when the model has one, ``None`` for a dim with neither ``dim_value`` nor ``dim_param``
(never onnx shape inference's ``unk__<n>`` or a name the lowering made up). The oracle is a real
``onnxruntime.InferenceSession`` on the same model file."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npu_deploy.runtime.session import InferenceSession


def _ort_shapes(path):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return ([(i.name, i.shape) for i in s.get_inputs()], [(o.name, o.shape) for o in s.get_outputs()])


def _ours(sess):
    return ([(i.name, list(i.shape)) for i in sess.get_inputs()], [(o.name, list(o.shape)) for o in sess.get_outputs()])


def _model(path, x_dims, y_dims):
    """y = relu(conv(x)) with x / y declared with ``x_dims`` / ``y_dims`` (int, str name, or None for a
    dim with neither value nor name)."""
    def vi(name, dims):
        t = helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        shape = t.type.tensor_type.shape
        for d in dims:
            dim = shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d
        return t

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3],
                           np.random.default_rng(0).standard_normal(108).astype(np.float32).tolist())
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "g", [vi("x", x_dims)], [vi("y", y_dims)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("x_dims, y_dims", [
    ([None, 3, 8, 8], [None, 4, 8, 8]),                  # unnamed batch
    (["N", 3, None, None], ["N", 4, None, None]),        # named batch, unnamed H, W
    ([None, 3, "H", 8], [None, None, None, None]),       # outputs fully unnamed
])
def test_dynamic_onnx_session_names_dims_as_onnxruntime(tmp_path, x_dims, y_dims):
    path = _model(tmp_path / "m.onnx", x_dims, y_dims)
    with InferenceSession(path) as sess:
        assert _ours(sess) == _ort_shapes(path)
        x = np.ones([2 if not isinstance(d, int) else d for d in x_dims], np.float32)
        (y,) = sess.run(None, {"x": x})                   # and it still runs
    assert y.shape[:2] == (2, 4)


def test_range_bundle_names_dims_as_onnxruntime_on_the_source(tmp_path):
    path = _model(tmp_path / "m.onnx", [None, 3, 8, 8], [None, 4, 8, 8])
    with InferenceSession(path, input_shapes={"x": "1~4,3,8,8"}) as sess:
        assert "shape range" in sess.conversion
        assert _ours(sess) == _ort_shapes(path)
        shutil.copy(sess.path, tmp_path / "m.bundle")
    # the bundle opened by itself: the names the lowering wrote for unnamed dims are not reported
    with InferenceSession(tmp_path / "m.bundle") as sess:
        assert _ours(sess) == _ort_shapes(path)


@pytest.mark.realmodel
@pytest.mark.parametrize("name", ["ppocr_cls", "silero_vad_623", "ppocr_rec", "ppocr_det", "silero_vad",
                                  pytest.param("minilm", marks=pytest.mark.slow)])
def test_real_models_name_dims_as_onnxruntime(real_model, name):
    # ppocr_cls and silero_vad_623 have unnamed dims (None); minilm declares outputs whose dims
    # onnxruntime's inference turns into sizes ('461': [Concat461_dim_0, 384])
    path = real_model(name)
    ref_in, ref_out = _ort_shapes(path)
    with InferenceSession(path) as sess:
        ours_in, ours_out = _ours(sess)
    assert ours_in == ref_in and ours_out == ref_out
