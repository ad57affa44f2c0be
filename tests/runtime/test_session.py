"""InferenceSession: content sniffing, backend choice, life cycle, thread safety."""

from __future__ import annotations

import gc
import importlib.util
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

from npu_deploy.errors import DependencyError, InputError, ModelError
from npu_deploy.runtime.session import InferenceSession, sniff_model
from tests.conftest import TEST_TIMEOUT

from .bundles import conv_model, io_entry, make_bundle


@pytest.fixture
def bundle(tmp_path):
    model, _ = conv_model()
    # a misleading name on purpose: recognition is by content
    path = make_bundle(tmp_path / "model.onnx.txt", model,
                       inputs=[io_entry("x", [1, 3, 6, 6], fmt="NCHW", device_format="NC1HWC0", c0=16)],
                       outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW")], packed={"W": ("FRACTAL_Z", {})})
    return path, model


def test_bundle_runs_on_emulator(bundle):
    path, model = bundle
    with InferenceSession(path) as s:
        assert s.backend_name == "emulator" and sniff_model(path) == "bundle"
        assert [m.name for m in s.get_inputs()] == ["x"] and s.gears() == []
        x = np.ones((1, 3, 6, 6), np.float32)
        (y,) = s.run(None, {"x": x})
        (y2,), t = s.run_timed(["y"], {"x": x})
    np.testing.assert_array_equal(y, y2)
    assert s.closed
    with pytest.raises(InputError, match="closed"):
        s.run(None, {"x": x})


def test_an_onnx_file_is_converted_in_memory_and_says_how(tmp_path):
    import onnxruntime as ort

    model, _ = conv_model()
    p = tmp_path / "m.bin"  # no .onnx suffix: sniffed from the protobuf's first field
    onnx.save(model, p)
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    with InferenceSession(p) as s:
        assert s.conversion == "built-in lowering (bundle, CPU emulator)" and s.source_model == p
        tmp = s.path.parent
        assert tmp.is_dir() and tmp != tmp_path and s.get_providers() == ["CPUExecutionProvider"]
        (y,) = s.run(None, {"x": x})
    assert not tmp.exists()  # the in-memory conversion leaves nothing behind
    ref = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-2, atol=1e-2)  # fp16 by default, as ATC


def test_unknown_and_missing_files(tmp_path):
    junk = tmp_path / "junk.dat"
    junk.write_bytes(b"hello world")
    with pytest.raises(ModelError, match="not an offline bundle or .om"):
        InferenceSession(junk)
    with pytest.raises(InputError, match="does not exist"):
        InferenceSession(tmp_path / "nope.bundle")
    with pytest.raises(InputError, match="not a file"):
        InferenceSession(tmp_path)


def test_backend_choice_errors(bundle, tmp_path):
    path, _ = bundle
    with pytest.raises(InputError, match="unknown backend"):
        InferenceSession(path, backend="cuda")
    with pytest.raises(InputError, match="acl backend runs .om"):
        InferenceSession(path, backend="acl")


@pytest.mark.skipif(importlib.util.find_spec("acl") is not None, reason="a pyACL module is importable here")
def test_om_without_acl_is_dependency_error(tmp_path):
    from tests.standins.omfile import build_om, tensor

    om = build_om(tmp_path / "model.anything", inputs=[tensor("x", "float32", [1, 4], "ND")],
                  outputs=[tensor("y", "float32", [1, 4], "ND")])
    assert sniff_model(om) == "om"
    with pytest.raises(DependencyError) as ei:
        InferenceSession(om)
    assert ei.value.exit_code == 3
    with pytest.raises(InputError, match="emulator runs offline bundles"):
        InferenceSession(om, backend="emulator")


def test_closed_on_exception_and_gc(bundle):
    path, _ = bundle
    s = None
    with pytest.raises(RuntimeError):
        with InferenceSession(path) as s:
            raise RuntimeError("user code failed")
    assert s.closed
    s2 = InferenceSession(path)
    be = s2.backend
    del s2
    gc.collect()
    assert not be.is_active


