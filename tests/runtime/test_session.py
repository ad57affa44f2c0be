"""InferenceSession: content sniffing, backend choice, life cycle, thread safety."""

from __future__ import annotations

import gc
import importlib.util
import threading

import numpy as np
import onnx
import pytest

from npu_deploy.errors import DependencyError, InputError, ModelError
from npu_deploy.runtime.session import InferenceSession, sniff_model

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


def test_onnx_file_is_refused_with_advice(tmp_path):
    model, _ = conv_model()
    p = tmp_path / "m.bin"  # no .onnx suffix: sniffed from the protobuf's first field
    onnx.save(model, p)
    with pytest.raises(ModelError, match="convert it first"):
        InferenceSession(p)


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
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(list(prof.glob("PROF_*/mindstudio_profiler_output/op_summary_*.csv"))) == 1


def test_profile_on_device_path_is_refused_clearly(tmp_path):
    from tests.standins.omfile import build_om, tensor

    om = build_om(tmp_path / "m.om", inputs=[tensor("x", "float32", [1, 4], "ND")],
                  outputs=[tensor("y", "float32", [1, 4], "ND")])
    with pytest.raises((InputError, DependencyError)):
        InferenceSession(om, profile=True)
