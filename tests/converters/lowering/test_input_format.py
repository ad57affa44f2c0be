"""``--input-format NHWC`` (and NDHWC) in the built-in backend: the host feeds channels-last, the graph
is NCHW, the plan's first TransData converts on the device; ATC keeps refusing it for ONNX."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import npu_deploy
from npu_deploy import InferenceSession
from npu_deploy.converters.files.bundle import read_bundle
from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.converters.lowering.planner import plan
from npu_deploy.errors import InputError
from tests.conftest import write_example

RNG = np.random.default_rng(11)


def _example(tmp_path, batch=1) -> Path:
    return write_example(tmp_path / "example.onnx", batch)


def _save(tmp_path, nodes, inputs, outputs, inits=(), name="m.onnx") -> Path:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _w(name, shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _convert(model, tmp_path, fmt="NHWC", **kw):
    out = tmp_path / f"{Path(model).stem}.{fmt}.bundle"
    kw.setdefault("precision_mode", "must_keep_origin_dtype")
    r = npu_deploy.convert(str(model), str(out), backend="builtin", input_format=fmt, **kw)
    return r, out


def _ref(model, feeds):
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)


def _check_nhwc_run(model, bundle, x_nchw):
    ref = _ref(model, {"x": x_nchw})
    with InferenceSession(bundle) as s:
        (meta,) = s.get_inputs()
        n, c, h, w = x_nchw.shape
        assert (meta.shape, meta.format, meta.device_format) == ([n, h, w, c], "NHWC", "NHWC")
        outs = s.run(None, {"x": x_nchw.transpose(0, 2, 3, 1)})
        with pytest.raises(InputError, match="channels-last"):
            s.run(None, {"x": x_nchw})  # NCHW data is refused with a hint, not silently misread
    assert len(outs) == len(ref)
    for y, r in zip(outs, ref):
        assert y.shape == r.shape
        np.testing.assert_allclose(y, r, rtol=1e-3, atol=1e-4)


def test_readme_example_nhwc(tmp_path):
    model = _example(tmp_path)
    r, bundle = _convert(model, tmp_path)
    first = r.plan["transdata"][0]
    assert (first["tensor"], first["src_format"], first["dst_format"]) == ("x", "NHWC", "NC1HWC0")
    assert first["est_us"] and first["est_us"] > 0
    # the direct NHWC->NC1HWC0 transfer: no extra transpose planned
    assert [t["tensor"] for t in r.plan["transdata"]].count("x") == 1
    with read_bundle(bundle) as b:
        (entry,) = b.manifest["inputs"]
        assert b.manifest["tensor_formats"]["x"] == "NHWC"
    assert (entry["format"], entry["shape"], entry["device_format"], entry["device_shape"]) == \
        ("NHWC", [1, 64, 64, 3], "NHWC", [1, 64, 64, 3])
    assert (entry["graph_format"], entry["graph_shape"]) == ("NCHW", [1, 3, 64, 64])
    x = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    _check_nhwc_run(model, bundle, x)


def test_nhwc_same_plan_cost_as_nchw_for_a_conv_input(tmp_path):
    model = _example(tmp_path)
    a = plan(load_model(model), input_format=None)
    b = plan(load_model(model), input_format="NHWC")
    assert [(t.tensor, t.dst_format) for t in a.transdata] == [(t.tensor, t.dst_format) for t in b.transdata]
    assert (a.transdata[0].src_format, b.transdata[0].src_format) == ("NCHW", "NHWC")
    assert b.transdata[0].shape == (1, 3, 64, 64)  # logical (NCHW-origin) shape, as formats takes it
    assert b.tensor_formats["x"] == "NHWC"


@pytest.mark.realmodel
def test_real_model_ppocr_cls_nhwc(real_model, tmp_path):
    model = real_model("ppocr_cls")
    r, bundle = _convert(model, tmp_path, input_shapes={"x": (1, 3, 48, 192)})
    first = r.plan["transdata"][0]
    assert (first["tensor"], first["src_format"], first["dst_format"]) == ("x", "NHWC", "NC1HWC0")
    x = np.random.default_rng(3).standard_normal((1, 3, 48, 192)).astype(np.float32)
    _check_nhwc_run(model, bundle, x)


@pytest.mark.realmodel
def test_real_model_nhwc_dynamic_batch(real_model, tmp_path):
    model = real_model("ppocr_cls")
    _, bundle = _convert(model, tmp_path, input_shapes={"x": (-1, 3, 48, 192)}, dynamic_batch=[1, 4])
    x = np.random.default_rng(4).standard_normal((4, 3, 48, 192)).astype(np.float32)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    with InferenceSession(bundle) as s:
        assert s.gears() == [{"x": (1, 48, 192, 3)}, {"x": (4, 48, 192, 3)}]
        for batch in (1, 3):  # 3 is padded to the batch-4 gear (in NHWC) and cropped back
            (y,) = s.run(None, {"x": x[:batch].transpose(0, 2, 3, 1)})
            (ref,) = sess.run(None, {"x": x[:batch]})
            np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-4)


def test_nd_consumer_gets_a_costed_transpose(tmp_path):
    """An ND consumer (Reshape) of the NHWC input: the plan has an NHWC->NCHW conversion."""
    shape = numpy_helper.from_array(np.array([1, 2, 48], np.int64), "s")
    model = _save(tmp_path, [helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
                             helper.make_node("Relu", ["r"], ["y"], name="relu")],
                  [_vi("x", [1, 2, 6, 8])], [_vi("y", [1, 2, 48])], [shape])
    r, bundle = _convert(model, tmp_path)
    (td,) = r.plan["transdata"]
    assert (td["tensor"], td["src_format"], td["dst_format"], td["consumers"]) == ("x", "NHWC", "NCHW", ["reshape"])
    assert td["est_us"] > 0 and td["bytes"] == 1 * 2 * 6 * 8 * 4
    x = RNG.standard_normal((1, 2, 6, 8)).astype(np.float32)
    with InferenceSession(bundle) as s:
        (y,) = s.run(None, {"x": x.transpose(0, 2, 3, 1)})
    np.testing.assert_array_equal(y, _ref(model, {"x": x})[0])


def test_elementwise_before_conv_moves_to_5hd(tmp_path):
    """x(NHWC) -> Mul -> Conv: the Mul runs in NC1HWC0, so one direct NHWC->NC1HWC0 stays."""
    model = _save(tmp_path, [helper.make_node("Mul", ["x", "k"], ["a"], name="scale"),
                             helper.make_node("Conv", ["a", "w"], ["y"], name="conv")],
                  [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 16, 6, 6])],
                  [numpy_helper.from_array(np.array(0.5, np.float32), "k"), _w("w", (16, 3, 3, 3))])
    p = plan(load_model(model), input_format="NHWC")
    assert sorted((t.tensor, t.src_format, t.dst_format) for t in p.transdata) == \
        [("x", "NHWC", "NC1HWC0"), ("y", "NC1HWC0", "NCHW")]
    r, bundle = _convert(model, tmp_path)
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    with InferenceSession(bundle) as s:
        (y,) = s.run(None, {"x": x.transpose(0, 2, 3, 1)})
    np.testing.assert_allclose(y, _ref(model, {"x": x})[0], rtol=1e-3, atol=1e-4)


def test_other_rank_inputs_keep_nd_and_a_note_says_so(tmp_path):
    model = _save(tmp_path, [helper.make_node("ReduceMean", ["x"], ["m"], name="gap", axes=[2, 3], keepdims=0),
                             helper.make_node("Add", ["m", "bias"], ["y"], name="add")],
                  [_vi("x", [2, 4, 3, 5]), _vi("bias", [2, 4])], [_vi("y", [2, 4])])
    r, bundle = _convert(model, tmp_path)
    assert any("input bias (rank 2) keeps ND" in n for n in r.plan["notes"])
    with read_bundle(bundle) as b:
        fmts = {e["name"]: (e["format"], e["shape"]) for e in b.manifest["inputs"]}
    assert fmts == {"x": ("NHWC", [2, 3, 5, 4]), "bias": ("ND", [2, 4])}
    x = RNG.standard_normal((2, 4, 3, 5)).astype(np.float32)
    bias = RNG.standard_normal((2, 4)).astype(np.float32)
    with InferenceSession(bundle) as s:
        (y,) = s.run(None, {"x": x.transpose(0, 2, 3, 1), "bias": bias})
    np.testing.assert_allclose(y, _ref(model, {"x": x, "bias": bias})[0], rtol=1e-5, atol=1e-6)


def test_ndhwc_5d(tmp_path):
    model = _save(tmp_path, [helper.make_node("Conv", ["x", "w"], ["y"], name="conv3d", pads=[1] * 6)],
                  [_vi("x", [1, 3, 4, 5, 6])], [_vi("y", [1, 8, 4, 5, 6])], [_w("w", (8, 3, 3, 3, 3))])
    r, bundle = _convert(model, tmp_path, fmt="NDHWC")
    assert (r.plan["transdata"][0]["src_format"], r.plan["transdata"][0]["dst_format"]) == ("NDHWC", "NDC1HWC0")
    x = RNG.standard_normal((1, 3, 4, 5, 6)).astype(np.float32)
    with InferenceSession(bundle) as s:
        assert s.get_inputs()[0].shape == [1, 4, 5, 6, 3]
        (y,) = s.run(None, {"x": x.transpose(0, 2, 3, 4, 1)})
    np.testing.assert_allclose(y, _ref(model, {"x": x})[0], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("fmt, shape", [("NHWC", [2, 8]), ("NDHWC", [1, 3, 8, 8]), ("NHWC", [1, 3, 4, 5, 6])])
def test_no_input_of_the_rank_is_a_clear_error(tmp_path, fmt, shape):
    model = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", shape)],
                  [_vi("y", shape)])
    want = {"NHWC": 4, "NDHWC": 5}[fmt]
    with pytest.raises(InputError, match=f"--input-format {fmt} applies to {want}-D inputs.*x rank {len(shape)}"):
        _convert(model, tmp_path, fmt=fmt)
    assert not (tmp_path / f"m.{fmt}.bundle").exists()


@pytest.mark.parametrize("fmt", ["NHWC", "NDHWC"])
def test_atc_backend_refuses_channels_last_for_onnx(tmp_path, fmt, monkeypatch):
    model = _example(tmp_path)
    with pytest.raises(InputError, match=r"not accepted by ATC for ONNX models.*NCHW, NCDHW, ND") as e:
        npu_deploy.convert(str(model), str(tmp_path / "m.om"), backend="atc", input_format=fmt,
                           atc=str(tmp_path / "no-such-atc"))
    assert "--backend builtin" in e.value.hint


def test_auto_with_atc_found_refuses_too(tmp_path, monkeypatch):
    from npu_deploy.converters.lowering import atc as atcmod

    model = _example(tmp_path)
    monkeypatch.setattr(atcmod, "find_atc", lambda atc=None: "/opt/atc")
    with pytest.raises(InputError, match="not accepted by ATC.*auto: ATC found"):
        npu_deploy.convert(str(model), str(tmp_path / "m.om"), backend="auto", input_format="NHWC")


def test_cli_convert_nhwc(run_cli, tmp_path):
    model = _example(tmp_path)
    out = tmp_path / "cli.bundle"
    code, text, err = run_cli("convert", str(model), "-o", str(out), "--backend", "builtin",
                              "--input-format", "NHWC", "--explain")
    assert code == 0, err
    assert "x NHWC -> NC1HWC0" in text
    code, _, err = run_cli("convert", str(model), "-o", str(tmp_path / "m.om"), "--backend", "atc",
                           "--input-format", "NHWC")
    assert code == 2 and "not accepted by ATC for ONNX models" in err
