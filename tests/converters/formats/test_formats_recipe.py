"""The per-call fast path of ``formats.pack``/``unpack`` (issue 15): recipes cached per call signature,
the small-tensor gather, the recorded kernel program, ``out=`` without allocation, ``threads=``.

Results are checked against the plain derived interpreter (``NPU_DEPLOY_FASTCOPY`` off), which the
oracle tests in ``test_formats_oracle.py`` check against the reference formulas."""

from __future__ import annotations

import threading
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from npu_deploy.converters.formats import _fastcopy
from npu_deploy.converters import formats as F


@pytest.fixture(autouse=True)
def fresh_recipes():
    F._clear_recipes()
    yield
    F._clear_recipes()


def _random(shape, dtype, seed=0):
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)        # any bit pattern: compared as bytes


def _plain(fn):
    old = _fastcopy.ENABLED
    _fastcopy.ENABLED = False
    try:
        return fn()
    finally:
        _fastcopy.ENABLED = old


# (format, logical shape, keywords): small (gather), medium (kernel program), multi-stage (grouped)
CASES = [
    ("NC1HWC0", (1, 32, 8, 8), {}), ("NC1HWC0", (2, 3, 26, 26), {}), ("NC1HWC0", (2, 70, 30, 31), {}),
    ("NDC1HWC0", (1, 20, 3, 9, 9), {}), ("FRACTAL_Z", (64, 32, 1, 1), {}), ("FRACTAL_Z", (70, 40, 3, 3), {}),
    ("FRACTAL_Z", (64, 16, 3, 3), {"groups": 4}), ("FRACTAL_Z", (96, 10, 3, 3), {"groups": 3}),
    ("FRACTAL_NZ", (32, 64), {}), ("FRACTAL_NZ", (3, 100, 130), {}), ("FRACTAL_NZ", (33, 1), {}),
    ("FRACTAL_Z_C04", (40, 3, 5, 5), {}), ("C1HWNCoC0", (3, 3, 33, 2), {"origin": "HWCN"}),
    ("NHWC", (2, 5, 6, 7), {}), ("ND", (), {}),
]


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8, ml_dtypes.bfloat16])
@pytest.mark.parametrize("fmt,shape,kw", CASES)
def test_repeated_calls_equal_the_plain_path(fmt, shape, kw, dtype, kernel, monkeypatch):
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", kernel)
    if fmt == "C1HWNCoC0" and dtype not in (np.float16, np.float32, np.int8):
        return
    x = _random(shape, dtype)
    want = _plain(lambda: F.pack(x, fmt, **kw))
    out = np.empty_like(want)
    for i in range(3):                      # first call builds the recipe, the others reuse it
        out.reshape(-1).view(np.uint8).fill(0x5A + i)   # dirty: padding must be written every time
        assert F.pack(x, fmt, out=out, **kw) is out
        assert out.tobytes() == want.tobytes()
        assert F.pack(x, fmt, **kw).tobytes() == want.tobytes()
    back = np.empty_like(x)
    for i in range(3):
        back.reshape(-1).view(np.uint8).fill(0xA5 - i)
        assert F.unpack(want, fmt, shape, out=back, **kw) is back
        assert back.tobytes() == x.tobytes()
    flat = np.frombuffer(want.tobytes(), dtype=want.dtype)      # a raw dump: flat and read-only
    assert F.unpack(flat, fmt, shape, **kw).tobytes() == x.tobytes()


def test_small_calls_are_one_gather_and_larger_ones_a_kernel_program(monkeypatch):
    monkeypatch.setattr(_fastcopy, "KERNEL_ENABLED", True)
    if _fastcopy._kernel_fn() is None:
        pytest.skip("no compiled kernel here")
    small = _random((1, 32, 8, 8), np.float16)
    F.pack(small, "NC1HWC0")
    (key, r), = F._recipes.items()
    assert key[:2] == ("p", "NC1HWC0") and r.gather is not None and r.gather.size <= F._GATHER_MAX
    F._clear_recipes()
    big = _random((4, 64, 40, 40), np.float16)
    y = F.pack(big, "NC1HWC0")
    F.unpack(y, "NC1HWC0", big.shape)
    for r in F._recipes.values():
        assert r.gather is None or r.gather.size > F._GATHER_MAX
        assert r.programs and all(p is not False for p in r.programs.values())


