"""The shared backend base: feed validation, lossless casts, gears, padding, timing hooks, life cycle."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from npu_deploy.errors import InputError, InternalError
from npu_deploy.runtime.backend import Backend, Gear, TensorMeta, lossless_cast_allowed


class Recorder(Backend):
    """A backend that records what reaches ``_run_validated`` and returns simple functions of it."""

    name = "recorder"

    def __init__(self, inputs, outputs, fn):
        super().__init__()
        self._inputs, self._outputs, self._fn = inputs, outputs, fn
        self.calls: list[tuple[list[str], dict, Gear | None]] = []
        self.activations = 0
        self.deactivations = 0

    def _activate(self):
        self.activations += 1

    def _deactivate(self):
        self.deactivations += 1

    def get_inputs(self):
        return self._inputs

    def get_outputs(self):
        return self._outputs

    def _run_validated(self, output_names, feeds, *, gear):
        self.calls.append((output_names, feeds, gear))
        with self._phase("h2d"):
            pass
        with self._phase("compute"):
            outs = self._fn(feeds)
        with self._phase("d2h"):
            return [outs[n] for n in output_names]


def two_in():
    ins = [TensorMeta("a", (2, 3), np.float32), TensorMeta("b", (2, 3), np.int64)]
    outs = [TensorMeta("sum", (2, 3), np.float32), TensorMeta("prod", (2, 3), np.float32)]
    return Recorder(ins, outs, lambda f: {"sum": f["a"] + f["b"], "prod": f["a"] * f["b"]})


def test_refuses_when_inactive():
    b = two_in()
    with pytest.raises(InputError, match="inactive"):
        b.run(None, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.int64)})
    with b:
        b.run(None, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.int64)})
    with pytest.raises(InputError, match="inactive"):
        b.run(None, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.int64)})
    assert (b.activations, b.deactivations) == (1, 1)


def test_activate_deactivate_idempotent():
    b = two_in()
    b.activate(); b.activate()
    b.deactivate(); b.deactivate()
    assert (b.activations, b.deactivations) == (1, 1)


def test_failed_activate_releases():
    class Failing(Recorder):
        def _activate(self):
            raise RuntimeError("load failed")
    b = Failing([], [], None)
    with pytest.raises(RuntimeError):
        b.activate()
    assert not b.is_active and b.deactivations == 1


def test_outputs_order_and_subset():
    b = two_in()
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    c = np.full((2, 3), 2, np.int64)
    with b:
        prod, s = b.run(["prod", "sum"], {"a": a, "b": c})
        only = b.run("sum", {"a": a, "b": c})
    np.testing.assert_array_equal(prod, a * 2)
    np.testing.assert_array_equal(s, a + 2)
    assert len(only) == 1


@pytest.mark.parametrize("feeds, match", [
    ({"a": np.zeros((2, 3), np.float32)}, "missing input.*'b'"),
    ({"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.int64), "c": 1}, "unknown input.*'c'"),
    ({"a": np.zeros((2, 3), np.float64), "b": np.zeros((2, 3), np.int64)}, "float64 cannot be converted.*float32"),
    ({"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.float32)}, "float32 cannot be converted.*int64"),
    ({"a": np.zeros((2, 3, 1), np.float32), "b": np.zeros((2, 3), np.int64)}, "rank 3"),
    ({"a": np.zeros((2, 4), np.float32), "b": np.zeros((2, 3), np.int64)}, r"axis 1: 4 != 3"),
    ({"a": np.array(["x"] * 6).reshape(2, 3), "b": np.zeros((2, 3), np.int64)}, "cannot be converted"),
])
def test_bad_feeds_are_input_errors(feeds, match):
    b = two_in()
    with b, pytest.raises(InputError, match=match):
        b.run(None, feeds)
    assert b.calls == []  # nothing reached the "device"


def test_bad_output_name():
    b = two_in()
    with b, pytest.raises(InputError, match="unknown output.*'nope'.*sum, prod"):
        b.run(["nope"], {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.int64)})


def test_feeds_not_a_dict():
    b = two_in()
    with b, pytest.raises(InputError, match="dict"):
        b.run(None, [np.zeros((2, 3), np.float32)])


@pytest.mark.parametrize("src, dst, ok", [
    ("int32", "int64", True), ("int8", "int32", True), ("uint8", "int16", True), ("float16", "float32", True),
    ("bool", "float32", True), ("int32", "float64", True), ("int64", "int32", False), ("float32", "float16", False),
    ("float64", "float32", False), ("int64", "float64", False), ("uint32", "int32", False), ("float32", "int64", False),
])
def test_lossless_cast_table(src, dst, ok):
    assert lossless_cast_allowed(np.dtype(src), np.dtype(dst)) is ok
    # the oracle: a lossless cast round-trips the extreme values of the source type
    if ok and np.dtype(src).kind in "iu":
        info = np.iinfo(src)
        x = np.array([info.min, info.max], dtype=src)
        assert np.array_equal(x.astype(dst).astype(src), x)


def test_lossless_cast_applied_and_contiguous():
    b = two_in()
    a16 = np.asfortranarray(np.arange(6, dtype=np.float16).reshape(2, 3))
    with b:
        b.run(None, {"a": a16, "b": np.ones((2, 3), np.int32)})
    _, feeds, _ = b.calls[0]
    assert feeds["a"].dtype == np.float32 and feeds["a"].flags.c_contiguous
    assert feeds["b"].dtype == np.int64
    np.testing.assert_array_equal(feeds["a"], a16.astype(np.float32))


def geared(pad=True):
    ins = [TensorMeta("x", (-1, 3), np.float32, gears=((1, 3), (4, 3), (8, 3))),
           TensorMeta("m", (-1,), np.int64, gears=((1,), (4,), (8,))),
           TensorMeta("k", (5,), np.float32)]
    outs = [TensorMeta("y", (-1, 3), np.float32), TensorMeta("s", (1,), np.float32)]
    b = Recorder(ins, outs, lambda f: {"y": f["x"] * 2 + f["m"][:, None],
                                       "s": np.array([f["x"].shape[0]], np.float32)})
    b.pad_to_gear = pad
    return b


def test_gears_listing():
    b = geared()
    assert b.gears() == [{"x": (1, 3), "m": (1,)}, {"x": (4, 3), "m": (4,)}, {"x": (8, 3), "m": (8,)}]


def test_exact_gear_picked():
    b = geared()
    x = np.random.default_rng(0).random((4, 3), dtype=np.float32)
    with b:
        y, s = b.run(None, {"x": x, "m": np.arange(4), "k": np.zeros(5, np.float32)})
    gear = b.calls[0][2]
    assert (gear.index, gear.batch, gear.padded) == (1, 4, False)
    np.testing.assert_array_equal(y, x * 2 + np.arange(4)[:, None])
    assert s[0] == 4


def test_padding_to_next_gear_and_crop():
    b = geared()
    x = np.random.default_rng(1).random((3, 3), dtype=np.float32)
    with b:
        y, s = b.run(None, {"x": x, "m": np.arange(3), "k": np.zeros(5, np.float32)})
    gear = b.calls[0][2]
    assert (gear.index, gear.batch, gear.real_batch, gear.padded) == (1, 4, 3, True)
    fed = b.calls[0][1]["x"]
    assert fed.shape == (4, 3) and np.all(fed[3] == 0)
    assert y.shape == (3, 3)  # cropped back
    np.testing.assert_array_equal(y, x * 2 + np.arange(3)[:, None])
    assert s[0] == 4  # static output untouched


def test_no_gear_fits_names_gears():
    b = geared()
    with b, pytest.raises(InputError, match=r"fit no gear.*x:1,3, m:1 \| x:4,3, m:4 \| x:8,3, m:8"):
        b.run(None, {"x": np.zeros((9, 3), np.float32), "m": np.zeros(9, np.int64), "k": np.zeros(5, np.float32)})


def test_padding_disabled():
    b = geared(pad=False)
    with b, pytest.raises(InputError, match="fit no gear"):
        b.run(None, {"x": np.zeros((3, 3), np.float32), "m": np.zeros(3, np.int64), "k": np.zeros(5, np.float32)})


def test_inconsistent_batches_not_padded():
    b = geared()
    with b, pytest.raises(InputError, match="fit no gear"):
        b.run(None, {"x": np.zeros((3, 3), np.float32), "m": np.zeros(2, np.int64), "k": np.zeros(5, np.float32)})


def test_dims_gears_exact_only():
    ins = [TensorMeta("t", (1, -1), np.int64, gears=((1, 16), (1, 32)))]
    b = Recorder(ins, [TensorMeta("o", (1, -1), np.int64)], lambda f: {"o": f["t"]})
    with b:
        assert b.run(None, {"t": np.zeros((1, 32), np.int64)})[0].shape == (1, 32)
        with pytest.raises(InputError, match="fit no gear"):
            b.run(None, {"t": np.zeros((1, 20), np.int64)})  # axis 0 is not dynamic: no padding


def test_timing_phases_reported():
    b = two_in()
    with b:
        _, t = b.run_timed(None, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.int64)})
    assert t.total >= t.h2d + t.compute + t.d2h
    assert set(t.as_ms()) == {"h2d_ms", "compute_ms", "d2h_ms", "overhead_ms", "total_ms"}
    with pytest.raises(InternalError):
        b._report_phase("upload", 1.0)


def test_wrong_output_count_is_internal_error():
    b = Recorder([TensorMeta("a", (1,), np.float32)], [TensorMeta("o", (1,), np.float32)], None)
    b._run_validated = lambda names, feeds, gear: []
    with b, pytest.raises(InternalError):
        b.run(None, {"a": np.zeros(1, np.float32)})


def test_threads_share_one_backend():
    b = two_in()
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(50):
            a = rng.random((2, 3), dtype=np.float32)
            c = rng.integers(0, 9, (2, 3))
            s, = b.run(["sum"], {"a": a, "b": c})
            if not np.array_equal(s, a + c):
                errors.append(seed)

    with b:
        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    assert errors == [] and len(b.calls) == 400


def test_tensor_meta_normalises():
    m = TensorMeta("x", [1, -1], "float16", device_shape=[1, 1, 16, 16], gears=[[1, 2]])
    assert m.dtype == np.float16 and m.shape == (1, -1) and m.gears == ((1, 2),)
    assert m.to_dict()["dtype"] == "float16"


def test_scalar_inputs_keep_rank_0():
    b = Recorder([TensorMeta("s", (), np.float32)], [TensorMeta("o", (), np.float32)], lambda f: {"o": f["s"] * 2})
    with b:
        (o,) = b.run(None, {"s": np.float32(1.5)})
    assert b.calls[0][1]["s"].shape == () and o.shape == () and o == 3.0
