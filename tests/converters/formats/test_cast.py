"""``_fastcopy.cast``: float32 -> float16 through the compiled kernel's F16C loop (``npd_f32_to_f16``),
checked bit for bit against numpy's own ``astype`` (the independent oracle): special values, the
rounding ties either side of every boundary, NaN payloads (signalling ones included), lengths around
the 8-lane vector and the size the kernel starts at; every other case must be numpy's cast unchanged.
The slow test runs every mantissa of the exponents where the rounding changes kind."""

from __future__ import annotations

import numpy as np
import pytest

from npu_deploy.converters.formats import _fastcopy

needs_kernel = pytest.mark.skipif(_fastcopy._find_cc() is None, reason="no C compiler here")

SPECIAL = np.array([
    0x00000000, 0x80000000, 0x00000001, 0x807fffff,            # zeros, the smallest and largest subnormals
    0x7f800000, 0xff800000,                                    # infinities
    0x7fc00000, 0xffc00000, 0x7fc00001, 0x7fffffff,            # quiet NaNs
    0x7f800001, 0xff800001, 0x7fa00000, 0x7f801fff, 0x7f802000,  # signalling NaNs: low payloads vanish
    0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x47800000,  # 65504, the tie to 65536 (-> inf), over
    0x33000000, 0x33000001, 0x337fffff, 0x33800000,            # 2**-25 (ties to 0), just above, 2**-24
    0x387fc000, 0x387fe000, 0x38800000, 0x38801000, 0x38802000,  # the subnormal / normal boundary, ties
    0x3f801000, 0x3f803000, 0x3f800fff, 0x3f801001,            # ties to even around 1.0
], dtype=np.uint32)


def _numpy(bits: np.ndarray) -> bytes:
    with np.errstate(all="ignore"):
        return bits.view(np.float32).astype(np.float16).view(np.uint16).tobytes()


def _kernel(bits: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):               # numpy's cast (short inputs) warns of overflow
        return _fastcopy.cast(bits.view(np.float32), np.float16)


@needs_kernel
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 4095, 4096, 4097, 4103, 70001])
def test_cast_matches_numpy_bit_for_bit(n):
    rng = np.random.default_rng(n)
    bits = np.concatenate([SPECIAL, rng.integers(0, 2**32, size=n, dtype=np.uint32),
                           rng.choice(SPECIAL, size=n % 97)])
    got = _kernel(bits)
    assert got.dtype == np.float16 and got.shape == bits.shape
    assert got.view(np.uint16).tobytes() == _numpy(bits)


@needs_kernel
def test_cast_uses_the_kernel_and_keeps_the_shape():
    assert _fastcopy._kernel_fn() is not None
    if _fastcopy._kernel.get("f16") is None:
        pytest.skip("the kernel has no float16 cast on this CPU")
    x = np.random.default_rng(1).standard_normal((64, 33, 5)).astype(np.float32)
    buf = np.empty(x.size, np.uint16)
    assert _fastcopy._kernel["f16"](buf.ctypes.data, x.ctypes.data, x.size) in (0, 1)
    got = _fastcopy.cast(x, np.float16)
    assert got.shape == (64, 33, 5) and got.tobytes() == x.astype(np.float16).tobytes()


@pytest.mark.parametrize("make", [
    lambda x: x[:, ::2],                                     # not contiguous
    lambda x: x.astype(">f4"),                               # other byte order
    lambda x: x.astype(np.float64),                          # other source dtype
])
def test_cast_other_inputs_are_numpys_cast(make):
    x = make(np.random.default_rng(2).standard_normal((300, 40)).astype(np.float32))
    got = _fastcopy.cast(x, np.float16)
    assert got.tobytes() == x.astype(np.float16).tobytes() and got.shape == x.shape
    assert _fastcopy.cast(x, np.float32).tobytes() == x.astype(np.float32).tobytes()


@needs_kernel
def test_cast_without_the_kernel_or_avx2_is_numpys(monkeypatch):
    bits = np.concatenate([SPECIAL, np.arange(0, 2**32 - 1, 2**20, dtype=np.uint32)])
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", False)
    assert _kernel(bits).view(np.uint16).tobytes() == _numpy(bits)
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", True)
    if _fastcopy._kernel_fn() is None or _fastcopy._kernel.get("isa_fn") is None:
        pytest.skip("no compiled kernel here")
    old = _fastcopy._kernel["isa"]
    _fastcopy.set_isa("sse2")
    try:
        buf = np.empty(bits.size, np.uint16)
        assert _fastcopy._kernel["f16"](buf.ctypes.data, bits.ctypes.data, bits.size) == 1   # declines
        assert _kernel(bits).view(np.uint16).tobytes() == _numpy(bits)
    finally:
        _fastcopy.set_isa(old)


# exponents whose every mantissa is tried: float32 subnormals (0), the range that becomes float16
# subnormals or rounds to zero (101-113) and the first normals (114), the overflow edge (141-143),
# infinities and NaNs (255); the other exponents are sampled
EDGE_EXPONENTS = (0, *range(101, 115), 141, 142, 143, 255)


@needs_kernel
@pytest.mark.slow
def test_cast_every_mantissa_at_the_edges():
    """Both signs: every one of the 2**23 mantissas at the edge exponents (40 x 8.4 M patterns), every
    128th at the others, against numpy's cast (about 15 s)."""
    every = np.arange(1 << 23, dtype=np.uint32)
    some = every[::128] | np.uint32(0x55)                        # low bits set: not only ties
    for sign in (0, 1):
        for e in range(256):
            bits = np.uint32((sign << 31) | (e << 23)) | (every if e in EDGE_EXPONENTS else some)
            got = _kernel(bits).view(np.uint16)
            with np.errstate(all="ignore"):
                ref = bits.view(np.float32).astype(np.float16).view(np.uint16)
            if not np.array_equal(got, ref):
                i = int(np.flatnonzero(got != ref)[0])
                pytest.fail(f"float32 bits {int(bits[i]):#010x}: kernel {int(got[i]):#06x}, numpy {int(ref[i]):#06x}")
