"""`npu-deploy aipp` and `convert --insert-op-conf` (built-in path) through the real entry point."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_deploy.converters.lowering import aipp


def test_write_and_check(run_cli, tmp_path):
    cfg = tmp_path / "a.cfg"
    code, out, err = run_cli("aipp", "--mean", "123.675,116.28,103.53", "--std", "58.395,57.12,57.375",
                             "--input-format", "RGB888_U8", "--size", "224x224", "-o", cfg)
    assert code == 0, err
    [c] = aipp.parse_config(cfg)
    assert c.var_reci_chn_1 == pytest.approx(1 / 57.12) and c.src_image_size_w == 224
    code, out, _ = run_cli("aipp", "--check", cfg)
    assert code == 0 and "valid" in out.strip().splitlines()[-1]


def test_check_reports_file_line_field(run_cli, tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text("aipp_op {\n  input_format: YUV420SP_U8\n  src_image_size_w: 63\n}\n")
    code, _, err = run_cli("aipp", "--check", cfg)
    assert code == 2 and f"{cfg}:3: src_image_size_w: 63 must be even" in err
    assert len(err.strip().splitlines()) == 1


def test_crop_and_bad_flags(run_cli, tmp_path):
    code, _, err = run_cli("aipp", "--input-format", "YUV420SP_U8", "--size", "32x16", "--crop", "2,4,32,16",
                           "--src-size", "64x32", "-o", tmp_path / "y.cfg")
    assert code == 0, err
    assert aipp.parse_config(tmp_path / "y.cfg")[0].csc_switch
    code, _, err = run_cli("aipp", "--size", "32x16", "--crop", "2,4,30,16", "-o", tmp_path / "z.cfg")
    assert code == 2 and "--crop gives 30x16" in err and not (tmp_path / "z.cfg").exists()
    code, _, err = run_cli("aipp", "--size", "32", "-o", tmp_path / "z.cfg")
    assert code == 2 and "--size" in err


def test_convert_builtin_applies_aipp_and_run(run_cli, tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 6])])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), src)
    cfg = tmp_path / "a.cfg"
    aipp.write_config(cfg, [aipp.from_flags(input_format="RGB888_U8", size=(6, 4), mean=[100, 110, 120],
                                            std=[50, 60, 70])])
    code, out, err = run_cli("convert", src, "--backend", "builtin", "--insert-op-conf", cfg,
                             "-o", tmp_path / "m.bundle")
    assert code == 0, err
    assert "ignored" not in out + err
    from npu_deploy.runtime.session import InferenceSession

    raw = np.arange(72, dtype=np.uint8).reshape(1, 4, 6, 3) * 3
    with InferenceSession(tmp_path / "m.bundle") as s:
        got = s.run(None, {"x": raw})[0]
    want = np.maximum((raw.astype(np.float32) - [100, 110, 120]) / [50, 60, 70], 0).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, want, atol=2e-3)
    bad = tmp_path / "bad.cfg"
    bad.write_text("aipp_op {\n input_format: RGB888_U8\n src_image_size_w: 8\n src_image_size_h: 4\n}\n")
    code, _, err = run_cli("convert", src, "--backend", "builtin", "--insert-op-conf", bad, "-o", tmp_path / "b.bundle")
    assert code == 2 and "AIPP produces 8x4" in err and not (tmp_path / "b.bundle").exists()


def test_compare_feeds_the_raw_image_to_the_bundle_and_the_normalised_tensor_to_onnxruntime(
        run_cli, example_onnx, tmp_path):
    """A bundle with AIPP takes the raw uint8 NHWC image; compare generates raw images over 0..255,
    feeds them to the bundle and the equivalent normalised NCHW tensor to the original model."""
    import json

    cfg = tmp_path / "aipp.cfg"
    code, _, err = run_cli("aipp", "--input-format", "RGB888_U8", "--size", "64x64",
                           "--mean", "123.675,116.28,103.53", "--std", "58.395,57.12,57.375", "-o", cfg)
    assert code == 0, err
    bundle = tmp_path / "a.bundle"
    code, _, err = run_cli("convert", example_onnx, "-o", bundle, "--backend", "builtin",
                           "--insert-op-conf", cfg, "--precision-mode", "must_keep_origin_dtype")
    assert code == 0, err
    code, out, err = run_cli("compare", example_onnx, bundle, "--json", tmp_path / "c.json")
    assert code == 0, (out, err)
    res = json.loads((tmp_path / "c.json").read_text())
    assert res["inputs"]["x"]["dtype"] == "uint8" and res["inputs"]["x"]["shape"] == [1, 64, 64, 3]
