"""AIPP: the parser's errors (file, line, field), the constraints of the reference, the preprocessing
subgraph against a per-pixel oracle written here, and the built-in path end to end on the emulator."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npu_deploy.converters.lowering import aipp
from npu_deploy.converters.files.bundle import BundleError, validate_manifest
from npu_deploy.errors import InputError, ModelError


def cfg_text(**fields) -> str:
    body = "\n".join(f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in fields.items())
    return "aipp_op {\n" + body + "\n}\n"


def one(**fields):
    [c] = aipp.parse_text(cfg_text(**fields), "t.cfg")
    return c


# ------------------------------------------------------------------------------------------ parsing
@pytest.mark.parametrize("fields, line, field, what", [
    ({"input_format": "RGB888_U8", "mean_chn_7": 1}, 3, "mean_chn_7", "unknown AIPP field"),
    ({"input_format": "RGB888_U8", "crop": "maybe"}, 3, "crop", "not a boolean"),
    ({"input_format": "RGB888_U8", "src_image_size_w": "wide"}, 3, "src_image_size_w", "not an integer"),
    ({"input_format": "BGR_U8"}, 2, "input_format", "is not one of"),
    ({"input_format": "RGB888_U8", "mean_chn_0": 300}, 3, "mean_chn_0", "outside 0..255"),
    ({"input_format": "RGB888_U8", "src_image_size_w": 5000}, 3, "src_image_size_w", "outside"),
    ({"input_format": "YUV420SP_U8", "src_image_size_w": 63, "src_image_size_h": 64}, 3, "src_image_size_w", "even"),
    ({"input_format": "YUV420SP_U8", "src_image_size_w": 64, "src_image_size_h": 64, "crop": True,
      "load_start_pos_h": 3, "crop_size_w": 32, "crop_size_h": 32}, 6, "load_start_pos_h", "even"),
    ({"input_format": "RGB888_U8", "src_image_size_w": 64, "src_image_size_h": 64, "crop": True,
      "load_start_pos_w": 40, "crop_size_w": 32, "crop_size_h": 8}, 7, "crop_size_w", "exceeds"),
    ({"input_format": "RGB888_U8", "crop_size_w": 32}, 3, "crop_size_w", "without crop: true"),
    ({"input_format": "RGB888_U8", "left_padding_size": 2}, 3, "left_padding_size", "without padding"),
    ({"input_format": "RGB888_U8", "matrix_r0c0": 256}, 3, "matrix_r0c0", "without csc_switch"),
    ({"input_format": "RGB888_U8", "ax_swap_switch": True}, 3, "ax_swap_switch", "4-channel"),
    ({"aipp_mode": "dynamic", "input_format": "RGB888_U8"}, None, "max_src_image_size", "dynamic AIPP needs"),
])
def test_errors_name_file_line_and_field(fields, line, field, what):
    with pytest.raises(InputError) as e:
        aipp.parse_text(cfg_text(**fields), "t.cfg")
    msg = str(e.value)
    assert msg.startswith(f"t.cfg:{line}: {field}" if line else f"t.cfg: {field}"), msg
    assert what in msg and "\n" not in msg


def test_syntax_errors_and_duplicates():
    with pytest.raises(InputError, match=r"t.cfg:1: 'aipp_op' must be followed by"):
        aipp.parse_text("aipp_op\n", "t.cfg")
    with pytest.raises(InputError, match=r"t.cfg:3: input_format: given twice \(first on line 2\)"):
        aipp.parse_text("aipp_op {\ninput_format: RGB888_U8\ninput_format: RGB888_U8\n}", "t.cfg")
    with pytest.raises(InputError, match="not closed"):
        aipp.parse_text("aipp_op {\ninput_format: RGB888_U8\n", "t.cfg")
    with pytest.raises(InputError, match="no aipp_op block"):
        aipp.parse_text("# nothing\n", "t.cfg")
    with pytest.raises(InputError, match="t.cfg:2: unexpected text"):
        aipp.parse_text("aipp_op {\n input_format ; RGB888_U8 }", "t.cfg")


def test_comments_quotes_and_file_errors(tmp_path):
    c = one(input_format="RGB888_U8", related_input_name='"x"')
    assert c.related_input_name == "x"
    [c] = aipp.parse_text("# camera\naipp_op { # inline\n input_format : YUV400_U8 # grey\n}\n")
    assert c.input_format == "YUV400_U8"
    with pytest.raises(InputError, match="does not exist"):
        aipp.parse_config(tmp_path / "none.cfg")
    (tmp_path / "bin.cfg").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8"):
        aipp.parse_config(tmp_path / "bin.cfg")


def test_from_flags_round_trips_through_the_file(tmp_path):
    c = aipp.from_flags(input_format="RGB888_U8", size=(224, 224), mean=[123.675, 116.28, 103.53],
                        std=[58.395, 57.12, 57.375])
    aipp.write_config(tmp_path / "a.cfg", [c])
    [back] = aipp.parse_config(tmp_path / "a.cfg")
    assert back.input_format == "RGB888_U8" and (back.src_image_size_w, back.src_image_size_h) == (224, 224)
    # the reference's ImageNet figures: var_reci = 1 / std
    assert back.var_reci_chn_0 == pytest.approx(0.0171248, abs=1e-7)
    assert back.var_reci_chn_2 == pytest.approx(0.0174292, abs=1e-7)
    assert back.min_chn_1 == pytest.approx(116.28)
    y = aipp.from_flags(input_format="YUV420SP_U8", size=(32, 16), crop=(2, 4, 32, 16), src_size=(64, 32))
    assert y.csc_switch and y.crop and y.result_size() == (32, 16)
    with pytest.raises(InputError, match="even"):
        aipp.from_flags(input_format="YUV420SP_U8", size=(32, 16), crop=(1, 4, 32, 16), src_size=(64, 32))
    with pytest.raises(InputError, match="--mean has 2 values"):
        aipp.from_flags(input_format="RGB888_U8", size=(8, 8), mean=[1, 2])


# ------------------------------------------------------------------------------------------ semantics
def _oracle(raw: np.ndarray, c: aipp.AippConfig) -> np.ndarray:
    """Pixel by pixel, in the hardware's order: swap -> crop -> CSC -> normalise -> padding."""
    n = raw.shape[0]
    w, h = c.result_size()
    k = 1 if c.input_format == "YUV400_U8" else 3
    out = np.full((n, k, h, w), c.pad_value(), np.float64)
    cx, cy, cw, ch = c.crop_box()
    top = c.top_padding_size if c.padding else 0
    left = c.left_padding_size if c.padding else 0
    sh = c.src_image_size_h
    stage = np.zeros((n, ch, cw, k))
    for b in range(n):
        for yy in range(ch):
            for xx in range(cw):
                sy, sx = cy + yy, cx + xx
                if c.input_format == "YUV420SP_U8":
                    u = int(raw[b, sh + sy // 2, (sx // 2) * 2, 0])
                    v = int(raw[b, sh + sy // 2, (sx // 2) * 2 + 1, 0])
                    px = [int(raw[b, sy, sx, 0]), u, v]
                    if c.rbuv_swap_switch:
                        px = [px[0], px[2], px[1]]
                else:
                    px = [int(p) for p in raw[b, sy, sx, :k]]
                    if c.rbuv_swap_switch and k == 3:
                        px = px[::-1]
                if c.csc_switch:
                    m, ib, ob = c.csc()["matrix"], c.csc()["input_bias"], c.csc()["output_bias"]
                    px = [min(255, max(0, (sum(m[r][j] * (px[j] - ib[j]) for j in range(3)) >> 8) + ob[r]))
                          for r in range(3)]
                stage[b, yy, xx] = px
    if c.resize:
        stage = _resize_oracle(stage, c.resize_output_h, c.resize_output_w)
    for b in range(n):
        for yy in range(stage.shape[1]):
            for xx in range(stage.shape[2]):
                for ci in range(k):
                    val = (stage[b, yy, xx, ci] - c.values.get(f"mean_chn_{ci}", 0)
                           - c.values.get(f"min_chn_{ci}", 0.0)) * c.values.get(f"var_reci_chn_{ci}", 1.0)
                    out[b, ci, top + yy, left + xx] = val
    return out.astype(np.float32)


def _resize_oracle(img, oh, ow):
    """Bilinear, half-pixel centres, clamped at the edges: one output pixel at a time."""
    n, ih, iw, k = img.shape
    out = np.zeros((n, oh, ow, k))
    for y in range(oh):
        sy = min(max((y + 0.5) * ih / oh - 0.5, 0.0), ih - 1)
        for x in range(ow):
            sx = min(max((x + 0.5) * iw / ow - 0.5, 0.0), iw - 1)
            y0, x0 = int(sy), int(sx)
            y1, x1 = min(y0 + 1, ih - 1), min(x0 + 1, iw - 1)
            wy, wx = sy - y0, sx - x0
            out[:, y, x] = ((1 - wy) * ((1 - wx) * img[:, y0, x0] + wx * img[:, y0, x1])
                            + wy * ((1 - wx) * img[:, y1, x0] + wx * img[:, y1, x1]))
    return out


def _identity_model(c: int, h: int, w: int) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, h, w])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


CASES = {
    "rgb-crop-pad-swap": dict(input_format="RGB888_U8", src_image_size_w=9, src_image_size_h=7, crop=True,
                              load_start_pos_w=2, load_start_pos_h=1, crop_size_w=5, crop_size_h=4,
                              rbuv_swap_switch=True, padding=True, left_padding_size=1, right_padding_size=2,
                              top_padding_size=2, bottom_padding_size=0, padding_value=-1.5,
                              mean_chn_0=10, min_chn_0=0.5, min_chn_1=100.25, min_chn_2=3.0,
                              var_reci_chn_0=0.5, var_reci_chn_1=0.01, var_reci_chn_2=2.0),
    "yuv420sp-csc-crop": dict(input_format="YUV420SP_U8", src_image_size_w=8, src_image_size_h=6, crop=True,
                              load_start_pos_w=2, load_start_pos_h=2, crop_size_w=4, crop_size_h=4,
                              csc_switch=True, matrix_r0c0=298, matrix_r0c1=516, matrix_r0c2=0,
                              matrix_r1c0=298, matrix_r1c1=-100, matrix_r1c2=-208, matrix_r2c0=298,
                              matrix_r2c1=0, matrix_r2c2=409, input_bias_0=16, input_bias_1=128,
                              input_bias_2=128, min_chn_0=123.675, var_reci_chn_0=0.0171248),
    "yuv420sp-swap": dict(input_format="YUV420SP_U8", src_image_size_w=4, src_image_size_h=4, csc_switch=True,
                          rbuv_swap_switch=True),
    "rgb-crop-resize-pad": dict(input_format="RGB888_U8", src_image_size_w=12, src_image_size_h=10, crop=True,
                                load_start_pos_w=1, load_start_pos_h=2, crop_size_w=9, crop_size_h=6, resize=True,
                                resize_output_w=5, resize_output_h=8, padding=True, top_padding_size=1,
                                min_chn_0=10.0, var_reci_chn_2=0.5),
    "yuv400": dict(input_format="YUV400_U8", src_image_size_w=5, src_image_size_h=3, min_chn_0=128.0,
                   var_reci_chn_0=0.0078125),
}


@pytest.mark.parametrize("name", list(CASES))
def test_subgraph_and_reference_feeds_match_the_oracle(name):
    c = one(**CASES[name])
    w, h = c.result_size()
    k = 1 if c.input_format == "YUV400_U8" else 3
    raw = np.random.default_rng(5).integers(0, 256, aipp.raw_shape(c)).astype(np.uint8)
    want = _oracle(raw, c)
    np.testing.assert_allclose(aipp.reference_feeds({"x": raw}, c)["x"], want, rtol=1e-6, atol=1e-5)
    m = aipp.prepend(_identity_model(k, h, w), c)
    onnx.checker.check_model(m, full_check=True)
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": raw})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_result_size_must_equal_the_model_input():
    c = one(input_format="RGB888_U8", src_image_size_w=10, src_image_size_h=8)
    with pytest.raises(InputError, match=r"t.cfg:3: src_image_size_w: AIPP produces 10x8 .* is 9x8"):
        aipp.prepend(_identity_model(3, 8, 9), c)
    with pytest.raises(ModelError, match="gives 1 channel"):
        aipp.prepend(_identity_model(3, 8, 10), one(input_format="YUV400_U8", src_image_size_w=10,
                                                    src_image_size_h=8))
    with pytest.raises(InputError, match="not implemented by the built-in lowering"):
        aipp.prepend(_identity_model(3, 8, 10), one(input_format="XRGB8888_U8"))
    with pytest.raises(InputError, match="related_input_rank: the model has 1 input"):
        aipp.prepend(_identity_model(3, 8, 10), one(input_format="RGB888_U8", related_input_rank=1))


def test_manifest_record_validates():
    rec = one(**CASES["yuv400"]).to_manifest()
    validate_manifest({"aipp": rec})
    with pytest.raises(BundleError, match="aipp"):
        validate_manifest({"aipp": {"source": "x"}})
    raw = np.zeros(aipp.raw_shape(one(**CASES["yuv400"])), np.uint8)
    assert aipp.reference_feeds({"x": raw}, {"aipp": {**rec, "input": "x"}})["x"].shape == (1, 1, 3, 5)
    with pytest.raises(InputError, match="raw uint8"):
        aipp.reference_feeds({"x": raw.astype(np.float32)}, rec)
    with pytest.raises(InputError, match=r"expects \[1, 3, 5, 1\]"):
        aipp.reference_feeds({"x": np.zeros((1, 3, 4, 1), np.uint8)}, rec)


# ------------------------------------------------------------------------------------------ built-in path
@pytest.mark.realmodel
def test_convert_with_aipp_runs_on_the_emulator(real_model, tmp_path):
    from npu_deploy.converters.files.bundle import read_bundle
    from npu_deploy.converters.lowering.convert import convert
    from npu_deploy.runtime.session import InferenceSession

    src = real_model("ppocr_cls")
    c = aipp.from_flags(input_format="YUV420SP_U8", size=(192, 48), mean=[127.5] * 3, std=[127.5] * 3,
                        crop=(4, 2, 192, 48), src_size=(200, 52))
    aipp.write_config(tmp_path / "a.cfg", [c])
    r = convert(src, tmp_path / "cls.bundle", backend="builtin", input_shapes={"x": (1, 3, 48, 192)},
                insert_op_conf=tmp_path / "a.cfg")
    # the built-in path honours --insert-op-conf: nothing "ignored" (bool(r) also needs the estimated
    # FormatTrans share within 8 %: 8.6 % once fused elementwise ops stop counting as kernels)
    assert r.output and not r.notes
    with read_bundle(tmp_path / "cls.bundle") as b:
        man = b.manifest
    assert man["aipp"]["input"] == "x" and man["source_model"]["path"] == str(src)
    assert man["inputs"][0]["dtype"] == "uint8" and man["inputs"][0]["shape"] == [1, 78, 200, 1]
    raw = np.random.default_rng(0).integers(0, 256, (1, 78, 200, 1)).astype(np.uint8)
    with InferenceSession(tmp_path / "cls.bundle") as s:
        got = s.run(None, {"x": raw})[0]
        rec = aipp.record_of(s)
    assert rec == man["aipp"]
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(
        None, aipp.reference_feeds({"x": raw}, rec))[0]
    np.testing.assert_allclose(got, ref, atol=2e-3)
