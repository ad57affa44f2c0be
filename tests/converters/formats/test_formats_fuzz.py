"""Hostile arguments to the format API: any format name, shape, dtype, C0, groups and origin give a
result or one FormatError (an NpuDeployError, exit 2), never another exception, a hang or a huge
allocation. Bounded: a few hundred examples, tiny arrays only."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters import formats
from npu_deploy.errors import NpuDeployError
from tests.fuzzing import examples

FORMAT_NAMES = sorted(formats.FORMATS)
formats_ = st.one_of(st.sampled_from(FORMAT_NAMES), st.text(max_size=12), st.integers(-5, 1 << 33),
                     st.sampled_from(["FORMAT_NC1HWC0", "NC1HWC0:1", "fractal_nz", "", "NZ", "5HD"]))
dims = st.integers(-3, 40) | st.sampled_from([0, 1, 16, 17, 1 << 40, -1])
shapes = st.lists(dims, min_size=0, max_size=6)
dtypes = st.sampled_from(["float16", "float32", "int8", "uint8", "bfloat16", "float64", "bool", "int4",
                          "complex64", "object", "str", "nonsense", "V8"])
c0s = st.none() | st.integers(-2, 70) | st.sampled_from([True, 0, 1 << 20])
groups_ = st.integers(-1, 40) | st.sampled_from([1, 1 << 17])
origins = st.none() | st.sampled_from(["NCHW", "NHWC", "HWCN", "ND", "NCDHW", "nope", ""])
SLOW = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _small(shape) -> bool:
    return all(isinstance(d, int) and 0 <= d <= 64 for d in shape) and math.prod(shape or [1]) <= 4096


@SLOW
@given(formats_, shapes, dtypes, c0s, groups_, origins)
def test_shapes_and_sizes_raise_only_format_errors(fmt, shape, dtype, c0, groups, origin):
    try:
        s = formats.storage_shape(fmt, shape, dtype, c0=c0, groups=groups, origin=origin)
    except NpuDeployError as e:
        assert "\n" not in str(e)
        return
    assert all(isinstance(d, int) and d >= 0 for d in s)
    assert formats.nbytes(fmt, shape, dtype, c0=c0, groups=groups, origin=origin) >= 0


@SLOW
@given(formats_, shapes, dtypes, c0s, groups_, origins, st.integers(0, 2**31 - 1))
def test_pack_and_unpack_raise_only_format_errors(fmt, shape, dtype, c0, groups, origin, seed):
    if not _small(shape):
        return
    try:
        dt = formats.normalize_dtype(dtype)
        x = np.random.default_rng(seed).integers(0, 100, size=shape).astype(dt)
    except (NpuDeployError, TypeError, ValueError):
        return  # not an array numpy can make: nothing to hand to the API
    try:
        storage = formats.storage_shape(fmt, shape, dtype, c0=c0, groups=groups, origin=origin)
        if math.prod(storage) > 1 << 20:
            return
        y = formats.pack(x, fmt, c0=c0, groups=groups, origin=origin)
        back = formats.unpack(y, fmt, shape, c0=c0, groups=groups, origin=origin)
    except NpuDeployError as e:
        assert "\n" not in str(e)
        return
    assert tuple(y.shape) == tuple(storage)
    np.testing.assert_array_equal(back, x)


@SLOW
@given(formats_, st.lists(st.integers(0, 1 << 20), max_size=5), shapes, dtypes,
       st.sampled_from(["any", "storage", "flat"]))
def test_unpack_of_a_raw_buffer_of_any_size(fmt, raw_shape, shape, dtype, fit):
    """A raw dump read as some format: the buffer's size rarely fits; never anything but FormatError.
    Where it is accepted, the result is ``shape`` made of the buffer's own elements, each at most once
    (unpacking moves elements and drops padding; it never invents or repeats one): every element of
    the buffer has a distinct bit pattern, so a repeated or foreign value shows."""
    if not _small(shape):
        return
    if fit != "any":  # a buffer of the right size too (as stored, or flat as read from a file), else none fits
        try:
            storage = formats.storage_shape(fmt, shape, dtype)
        except NpuDeployError:
            return
        raw_shape = list(storage) if fit == "storage" else [math.prod(storage)]
    n = math.prod(raw_shape or [1])
    if n > 4096:
        return
    try:
        dt = np.dtype(formats.normalize_dtype(dtype))
        bits = np.dtype(f"u{dt.itemsize}") if dt.itemsize in (1, 2, 4, 8) else None
        pattern = (np.arange(n) % (2 if dt.kind == "b" else 1 << min(8 * dt.itemsize, 62))).astype(bits) \
            if bits is not None else None
        buf = (pattern.view(dt) if pattern is not None else np.zeros(n, dt)).reshape(raw_shape)
    except (NpuDeployError, TypeError, ValueError):
        return
    try:
        back = formats.unpack(buf, fmt, shape)
    except NpuDeployError as e:
        assert "\n" not in str(e)
        return
    assert tuple(back.shape) == tuple(int(d) for d in shape) and back.dtype == buf.dtype
    assert back.size <= buf.size
    if pattern is not None:
        got = np.ascontiguousarray(back).reshape(-1).view(bits)
        assert np.isin(got, pattern).all()
        if dt.kind != "b" and n <= 1 << (8 * dt.itemsize):  # the buffer's patterns are all distinct
            assert np.unique(got).size == got.size


@SLOW
@given(st.one_of(st.text(max_size=20), st.integers(-10, 1 << 40)))
def test_parse_format_of_anything(value):
    try:
        w = formats.parse_format(value)
    except NpuDeployError:
        return
    assert w.format.name in formats.FORMATS