def test_eight_threads_identical_results(bundle):
    path, _ = bundle
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 3, 6, 6)).astype(np.float32) for _ in range(8)]
    with InferenceSession(path) as s:
        expected = [s.run(None, {"x": x})[0] for x in xs]
        bad = []

        def work(i):
            for _ in range(20):
                if not np.array_equal(s.run(None, {"x": xs[i]})[0], expected[i]):
                    bad.append(i)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    assert bad == []


def test_closed_at_interpreter_exit(bundle, tmp_path):
    """A session left open is closed by the atexit hook: its (estimated) profile gets written."""
    import subprocess
    import sys

    path, _ = bundle
    prof = tmp_path / "prof"
    code = (f"import numpy as np\nfrom npu_deploy import InferenceSession\n"
            f"s = InferenceSession({str(path)!r}, profile=True, profile_dir={str(prof)!r})\n"
            f"s.run(None, {{'x': np.ones((1, 3, 6, 6), np.float32)}})\n"
            f"_keep = [s]\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TEST_TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert len(list(prof.glob("PROF_*/mindstudio_profiler_output/op_summary_*.csv"))) == 1


def test_profile_on_device_path_is_refused_clearly(tmp_path):
    from tests.standins.omfile import build_om, tensor

    om = build_om(tmp_path / "m.om", inputs=[tensor("x", "float32", [1, 4], "ND")],
                  outputs=[tensor("y", "float32", [1, 4], "ND")])
    with pytest.raises((InputError, DependencyError)):
        InferenceSession(om, profile=True)


# ------------------------------------------------------------------ onnxruntime's habits (issue 13)
@pytest.mark.realmodel
def test_onnxruntime_style_code_runs_unchanged_on_a_real_onnx(real_model):
    import onnxruntime as ort

    path = real_model("ppocr_cls")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = InferenceSession(str(path), sess_options=so, providers=["CANNExecutionProvider", "CPUExecutionProvider"],
                            input_shapes={"x": (1, 3, 48, 192)})
    try:
        assert sess.get_providers() == ["CPUExecutionProvider"]  # no device here: CANN skipped, as ort does
        inp, out = sess.get_inputs()[0], sess.get_outputs()[0]
        assert (inp.name, inp.type, tuple(inp.shape)) == ("x", "tensor(float)", (1, 3, 48, 192))
        assert inp.format and inp.nbytes == 1 * 3 * 48 * 192 * 4  # the TensorMeta fields are still there
        src = onnx.load(str(path), load_external_data=False)
        meta = sess.get_modelmeta()
        assert meta.graph_name == src.graph.name and meta.custom_metadata_map["npu_deploy.soc"] == "Ascend310P3"
        x = np.random.default_rng(0).standard_normal((1, 3, 48, 192)).astype(np.float32)
        (y,) = sess.run([out.name], {inp.name: x}, None)
        # honoured, not just kept: the onnxruntime sessions the emulator ran were built with it
        used = [ps for _, ps in sess.backend._plan_sessions.values()] + [sess.backend._sess]
        threads = {u.get_session_options().intra_op_num_threads for u in used if u is not None}
        assert threads == {1}
    finally:
        sess.close()
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run([out.name], {"x": x})[0]
    np.testing.assert_allclose(y, ref, atol=2e-2)


def test_dynamic_dims_read_as_names_and_still_compare_as_minus_one(tmp_path):
    from npu_deploy.converters.lowering.convert import convert
    from tests.conftest import write_example

    src = write_example(tmp_path / "e.onnx", batch="N")
    convert(src, tmp_path / "e.bundle", backend="builtin", input_shapes={"x": (-1, 3, 64, 64)}, dynamic_batch=[1, 4])
    with InferenceSession(tmp_path / "e.bundle") as s:
        shape = s.get_inputs()[0].shape
        assert shape == ["N", 3, 64, 64] and isinstance(shape[0], str)
        assert shape[0] == -1 and shape[0] < 0 and s.get_inputs()[0].is_dynamic  # TensorMeta's convention
        assert s.get_inputs()[0].gears == ((1, 3, 64, 64), (4, 3, 64, 64))
        assert "N" in repr(s.get_inputs()[0]) and "tensor(float)" in repr(s.get_inputs()[0])


def test_providers_are_honoured_or_refused_clearly(tmp_path):
    model, _ = conv_model()
    path = make_bundle(tmp_path / "m.bundle", model, inputs=[io_entry("x", [1, 3, 6, 6], fmt="NCHW")],
                       outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW")])
    with pytest.raises(InputError, match="'CUDAExecutionProvider' is not available"):
        InferenceSession(path, providers=["CUDAExecutionProvider"])
    with pytest.raises(InputError, match="can run this bundle"):
        InferenceSession(path, providers=["CANNExecutionProvider"])
    with pytest.raises(InputError, match="another"):
        InferenceSession(path, providers=["CPUExecutionProvider"], backend="acl")
    with InferenceSession(path, providers=[("CANNExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]) as s:
        assert s.backend_name == "emulator"


def test_io_binding_keeps_the_bound_input_like_a_device_copy(tmp_path):
    model, _ = conv_model()
    path = make_bundle(tmp_path / "m.bundle", model, inputs=[io_entry("x", [1, 3, 6, 6], fmt="NCHW")],
                       outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW")])
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)
    with InferenceSession(path) as s:
        (expected,) = s.run(None, {"x": x.copy()})
        b = s.io_binding()
        b.bind_cpu_input("x", x)
        b.bind_output("y")
        x[...] = 0  # the host array changes; the bound (device) copy does not
        s.run_with_iobinding(b)
        np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], expected)
        s.run_with_iobinding(b)  # and it stays bound for the next run
        np.testing.assert_array_equal(b.get_outputs()[0], expected)
        b.bind_cpu_input("x", x)
        s.run_with_iobinding(b)
        assert not np.array_equal(b.copy_outputs_to_cpu()[0], expected)
        with pytest.raises(InputError, match="no input 'z'"):
            b.bind_cpu_input("z", x)
        with pytest.raises(InputError, match="by pointer"):
            b.bind_input("x", "npu", 0, np.float32, [1, 3, 6, 6], 1234)


def test_end_profiling_writes_now_and_run_options_terminate_is_refused(tmp_path):
    import onnxruntime as ort

    model, _ = conv_model()
    path = make_bundle(tmp_path / "m.bundle", model, inputs=[io_entry("x", [1, 3, 6, 6], fmt="NCHW")],
                       outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW")])
    x = np.zeros((1, 3, 6, 6), np.float32)
    with InferenceSession(path, profile=True, profile_dir=tmp_path / "prof") as s:
        s.run(None, {"x": x})
        written = s.end_profiling()
        assert written and (tmp_path / "prof").is_dir() and Path(written).exists()
        s.run(None, {"x": x})  # the session goes on, no longer profiling
        assert s.end_profiling() == ""
        ro = ort.RunOptions()
        ro.terminate = True
        with pytest.raises(InputError, match="terminate"):
            s.run(None, {"x": x}, ro)
    with InferenceSession(path) as s:
        assert s.end_profiling() == ""


def test_cpu_threads_are_refused_for_a_device_run():
    import onnxruntime as ort

    from npu_deploy.runtime.session import _refuse_device_options

    so = ort.SessionOptions()
    so.intra_op_num_threads = 4
    with pytest.raises(InputError, match="do not apply to a model running on an Ascend device"):
        _refuse_device_options(so)
    _refuse_device_options(ort.SessionOptions())  # defaults: nothing to refuse
