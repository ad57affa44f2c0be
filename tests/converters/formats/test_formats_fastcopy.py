"""The fast strided copy behind the format transforms must equal ``dst[...] = src`` exactly, for any
pair of same-shape views (transposed, sliced, reversed, overlapping-free), dtype and threshold."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_deploy.converters.formats import _fastcopy
from npu_deploy.converters import formats as F


@st.composite
def view_pairs(draw):
    ndim = draw(st.integers(1, 5))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.int8, np.uint8, np.int64, ml_dtypes.bfloat16,
                                  np.complex64]))

    def make_view(rng):
        # a larger base array, then a transpose, a slice with steps (maybe negative) down to ``shape``
        perm = draw(st.permutations(range(ndim)))
        steps = [draw(st.sampled_from([1, 1, 2, -1])) for _ in range(ndim)]
        base_shape = [shape[a] * abs(steps[a]) + draw(st.integers(0, 2)) for a in range(ndim)]
        raw = rng.integers(0, 256, size=int(np.prod(base_shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
        # memory laid out in ``perm`` order, seen in logical order
        base = raw.view(dtype).reshape([base_shape[p] for p in perm]).transpose(np.argsort(perm))
        index = []
        for axis in range(ndim):
            n, st_ = shape[axis], steps[axis]
            index.append(slice(0, n * st_, st_) if st_ > 0 else slice(n - 1, None, -1))
        v = base[tuple(index)]
        assert v.shape == shape
        return v

    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return make_view(rng), make_view(rng)


@settings(max_examples=300, deadline=None)
@given(view_pairs(), st.sampled_from([1, 64]), st.sampled_from([64, 1 << 20]), st.booleans(), st.booleans())
@pytest.mark.slow
def test_copy_equals_plain_assignment(pair, small, task_bytes, threads, kernel):
    dst, src = pair
    old_kernel = _fastcopy.KERNEL_ENABLED
    expect = dst.copy()
    expect[...] = src
    old = (_fastcopy._SMALL, _fastcopy._TASK_BYTES, _fastcopy._PARALLEL_BYTES, _fastcopy._ORT_MIN_CALL,
           _fastcopy._SCRATCH_BYTES)
    old_env = os.environ.get("NPU_DEPLOY_THREADS")
    try:
        _fastcopy._SMALL, _fastcopy._TASK_BYTES = small, task_bytes
        _fastcopy._ORT_MIN_CALL, _fastcopy._SCRATCH_BYTES = 1, 256
        _fastcopy._PARALLEL_BYTES = 1 if threads else 1 << 40
        os.environ["NPU_DEPLOY_THREADS"] = "2"  # use the pool even on a busy machine
        _fastcopy.KERNEL_ENABLED = kernel
        _fastcopy.copy(dst, src)
    finally:
        _fastcopy.KERNEL_ENABLED = old_kernel
        (_fastcopy._SMALL, _fastcopy._TASK_BYTES, _fastcopy._PARALLEL_BYTES, _fastcopy._ORT_MIN_CALL,
         _fastcopy._SCRATCH_BYTES) = old
        if old_env is None:
            os.environ.pop("NPU_DEPLOY_THREADS", None)
        else:
            os.environ["NPU_DEPLOY_THREADS"] = old_env
    assert dst.tobytes() == expect.tobytes()


def _plain_and_fast(fn):
    """(result with the fast copy disabled, result with it enabled) of ``fn()``."""
    old = _fastcopy.ENABLED
    try:
        _fastcopy.ENABLED = False
        want = fn()
        _fastcopy.ENABLED = True
        got = fn()
    finally:
        _fastcopy.ENABLED = old
    return want, got


@pytest.fixture
def low_thresholds(monkeypatch):
    """Every strategy runs on small tensors: tiny tasks, tiny onnxruntime calls, small scratch tiles."""
    monkeypatch.setattr(_fastcopy, "_SMALL", 1)
    monkeypatch.setattr(_fastcopy, "_TASK_BYTES", 4096)
    monkeypatch.setattr(_fastcopy, "_ORT_MIN_CALL", 1)
    monkeypatch.setattr(_fastcopy, "_SCRATCH_BYTES", 8192)
    monkeypatch.setattr(_fastcopy, "_FAR", 64)               # staged transposes on small arrays too
    monkeypatch.setattr(_fastcopy, "_STAGE_BYTES", 4096)
    monkeypatch.setattr(_fastcopy._local, "scratch", None, raising=False)
    monkeypatch.setattr(F, "_GATHER_MAX", 0)                # piece copies, not the small-tensor gather
    monkeypatch.setattr(F, "_GATHER_FALLBACK_MAX", 0)
    F._clear_recipes()
    yield monkeypatch
    F._clear_recipes()


def _random(shape, dtype, seed=0):
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize,
                                               dtype=np.uint8)
    return raw.view(dtype).reshape(shape)   # random bytes: NaN payloads, subnormals, -0 all included


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("use_ort", [True, False])
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("fmt,shape,dtype,c0", [
    ("FRACTAL_NZ", (100, 96), np.float16, None),       # 32-byte C0 rows as one wide unit
    ("FRACTAL_NZ", (3, 70, 35), np.float16, None),     # N not a multiple of C0: ragged tail piece
    ("FRACTAL_NZ", (64, 300), np.int8, None),          # int8, C0 = 32: still 32-byte units
    ("FRACTAL_NZ", (40, 50), np.float32, None),        # fp32 C0 = 16: 64-byte rows, two lanes
    ("FRACTAL_NZ", (33, 40), np.float16, 8),           # 16-byte units
    ("NC1HWC0", (3, 48, 20, 24), np.float16, None),    # onnxruntime batched transpose, one call per batch
    ("NC1HWC0", (2, 19, 5, 30), np.float16, None),     # C not a multiple of C0: main piece + tail
    ("NC1HWC0", (2, 70, 9, 9), np.int8, None),         # int8 C0 = 32, uint8 transpose
    ("NC1HWC0", (2, 20, 11, 13), np.float32, None),    # fp32 C0 = 8, uint32 transpose
    ("NDC1HWC0", (2, 40, 3, 10, 12), np.float16, None),
    ("FRACTAL_Z", (70, 40, 3, 3), np.float16, None),   # two-step: transpose tiles + wide-unit moves
    ("FRACTAL_Z", (64, 32, 5, 5), np.float16, None),   # aligned: one contiguous source block
    ("FRACTAL_Z", (33, 64, 3, 3), np.int8, None),
    ("FRACTAL_Z", (48, 32, 1, 1), np.float32, None),
    ("FRACTAL_Z", (40, 70), np.float16, None),         # 2-D [K, N] weight
])
def test_pack_unpack_paths_equal_plain(low_thresholds, fmt, shape, dtype, c0, use_ort, threads, kernel):
    low_thresholds.setattr(_fastcopy, "KERNEL_ENABLED", kernel)
    low_thresholds.setattr(_fastcopy, "USE_ORT", use_ort)
    low_thresholds.setenv("NPU_DEPLOY_THREADS", threads)
    low_thresholds.setattr(_fastcopy, "_PARALLEL_BYTES", 1)
    x = _random(shape, dtype)
    want, got = _plain_and_fast(lambda: F.pack(x, fmt, c0=c0))
    assert got.tobytes() == want.tobytes()
    out = np.full_like(want, 7)                        # out= given, dirty: padding must be re-zeroed
    assert F.pack(x, fmt, c0=c0, out=out) is out and out.tobytes() == want.tobytes()
    want.flags.writeable = False                       # e.g. np.frombuffer of a device dump
    back_want, back_got = _plain_and_fast(lambda: F.unpack(want, fmt, shape))
    assert back_got.tobytes() == back_want.tobytes() == x.tobytes()
    back = np.empty_like(x)
    assert F.unpack(want, fmt, shape, out=back) is back and back.tobytes() == x.tobytes()


def test_paths_taken(low_thresholds):
    """The strategies the benchmark relies on are actually chosen for its layouts (without the
    compiled kernel, which comes first when available: see test_copykernel.py)."""
    low_thresholds.setattr(_fastcopy, "KERNEL_ENABLED", False)
    seen = []
    for name in ("_ort_transpose", "_two_step"):
        orig = getattr(_fastcopy, name)

        def spy(*a, _orig=orig, _name=name):
            r = _orig(*a)
            if r:
                seen.append(_name)
            return r
        low_thresholds.setattr(_fastcopy, name, spy)
    low_thresholds.setattr(_fastcopy, "USE_ORT", True)
    F.pack(_random((2, 32, 16, 16), np.float16), "NC1HWC0")
    assert seen == ["_ort_transpose"]
    seen.clear()
    F.pack(_random((64, 32, 3, 3), np.float16), "FRACTAL_Z")
    assert seen == ["_two_step"]
    seen.clear()
    y = F.pack(_random((64, 32, 3, 3), np.float16), "FRACTAL_Z")
    seen.clear()
    F.unpack(y, "FRACTAL_Z", (64, 32, 3, 3))
    assert seen == ["_two_step"]
    seen.clear()
    staged = _fastcopy._staged_transpose

    def spy_staged(*a):
        r = staged(*a)
        if r:
            seen.append("_staged_transpose")
        return r
    low_thresholds.setattr(_fastcopy, "_staged_transpose", spy_staged)
    F.unpack(F.pack(_random((64, 96), np.float16), "FRACTAL_NZ"), "FRACTAL_NZ", (64, 96))
    assert "_staged_transpose" in seen
    # NZ: one 32-byte unit per C0 row, copied by numpy
    shape, ds, ss = _fastcopy._simplify(np.empty((4, 64, 16), np.float16).transpose(1, 0, 2),
                                        np.empty((64, 4, 16), np.float16))
    assert _fastcopy._widen(shape, ds, ss, 2)[3] == (32 if 32 in _fastcopy._UNITS else 16)


def test_falls_back_to_numpy_without_onnxruntime(low_thresholds):
    low_thresholds.setattr(_fastcopy, "_ort_session", lambda *a: None)
    for fmt, shape in (("NC1HWC0", (2, 32, 9, 20)), ("FRACTAL_Z", (40, 48, 3, 3))):
        x = _random(shape, np.float16, seed=3)
        want, got = _plain_and_fast(lambda: F.pack(x, fmt))
        assert got.tobytes() == want.tobytes()
        assert F.unpack(got, fmt, shape).tobytes() == x.tobytes()


def test_thread_count_depends_on_size_not_load(monkeypatch):
    monkeypatch.delenv("NPU_DEPLOY_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (99.0, 99.0, 99.0), raising=False)
    n = _fastcopy._threads()
    assert _fastcopy._threads_for(_fastcopy._PARALLEL_BYTES) == n
    assert _fastcopy._threads_for(_fastcopy._PARALLEL_BYTES - 1) == 1
    monkeypatch.setenv("NPU_DEPLOY_THREADS", "3")
    assert _fastcopy._threads_for(1 << 30) == 3


def test_wide_units_copy_bits_exactly():
    """complex128 / clongdouble copies must be raw byte moves (NaN payloads, long-double padding)."""
    for width, dt in _fastcopy._UNITS.items():
        raw = _random((4096,), np.uint8, seed=width)
        a = raw[: (4096 // width) * width].view(dt)
        b = np.zeros(2 * a.size, dt)[::2]
        b[...] = a
        assert np.ascontiguousarray(b).view(np.uint8).tobytes() == a.view(np.uint8).tobytes()


def test_structured_and_odd_itemsizes(low_thresholds):
    dt = np.dtype([("a", "<i2"), ("b", "u1")])                       # itemsize 3, no wide unit
    x = _random((6, 40), dt)
    dst = np.empty((40, 6), dt)
    _fastcopy.copy(dst.T, x)
    assert np.ascontiguousarray(dst.T).tobytes() == x.tobytes()


def test_disabled_is_plain_assignment(monkeypatch):
    monkeypatch.setattr(_fastcopy, "ENABLED", False)
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    b = np.empty((4, 3, 2), np.int32)
    _fastcopy.copy(b.transpose(2, 1, 0), a)
    assert np.array_equal(b, a.transpose(2, 1, 0))
