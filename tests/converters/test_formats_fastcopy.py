"""The fast strided copy behind the format transforms must equal ``dst[...] = src`` exactly, for any
pair of same-shape views (transposed, sliced, reversed, overlapping-free), dtype and threshold."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_deploy.converters import _fastcopy


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
@given(view_pairs(), st.sampled_from([1, 64]), st.sampled_from([64, 1 << 20]), st.booleans())
def test_copy_equals_plain_assignment(pair, small, task_bytes, threads):
    dst, src = pair
    expect = dst.copy()
    expect[...] = src
    old = (_fastcopy._SMALL, _fastcopy._TASK_BYTES, _fastcopy._PARALLEL_BYTES)
    old_env = os.environ.get("NPU_DEPLOY_THREADS")
    try:
        _fastcopy._SMALL, _fastcopy._TASK_BYTES = small, task_bytes
        _fastcopy._PARALLEL_BYTES = 1 if threads else 1 << 40
        os.environ["NPU_DEPLOY_THREADS"] = "2"  # use the pool even on a busy machine
        _fastcopy.copy(dst, src)
    finally:
        _fastcopy._SMALL, _fastcopy._TASK_BYTES, _fastcopy._PARALLEL_BYTES = old
        if old_env is None:
            os.environ.pop("NPU_DEPLOY_THREADS", None)
        else:
            os.environ["NPU_DEPLOY_THREADS"] = old_env
    assert dst.tobytes() == expect.tobytes()


@pytest.mark.parametrize("index_tile", [1 << 16, 8])
def test_nz_like_block_gather_and_hoisted_copy(monkeypatch, index_tile):
    monkeypatch.setattr(_fastcopy, "_SMALL", 1)
    monkeypatch.setattr(_fastcopy, "_TASK_BYTES", 8192)
    monkeypatch.setattr(_fastcopy, "_TAKE_INDEX", index_tile)                # also the column-chunked gather
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 96)).astype(np.float16)                 # NZ: 32-byte row blocks move
    dst = np.empty((6, 100, 16), np.float16)
    _fastcopy.copy(dst.transpose(1, 0, 2), x.reshape(100, 6, 16))
    assert np.array_equal(dst, x.reshape(100, 6, 16).transpose(1, 0, 2))
    back = np.empty_like(x)
    _fastcopy.copy(back.reshape(100, 6, 16), dst.transpose(1, 0, 2))       # and the NZ unpack direction
    assert np.array_equal(back, x)
    a = rng.standard_normal((3, 16, 40, 50)).astype(np.float16)            # 5HD: the short C0 is hoisted
    out = np.empty((3, 40, 50, 16), np.float16)
    _fastcopy.copy(out.transpose(0, 3, 1, 2), a)
    assert np.array_equal(out, a.transpose(0, 2, 3, 1))


def test_disabled_is_plain_assignment(monkeypatch):
    monkeypatch.setattr(_fastcopy, "ENABLED", False)
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    b = np.empty((4, 3, 2), np.int32)
    _fastcopy.copy(b.transpose(2, 1, 0), a)
    assert np.array_equal(b, a.transpose(2, 1, 0))
