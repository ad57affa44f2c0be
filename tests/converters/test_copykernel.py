"""The optional compiled strided-copy kernel (``converters/_copykernel.c``): byte-for-byte equal to
``dst[...] = src``, bounds-checked, and never required (any build/load failure falls back to numpy)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters import _fastcopy
from npu_deploy.converters import formats as F

needs_kernel = pytest.mark.skipif(_fastcopy._find_cc() is None, reason="no C compiler here")


@pytest.fixture(autouse=True)
def kernel_on(monkeypatch):
    """These tests exercise the kernel even when the run has NPU_DEPLOY_KERNEL=0."""
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", True)


def _kernel_copy(dst, src, threads=1):
    """Through the kernel only (no size threshold, no other path); False when it did not run."""
    shape, ds, ss = _fastcopy._simplify(dst, src)
    if not shape:                                   # one element (copy() never gets here)
        return _fastcopy._kernel_copy(dst, src, [], [], [], dst.dtype.itemsize, threads)
    shape, ds, ss, unit = _fastcopy._widen(shape, ds, ss, dst.dtype.itemsize)
    return _fastcopy._kernel_copy(dst, src, shape, ds, ss, unit, threads)


@st.composite
def strided_pairs(draw):
    ndim = draw(st.integers(1, 6))
    shape = tuple(draw(st.lists(st.integers(0 if ndim == 1 else 1, 12), min_size=ndim, max_size=ndim)))
    dtype = np.dtype(draw(st.sampled_from(["u1", "<f2", "<f4", "<i8", "<c16", "V3", "V32", "V40"])))

    def view(seed):
        rng = np.random.default_rng(seed)
        perm = draw(st.permutations(range(ndim)))
        steps = [draw(st.sampled_from([1, 1, 2, 3, -1, -2])) for _ in range(ndim)]
        base_shape = [max(1, shape[a] * abs(steps[a])) + draw(st.integers(0, 2)) for a in range(ndim)]
        raw = rng.integers(0, 256, size=int(np.prod(base_shape)) * dtype.itemsize, dtype=np.uint8)
        base = raw.view(dtype).reshape([base_shape[p] for p in perm]).transpose(np.argsort(perm))
        idx = tuple(slice(0, n * s, s) if s > 0 else slice(n * -s - 1, None, s) if n else slice(0, 0)
                    for n, s in zip(shape, steps))
        v = base[idx]
        assert v.shape == shape, (v.shape, shape)
        return v

    seed = draw(st.integers(0, 2**32 - 1))
    return view(seed), view(seed + 1)


@needs_kernel
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strided_pairs(), st.sampled_from([1, 2, 3]), st.sampled_from([(8, 8), (64, 64), (256, 4096)]))
def test_kernel_equals_numpy_assignment(pair, threads, tiles):
    dst, src = pair
    expect = dst.copy()
    expect[...] = src
    before = _fastcopy._byte_bounds(dst)
    old = (_fastcopy._KTILE_A_BYTES, _fastcopy._KTILE_B_BYTES)
    try:
        _fastcopy._KTILE_A_BYTES, _fastcopy._KTILE_B_BYTES = tiles
        ran = _kernel_copy(dst, src, threads)
    finally:
        _fastcopy._KTILE_A_BYTES, _fastcopy._KTILE_B_BYTES = old
    assert ran or dst.size == 0
    assert dst.tobytes() == expect.tobytes()
    assert _fastcopy._byte_bounds(dst) == before


@needs_kernel
def test_kernel_neighbours_untouched():
    """A strided destination inside a larger buffer: bytes between and around it keep their value."""
    buf = np.full((40, 50), 7, np.float16)
    dst = buf[3:35:2, 45:5:-3]
    src = np.random.default_rng(0).standard_normal(dst.shape[::-1]).astype(np.float16).T
    mask = np.ones(buf.shape, bool)
    mask[3:35:2, 45:5:-3] = False
    assert _kernel_copy(dst, src)
    assert np.array_equal(dst, src) and (buf[mask] == 7).all()


@needs_kernel
def test_kernel_zero_size_and_negative_strides():
    a = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    b = np.zeros((4, 3, 2), np.int16)
    assert _kernel_copy(b.transpose(2, 1, 0)[::-1, ::-1], a[:, :, ::-1][::-1, ::-1, ::-1])
    assert np.array_equal(b.transpose(2, 1, 0)[::-1, ::-1], a[:, :, ::-1][::-1, ::-1, ::-1])
    e = np.empty((0, 5), np.float32)
    assert _fastcopy._kernel_copy(e, np.empty((0, 5), np.float32), [0, 5], [20, 4], [20, 4], 4, 1)


@needs_kernel
def test_kernel_refuses_out_of_bounds():
    """The wrapper checks every task's box against both arrays before calling the kernel."""
    dst = np.zeros(16, np.uint16)
    src = np.arange(16, dtype=np.uint16)
    with pytest.raises(AssertionError, match="outside"):
        _fastcopy._kernel_copy(dst, src, [17], [2], [2], 2, 1)
    with pytest.raises(AssertionError, match="outside"):
        _fastcopy._kernel_copy(dst, src, [4, 4], [8, 2], [2, 10], 2, 1)
    assert (dst == 0).all()


