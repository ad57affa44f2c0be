"""The compiled copy kernel's two instruction-set paths (``_copykernel.c``: SSE2 baseline, AVX2 block
transposes chosen at run time): forced one at a time with ``_fastcopy.set_isa``, each must write exactly
the bytes of ``dst[...] = src`` (and of an independent FRACTAL_Z / NC1HWC0 index oracle), on odd
shapes and padded strides, and nothing outside the destination view."""

from __future__ import annotations

import os

import numpy as np
import pytest

from npu_deploy.converters import formats as F
from npu_deploy.converters.formats import _fastcopy

needs_kernel = pytest.mark.skipif(_fastcopy._find_cc() is None, reason="no C compiler here")
ISAS = ["sse2", "avx2"]


def _cpu_has_avx2() -> bool | None:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return " avx2 " in f" {line.split(':', 1)[1].strip()} "
    except OSError:
        pass
    return None


@pytest.fixture(autouse=True)
def kernel_on(monkeypatch):
    """The kernel on, through the piece copies (not the small-tensor gather); the ISA restored after."""
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", True)
    monkeypatch.setattr(F, "_GATHER_MAX", 0)
    monkeypatch.setattr(F, "_GATHER_FALLBACK_MAX", 0)
    F._clear_recipes()
    yield
    F._clear_recipes()
    if _fastcopy._kernel.get("isa_fn") is not None:
        _fastcopy.set_isa("auto")


def use(isa: str) -> None:
    got = _fastcopy.set_isa(isa)
    if got != isa:
        pytest.skip(f"this CPU has no {isa}")


@needs_kernel
def test_set_isa_names_and_auto():
    assert _fastcopy.set_isa("sse2") == "sse2"
    assert _fastcopy.kernel_info()["isa"] == "sse2"
    auto = _fastcopy.set_isa("auto")
    has = _cpu_has_avx2()
    if has is not None:
        assert auto == ("avx2" if has else "sse2")
    assert _fastcopy.kernel_info()["isa"] == auto
    with pytest.raises(ValueError, match="unknown kernel instruction set 'avx9'"):
        _fastcopy.set_isa("avx9")
    assert _fastcopy.kernel_info()["isa"] == auto        # a bad name changes nothing


def _guarded(rng, nbytes: int):
    """A random byte buffer with 64 guard bytes either side; (buffer, offset of the usable part)."""
    return rng.integers(0, 256, size=nbytes + 128, dtype=np.uint8), 64


def _view(buf, off, dtype, shape, strides):
    return np.lib.stride_tricks.as_strided(buf[off:].view(dtype), shape, strides)


def _tile3_views(rng, direction, outer, R, A, B, dtype, rpad, bpad):
    """(dst, src, dst buffer) for a copy between R contiguous A x B blocks (block side, row stride
    padded by ``rpad`` elements) and B runs of R*A (run side, run stride padded by ``bpad``), per outer
    index: the layout ``npd_tile3`` serves (FRACTAL_Z pack is direction 0, unpack 1)."""
    es = np.dtype(dtype).itemsize
    rstride = (A * B + rpad) * es
    blk_strides = (R * rstride, rstride, B * es, es)                    # (o, r, a, b)
    bstride = (R * A + bpad) * es
    run_strides = (B * bstride, A * es, es, bstride)
    blk_bytes = outer * R * rstride
    run_bytes = outer * B * bstride
    shape = (outer, R, A, B)
    if direction == 0:
        sbuf, so = _guarded(rng, blk_bytes)
        dbuf, do = _guarded(rng, run_bytes)
        src, dst = _view(sbuf, so, dtype, shape, blk_strides), _view(dbuf, do, dtype, shape, run_strides)
    else:
        sbuf, so = _guarded(rng, run_bytes)
        dbuf, do = _guarded(rng, blk_bytes)
        src, dst = _view(sbuf, so, dtype, shape, run_strides), _view(dbuf, do, dtype, shape, blk_strides)
    return dst, src, dbuf


def _kernel_copy(dst, src):
    shape, ds, ss = _fastcopy._simplify(dst, src)
    shape, ds, ss, unit = _fastcopy._widen(shape, ds, ss, dst.dtype.itemsize)
    assert _fastcopy._tile3_plan(shape, ds, ss, unit) is not None, "not the npd_tile3 layout"
    assert _fastcopy._kernel_copy(dst, src, shape, ds, ss, unit, 1)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("direction", [0, 1])