@pytest.mark.parametrize("fmt,shape,kw", [
    ("NC1HWC0", (1, 32, 8, 8), {}), ("NC1HWC0", (4, 64, 40, 40), {}), ("FRACTAL_NZ", (3, 100, 130), {}),
    ("FRACTAL_Z", (64, 16, 3, 3), {"groups": 4}), ("FRACTAL_Z", (256, 256, 3, 3), {})])
def test_out_is_the_zero_allocation_path(fmt, shape, kw):
    """With ``out=`` reused, a repeated call allocates nothing of the tensor's size (tracemalloc sees
    numpy's buffers): the emulator's per-inference transfers."""
    x = _random(shape, np.float16)
    out = F.pack(x, fmt, **kw)
    back = np.empty_like(x)
    F.pack(x, fmt, out=out, **kw)
    F.unpack(out, fmt, shape, out=back, **kw)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(3):
            F.pack(x, fmt, out=out, **kw)
            F.unpack(out, fmt, shape, out=back, **kw)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    # a few Python objects (views, ctypes arguments) at most; the no-kernel fallback builds its
    # strided views per call (some KiB), still nothing of the tensor's size (>= 800 KiB here)
    small_path = _fastcopy._kernel_fn() is not None or x.size <= F._GATHER_FALLBACK_MAX
    limit = 4096 if small_path else 65536      # (onnxruntime bindings of the fallback: ~17 KiB)
    assert peak < min(limit, x.nbytes // 4 + 4096), f"{peak} bytes allocated for a {x.nbytes}-byte tensor"
    assert back.tobytes() == x.tobytes()


def test_cached_calls_still_check_every_argument():
    x = _random((2, 20, 5, 5), np.float16)
    y = F.pack(x, "NC1HWC0", c0=16)
    for _ in range(2):                      # before and after the recipe exists
        with pytest.raises(F.FormatError, match="C0"):
            F.pack(x, "NC1HWC0", c0=True)   # a bool is not a C0, even though True == 1
        with pytest.raises(F.FormatError, match="shape"):
            F.pack(x, "NC1HWC0", out=np.empty((2, 2, 5, 5, 8), np.float16))
        with pytest.raises(F.FormatError, match="float16"):
            F.pack(x, "NC1HWC0", out=np.empty(y.shape, np.float32))
        with pytest.raises(F.FormatError, match="C-contiguous"):
            F.pack(x, "NC1HWC0", out=np.empty(y.shape[:-1] + (32,), np.float16)[..., ::2])
        ro = np.empty_like(y)
        ro.flags.writeable = False
        with pytest.raises(F.FormatError, match="read-only"):
            F.pack(x, "NC1HWC0", out=ro)
        with pytest.raises(F.FormatError, match="out= must be a numpy array"):
            F.unpack(y, "NC1HWC0", x.shape, out=[0] * x.size)
        with pytest.raises(F.FormatError, match="needs storage"):
            F.unpack(y[:1], "NC1HWC0", x.shape)
        with pytest.raises(F.FormatError, match="threads"):
            F.pack(x, "NC1HWC0", threads=0)
        with pytest.raises(F.FormatError, match="threads"):
            F.unpack(y, "NC1HWC0", x.shape, threads="2")
        assert F.pack(x, "NC1HWC0").tobytes() == y.tobytes()


def test_equal_arguments_of_other_types_share_nothing_wrong():
    """Keys are the raw arguments: a Format object, a name, an int and a lower-case name all give the
    same result, and a different dtype or shape never reuses another call's recipe."""
    x = _random((3, 17, 33), np.float16)
    want = F.pack(x, "FRACTAL_NZ")
    for fmt in (F.FORMATS["FRACTAL_NZ"], 29, "fractal_nz", "FORMAT_FRACTAL_NZ", "FRACTAL_NZ"):
        assert F.pack(x, fmt).tobytes() == want.tobytes()
    x32 = x.astype(np.float32)
    assert F.unpack(F.pack(x32, "FRACTAL_NZ"), "FRACTAL_NZ", x.shape).tobytes() == x32.tobytes()
    xs = x[:, :16]
    assert F.unpack(F.pack(xs, "FRACTAL_NZ"), "FRACTAL_NZ", list(xs.shape)).tobytes() == xs.tobytes()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_keyword_gives_identical_bytes(threads, monkeypatch):
    monkeypatch.setattr(_fastcopy, "_PARALLEL_BYTES", 1)        # threads even for these sizes
    for fmt, shape, kw in (("FRACTAL_NZ", (300, 260), {}), ("NC1HWC0", (2, 40, 33, 35), {}),
                           ("FRACTAL_Z", (96, 64, 3, 3), {}), ("FRACTAL_Z", (64, 16, 3, 3), {"groups": 4})):
        x = _random(shape, np.float16, seed=threads)
        want = _plain(lambda: F.pack(x, fmt, **kw))
        got = F.pack(x, fmt, threads=threads, **kw)
        assert got.tobytes() == want.tobytes()
        assert F.unpack(got, fmt, shape, threads=threads, **kw).tobytes() == x.tobytes()
        assert F.transdata(got, fmt, fmt, shape, threads=threads, **kw).tobytes() == want.tobytes()


def test_concurrent_calls_share_recipes_safely():
    """The emulator may run sessions from several threads: one recipe (and its per-thread
    intermediates for grouped FRACTAL_Z) serves them all."""
    cases = [(_random((64, 16, 3, 3), np.float16, s), "FRACTAL_Z", {"groups": 4}) for s in range(3)]
    cases += [(_random((3, 100, 130), np.float16, s), "FRACTAL_NZ", {}) for s in range(3)]
    wants = [_plain(lambda x=x, f=f, kw=kw: F.pack(x, f, **kw)).tobytes() for x, f, kw in cases]
    errors = []

    def worker(k):
        try:
            for i in range(30):
                x, f, kw = cases[(i + k) % len(cases)]
                got = F.pack(x, f, **kw)
                if got.tobytes() != wants[(i + k) % len(cases)]:
                    errors.append("pack")
                if F.unpack(got, f, x.shape, **kw).tobytes() != x.tobytes():
                    errors.append("unpack")
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_recipe_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(F, "_RECIPE_BUDGET", 64 << 10)
    for n in range(1, 60):
        x = _random((n, 64), np.float16, n)
        assert F.unpack(F.pack(x, "FRACTAL_NZ"), "FRACTAL_NZ", x.shape).tobytes() == x.tobytes()
    assert F._recipe_bytes <= 64 << 10 or len(F._recipes) == 1
    assert sum(r.nbytes + 512 for r in F._recipes.values()) == F._recipe_bytes


def test_plain_names_are_parsed_without_regexes(monkeypatch):
    """parse_format/get_format of a Format or a plain registry name is a dict hit (the hot path)."""
    def boom(*a, **k):
        raise AssertionError("regex used")
    monkeypatch.setattr(F, "_FMT_WORD_RE", None)
    monkeypatch.setattr(F.re, "fullmatch", boom)
    for name in ("NC1HWC0", "FRACTAL_NZ", "ND", "FRACTAL_Z_3D"):
        assert F.parse_format(name).format is F.FORMATS[name]
        assert F.parse_format(name) is F.parse_format(F.FORMATS[name])
        assert F.get_format(name) is F.FORMATS[name]
    monkeypatch.undo()
    assert F.parse_format("nc1hwc0:1").sub_format == 1          # the general syntax still parses
    assert F.get_format("ACL_FORMAT_ND").name == "ND"