@needs_kernel
def test_kernel_is_used_for_the_benchmark_layouts(monkeypatch):
    monkeypatch.setattr(_fastcopy, "_SMALL", 1)
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", True)
    calls = []
    orig = _fastcopy._kernel_copy

    def spy(*a):
        r = orig(*a)
        calls.append(r)
        return r
    monkeypatch.setattr(_fastcopy, "_kernel_copy", spy)
    for fmt, shape in (("NC1HWC0", (2, 32, 8, 8)), ("FRACTAL_Z", (64, 32, 3, 3)), ("FRACTAL_NZ", (64, 96))):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float16)
        y = F.pack(x, fmt)
        assert np.array_equal(F.unpack(y, fmt, shape), x)
    assert calls and all(calls)
    assert _fastcopy.kernel_info()["status"] == "loaded"


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """A kernel state reset before and after (the next use builds it again)."""
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", True)
    monkeypatch.setenv("NPU_DEPLOY_CACHE", str(tmp_path / "cache"))
    _fastcopy._reset_kernel()
    yield monkeypatch
    _fastcopy._reset_kernel()


def _pack_roundtrip_equals_plain():
    x = np.random.default_rng(2).standard_normal((40, 48, 3, 3)).astype(np.float16)
    old = _fastcopy.ENABLED
    try:
        _fastcopy.ENABLED = False
        want = F.pack(x, "FRACTAL_Z")
    finally:
        _fastcopy.ENABLED = old
    small = _fastcopy._SMALL
    _fastcopy._SMALL = 1
    try:
        got = F.pack(x, "FRACTAL_Z")
        back = F.unpack(got, "FRACTAL_Z", x.shape)
    finally:
        _fastcopy._SMALL = small
    return got.tobytes() == want.tobytes() and back.tobytes() == x.tobytes()


def test_fallback_without_compiler(fresh_kernel, tmp_path):
    fresh_kernel.setenv("PATH", str(tmp_path / "empty-bin"))
    assert _pack_roundtrip_equals_plain()
    info = _fastcopy.kernel_info()
    assert info["status"] == "failed" and "compiler" in info["reason"]
    assert _fastcopy._kernel_fn() is None          # remembered: no second attempt
    assert not (tmp_path / "cache").exists()


@needs_kernel
def test_fallback_with_unwritable_cache(fresh_kernel, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    fresh_kernel.setenv("NPU_DEPLOY_CACHE", str(ro / "sub"))
    real_mkdir = type(ro).mkdir

    def deny(self, *a, **k):
        if str(self).startswith(str(ro)):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **k)
    fresh_kernel.setattr(type(ro), "mkdir", deny)
    assert _pack_roundtrip_equals_plain()
    info = _fastcopy.kernel_info()
    assert info["status"] == "failed" and "Permission" in info["reason"]


@needs_kernel
def test_fallback_on_compile_error(fresh_kernel):
    fresh_kernel.setattr(_fastcopy, "_KERNEL_FLAGS", _fastcopy._KERNEL_FLAGS + ["-DNPD_BROKEN", "-include",
                                                                               "/nonexistent/header.h"])
    assert _pack_roundtrip_equals_plain()
    assert _fastcopy.kernel_info()["status"] == "failed"
    leftovers = list(_fastcopy._kernel_cache_dir().iterdir())
    assert leftovers == []                          # the failed build's temporary files are gone


@needs_kernel
def test_build_is_cached_and_atomic(fresh_kernel):
    fn = _fastcopy._kernel_fn()
    info = _fastcopy.kernel_info()
    assert fn is not None and info["status"] == "loaded" and info["compile_seconds"] is not None
    files = sorted(p.name for p in _fastcopy._kernel_cache_dir().iterdir())
    assert files == [os.path.basename(info["path"])]  # no temp files left behind
    _fastcopy._reset_kernel()
    assert _fastcopy._kernel_fn() is not None
    assert _fastcopy.kernel_info()["compile_seconds"] is None   # loaded from the cache


def test_disabled_by_environment(fresh_kernel):
    fresh_kernel.setattr(_fastcopy, "KERNEL_ENABLED", False)
    assert _fastcopy._kernel_fn() is None
    assert _fastcopy.kernel_info()["status"] == "disabled"
    assert _pack_roundtrip_equals_plain()


@needs_kernel
@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_refuses_a_world_writable_cache(fresh_kernel):
    """A cached shared object someone else could have planted is not loaded."""
    assert _fastcopy._kernel_fn() is not None
    cache = _fastcopy._kernel_cache_dir()
    _fastcopy._reset_kernel()
    cache.chmod(0o777)
    try:
        assert _fastcopy._kernel_fn() is None
        assert "writable" in _fastcopy.kernel_info()["reason"]
        assert _pack_roundtrip_equals_plain()
    finally:
        cache.chmod(0o755)