@pytest.mark.parametrize("dtype,A", [(np.uint8, 32), (np.uint16, 16), (np.uint32, 16), (np.uint16, 8)])
@pytest.mark.parametrize("B", [8, 9, 15, 16, 25])
def test_tile3_blocks_equal_numpy_assignment(isa, direction, dtype, A, B):
    if A * B * np.dtype(dtype).itemsize > _fastcopy._TILE3_MAX_BLOCK:
        pytest.skip("block beyond npd_tile3's size")
    use(isa)
    rng = np.random.default_rng(B * 100 + A + direction)
    for outer, R, rpad, bpad in ((2, 3, 1, 1), (2, 5, 3, 1), (3, 17, 1, 7)):
        dst, src, dbuf = _tile3_views(rng, direction, outer, R, A, B, dtype, rpad, bpad)
        before = dbuf.copy()
        expect_buf = dbuf.copy()
        _view(expect_buf, 64, dtype, dst.shape, dst.strides)[...] = src
        _kernel_copy(dst, src)
        assert dbuf.tobytes() == expect_buf.tobytes(), (outer, R, rpad, bpad)
        assert dbuf[:64].tobytes() == before[:64].tobytes() and dbuf[-64:].tobytes() == before[-64:].tobytes()


def _oracle_fz(x, c0):
    n_, c_, h_, w_ = x.shape
    c1, n1 = -(-c_ // c0), -(-n_ // 16)
    out = np.zeros((c1 * h_ * w_, n1, 16, c0), x.dtype)
    n, c, h, w = np.indices(x.shape)
    out.reshape(-1)[((((c // c0) * h_ + h) * w_ + w) * n1 + n // 16) * 16 * c0 + (n % 16) * c0 + c % c0] = x
    return out


def _oracle_5hd(x, c0):
    n_, c_, h_, w_ = x.shape
    c1 = -(-c_ // c0)
    out = np.zeros((n_, c1, h_, w_, c0), x.dtype)
    n, c, h, w = np.indices(x.shape)
    out.reshape(-1)[(((n * c1 + c // c0) * h_ + h) * w_ + w) * c0 + c % c0] = x
    return out


def _random(rng, shape, dtype):
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.float32])
@pytest.mark.parametrize("shape", [(37, 45, 3, 3), (16, 32, 2, 4), (21, 70, 5, 5), (48, 33, 3, 5), (17, 64, 4, 4)])
def test_fractal_z_each_isa_against_oracle(isa, dtype, shape):
    use(isa)
    rng = np.random.default_rng(sum(shape))
    x = _random(rng, shape, dtype)
    want = _oracle_fz(x, F.default_c0(dtype))
    got = F.pack(x, "FRACTAL_Z")
    assert got.tobytes() == want.tobytes()
    out = np.full_like(want, 0x5A if np.dtype(dtype).kind == "i" else 1)
    F.pack(x, "FRACTAL_Z", out=out)
    assert out.tobytes() == want.tobytes()
    back = np.empty_like(x)
    back.view(np.uint8).fill(0xA5)
    F.unpack(got, "FRACTAL_Z", shape, out=back)
    assert back.tobytes() == x.tobytes()


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(2, 45, 8, 12), (3, 64, 4, 10), (1, 32, 8, 8), (2, 96, 3, 64)])
def test_nc1hwc0_int8_each_isa_against_oracle(isa, shape):
    """int8 NC1HWC0 pack: H*W a multiple of 32 takes the AVX2 8x32 byte transposes, others SSE2's 8x8."""
    use(isa)
    rng = np.random.default_rng(sum(shape))
    x = _random(rng, shape, np.int8)
    want = _oracle_5hd(x, 32)
    got = F.pack(x, "NC1HWC0")
    assert got.tobytes() == want.tobytes()
    back = F.unpack(got, "NC1HWC0", shape)
    assert back.tobytes() == x.tobytes()


@needs_kernel
def test_isa_env_knob_in_a_fresh_process(tmp_path):
    """NPU_DEPLOY_KERNEL_ISA=sse2 keeps the baseline path for the whole process; output unchanged."""
    import subprocess
    import sys

    code = ("from npu_deploy.converters.formats import _fastcopy as f; import numpy as np;"
            "from npu_deploy.converters import formats as F; F._GATHER_MAX = F._GATHER_FALLBACK_MAX = 0;"
            "x = (np.arange(37*45*9) % 251).astype(np.float16).reshape(37, 45, 3, 3);"
            "y = F.pack(x, 'FRACTAL_Z'); f._kernel_fn(); print(f.kernel_info()['isa'], y.sum(dtype=np.float64))")
    env = dict(os.environ, NPU_DEPLOY_KERNEL_ISA="sse2", NPU_DEPLOY_KERNEL="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    isa, total = r.stdout.split()
    assert isa == "sse2"
    x = (np.arange(37 * 45 * 9) % 251).astype(np.float16).reshape(37, 45, 3, 3)
    assert float(total) == float(_oracle_fz(x, 16).sum(dtype=np.float64))
