"""The ACL backend against the strict stand-ins of pyACL (``tests/standins/acl``) and acllite.

The stand-in is the oracle of the documented contract: it tracks every allocation, context, dataset
and model, refuses out-of-order calls with the documented codes, and reports leaks and order
violations. Models are real ``.om`` files built with ``tests/standins/omfile.py``; the stand-in reads
their description itself and "executes" them with a function the test writes, so expected device
bytes and outputs are computed independently here (index loops, numpy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from npu_deploy.errors import AclError, DependencyError, InputError, OmError
from npu_deploy.runtime import device
from npu_deploy.runtime.acl import AclBackend
from tests.standins.omfile import build_om, tensor
from tests.conftest import TEST_TIMEOUT

STANDINS = Path(__file__).resolve().parents[1] / "standins"


def _purge_standins() -> None:
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if name == "acl" or name.startswith("acl.") or (f and str(STANDINS) in f and "." not in name):
            del sys.modules[name]


@pytest.fixture
def acl(monkeypatch):
    """The stand-in ``acl`` importable as ``acl``; reset before, everything finalised and forgotten after
    (a fresh stand-in module is a fresh process: ``device`` forgets the previous module's state)."""
    device.shutdown()
    _purge_standins()
    monkeypatch.syspath_prepend(str(STANDINS))
    import acl as mod

    mod._standin.reset()
    yield mod
    device.finalize()
    _purge_standins()


@pytest.fixture
def acllite(acl, monkeypatch):
    monkeypatch.syspath_prepend(str(STANDINS / "acllite"))
    return acl


def st(acl):
    return acl._standin


def static_model(tmp_path, name="m", soc="Ascend310P3"):
    return build_om(tmp_path / f"{name}.om", soc_version=soc,
                    inputs=[tensor("x", "float32", [2, 3, 4], "ND")],
                    outputs=[tensor("y", "float32", [2, 3, 4], "ND"), tensor("s", "float32", [2], "ND")])


def affine(spec, inputs, batch):
    """y = 2x + 1, s = row sums of x (computed from the device bytes)."""
    x = np.frombuffer(inputs["x"], np.float32).reshape(2, 3, 4)
    return [(2 * x + 1).astype(np.float32).tobytes(), x.sum(axis=(1, 2)).astype(np.float32).tobytes()]


def teardown_calls(calls):
    wanted = ("acl.mdl.destroy_dataset", "acl.mdl.unload", "acl.mdl.destroy_desc", "acl.rt.destroy_stream",
              "acl.rt.destroy_context", "acl.rt.reset_device", "acl.finalize")
    return [c for c in calls if c in wanted]


# ---------------------------------------------------------------------------------------------------
# life cycle


def test_full_lifecycle_reuses_buffers_and_ends_clean(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    rng = np.random.default_rng(0)
    b = AclBackend(path, api="pyacl")
    with b:
        assert b.api_used == "pyacl"
        (x_meta,) = b.get_inputs()
        assert (x_meta.name, x_meta.shape, x_meta.dtype, x_meta.nbytes) == ("x", (2, 3, 4), np.float32, 96)
        assert [m.name for m in b.get_outputs()] == ["y", "s"]
        for _ in range(3):
            x = rng.standard_normal((2, 3, 4)).astype(np.float32)
            y, s = b.run(None, {"x": x})
            np.testing.assert_array_equal(y, 2 * x + 1)
            np.testing.assert_allclose(s, x.sum(axis=(1, 2)), rtol=1e-6)
        (s_only,) = b.run(["s"], {"x": x})
        np.testing.assert_allclose(s_only, x.sum(axis=(1, 2)), rtol=1e-6)
    calls = st(acl).calls()
    # one buffer per input and output, made once and reused by the four runs
    assert calls.count("acl.rt.malloc") == 3
    assert calls.count("acl.mdl.execute") == 4
    assert calls.count("acl.mdl.load_from_file") == 1
    st(acl).assert_clean(finalized=False)          # released; acl.finalize waits for interpreter exit
    device.finalize()
    st(acl).assert_clean()
    assert teardown_calls(st(acl).calls()) == [
        "acl.mdl.destroy_dataset", "acl.mdl.destroy_dataset", "acl.mdl.unload", "acl.mdl.destroy_desc",
        "acl.rt.destroy_stream", "acl.rt.destroy_context", "acl.rt.reset_device", "acl.finalize"]


def test_reactivation_after_close(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    x = np.ones((2, 3, 4), np.float32)
    b = AclBackend(path, api="pyacl")
    for _ in range(2):
        with b:
            assert [m.name for m in b.get_inputs()] == ["x"]
            np.testing.assert_array_equal(b.run(["y"], {"x": x})[0], 2 * x + 1)
        assert st(acl).leaks() == []
    with pytest.raises(InputError, match="inactive"):
        b.run(None, {"x": x})


def test_two_sessions_share_one_init_and_one_device_context(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    x = np.ones((2, 3, 4), np.float32)
    with AclBackend(path, api="pyacl") as a, AclBackend(path, api="pyacl") as b:
        assert device.status()["devices"] == {0: 2}
        np.testing.assert_array_equal(a.run(["y"], {"x": x})[0], b.run(["y"], {"x": x})[0])
    calls = st(acl).calls()
    assert calls.count("acl.init") == 1 and calls.count("acl.rt.set_device") == 1
    assert calls.count("acl.rt.create_context") == 1
    device.finalize()
    st(acl).assert_clean()


def test_inference_session_runs_an_om_through_the_acl_backend(acl, tmp_path):
    from npu_deploy.runtime.session import InferenceSession

    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with InferenceSession(path) as sess:
        assert sess.backend_name == "acl"
        y, s = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, 2 * x + 1)
    device.finalize()
    st(acl).assert_clean()


def test_bad_feeds_are_refused_before_any_device_copy(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    with AclBackend(path, api="pyacl") as b:
        before = len(st(acl).calls())
        with pytest.raises(InputError, match="shape"):
            b.run(None, {"x": np.zeros((2, 3, 5), np.float32)})
        with pytest.raises(InputError, match="float64"):
            b.run(None, {"x": np.zeros((2, 3, 4), np.float64)})
        with pytest.raises(InputError, match="missing"):
            b.run(None, {})
        assert st(acl).calls()[before:] == []


# ---------------------------------------------------------------------------------------------------
# layout conversion at the transfer


def nc1hwc0_by_loop(x: np.ndarray, c0: int) -> np.ndarray:
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    out = np.zeros((n, c1, h, w, c0), x.dtype)
    for i in range(n):
        for k1 in range(c1):
            for k0 in range(c0):
                ch = k1 * c0 + k0
                if ch < c:
                    for hh in range(h):
                        for ww in range(w):
                            out[i, k1, hh, ww, k0] = x[i, ch, hh, ww]
    return out


def nz_by_loop(x: np.ndarray, c0: int) -> np.ndarray:
    m, n = x.shape
    m1, n1 = -(-m // 16), -(-n // c0)
    out = np.zeros((n1, m1, 16, c0), x.dtype)
    for i in range(m):
        for j in range(n):
            out[j // c0, i // 16, i % 16, j % c0] = x[i, j]
    return out


@pytest.mark.parametrize("channels,dtype,c0", [(3, "float16", 16), (20, "float16", 16), (5, "int8", 32)])
def test_nc1hwc0_input_is_packed_and_output_unpacked(acl, tmp_path, channels, dtype, c0):
    n, h, w = 2, 3, 4
    c1 = -(-channels // c0)
    dev = [n, c1, h, w, c0]
    path = build_om(tmp_path / "m.om",
                    inputs=[tensor("x", dtype, dev, "NC1HWC0", origin_shape=[n, channels, h, w],
                                   origin_format="NCHW")],
                    outputs=[tensor("y", dtype, dev, "NC1HWC0", origin_shape=[n, channels, h, w],
                                    origin_format="NCHW")])

    def negate(spec, inputs, batch):   # elementwise on the device layout: padding stays zero
        return [(-np.frombuffer(inputs["x"], dtype)).astype(dtype).tobytes()]

    st(acl).set_compute(path, negate)
    rng = np.random.default_rng(channels)
    x = (rng.integers(-50, 50, (n, channels, h, w))).astype(dtype)
    with AclBackend(path, api="pyacl") as b:
        (meta,) = b.get_inputs()
        assert (meta.shape, meta.format, meta.device_format) == ((n, channels, h, w), "NCHW", "NC1HWC0")
        (y,) = b.run(None, {"x": x})
    assert st(acl).executions()[-1].inputs["x"] == nc1hwc0_by_loop(x, c0).tobytes()
    assert y.shape == x.shape and y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y, -x)


def test_nhwc_host_layout_is_packed_from_nhwc(acl, tmp_path):
    n, h, w, c = 1, 4, 5, 3
    path = build_om(tmp_path / "m.om",
                    inputs=[tensor("x", "float16", [n, 1, h, w, 16], "NC1HWC0", origin_shape=[n, h, w, c],
                                   origin_format="NHWC")],
                    outputs=[tensor("y", "float16", [n, 1, h, w, 16], "NC1HWC0", origin_shape=[n, h, w, c],
                                    origin_format="NHWC")])
    st(acl).set_compute(path, lambda spec, ins, batch: [bytes(ins["x"])])
    x = np.arange(n * h * w * c, dtype=np.float16).reshape(n, h, w, c)
    with AclBackend(path, api="pyacl") as b:
        assert b.get_inputs()[0].format == "NHWC"
        (y,) = b.run(None, {"x": x})
    assert st(acl).executions()[-1].inputs["x"] == nc1hwc0_by_loop(x.transpose(0, 3, 1, 2), 16).tobytes()
    np.testing.assert_array_equal(y, x)


def test_blocked_input_without_origin_shape_uses_whole_blocks(acl, tmp_path):
    path = build_om(tmp_path / "m.om", inputs=[tensor("x", "float16", [1, 2, 2, 2, 16], "NC1HWC0")],
                    outputs=[tensor("y", "float16", [1, 2, 2, 2, 16], "NC1HWC0")])
    st(acl).set_compute(path, lambda spec, ins, gear: [bytes(ins["x"])])
    x = np.arange(1 * 32 * 2 * 2, dtype=np.float16).reshape(1, 32, 2, 2)
    with AclBackend(path, api="pyacl") as b:
        assert b.get_inputs()[0].shape == (1, 32, 2, 2)      # C = C1 * C0 when the .om does not say
        (y,) = b.run(None, {"x": x})
    assert st(acl).executions()[-1].inputs["x"] == nc1hwc0_by_loop(x, 16).tobytes()
    np.testing.assert_array_equal(y, x)


def test_fractal_nz_output_is_unpacked(acl, tmp_path):
    m, n = 20, 35
    path = build_om(tmp_path / "nz.om", inputs=[tensor("a", "float16", [m, n], "ND")],
                    outputs=[tensor("b", "float16", [3, 2, 16, 16], "FRACTAL_NZ", origin_shape=[m, n],
                                    origin_format="ND")])

    def plus_one_nz(spec, inputs, batch):
        a = np.frombuffer(inputs["a"], np.float16).reshape(m, n)
        return [nz_by_loop((a + 1).astype(np.float16), 16).tobytes()]

    st(acl).set_compute(path, plus_one_nz)
    a = np.random.default_rng(1).standard_normal((m, n)).astype(np.float16)
    with AclBackend(path, api="pyacl") as b:
        assert b.get_outputs()[0].shape == (m, n)
        (out,) = b.run(None, {"a": a})
    np.testing.assert_array_equal(out, (a + 1).astype(np.float16))


def test_size_mismatch_between_description_and_dims_is_explained(acl, tmp_path):
    path = build_om(tmp_path / "bad.om", inputs=[tensor("x", "float32", [1, 3, 8, 8], "NCHW", size=100)],
                    outputs=[tensor("y", "float32", [1, 10], "ND")])
    with pytest.raises(OmError, match=r"100-byte device buffer \(acl.mdl.get_input_size_by_index\).*768"):
        AclBackend(path, api="pyacl").activate()
    device.finalize()
    st(acl).assert_clean()


# ---------------------------------------------------------------------------------------------------
# return codes -> errors, and release on every failure path


@pytest.mark.parametrize("call,code,meaning", [
    ("acl.mdl.execute", 507011, "model execution failed"),
    ("acl.rt.memcpy", 100000, "invalid parameter"),
    ("acl.mdl.execute", 507015, "AI Core exception"),
])
def test_run_failure_maps_the_code_and_the_session_recovers(acl, tmp_path, call, code, meaning):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    x = np.ones((2, 3, 4), np.float32)
    with AclBackend(path, api="pyacl") as b:
        st(acl).fail(call, code)
        with pytest.raises(AclError) as info:
            b.run(None, {"x": x})
        assert (info.value.call, info.value.code, info.value.exit_code) == (call, code, 3)
        assert f"{call} returned {code}" in str(info.value) and meaning in str(info.value)
        np.testing.assert_array_equal(b.run(["y"], {"x": x})[0], 2 * x + 1)
    device.finalize()
    st(acl).assert_clean()


@pytest.mark.parametrize("call,code,after", [
    ("acl.mdl.load_from_file", 545001, 0),
    ("acl.rt.malloc", 207001, 2),          # third allocation fails: two buffers must still be freed
    ("acl.rt.create_stream", 107002, 0),
    ("acl.mdl.get_desc", 100000, 0),
])
def test_failed_activation_releases_everything(acl, tmp_path, call, code, after):
    path = static_model(tmp_path)
    st(acl).fail(call, code, after=after)
    b = AclBackend(path, api="pyacl")
    with pytest.raises(AclError) as info:
        b.activate()
    assert info.value.code == code and info.value.call == call
    assert not b.is_active
    assert st(acl).leaks() == []
    device.finalize()
    st(acl).assert_clean()


def test_exception_inside_with_block_releases(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    with pytest.raises(RuntimeError):
        with AclBackend(path, api="pyacl") as b:
            b.run(None, {"x": np.ones((2, 3, 4), np.float32)})
            raise RuntimeError("user code failed")
    assert st(acl).leaks() == []
    device.finalize()
    st(acl).assert_clean()


def test_error_codes_table():
    from npu_deploy.runtime.acl_codes import check, describe, error_for

    assert describe(507011).meaning == "model execution failed"
    assert describe(100000).meaning == "invalid parameter"
    assert describe(107002).name == "ACL_ERROR_RT_CONTEXT_NULL"
    e = error_for("acl.mdl.load_from_file", 507008, context="m.om")
    assert "507008" in str(e) and "another SoC" in str(e) and "m.om" in str(e) and e.hint
    unknown = error_for("acl.rt.malloc", 123456)
    assert "123456" in str(unknown) and "unlisted" in str(unknown)
    check("acl.init", 0)
    with pytest.raises(AclError):
        check("acl.init", 100001)


# ---------------------------------------------------------------------------------------------------
# preflight


def test_soc_mismatch_is_reported_before_loading(acl, tmp_path):
    path = static_model(tmp_path, soc="Ascend910B1")
    st(acl).set_soc_name("Ascend310P3")
    with pytest.raises(OmError) as info:
        AclBackend(path, api="pyacl").activate()
    msg = str(info.value)
    assert "Ascend910B1" in msg and "Ascend310P3" in msg and "--soc_version=Ascend310P3" in msg
    assert info.value.exit_code == 2
    assert "acl.mdl.load_from_file" not in st(acl).calls()
    assert "acl.rt.set_device" not in st(acl).calls()
    device.finalize()
    st(acl).assert_clean()


def test_dynamic_batch_on_a_static_model_is_refused_before_acl(acl, tmp_path):
    path = static_model(tmp_path)
    with pytest.raises(InputError, match="built without dynamic batch"):
        AclBackend(path, api="pyacl", dynamic_batch=4).activate()
    assert st(acl).calls() == []


def dyn_model(tmp_path, gears=(1, 2, 4, 8)):
    return build_om(tmp_path / "dyn.om", inputs=[tensor("x", "float32", [-1, 3, 2, 2], "NCHW")],
                    outputs=[tensor("y", "float32", [-1, 12], "ND")], dynamic_batch=list(gears))


def test_batch_that_is_not_a_gear_names_the_gears(acl, tmp_path):
    path = dyn_model(tmp_path)
    with pytest.raises(InputError, match=r"batch 3 is not a gear.*\[1, 2, 4, 8\]"):
        AclBackend(path, api="pyacl", dynamic_batch=3).activate()
    with pytest.raises(InputError, match="built without dynamic dims"):
        AclBackend(path, api="pyacl", dynamic_dims=[1, 2]).activate()
    assert st(acl).calls() == []


def triple(spec, inputs, batch):
    return [(np.frombuffer(inputs["x"], np.float32) * 3).astype(np.float32).tobytes()]


def test_dynamic_batch_gear_selection(acl, tmp_path):
    path = dyn_model(tmp_path)
    st(acl).set_compute(path, triple)
    rng = np.random.default_rng(2)
    with AclBackend(path, api="pyacl", dynamic_batch=4) as b:
        (x_meta,) = b.get_inputs()
        assert x_meta.shape == (-1, 3, 2, 2) and x_meta.gears[-1] == (8, 3, 2, 2)
        for batch, gear in [(2, 2), (3, 4), (8, 8), (1, 1)]:
            x = rng.standard_normal((batch, 3, 2, 2)).astype(np.float32)
            (y,) = b.run(None, {"x": x})
            assert y.shape == (batch, 12)
            np.testing.assert_allclose(y, x.reshape(batch, 12) * 3, rtol=1e-6)
            ex = st(acl).executions()[-1]
            assert ex.batch == gear
            # the device saw the real rows then zero padding, never more than the gear
            assert len(ex.inputs["x"]) == gear * 48
            assert ex.inputs["x"][: batch * 48] == x.tobytes()
        with pytest.raises(InputError, match="gear"):
            b.run(None, {"x": np.zeros((9, 3, 2, 2), np.float32)})
    log = st(acl).call_log()
    assert [c[1] for c in log if c[0] == "acl.mdl.set_dynamic_batch_size"] == [0, 0, 0, 0]
    device.finalize()
    st(acl).assert_clean()


def test_invalid_gear_code_from_the_runtime_is_mapped(acl, tmp_path):
    path = dyn_model(tmp_path)
    st(acl).set_compute(path, triple)
    with AclBackend(path, api="pyacl") as b:
        st(acl).fail("acl.mdl.set_dynamic_batch_size", 145013)
        with pytest.raises(AclError, match="not one of the model's gears"):
            b.run(None, {"x": np.zeros((2, 3, 2, 2), np.float32)})


# ---------------------------------------------------------------------------------------------------
# threads, exit, missing dependency


def test_two_threads_share_one_session(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    errors: list[BaseException] = []
    with AclBackend(path, api="pyacl") as b:
        def worker(seed: int) -> None:
            try:
                rng = np.random.default_rng(seed)
                for _ in range(15):
                    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
                    y, s = b.run(None, {"x": x})
                    np.testing.assert_array_equal(y, 2 * x + 1)
            except BaseException as e:   # re-raised in the main thread
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,), name=f"worker-{k}") for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    seen = {e.thread for e in st(acl).executions()}
    assert seen == {"worker-0", "worker-1"}
    assert st(acl).violations() == []
    device.finalize()
    st(acl).assert_clean()


def test_two_sessions_in_two_threads(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            with AclBackend(path, api="pyacl") as b:
                rng = np.random.default_rng(seed)
                for _ in range(10):
                    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
                    np.testing.assert_array_equal(b.run(["y"], {"x": x})[0], 2 * x + 1)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and st(acl).violations() == [] and st(acl).leaks() == []
    device.finalize()
    st(acl).assert_clean()


def test_close_from_another_thread_sets_the_context_there(acl, tmp_path):
    path = static_model(tmp_path)
    b = AclBackend(path, api="pyacl")
    b.activate()
    t = threading.Thread(target=b.deactivate)
    t.start()
    t.join()
    assert st(acl).violations() == []
    device.finalize()
    st(acl).assert_clean()


@pytest.mark.parametrize("opener", [
    'b = AclBackend(PATH, api="pyacl"); b.activate()',
    'from npu_deploy.runtime.session import InferenceSession; b = InferenceSession(PATH)',
], ids=["backend", "session"])
def test_teardown_at_interpreter_exit(tmp_path, opener):
    path = static_model(tmp_path)
    log = tmp_path / "acl.log"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(STANDINS)!r})
        import numpy as np
        import acl
        from npu_deploy.runtime.acl import AclBackend
        PATH = {str(path)!r}
        {opener}
        b.run(None, {{"x": np.ones((2, 3, 4), np.float32)}})
        # exit without closing
    """)
    env = dict(os.environ, NPU_STANDIN_ACL_LOG=str(log))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=TEST_TIMEOUT)  # not the tree: it would shadow an installed package
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["event"] for r in records] == ["finalize", "exit"]
    fin = records[0]
    assert fin["leaks"] == [] and fin["violations"] == []
    end = records[1]                    # written by the stand-in's own atexit hook, after ours
    assert end["finalized"] and end["leaks"] == [] and end["violations"] == []
    assert end["calls"][-1] == "acl.finalize" and end["calls"].count("acl.finalize") == 1
    assert teardown_calls(end["calls"]) == [
        "acl.mdl.destroy_dataset", "acl.mdl.destroy_dataset", "acl.mdl.unload", "acl.mdl.destroy_desc",
        "acl.rt.destroy_stream", "acl.rt.destroy_context", "acl.rt.reset_device", "acl.finalize"]


def test_missing_pyacl_is_a_dependency_error(tmp_path):
    import importlib.util

    if importlib.util.find_spec("acl") is not None:
        pytest.skip("an `acl` module is importable in this environment")
    device.finalize()
    path = static_model(tmp_path)
    with pytest.raises(DependencyError) as info:
        AclBackend(path).activate()
    assert "set_env.sh" in str(info.value) and info.value.exit_code == 3


def test_missing_pyacl_through_the_cli_exits_3(tmp_path, run_cli):
    import importlib.util

    if importlib.util.find_spec("acl") is not None:
        pytest.skip("an `acl` module is importable in this environment")
    path = static_model(tmp_path)
    code, out, err = run_cli("run", str(path))
    assert code == 3, (out, err)
    assert "pyACL" in err and "Traceback" not in err


def test_unrelated_acl_module_is_recognised(tmp_path, monkeypatch):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "acl.py").write_text("'''a network ACL parser'''\n")
    device.finalize()
    monkeypatch.syspath_prepend(str(fake))
    sys.modules.pop("acl", None)
    try:
        with pytest.raises(DependencyError, match="not pyACL"):
            AclBackend(static_model(tmp_path)).activate()
    finally:
        sys.modules.pop("acl", None)


# ---------------------------------------------------------------------------------------------------
# acllite


def test_acllite_is_preferred_and_runs_clean(acllite, tmp_path):
    acl = acllite
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with AclBackend(path) as b:
        assert b.api_used == "acllite"
        for _ in range(2):
            y, s = b.run(None, {"x": x})
            np.testing.assert_array_equal(y, 2 * x + 1)
            np.testing.assert_allclose(s, x.sum(axis=(1, 2)))
    import acllite_model

    assert acllite_model.log == []
    device.finalize()
    st(acl).assert_clean()


def test_acllite_dynamic_batch_and_nc1hwc0(acllite, tmp_path):
    acl = acllite
    path = dyn_model(tmp_path)
    st(acl).set_compute(path, triple)
    x = np.random.default_rng(3).standard_normal((3, 3, 2, 2)).astype(np.float32)
    with AclBackend(path, api="acllite") as b:
        (y,) = b.run(None, {"x": x})
    np.testing.assert_allclose(y, x.reshape(3, 12) * 3, rtol=1e-6)
    assert st(acl).executions()[-1].batch == 4

    c = 3
    p2 = build_om(tmp_path / "5hd.om",
                  inputs=[tensor("x", "float16", [1, 1, 2, 2, 16], "NC1HWC0", origin_shape=[1, c, 2, 2],
                                 origin_format="NCHW")],
                  outputs=[tensor("y", "float16", [1, 1, 2, 2, 16], "NC1HWC0", origin_shape=[1, c, 2, 2],
                                  origin_format="NCHW")])
    st(acl).set_compute(p2, lambda spec, ins, batch: [bytes(ins["x"])])
    x2 = np.arange(12, dtype=np.float16).reshape(1, c, 2, 2)
    with AclBackend(p2, api="acllite") as b:
        (y2,) = b.run(None, {"x": x2})
    assert st(acl).executions()[-1].inputs["x"] == nc1hwc0_by_loop(x2, 16).tobytes()
    np.testing.assert_array_equal(y2, x2)
    device.finalize()
    st(acl).assert_clean()


def test_acllite_errors_become_acl_errors(acllite, tmp_path):
    acl = acllite
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    st(acl).fail("acl.mdl.load_from_file", 145002)
    with pytest.raises(AclError) as info:
        AclBackend(path, api="acllite").activate()
    assert info.value.code == 145002 and info.value.call == "acl.mdl.load_from_file"
    with AclBackend(path, api="acllite") as b:
        st(acl).fail("acl.mdl.execute", 507011)
        with pytest.raises(AclError, match="AclLiteModel.execute failed"):
            b.run(None, {"x": np.ones((2, 3, 4), np.float32)})
    device.finalize()
    st(acl).assert_clean()


def test_acllite_requested_but_missing(acl, tmp_path):
    with pytest.raises(DependencyError, match="acllite"):
        AclBackend(static_model(tmp_path), api="acllite").activate()
    device.finalize()
    st(acl).assert_clean()


# ---------------------------------------------------------------------------------------------------
# the process-wide device helper


def test_device_refcount_and_shutdown_order(acl):
    ctx = device.acquire(0)
    assert device.acquire(0) == ctx
    assert device.status() == {"initialized": True, "owns_finalize": True, "finalized": False,
                               "devices": {0: 2}, "open": 0}
    device.release(0)
    assert "acl.rt.destroy_context" not in st(acl).calls()
    device.release(0)
    assert [c for c in st(acl).calls() if c.startswith(("acl.rt.destroy", "acl.rt.reset"))] == [
        "acl.rt.destroy_context", "acl.rt.reset_device"]
    assert device.shutdown() == []
    assert "acl.finalize" not in st(acl).calls()          # finalize only at exit
    st(acl).assert_clean(finalized=False)
    assert device.finalize() == []
    assert st(acl).calls()[-1] == "acl.finalize"
    st(acl).assert_clean()
    assert device.finalize() == []                        # idempotent
    assert st(acl).calls().count("acl.finalize") == 1


def test_acl_initialised_by_someone_else_is_not_finalised_by_us(acl):
    assert acl.init() == 0                                # e.g. user code or another library
    device.acquire(0)
    device.release(0)
    device.finalize()
    assert "acl.finalize" not in st(acl).calls()
    assert st(acl).leaks() == []


def test_invalid_device_id(acl, tmp_path):
    with pytest.raises(AclError, match=r"acl.rt.set_device returned 107001.*invalid device id.*device 3"):
        AclBackend(static_model(tmp_path), device_id=3, api="pyacl").activate()
    device.finalize()
    st(acl).assert_clean()


def test_dropped_backend_is_closed_at_shutdown(acl, tmp_path):
    path = static_model(tmp_path)
    b = AclBackend(path, api="pyacl")
    b.activate()
    del b
    import gc

    gc.collect()
    assert device.status()["open"] == 1
    assert device.shutdown() == []
    st(acl).assert_clean(finalized=False)
    assert device.status()["open"] == 0 and device.status()["devices"] == {}


def test_device_run_mode_copies_device_to_device(acl, tmp_path):
    st(acl).reset(run_mode=0)
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with AclBackend(path, api="pyacl") as b:
        y, _ = b.run(None, {"x": x})
    np.testing.assert_array_equal(y, 2 * x + 1)
    device.finalize()
    st(acl).assert_clean()


def test_stand_in_refuses_init_after_finalize(acl):
    """The oracle of the next test: pyACL allows one init/finalize per process."""
    assert acl.init() == 0 and acl.finalize() == 0
    acl.init()
    assert any("acl.init after acl.finalize" in v for v in st(acl).violations())
    assert acl.rt.set_device(0) == 100001                 # nothing works again


def test_shutdown_keeps_acl_initialised_and_the_next_session_does_not_init_again(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    x = np.ones((2, 3, 4), np.float32)
    for _ in range(2):                                    # the old shutdown() finalised: init ran twice
        with AclBackend(path, api="pyacl") as b:
            np.testing.assert_array_equal(b.run(["y"], {"x": x})[0], 2 * x + 1)
        assert device.shutdown() == []
        assert "acl.finalize" not in st(acl).calls()
    calls = st(acl).calls()
    assert calls.count("acl.init") == 1 and calls.count("acl.rt.set_device") == 2
    assert st(acl).violations() == []
    device.finalize()
    st(acl).assert_clean()


def test_after_finalize_acquire_refuses_instead_of_initialising_again(acl, tmp_path):
    device.acquire(0)
    device.release(0)
    device.finalize()
    with pytest.raises(AclError, match="finalised in this process") as info:
        AclBackend(static_model(tmp_path), api="pyacl").activate()
    assert info.value.exit_code == 3
    assert st(acl).calls().count("acl.init") == 1 and st(acl).violations() == []


def _own_context(acl):
    """What user code (or another library) does before using npu-deploy: its own device context."""
    assert acl.init() in (0, 100002) and acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.create_context(0)
    assert ret == 0
    return ctx


def _drop_own_context(acl, ctx):
    assert acl.rt.destroy_context(ctx) == 0 and acl.rt.reset_device(0) == 0


def test_the_callers_context_is_current_again_after_open_run_and_close(acl, tmp_path):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    mine = _own_context(acl)
    x = np.ones((2, 3, 4), np.float32)
    with AclBackend(path, api="pyacl") as b:
        assert acl.rt.get_context() == (mine, 0)          # after activation
        b.run(None, {"x": x})
        assert acl.rt.get_context() == (mine, 0)          # after a run
    # the old code left the thread on the destroyed session context here (get_context: no context)
    assert acl.rt.get_context() == (mine, 0)
    ptr, ret = acl.rt.malloc(64, 0)                       # the caller's own work goes on, in its context
    assert ret == 0 and acl.rt.free(ptr) == 0
    assert st(acl).violations() == []
    _drop_own_context(acl, mine)
    device.finalize()                                     # the user initialised ACL: the user finalises
    assert "acl.finalize" not in st(acl).calls() and acl.finalize() == 0
    st(acl).assert_clean()


def test_shutdown_with_sessions_open_leaves_the_callers_context_current(acl, tmp_path):
    path = static_model(tmp_path)
    mine = _own_context(acl)
    AclBackend(path, api="pyacl").activate()             # left open: shutdown closes it
    assert device.shutdown() == []
    assert acl.rt.get_context() == (mine, 0) and st(acl).violations() == []
    _drop_own_context(acl, mine)
    assert acl.finalize() == 0                            # the user initialised ACL
    st(acl).assert_clean()


def test_a_worker_thread_is_not_left_on_a_destroyed_context(acl, tmp_path):
    """Thread B runs a session that thread A owns, then A closes it: B must still be on its own
    context, not on the session's (destroyed) one."""
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    b = AclBackend(path, api="pyacl")
    b.activate()
    ran, closed, out = threading.Event(), threading.Event(), {}

    def worker():
        assert acl.rt.set_device(0) == 0                  # B's own device reference and context
        mine, ret = acl.rt.create_context(0)
        out["mine"] = mine
        b.run(None, {"x": np.ones((2, 3, 4), np.float32)})
        out["after_run"] = acl.rt.get_context()
        ran.set()
        closed.wait(10)
        ptr, ret = acl.rt.malloc(64, 0)                   # the old code: a use of a destroyed context
        out["malloc"] = ret
        if ret == 0:
            acl.rt.free(ptr)
        acl.rt.destroy_context(mine)
        acl.rt.reset_device(0)

    t = threading.Thread(target=worker, name="worker-B")
    t.start()
    ran.wait(10)
    b.deactivate()
    closed.set()
    t.join(10)
    assert out["after_run"] == (out["mine"], 0)
    assert out["malloc"] == 0 and st(acl).violations() == []
    device.finalize()
    st(acl).assert_clean()


def test_stand_in_flags_any_use_of_a_destroyed_context(acl):
    """Oracle: a thread whose current context another thread destroyed still names it, and using it
    is a violation."""
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    ctx, _ = acl.rt.create_context(0)
    t = threading.Thread(target=lambda: acl.rt.destroy_context(ctx))
    t.start()
    t.join()
    assert acl.rt.get_context() == (ctx, 0)               # the stale handle
    assert acl.rt.malloc(64, 0) == (0, 107002)
    assert any("was destroyed" in v for v in st(acl).violations())
    acl.rt.reset_device(0)


# ---------------------------------------------------------------------------------------------------
# a real model behind the stand-in: ppocr_cls "compiled" with an NC1HWC0 fp16 input and batch gears


@pytest.mark.realmodel
def test_real_model_through_nc1hwc0_fp16_input_and_batch_gears(acl, tmp_path, real_model):
    import onnxruntime as ort

    onnx_path = real_model("ppocr_cls")
    ref = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    out_name = ref.get_outputs()[0].name
    h, w = 48, 192
    path = build_om(tmp_path / "cls.om",
                    inputs=[tensor("x", "float16", [-1, 1, h, w, 16], "NC1HWC0", origin_shape=[-1, 3, h, w],
                                   origin_format="NCHW")],
                    outputs=[tensor(out_name, "float32", [-1, 2], "ND")], dynamic_batch=[1, 2, 4])

    def run_onnx(spec, inputs, batch):
        # what the device would compute: read the 5HD fp16 bytes back to NCHW independently, run the model
        phys = np.frombuffer(inputs["x"], np.float16).reshape(batch, 1, h, w, 16)
        nchw = np.ascontiguousarray(phys[..., :3].transpose(0, 4, 2, 3, 1)[..., 0]).astype(np.float32)
        return [ref.run(None, {"x": nchw})[0].astype(np.float32).tobytes()]

    st(acl).set_compute(path, run_onnx)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 3, h, w)).astype(np.float16)
    with AclBackend(path, api="pyacl") as b:
        (x_meta,) = b.get_inputs()
        assert (x_meta.shape, x_meta.dtype, x_meta.device_format) == ((-1, 3, h, w), np.float16, "NC1HWC0")
        (probs,) = b.run(None, {"x": x})
    assert st(acl).executions()[-1].batch == 4
    expected = ref.run(None, {"x": x.astype(np.float32)})[0]
    assert probs.shape == (3, 2)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)
    device.finalize()
    st(acl).assert_clean()


def test_cli_run_on_an_om_with_the_standin(acl, tmp_path, run_cli):
    path = dyn_model(tmp_path)
    st(acl).set_compute(path, triple)
    x = np.random.default_rng(5).standard_normal((2, 3, 2, 2)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--loop", "3",
                                   "--output", str(out))
    assert code == 0, (stdout, stderr)
    assert "backend: acl" in stdout
    np.testing.assert_allclose(np.load(out / "y.npy", allow_pickle=False), x.reshape(2, 12) * 3, rtol=1e-6)
    assert st(acl).calls().count("acl.mdl.load_from_file") == 1
    assert st(acl).leaks() == []


def test_cli_reports_a_device_error_in_one_line(acl, tmp_path, run_cli):
    path = static_model(tmp_path)
    st(acl).set_compute(path, affine)
    st(acl).fail("acl.mdl.execute", 507011, times=100)
    code, stdout, stderr = run_cli("run", str(path), "--loop", "2")
    assert code == 3
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "acl.mdl.execute returned 507011" in lines[0] and "Traceback" not in stderr
    assert st(acl).leaks() == []


def test_missing_or_foreign_file_is_refused_before_acl(acl, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        AclBackend(tmp_path / "nope.om").activate()
    junk = tmp_path / "junk.om"
    junk.write_bytes(b"\0" * 300)
    with pytest.raises(OmError):
        AclBackend(junk).activate()
    assert st(acl).calls() == []


# ---------------------------------------------------------------------------------------------------
# dynamic image size and dynamic dims


def test_dynamic_hw_gears(acl, tmp_path):
    path = build_om(tmp_path / "hw.om", inputs=[tensor("x", "float32", [1, 3, -1, -1], "NCHW")],
                    outputs=[tensor("y", "float32", [1, 3, -1, -1], "NCHW")], dynamic_hw=[[4, 4], [8, 6]])

    def double(spec, inputs, gear):
        assert isinstance(gear, tuple) and len(gear) == 2
        return [(np.frombuffer(inputs["x"], np.float32) * 2).tobytes()]

    st(acl).set_compute(path, double)
    rng = np.random.default_rng(4)
    with AclBackend(path, api="pyacl") as b:
        assert b.get_inputs()[0].gears == ((1, 3, 4, 4), (1, 3, 8, 6))
        assert b.get_outputs()[0].shape == (1, 3, -1, -1)
        for h, w in [(8, 6), (4, 4)]:
            x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
            (y,) = b.run(None, {"x": x})
            np.testing.assert_array_equal(y, 2 * x)
            assert st(acl).executions()[-1].gear == (h, w)
        with pytest.raises(InputError, match="gear"):
            b.run(None, {"x": np.zeros((1, 3, 5, 5), np.float32)})
    assert [c[1] for c in st(acl).call_log() if c[0] == "acl.mdl.set_dynamic_hw_size"] == [0, 0]
    device.finalize()
    st(acl).assert_clean()


def test_dynamic_hw_with_nc1hwc0_layout(acl, tmp_path):
    path = build_om(tmp_path / "hw5.om",
                    inputs=[tensor("x", "float16", [1, 1, -1, -1, 16], "NC1HWC0", origin_shape=[1, 3, -1, -1],
                                   origin_format="NCHW")],
                    outputs=[tensor("y", "float16", [1, 1, -1, -1, 16], "NC1HWC0", origin_shape=[1, 3, -1, -1],
                                    origin_format="NCHW")], dynamic_hw=[[2, 3], [4, 5]])
    st(acl).set_compute(path, lambda spec, ins, gear: [bytes(ins["x"])])
    x = np.arange(1 * 3 * 2 * 3, dtype=np.float16).reshape(1, 3, 2, 3)
    with AclBackend(path, api="pyacl") as b:
        (y,) = b.run(None, {"x": x})
    assert st(acl).executions()[-1].inputs["x"] == nc1hwc0_by_loop(x, 16).tobytes()
    np.testing.assert_array_equal(y, x)


def test_dynamic_dims_gears(acl, tmp_path):
    path = build_om(tmp_path / "dims.om",
                    inputs=[tensor("a", "float32", [-1, 4], "ND"), tensor("b", "float32", [2, -1], "ND")],
                    outputs=[tensor("y", "float32", [-1, -1], "ND")], dynamic_dims=[[1, 3], [2, 5]])

    def combine(spec, inputs, gear):
        g0, g1 = gear
        a = np.frombuffer(inputs["a"], np.float32).reshape(g0, 4)
        b = np.frombuffer(inputs["b"], np.float32).reshape(2, g1)
        return [(a.sum(axis=1)[:, None] + b[0][None, :]).astype(np.float32).tobytes()]

    st(acl).set_compute(path, combine)
    rng = np.random.default_rng(6)
    with AclBackend(path, api="pyacl", dynamic_dims=[2, 5]) as b:
        assert b.get_outputs()[0].shape == (-1, -1)
        for g0, g1 in [(2, 5), (1, 3)]:
            a = rng.standard_normal((g0, 4)).astype(np.float32)
            bb = rng.standard_normal((2, g1)).astype(np.float32)
            (y,) = b.run(None, {"a": a, "b": bb})
            np.testing.assert_allclose(y, a.sum(axis=1)[:, None] + bb[0][None, :], rtol=1e-6)
            assert st(acl).executions()[-1].gear == (g0, g1)
    with pytest.raises(InputError, match=r"dims \[1, 5\] are not a gear"):
        AclBackend(path, api="pyacl", dynamic_dims=[1, 5]).activate()
    device.finalize()
    st(acl).assert_clean()


def test_acllite_is_bypassed_for_hw_models(acllite, tmp_path):
    acl = acllite
    path = build_om(tmp_path / "hw.om", inputs=[tensor("x", "float32", [1, 3, -1, -1], "NCHW")],
                    outputs=[tensor("y", "float32", [1, 3, -1, -1], "NCHW")], dynamic_hw=[[4, 4], [8, 6]])
    with pytest.raises(InputError, match="acllite has no API"):
        AclBackend(path, api="acllite").activate()
    with AclBackend(path) as b:
        assert b.api_used == "pyacl"
    device.finalize()
    st(acl).assert_clean()


def test_random_nc1hwc0_shapes_reach_the_device_packed(acl, tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    counter = iter(range(10_000))

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(n=hs.integers(1, 2), c=hs.integers(1, 40), h=hs.integers(1, 3), w=hs.integers(1, 3),
           dtype=hs.sampled_from(["float16", "float32", "int8", "uint8"]))
    def check(n, c, h, w, dtype):
        c0 = 32 if np.dtype(dtype).itemsize == 1 else 16
        dev = [n, -(-c // c0), h, w, c0]
        path = build_om(tmp_path / f"r{next(counter)}.om",
                        inputs=[tensor("x", dtype, dev, "NC1HWC0", origin_shape=[n, c, h, w], origin_format="NCHW")],
                        outputs=[tensor("y", dtype, dev, "NC1HWC0", origin_shape=[n, c, h, w], origin_format="NCHW")])
        st(acl).set_compute(path, lambda spec, ins, gear: [bytes(ins["x"])])
        x = np.random.default_rng(c).integers(0, 100, (n, c, h, w)).astype(dtype)
        with AclBackend(path, api="pyacl") as b:
            (y,) = b.run(None, {"x": x})
        assert st(acl).executions()[-1].inputs["x"] == nc1hwc0_by_loop(x, c0).tobytes()
        np.testing.assert_array_equal(y, x)

    check()
    device.finalize()
    st(acl).assert_clean()


# ---------------------------------------------------------------------------------------------------
# shape-range (dynamic shape) .om: tensor descs per run (pyACL "Dynamic Shape Input (Setting the Shape
# Range)"; reference §3.6). The stand-in refuses a run without a desc per input, or outside the range.

X_RANGE = [[1, 4], [3, 3], [2, 8]]


def range_model(tmp_path, name="r", out_range=True):
    """x: float32 [1~4, 3, 2~8] -> y = 2x + 1 (same shape), s = sums over axis 1 ([1~4, 2~8])."""
    return build_om(tmp_path / f"{name}.om", is_unknown_model=1,
                    inputs=[tensor("x", "float32", [-1, 3, -1], "ND", shape_range=X_RANGE)],
                    outputs=[tensor("y", "float32", [-1, 3, -1], "ND", shape_range=X_RANGE if out_range else None),
                             tensor("s", "float32", [-1, -1], "ND",
                                    shape_range=[[1, 4], [2, 8]] if out_range else None)])


def affine_any(spec, inputs, gear):
    """The device side of range_model, from the bytes and the gear (the actual n, w) alone."""
    n, w = gear
    x = np.frombuffer(inputs["x"], np.float32).reshape(n, 3, w)
    return [(2 * x + 1).astype(np.float32).tobytes(), x.sum(axis=1).astype(np.float32).tobytes()]


def test_shape_range_om_runs_every_shape_inside_its_range(acl, tmp_path):
    path = range_model(tmp_path)
    st(acl).set_compute(path, affine_any)
    rng = np.random.default_rng(3)
    shapes = [(1, 3, 2), (4, 3, 8), (2, 3, 5), (4, 3, 8)]
    with AclBackend(path, api="pyacl") as b:
        (x_meta,) = b.get_inputs()
        assert x_meta.shape == (-1, 3, -1) and x_meta.nbytes == 4 * 3 * 8 * 4   # largest shape of the range
        assert b.ranges == {"x": ((1, 4), None, (2, 8))}
        assert [m.nbytes for m in b.get_outputs()] == [4 * 3 * 8 * 4, 4 * 8 * 4]
        for shape in shapes:
            x = rng.standard_normal(shape).astype(np.float32)
            y, s = b.run(None, {"x": x})
            assert y.shape == shape and s.shape == (shape[0], shape[2])
            np.testing.assert_array_equal(y, 2 * x + 1)
            np.testing.assert_allclose(s, x.sum(axis=1), rtol=1e-6)
            assert st(acl).executions()[-1].gear == (shape[0], shape[2])
    calls = st(acl).calls()
    assert calls.count("acl.create_tensor_desc") == calls.count("acl.destroy_tensor_desc") == len(shapes)
    assert calls.count("acl.mdl.set_dataset_tensor_desc") == len(shapes)
    assert calls.count("acl.rt.malloc") == 3                       # buffers made once, for the largest shape
    # the desc is set after the input copy and before execute, destroyed after it
    first = calls.index("acl.mdl.execute")
    assert calls.index("acl.rt.memcpy") < calls.index("acl.mdl.set_dataset_tensor_desc") < first
    assert calls.index("acl.destroy_tensor_desc") > first
    device.finalize()
    st(acl).assert_clean()


@pytest.mark.parametrize("shape, axis", [((5, 3, 4), 0), ((2, 3, 9), 2), ((2, 3, 1), 2)])
def test_shape_outside_the_range_is_refused_naming_input_and_range(acl, tmp_path, shape, axis):
    path = range_model(tmp_path)
    st(acl).set_compute(path, affine_any)
    with AclBackend(path, api="pyacl") as b:
        before = len(st(acl).calls())
        with pytest.raises(InputError) as e:
            b.run(None, {"x": np.zeros(shape, np.float32)})
        assert st(acl).calls()[before:] == []                        # nothing reached the device
        (b_ok,) = b.run(["s"], {"x": np.ones((1, 3, 2), np.float32)})  # and the backend still runs
    assert "'x'" in e.value.message and "1~4,3,2~8" in e.value.message and f"axis {axis}" in e.value.message
    assert e.value.exit_code == 2
    np.testing.assert_array_equal(b_ok, np.full((1, 2), 3, np.float32))
    device.finalize()
    st(acl).assert_clean()


def test_shape_range_om_through_inference_session_and_cli(acl, tmp_path, run_cli):
    from npu_deploy.runtime.session import InferenceSession

    path = range_model(tmp_path)
    st(acl).set_compute(path, affine_any)
    x = np.arange(2 * 3 * 7, dtype=np.float32).reshape(2, 3, 7)
    with InferenceSession(path) as sess:
        assert sess.backend_name == "acl"
        (inp,) = sess.get_inputs()
        assert inp.shape == [None, 3, None]          # an .om does not name its dims: None, as onnxruntime
        assert [o.shape for o in sess.get_outputs()] == [[None, 3, None], [None, None]]
        assert sess.ranges == {"x": ((1, 4), None, (2, 8))}
        y, s = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, 2 * x + 1)
        with pytest.raises(InputError, match=r"outside the range 1~4,3,2~8"):
            sess.run(None, {"x": np.zeros((8, 3, 7), np.float32)})
    np.save(tmp_path / "x.npy", np.zeros((6, 3, 7), np.float32))
    code, stdout, stderr = run_cli("run", str(path), "--input", f"x={tmp_path / 'x.npy'}")
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "1~4,3,2~8" in lines[0] and "Traceback" not in stderr
    device.finalize()
    st(acl).assert_clean()


def test_acllite_is_bypassed_for_shape_range_models(acllite, tmp_path):
    path = range_model(tmp_path)
    st(acllite).set_compute(path, affine_any)
    with AclBackend(path) as b:                       # auto: acllite has no tensor-desc API
        assert b.api_used == "pyacl"
        y, _ = b.run(None, {"x": np.ones((3, 3, 4), np.float32)})
        assert y.shape == (3, 3, 4)
    with pytest.raises(InputError, match="acllite has no API for dynamic shape"):
        AclBackend(path, api="acllite").activate()
    device.finalize()
    st(acllite).assert_clean()


def test_unbounded_range_grows_the_input_buffer_and_needs_output_bytes(acl, tmp_path):
    path = build_om(tmp_path / "u.om", is_unknown_model=1,
                    inputs=[tensor("x", "float32", [-1, 4], "ND", shape_range=[[1, -1], [4, 4]])],
                    outputs=[tensor("y", "float32", [-1, 4], "ND")])
    st(acl).set_compute(path, lambda spec, ins, gear: [bytes(ins["x"])])
    with pytest.raises(OmError, match=r"output 'y'.*output_bytes"):
        AclBackend(path, api="pyacl").activate()
    with AclBackend(path, api="pyacl", output_bytes={"y": 64 * 4 * 4}) as b:
        assert b.ranges == {"x": ((1, -1), None)}
        for n in (2, 9, 64, 3):
            x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
            (y,) = b.run(None, {"x": x})
            np.testing.assert_array_equal(y, x)
        # beyond the output size it was given: the device refuses the run (as ACL would), named
        with pytest.raises(AclError, match="acl.mdl.execute returned 100000"):
            b.run(None, {"x": np.zeros((65, 4), np.float32)})
    assert "output 'y' buffer is 1024 bytes, shape [65, 4] needs 1040" in st(acl).violations()[-1]
    calls = st(acl).calls()
    assert calls.count("acl.update_data_buffer") == 4             # 0 -> 2 -> 9 -> 64 -> 65 rows; 3 fits
    assert st(acl).leaks() == []


def test_ranges_are_read_from_acl_when_it_has_get_input_dims_range(acl, tmp_path, monkeypatch):
    # the .om's attribute and ACL's answer differ on purpose: ACL's wins when the call exists
    path = range_model(tmp_path)
    st(acl).set_compute(path, affine_any)
    real = acl.mdl.get_input_dims_range

    def narrower(desc, i):
        d, ret = real(desc, i)
        return {"rangeCount": 3, "range": [[1, 2], [3, 3], [2, 8]]}, ret

    monkeypatch.setattr(acl.mdl, "get_input_dims_range", narrower)
    with AclBackend(path, api="pyacl") as b:
        assert b.ranges == {"x": ((1, 2), None, (2, 8))}
        with pytest.raises(InputError, match="1~2,3,2~8"):
            b.run(None, {"x": np.zeros((3, 3, 4), np.float32)})
    monkeypatch.delattr(acl.mdl, "get_input_dims_range")          # older pyACL: the .om's shape_range
    with AclBackend(path, api="pyacl") as b:
        assert b.ranges == {"x": ((1, 4), None, (2, 8))}
    device.finalize()
    st(acl).assert_clean()


# the stand-in's own rules for shape-range models, driven through raw pyACL calls


def _open_raw(acl, path):
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    ctx, _ = acl.rt.create_context(0)
    mid, ret = acl.mdl.load_from_file(str(path))
    assert ret == 0
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, mid) == 0
    sizes = {"x": 4 * 3 * 8 * 4, "y": 4 * 3 * 8 * 4, "s": 4 * 8 * 4}
    ds, ptrs = {}, []
    for kind, names in (("in", ["x"]), ("out", ["y", "s"])):
        ds[kind] = acl.mdl.create_dataset()
        for n in names:
            p, ret = acl.rt.malloc(sizes[n], 0)
            ptrs.append(p)
            buf = acl.create_data_buffer(p, sizes[n])
            acl.mdl.add_dataset_buffer(ds[kind], buf)
    return ctx, mid, desc, ds, ptrs


def _close_raw(acl, ctx, mid, desc, ds, ptrs):
    for d in ds.values():
        for k in range(acl.mdl.get_dataset_num_buffers(d)):
            acl.destroy_data_buffer(acl.mdl.get_dataset_buffer(d, k))
        acl.mdl.destroy_dataset(d)
    for p in ptrs:
        acl.rt.free(p)
    acl.mdl.unload(mid)
    acl.mdl.destroy_desc(desc)
    acl.rt.destroy_context(ctx)
    acl.rt.reset_device(0)


def test_standin_refuses_a_range_run_without_a_desc_or_outside_the_range(acl, tmp_path):
    path = range_model(tmp_path)
    ctx, mid, desc, ds, ptrs = _open_raw(acl, path)
    assert acl.mdl.get_input_size_by_index(desc, 0) == 0         # "0: the input shape is dynamic"
    assert acl.mdl.get_input_dims(desc, 0)[0]["dims"] == [-1, 3, -1]
    assert acl.mdl.get_input_dims_range(desc, 0) == ({"rangeCount": 3, "range": X_RANGE}, 0)
    assert acl.mdl.execute(mid, ds["in"], ds["out"]) == 100000   # no tensor desc for the input
    assert "has no tensor desc" in st(acl).violations()[-1]
    td = acl.create_tensor_desc(0, [5, 3, 4], 2)
    assert acl.mdl.set_dataset_tensor_desc(ds["in"], td, 0)[1] == 0
    acl.destroy_tensor_desc(td)
    assert acl.mdl.execute(mid, ds["in"], ds["out"]) == 100000   # 5 is outside 1~4
    assert "outside its range 1~4" in st(acl).violations()[-1]
    td = acl.create_tensor_desc(0, [2, 3, 6], 2)
    acl.mdl.set_dataset_tensor_desc(ds["in"], td, 0)
    acl.destroy_tensor_desc(td)
    assert acl.mdl.execute(mid, ds["in"], ds["out"]) == 0        # the dataset kept its copy of the desc
    out = [acl.mdl.get_dataset_tensor_desc(ds["out"], j) for j in range(2)]
    got = [[acl.get_tensor_desc_dim_v2(o, k)[0] for k in range(acl.get_tensor_desc_num_dims(o))] for o in out]
    assert got == [[2, 3, 6], [2, 6]]                            # outputs written for the given input shape
    acl.destroy_tensor_desc(out[0])                              # not the caller's to destroy
    assert "belongs to dataset" in st(acl).violations()[-1]
    _close_raw(acl, ctx, mid, desc, ds, ptrs)


def test_standin_reports_leaked_tensor_descs_at_finalize(acl, tmp_path):
    path = range_model(tmp_path)
    ctx, mid, desc, ds, ptrs = _open_raw(acl, path)
    td = acl.create_tensor_desc(0, [1, 3, 2], 2)
    acl.mdl.set_dataset_tensor_desc(ds["in"], td, 0)
    assert acl.mdl.execute(mid, ds["in"], ds["out"]) == 0
    _close_raw(acl, ctx, mid, desc, ds, ptrs)
    assert st(acl).leaks() == [f"tensor desc {hex(td)} [1, 3, 2] not destroyed (acl.destroy_tensor_desc)"]
    assert acl.finalize() == 0
    assert any("never destroyed" in v for v in st(acl).violations())
    with pytest.raises(AssertionError, match="tensor desc"):
        st(acl).assert_clean()
    _purge_standins()   # the fixture's own check would see the same leak; this stand-in is done


@pytest.mark.realmodel
def test_real_model_behind_a_shape_range_om(acl, tmp_path, real_model):
    """PP-OCR cls "compiled" with a batch and width range; each run is the onnxruntime model on the
    bytes the device got, the result compared with onnxruntime on the host array."""
    import onnxruntime as ort

    onnx_path = real_model("ppocr_cls")
    ref = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    out_name = ref.get_outputs()[0].name
    path = build_om(tmp_path / "cls_range.om", is_unknown_model=1,
                    inputs=[tensor("x", "float32", [-1, 3, 48, -1], "NCHW",
                                   shape_range=[[1, 4], [3, 3], [48, 48], [96, 320]])],
                    outputs=[tensor(out_name, "float32", [-1, 2], "ND", shape_range=[[1, 4], [2, 2]])])

    def run_onnx(spec, inputs, gear):
        n, w = gear
        x = np.frombuffer(inputs["x"], np.float32).reshape(n, 3, 48, w)
        return [ref.run(None, {"x": x})[0].astype(np.float32).tobytes()]

    st(acl).set_compute(path, run_onnx)
    rng = np.random.default_rng(11)
    with AclBackend(path, api="pyacl") as b:
        for n, w in ((1, 96), (3, 192), (4, 320)):
            x = rng.standard_normal((n, 3, 48, w)).astype(np.float32)
            (probs,) = b.run(None, {"x": x})
            assert probs.shape == (n, 2)
            np.testing.assert_allclose(probs, ref.run(None, {"x": x})[0], rtol=1e-6, atol=1e-7)
        with pytest.raises(InputError, match="48,96~320"):
            b.run(None, {"x": np.zeros((1, 3, 48, 400), np.float32)})
    device.finalize()
    st(acl).assert_clean()
