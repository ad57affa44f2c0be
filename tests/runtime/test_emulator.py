"""The CPU emulator on hand-built bundles: weights unpacked from device formats, layout-faithful
transfers checked against an index-map oracle, fp16 rounding at op boundaries, estimated profile."""

from __future__ import annotations

import csv

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from npu_deploy.errors import BundleError, InputError
from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.runtime.emulator import OP_SUMMARY_HEADER, EmulatorBackend

from .bundles import conv_model, io_entry, make_bundle


def ort_run(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def nc1hwc0_oracle(x: np.ndarray, c0: int) -> np.ndarray:
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    out = np.zeros((n, c1, h, w, c0), x.dtype)
    for ni in range(n):
        for ci in range(c):
            for hi in range(h):
                for wi in range(w):
                    out[ni, ci // c0, hi, wi, ci % c0] = x[ni, ci, hi, wi]
    return out


@pytest.fixture
def conv_bundle(tmp_path):
    model, _ = conv_model()
    path = make_bundle(
        tmp_path / "conv.bin", model,
        inputs=[io_entry("x", [1, 3, 6, 6], fmt="NCHW", device_format="NC1HWC0", c0=16)],
        outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW", device_format="NC1HWC0", c0=16)],
        packed={"W": ("FRACTAL_Z", {"c0": 16})},
        node_formats={"conv": {"op_type": "Conv", "engine": "AI Core", "input_formats": ["NC1HWC0", "FRACTAL_Z", "ND"],
                               "output_formats": ["NC1HWC0"], "dtype": "float32"},
                      "relu": {"op_type": "Relu", "engine": "AI Core", "input_formats": ["NC1HWC0"],
                               "output_formats": ["NC1HWC0"], "dtype": "float32"}},
        transdata=[{"name": "trans_TransData_0", "src_format": "NCHW", "dst_format": "NC1HWC0",
                    "shape": [1, 3, 6, 6], "dtype": "float32", "bytes": 432, "onnx_nodes": ["conv"],
                    "reason": "input", "est_us": 11.5}],
        cost={"estimated": True, "est_us": {"conv": 20.0, "relu": 3.0}})
    return path, model


def test_matches_onnxruntime_and_transfers_are_layout_faithful(conv_bundle):
    path, model = conv_bundle
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    with EmulatorBackend(path, record_device_buffers=True) as b:
        (y,), t = b.run_timed(None, {"x": x})
        dev_in = b.last_device_buffers["x"]
        dev_out = b.last_device_buffers["output:y"]
    (ref,) = ort_run(model, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(dev_in, nc1hwc0_oracle(x, 16))
    np.testing.assert_array_equal(dev_out, nc1hwc0_oracle(y, 16))
    assert t.h2d > 0 and t.d2h > 0 and t.compute > 0


def test_metadata(conv_bundle):
    path, _ = conv_bundle
    b = EmulatorBackend(path)
    (i,), (o,) = b.get_inputs(), b.get_outputs()
    assert (i.name, i.shape, i.format, i.device_format, i.device_shape) == \
        ("x", (1, 3, 6, 6), "NCHW", "NC1HWC0", (1, 1, 6, 6, 16))
    assert o.dtype == np.float32 and b.precision_mode == "must_keep_origin_dtype"


def test_fp16_rounding_at_op_boundaries(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64,)).astype(np.float32)
    bias = rng.standard_normal((64,)).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "A"], ["t"], name="mul"),
             helper.make_node("Add", ["t", "Bi"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [64])],
                          [helper.make_tensor_value_info("y", 1, [64])],
                          [numpy_helper.from_array(a, "A"), numpy_helper.from_array(bias, "Bi")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = make_bundle(tmp_path / "m.bundle", model, inputs=[io_entry("x", [64])], outputs=[io_entry("y", [64])],
                       store_dtype={"A": "float16"}, precision_mode="force_fp16",
                       tensor_dtypes={"t": "float16", "A": "float16"})
    x = rng.standard_normal(64).astype(np.float32) * 3
    with EmulatorBackend(path) as b:
        (y,) = b.run(None, {"x": x})
        assert b.rounded_tensors == ["t"]
    f16 = lambda v: v.astype(np.float16).astype(np.float32)  # noqa: E731
    oracle = f16(x * f16(a)) + bias  # weight stored fp16, product held in fp16, add in fp32
    np.testing.assert_array_equal(y, oracle)
    assert not np.array_equal(y, x * a + bias)  # the rounding is visible


def test_fp16_graph_output_rounded(tmp_path):
    nodes = [helper.make_node("Mul", ["x", "x"], ["y"], name="sq")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [5])],
                          [helper.make_tensor_value_info("y", 1, [5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = make_bundle(tmp_path / "m.bundle", model, inputs=[io_entry("x", [5])], outputs=[io_entry("y", [5])],
                       precision_mode="force_fp16", node_formats={"sq": {"dtype": "float16"}})
    x = np.array([1.0001, 3.14159, 1e-6, 250.3, -2.5], np.float32)
    with EmulatorBackend(path) as b:
        (y,) = b.run(None, {"x": x})
    np.testing.assert_array_equal(y, (x * x).astype(np.float16).astype(np.float32))


def test_dynamic_batch_gears(tmp_path):
    model, _ = conv_model(batch="N")
    gears = [{"x": [1, 3, 6, 6]}, {"x": [4, 3, 6, 6]}]
    path = make_bundle(tmp_path / "d.bundle", model,
                       inputs=[io_entry("x", [-1, 3, 6, 6], fmt="NCHW", device_format="NC1HWC0", c0=16)],
                       outputs=[io_entry("y", [-1, 8, 6, 6], fmt="NCHW")], packed={"W": ("FRACTAL_Z", {})},
                       dynamic={"mode": "batch", "gears": gears},
                       # the input arrives in NC1HWC0: the plan's conv reads it so (the emulator executes
                       # the plan, so a reader expecting NCHW would see the bytes as they lie)
                       node_formats={"conv": {"input_formats": ["NC1HWC0", "FRACTAL_Z", "ND"],
                                              "output_formats": ["NCHW"]}})
    x = np.random.default_rng(1).random((3, 3, 6, 6), dtype=np.float32)
    with EmulatorBackend(path) as b:
        assert b.get_inputs()[0].gears == ((1, 3, 6, 6), (4, 3, 6, 6))
        (y,) = b.run(None, {"x": x})
        with pytest.raises(InputError, match="fit no gear.*x:1,3,6,6 \\| x:4,3,6,6"):
            b.run(None, {"x": np.zeros((5, 3, 6, 6), np.float32)})
    (ref,) = ort_run(model, {"x": x})
    assert y.shape == (3, 8, 6, 6)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_corrupt_bundle_is_bundle_error(conv_bundle, tmp_path):
    path, _ = conv_bundle
    data = bytearray(path.read_bytes())
    data[300] ^= 0xFF  # inside the weight blob
    bad = tmp_path / "bad.bundle"
    bad.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="checksum"):
        EmulatorBackend(bad).activate()


def test_estimated_profile(conv_bundle, tmp_path):
    path, _ = conv_bundle
    prof = tmp_path / "prof"
    b = EmulatorBackend(path, profile=True, profile_dir=prof)
    with b:
        for _ in range(3):
            b.run(None, {"x": np.ones((1, 3, 6, 6), np.float32)})
    root = b.profile_path
    assert root.parent == prof and root.name.startswith("PROF_000001_")
    out = root / "mindstudio_profiler_output"
    assert "estimate" in (out / "README.txt").read_text().lower()
    (summary,) = out.glob("op_summary_*.csv")
    with open(summary, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == OP_SUMMARY_HEADER
    body = [dict(zip(rows[0], r)) for r in rows[1:]]
    assert [r["OP Type"] for r in body] == ["TransData", "Conv2D", "Relu"] * 3   # CANN types, as msprof names them
    td = body[0]
    assert (td["Input Formats"], td["Output Formats"]) == ("NCHW", "NC1HWC0")
    assert (td["Input Shapes"], td["Output Shapes"]) == ('"1,3,6,6"', '"1,1,6,6,16"')
    assert float(td["Task Duration(us)"]) == 11.5 and td["Task Start Time(us)"].endswith("\t")
    conv = body[1]
    assert float(conv["Task Duration(us)"]) == 20.0
    assert conv["Input Formats"] == "NC1HWC0;FRACTAL_Z;ND" and conv["Input Shapes"] == '"1,3,6,6;8,3,3,3;8"'
    starts = [float(r["Task Start Time(us)"]) for r in body[:3]]
    assert starts[1] == pytest.approx(starts[0] + 11.5) and starts[2] == pytest.approx(starts[1] + 20.0)
    (stat,) = out.glob("op_statistic_*.csv")
    stats = {r["OP Type"]: r for r in csv.DictReader(open(stat, newline=""))}
    assert int(stats["Conv2D"]["Count"]) == 3
    assert float(stats["TransData"]["Ratio(%)"]) == pytest.approx(100 * 11.5 / 34.5, abs=1e-3)
    assert not list(prof.glob(".*.part"))


def test_no_runs_no_profile(conv_bundle, tmp_path):
    path, _ = conv_bundle
    b = EmulatorBackend(path, profile=True, profile_dir=tmp_path / "p")
    with b:
        pass
    assert b.profile_path is None and not (tmp_path / "p").exists()


def test_profile_analyser_runs_on_estimated_profile(conv_bundle, tmp_path):
    path, _ = conv_bundle
    b = EmulatorBackend(path, profile=True, profile_dir=tmp_path / "prof")
    with b:
        b.run(None, {"x": np.ones((1, 3, 6, 6), np.float32)})
    report = analyze_profile(tmp_path / "prof")
    # oracle: TransData 11.5 µs of 34.5 µs estimated device time
    assert report.formattrans_share() == pytest.approx(100 * 11.5 / 34.5, rel=1e-6)  # percent
    assert "estimated" in report.verdict()


def test_profile_skips_non_tasks(tmp_path):
    from npu_deploy.runtime.emulator import profile_rows

    nodes = [helper.make_node("Constant", [], ["k"], name="k0", value=numpy_helper.from_array(np.ones(2, np.float32))),
             helper.make_node("Reshape", ["x", "shape"], ["r"], name="view"),
             helper.make_node("Add", ["r", "k"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 2])],
                          [helper.make_tensor_value_info("y", 1, [2])],
                          [numpy_helper.from_array(np.array([2], np.int64), "shape")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    man = {"node_formats": {"k0": {"folded": True}}, "cost": {"est_us": {"add": 2.0, "view": 0.0}}}
    assert [r["type"] for r in profile_rows(man, model)] == ["Add"]


# ---------------------------------------------------------------------- channels-last host inputs
def _nhwc_bundle(tmp_path, c_in=3, device_format="NHWC", graph_format="NCHW", name="nhwc.bin"):
    model, _ = conv_model(c_in=c_in)
    entry = io_entry("x", [1, 6, 6, c_in], fmt="NHWC")
    entry.update(graph_format=graph_format, graph_shape=[1, c_in, 6, 6])
    if device_format != "NHWC":  # the device holds the padded layout, packed from NHWC at the transfer
        entry.update(device_format=device_format, c0=16,
                     device_shape=[1, 1, 6, 6, 16])
    path = make_bundle(tmp_path / name, model, inputs=[entry], outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW")],
                       packed={"W": ("FRACTAL_Z", {"c0": 16})})
    return path, model


def test_nhwc_input_converted_to_the_graph_layout_during_h2d(tmp_path, monkeypatch):
    from npu_deploy.converters import formats

    path, model = _nhwc_bundle(tmp_path)
    x = np.random.default_rng(5).standard_normal((1, 3, 6, 6)).astype(np.float32)
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    phase, calls = [], []
    real_unpack = formats.unpack

    def spy(phys, fmt, shape, **kw):
        calls.append((phase[-1] if phase else None, fmt, tuple(shape), kw.get("origin")))
        return real_unpack(phys, fmt, shape, **kw)

    monkeypatch.setattr(formats, "unpack", spy)
    with EmulatorBackend(path, record_device_buffers=True) as b:
        (m,) = b.get_inputs()
        assert (m.shape, m.format, m.device_format, m.device_shape) == ((1, 6, 6, 3), "NHWC", "NHWC", (1, 6, 6, 3))
        real_phase = b._phase

        def tracking(name):
            phase.append(name)
            return real_phase(name)

        b._phase = tracking
        calls.clear()  # activation unpacked the weights
        (y,), t = b.run_timed(None, {"x": x_nhwc})
        assert b.last_device_buffers["x"] is x_nhwc  # the device receives the compact NHWC array
        # the NHWC buffer is converted on the device (in the executed graph), not by the transfer
        assert any("unpack_NHWC" in n.name for n in b.last_plan_graph.model.graph.node)
    np.testing.assert_array_equal(y, ort_run(model, {"x": x})[0])
    assert [c for c in calls if c[0] == "h2d"] == []  # the transfer itself moves the bytes as they are
    assert t.h2d > 0


def test_nhwc_input_with_one_channel_is_a_free_view(tmp_path):
    path, model = _nhwc_bundle(tmp_path, c_in=1)
    b = EmulatorBackend(path)
    x = np.random.default_rng(6).standard_normal((1, 6, 6, 1)).astype(np.float32)
    g = b._in_transfers["x"].to_graph(x)
    assert g.shape == (1, 1, 6, 6) and np.shares_memory(g, x)
    with b:
        (y,) = b.run(None, {"x": x})
    np.testing.assert_array_equal(y, ort_run(model, {"x": x.transpose(0, 3, 1, 2)})[0])


def test_nhwc_host_with_padded_device_layout(tmp_path):
    """Host NHWC, device NC1HWC0 (packed from NHWC at the transfer), graph NCHW."""
    path, model = _nhwc_bundle(tmp_path, device_format="NC1HWC0")
    x = np.random.default_rng(8).standard_normal((1, 3, 6, 6)).astype(np.float32)
    with EmulatorBackend(path, record_device_buffers=True) as b:
        (y,) = b.run(None, {"x": x.transpose(0, 2, 3, 1)})
        np.testing.assert_array_equal(b.last_device_buffers["x"], nc1hwc0_oracle(x, 16))
    np.testing.assert_array_equal(y, ort_run(model, {"x": x})[0])


def test_nhwc_input_with_a_graph_format_of_other_axes_is_refused(tmp_path):
    path, _ = _nhwc_bundle(tmp_path, graph_format="NCDHW")
    with pytest.raises(BundleError, match="cannot be read as graph format NCDHW"):
        EmulatorBackend(path)


def test_profile_places_each_transdata_between_producer_and_first_consumer(tmp_path, example_onnx):
    """A conversion runs after the op that produces its tensor and before the first op that reads it;
    one with two consumers (the example's `tokens`) must not drift past the first one."""
    import npu_deploy
    from npu_deploy.converters.files.bundle import read_bundle
    from npu_deploy.runtime.emulator import profile_rows

    src = example_onnx
    npu_deploy.convert(src, output=tmp_path / "e.bundle", backend="builtin")
    with read_bundle(tmp_path / "e.bundle") as b:
        manifest, graph = b.manifest, b.graph
    names = [r["name"] for r in profile_rows(manifest, graph)]
    graph_order = [n.name for n in graph.graph.node]
    multi = 0
    for td in manifest["transdata"]:
        pos = names.index(td["name"])
        consumers = [c for c in td.get("consumers") or [] if c in names]
        if td.get("producer") in names:
            assert names.index(td["producer"]) < pos, td["name"]
        if consumers:
            first = min(consumers, key=graph_order.index)
            assert pos < names.index(first), (td["name"], first, names)
            multi += len(td.get("consumers") or []) > 1   # (a consumer fused into its producer has no row)
    assert multi >= 1  # the case that used to be misplaced is present


def test_h2d_packing_reuses_its_buffer_between_runs(conv_bundle):
    path, model = conv_bundle
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((1, 3, 6, 6)).astype(np.float32) for _ in range(3)]
    with EmulatorBackend(path) as b:
        ys = [b.run(None, {"x": x})[0] for x in xs]
        bufs = b._in_transfers["x"]._buffers
        assert len(bufs) == 1  # one device buffer for the input, written in place each run
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(y, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
