"""The optional compiled strided-copy kernel (``converters/formats/_copykernel.c``): byte-for-byte equal to
``dst[...] = src``, bounds-checked, and never required (any build/load failure falls back to numpy)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters.formats import _fastcopy
from npu_deploy.converters import formats as F

needs_kernel = pytest.mark.skipif(_fastcopy._find_cc() is None, reason="no C compiler here")


@pytest.fixture(autouse=True)
def kernel_on(monkeypatch):
    """These tests exercise the kernel even when the run has NPU_DEPLOY_KERNEL=0, through the piece
    copies (not the small-tensor gather of ``formats``)."""
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", True)
    if _fastcopy.kernel_info()["status"] == "failed":
        # an earlier test of this process ran with a PATH without a compiler (the msprof-absent cases):
        # that failure is remembered for the process; load the kernel again under this test's PATH
        _fastcopy._reset_kernel()
    monkeypatch.setattr(F, "_GATHER_MAX", 0)
    monkeypatch.setattr(F, "_GATHER_FALLBACK_MAX", 0)
    F._clear_recipes()
    yield
    F._clear_recipes()


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
@pytest.mark.slow
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
    orig = _fastcopy._kernel_tasks

    def spy(*a):
        r = orig(*a)
        calls.append(r is not None)
        return r
    monkeypatch.setattr(_fastcopy, "_kernel_tasks", spy)
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


# ------------------------------------------------------------------------------ npd_tile3 (FRACTAL_Z)
def _plain(fn):
    """``fn()`` with the fast copy off: plain ``dst[...] = src`` per piece (the reference)."""
    old = _fastcopy.ENABLED
    try:
        _fastcopy.ENABLED = False
        return fn()
    finally:
        _fastcopy.ENABLED = old


def _spy_tile3(monkeypatch):
    """Record which copies _tile3_plan accepted (a list of (order, dir))."""
    seen = []
    orig = _fastcopy._tile3_plan

    def spy(*a):
        r = orig(*a)
        if r is not None:
            seen.append(r)
        return r
    monkeypatch.setattr(_fastcopy, "_tile3_plan", spy)
    return seen


def _rand_bytes(shape, dtype, seed):
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)     # NaN payloads, -0, subnormals: compared as bytes


@needs_kernel
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 7), st.integers(1, 7),
       st.sampled_from([(np.float16, None), (np.float32, None), (np.int8, None), (np.float16, 8)]),
       st.sampled_from([1, 2]), st.integers(0, 2**32 - 1))
def test_tile3_fractal_z_equals_plain(monkeypatch, n, c, h, w, dt_c0, threads, seed):
    """FRACTAL_Z pack/unpack through the kernel (npd_tile3 for the full C0 blocks) byte for byte
    equal to plain assignment: N, C not multiples of 16, H·W from 1 to 49, fp16/fp32/int8."""
    dtype, c0 = dt_c0
    monkeypatch.setattr(_fastcopy, "_SMALL", 1)
    monkeypatch.setattr(_fastcopy, "_PARALLEL_BYTES", 1)
    monkeypatch.setenv("NPU_DEPLOY_THREADS", str(threads))
    seen = _spy_tile3(monkeypatch)
    F._clear_recipes()                      # each example records its own kernel program
    x = _rand_bytes((n, c, h, w), dtype, seed)
    want = _plain(lambda: F.pack(x, "FRACTAL_Z", c0=c0))
    got = F.pack(x, "FRACTAL_Z", c0=c0)
    assert got.tobytes() == want.tobytes()
    back_want = _plain(lambda: F.unpack(want, "FRACTAL_Z", x.shape, c0=c0))
    back = np.full_like(x, 7)
    F.unpack(want, "FRACTAL_Z", x.shape, c0=c0, out=back)
    assert back.tobytes() == back_want.tobytes() == x.tobytes()
    cc0 = c0 or (32 if np.dtype(dtype).itemsize == 1 else 16)
    # a full-block piece exists and is not a plain 2-D transpose (with one C1 block, n merges into C0):
    # npd_tile3 serves it both ways
    if n >= 16 and c >= 2 * cc0 and h * w >= 2:
        assert {d for _, d in seen} == {0, 1}


@needs_kernel
@pytest.mark.parametrize("n,c,h,w,groups,dtype", [
    (64, 32, 3, 3, 2, np.float16), (48, 48, 3, 3, 3, np.float16), (96, 40, 5, 5, 4, np.float16),
    (64, 64, 1, 1, 4, np.float32), (64, 96, 3, 3, 2, np.int8), (32, 8, 7, 7, 8, np.float16),
])
def test_tile3_grouped_fractal_z_equals_plain(monkeypatch, n, c, h, w, groups, dtype):
    monkeypatch.setattr(_fastcopy, "_SMALL", 1)
    x = _rand_bytes((n, c // groups, h, w), dtype, n + c + groups)
    want = _plain(lambda: F.pack(x, "FRACTAL_Z", groups=groups))
    got = F.pack(x, "FRACTAL_Z", groups=groups)
    assert got.tobytes() == want.tobytes()
    back = F.unpack(want, "FRACTAL_Z", x.shape, groups=groups)
    assert back.tobytes() == _plain(lambda: F.unpack(want, "FRACTAL_Z", x.shape, groups=groups)).tobytes()
    assert back.tobytes() == x.tobytes()


@needs_kernel
@pytest.mark.parametrize("hw", [1, 2, 7, 8, 9, 15, 16, 17, 25, 49])
@pytest.mark.parametrize("dtype,c0", [(np.float16, 16), (np.float32, 16), (np.int8, 32), (np.uint16, 8)])
def test_tile3_pieces_direct(hw, dtype, c0):
    """An FZ-like piece (phys[c1, hw, n, c0] = x[n, c1*C0 + c0, hw]) straight through _kernel_copy,
    both directions, inside larger buffers whose other bytes stay untouched."""
    n, c1 = 37, 3
    x_full = _rand_bytes((n + 2, c1 * c0 + 5, hw), dtype, hw)
    x = x_full[1:n + 1, 2:2 + c1 * c0]                  # not contiguous: a sub-box of a bigger array
    phys_full = np.full((c1, hw, n + 3, c0), 5, dtype)
    phys = phys_full[:, :, 1:n + 1]
    dst = phys.transpose(2, 0, 3, 1)                      # [n, c1, c0, hw] view of the storage
    src = x.reshape(n, c1, c0, hw)
    shape, ds, ss = _fastcopy._simplify(dst, src)
    shape, ds, ss, unit = _fastcopy._widen(shape, ds, ss, dst.dtype.itemsize)
    plan = _fastcopy._tile3_plan(shape, ds, ss, unit)
    if hw >= 2:
        assert plan is not None and plan[1] == 0
    assert _kernel_copy(dst, src)
    want = np.full_like(phys_full, 5)
    want[:, :, 1:n + 1] = x.reshape(n, c1, c0, hw).transpose(1, 3, 0, 2)
    assert phys_full.tobytes() == want.tobytes()
    # and back
    back_full = np.full_like(x_full, 3)
    back = back_full[1:n + 1, 2:2 + c1 * c0].reshape(n, c1, c0, hw)
    shape, ds, ss = _fastcopy._simplify(back, dst)
    shape, ds, ss, unit = _fastcopy._widen(shape, ds, ss, back.dtype.itemsize)
    plan = _fastcopy._tile3_plan(shape, ds, ss, unit)
    if hw >= 2:
        assert plan is not None and plan[1] == 1
    assert _kernel_copy(back, dst)
    want_back = np.full_like(x_full, 3)
    want_back[1:n + 1, 2:2 + c1 * c0] = x
    assert back_full.tobytes() == want_back.tobytes()


@needs_kernel
@pytest.mark.parametrize("hw", [4, 9, 25])
@pytest.mark.parametrize("dtype,c0", [(np.float16, 16), (np.float32, 16), (np.int8, 32)])
@pytest.mark.parametrize("rc", [1, 3, 8, 32])
@pytest.mark.parametrize("dst_off,src_off", [(0, 0), (16, 0), (48, 16), (8, 4), (4, 12)])
def test_tile3_staged_walk_equals_numpy(hw, dtype, c0, rc, dst_off, src_off):
    """npd_tile3's staged walk (r-tiles through an L1 buffer, whole lines streamed, the partial ones
    carried to the next tile) both ways, for destinations and sources at any offset from a line
    (numpy's own large arrays start 16 bytes past one; offsets not a multiple of 16 take the
    byte-copy path of the carried line), with
    r-chunks that do and do not divide N: byte for byte the numpy assignment, and not a byte outside
    the destination box written. Threads split the outer axis, so two calls share a run's edge."""
    n, c1 = 41, 5
    item = np.dtype(dtype).itemsize

    def buffer(nbytes, off, fill):
        raw = np.full(nbytes + 192, fill, np.uint8)
        start = (-raw.ctypes.data) % 64 + off
        return raw, raw[start:start + nbytes]

    x_raw, x_bytes = buffer(n * c1 * c0 * hw * item, src_off, 0)
    x_bytes[:] = _rand_bytes((x_bytes.size,), np.uint8, hw + rc)
    x = x_bytes.view(dtype).reshape(n, c1, c0, hw)
    p_raw, p_bytes = buffer(c1 * hw * n * c0 * item, dst_off, 0xA5)
    phys = p_bytes.view(dtype).reshape(c1, hw, n, c0)
    for threads in (1, 2):
        p_raw[:] = 0xA5
        p_before = p_raw.copy()
        dst = phys.transpose(2, 0, 3, 1)                      # [n, c1, c0, hw] view of the storage
        tasks = _fastcopy.kernel_tasks(dst, x, threads=threads)
        assert tasks and all(t[0] is _fastcopy._kernel["fn3"] for t in tasks)
        for fn, dp, sp, args in tasks:
            assert fn(dp, sp, *_fastcopy.task_variant(fn, args, True, 256, rc, True)) == 0
        want = x.transpose(1, 3, 0, 2)
        assert phys.tobytes() == np.ascontiguousarray(want).tobytes()
        outside = np.ones(p_raw.size, bool)
        outside[p_bytes.ctypes.data - p_raw.ctypes.data:][:p_bytes.size] = False
        assert (p_raw[outside] == p_before[outside]).all()
        # and back, into a destination at the source's offset
        b_raw, b_bytes = buffer(x_bytes.size, src_off, 0x3C)
        back = b_bytes.view(dtype).reshape(n, c1, c0, hw)
        tasks = _fastcopy.kernel_tasks(back, dst, threads=threads)
        assert tasks and all(t[0] is _fastcopy._kernel["fn3"] for t in tasks)
        for fn, dp, sp, args in tasks:
            assert fn(dp, sp, *_fastcopy.task_variant(fn, args, True, 256, rc, True)) == 0
        assert back.tobytes() == x.tobytes()
        outside = np.ones(b_raw.size, bool)
        outside[b_bytes.ctypes.data - b_raw.ctypes.data:][:b_bytes.size] = False
        assert (b_raw[outside] == 0x3C).all()


