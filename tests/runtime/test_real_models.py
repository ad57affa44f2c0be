"""Real models (shared/testing.md): built-in bundles on the emulator against onnxruntime on the original.

must_keep_origin_dtype: within float32 tolerance (compare's defaults, atol 1e-4 / rtol 1e-3).
force_fp16: cosine ≥ 0.999 on every output (the fp16 loss must be visible, and small).
"""

from __future__ import annotations

import numpy as np
import pytest

import npu_deploy
from npu_deploy.runtime.check.compare import compare

# small but realistic shapes, to keep CI time low
SHAPES = {
    "ppocr_det": {"x": (1, 3, 224, 224)},
    "ppocr_rec": {"x": (1, 3, 48, 160)},
    "ppocr_cls": {"x": (1, 3, 48, 192)},
    "silero_vad": {"input": (4, 576)},
    "minilm": {"input_ids": (1, 32), "attention_mask": (1, 32)},
}


def feeds(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for k, shape in SHAPES[name].items():
        if k == "input_ids":
            out[k] = rng.integers(0, 30000, size=shape).astype(np.int64)
        elif k == "attention_mask":
            out[k] = np.ones(shape, np.int64)
        else:
            out[k] = rng.standard_normal(shape).astype(np.float32) * (0.5 if k != "input" else 0.1)
    if name == "silero_vad":
        out["h"] = np.zeros((1, 1, 128), np.float32)
        out["c"] = np.zeros((1, 1, 128), np.float32)
    return out


def _convert(real_model, tmp_path, name, precision):
    model = real_model(name)
    shapes = dict(SHAPES[name])
    out = tmp_path / f"{name}.{precision}.bundle"
    npu_deploy.convert(str(model), output=str(out), backend="builtin", precision_mode=precision,
                       input_shapes=shapes)
    return model, out


@pytest.mark.realmodel
@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.slow
def test_fp32_matches_onnxruntime(real_model, tmp_path, name):
    model, bundle = _convert(real_model, tmp_path, name, "must_keep_origin_dtype")
    res = compare(model, bundle, inputs=feeds(name))
    assert res, res.table()
    assert all(o.cosine > 0.99999 for o in res.outputs if o.cosine is not None)


@pytest.mark.realmodel
@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.slow
def test_fp16_cosine(real_model, tmp_path, name):
    model, bundle = _convert(real_model, tmp_path, name, "force_fp16")
    res = compare(model, bundle, inputs=feeds(name))  # fp16 defaults: cosine >= 0.999, <= 0.1 % outside 1e-2
    assert res.cosine_min == 0.999 and res.max_outside == 1e-3
    assert res, res.table()
    # the fp16 plan must actually change the numbers (otherwise no rounding is emulated)
    assert any((o.max_abs or 0) > 0 for o in res.outputs), res.table()


@pytest.mark.realmodel
@pytest.mark.slow
def test_dynamic_batch_gears_real_model(real_model, tmp_path):
    import onnxruntime as ort

    from npu_deploy import InferenceSession

    model = real_model("ppocr_cls")
    out = tmp_path / "cls_dyn.bundle"
    npu_deploy.convert(str(model), output=str(out), backend="builtin", precision_mode="must_keep_origin_dtype",
                       input_shapes={"x": (-1, 3, 48, 192)}, dynamic_batch=[1, 4])
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((4, 3, 48, 192)).astype(np.float32)
    with InferenceSession(out) as s:
        assert s.gears() == [{"x": (1, 3, 48, 192)}, {"x": (4, 3, 48, 192)}]
        for batch in (1, 4, 3):  # 3 is padded to the batch-4 gear and cropped back
            (y,) = s.run(None, {"x": x[:batch]})
            (r,) = ref.run(None, {"x": x[:batch]})
            assert y.shape == r.shape
            np.testing.assert_allclose(y, r, rtol=1e-3, atol=1e-4)