@needs_kernel
def test_tile3_rejects_other_strides():
    """npd_tile3 checks the block/run structure itself (returns -1 rather than copying wrongly)."""
    import ctypes

    fn3 = _fastcopy._kernel_fn() and _fastcopy._kernel["fn3"]
    assert fn3 is not None
    a = (ctypes.c_int64 * 3)
    dst = np.zeros(64, np.uint16)
    src = np.arange(64, dtype=np.uint16)
    d, s = dst.ctypes.data, src.ctypes.data
    # (r, a, b) = (2, 4, 8): the run side's r stride must be A*2 = 8 bytes; 16 is wrong
    assert fn3(d, s, 3, a(2, 4, 8), a(16, 2, 16), a(64, 16, 2), 2, 0) == -1
    assert fn3(d, s, 3, a(2, 4, 8), a(8, 2, 16), a(64, 16, 2), 2, 2) == -1      # no such direction
    assert (dst == 0).all()
    assert fn3(d, s, 3, a(2, 4, 8), a(8, 2, 16), a(64, 16, 2), 2, 0) == 0
    want = src.reshape(2, 4, 8).transpose(2, 0, 1).reshape(-1)
    assert dst.tobytes() == want.tobytes()


@needs_kernel
@pytest.mark.parametrize("nb", [3, 4, 5, 7, 8, 9, 13, 16, 17, 24, 25, 33, 40, 41])
@pytest.mark.parametrize("na", [3, 4, 7, 8, 9, 15, 16, 17, 32, 33, 80, 96])
@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.float32])
def test_sse_tile_edges(nb, na, dtype):
    """2-D transposes with ragged edges on either side (the gathered last rows, the element-wise last
    columns and the overlapping last blocks of the SSE2 8x8 (2-byte), 16x16 and 8x8 (1-byte) and 4x4
    (4-byte) tiles), with gaps around the destination rows."""
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
    src_full = _rand_bytes((na + 1, nb + 3 + 70 * ((nb // 8) % 2)), dtype, nb * 100 + na)
    src = src_full[1:, 2:2 + nb].T                         # [nb, na], nb contiguous; rows > 64 B apart for some nb
    buf = np.full((nb, na + 4), 9, unsigned).view(dtype)
    dst = buf[:, 1:na + 1]
    assert _kernel_copy(dst, src)
    want = np.full((nb, na + 4), 9, unsigned).view(dtype)
    want[:, 1:na + 1] = src
    assert buf.tobytes() == want.tobytes()


@needs_kernel
@pytest.mark.parametrize("fmt,shape", [("NC1HWC0", (2, 48, 20, 24)), ("NC1HWC0", (1, 32, 7, 9)),
                                       ("FRACTAL_NZ", (70, 300)), ("FRACTAL_NZ", (2, 33, 50)),
                                       ("FRACTAL_Z", (64, 96, 3, 3)), ("NDC1HWC0", (1, 40, 2, 8, 16))])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
@pytest.mark.parametrize("offset", [0, 1])
def test_streaming_stores_equal_plain(monkeypatch, fmt, shape, dtype, offset):
    """The streaming-store variants (used for copies of at least _NT_BYTES) on small tensors: byte
    for byte the plain result, also into a destination that is not 16-byte aligned (then the kernel
    must fall back to ordinary stores)."""
    monkeypatch.setattr(_fastcopy, "_NT_BYTES", 1)
    x = _rand_bytes(shape, dtype, offset + 7)
    want = _plain(lambda: F.pack(x, fmt))
    raw = np.zeros(want.nbytes + 64, np.uint8)
    start = (-raw.ctypes.data) % 16 + offset * np.dtype(dtype).itemsize
    out = raw[start:start + want.nbytes].view(dtype).reshape(want.shape)
    assert F.pack(x, fmt, out=out) is out
    assert out.tobytes() == want.tobytes()
    raw2 = np.zeros(x.nbytes + 64, np.uint8)
    start2 = (-raw2.ctypes.data) % 16 + offset * np.dtype(dtype).itemsize
    back = raw2[start2:start2 + x.nbytes].view(dtype).reshape(x.shape)
    assert F.unpack(want, fmt, shape, out=back) is back
    assert back.tobytes() == x.tobytes()


@needs_kernel
@pytest.mark.parametrize("hw", [(8, 16), (16, 32), (64, 65), (64, 96)])
@pytest.mark.parametrize("c0", [8, 16, 32])
@pytest.mark.parametrize("offset", [0, 8, 16, 32, 48])
def test_row_staged_int8_pack_equals_plain(monkeypatch, hw, c0, offset):
    """NC1HWC0 int8 pack with streaming stores, where the tile's source rows (one channel plane each)
    are staged in row pieces before the transpose: C0 = 32 writes whole runs from the registers
    (streamed in 32-byte stores when the destination is 32-byte aligned, in 16-byte halves when it
    is 16-byte aligned, through the tile buffer otherwise), smaller C0 transposes from the row
    buffer; H*W from one tile to several (2,048-byte row pieces, a ragged last tile), the destination
    at offsets 0-48 bytes into a line, the bytes around it untouched."""
    monkeypatch.setattr(_fastcopy, "_NT_BYTES", 1)
    shape = (2, 2 * c0 + 5, *hw)                       # a padded last C1 block too
    x = _rand_bytes(shape, np.int8, hw[0] * c0 + offset)
    want = _plain(lambda: F.pack(x, "NC1HWC0", c0=c0))
    raw = np.zeros(want.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start:start + want.nbytes].view(np.int8).reshape(want.shape)
    out.view(np.uint8).fill(0x5A)
    assert F.pack(x, "NC1HWC0", c0=c0, out=out) is out
    assert out.tobytes() == want.tobytes()
    assert (raw[:start] == 0).all() and (raw[start + want.nbytes:] == 0).all()
