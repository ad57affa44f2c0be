"""A faster strided copy for the format transforms (private).

:mod:`npu_deploy.converters.formats` interprets a format's pattern as rectangular pieces, each one a
copy between two strided views. ``dst[...] = src`` is correct but slow when the destination's
innermost axis is short (C0 = 16 elements): numpy then runs a 16-element inner loop millions of times.
:func:`copy` gives the same result faster, with numpy alone:

1. drop length-1 axes, order the axes by destination stride and merge axes that are contiguous in
   both arrays (``(m1 m0)`` becomes ``m``; a whole aligned NC1HWC0 block becomes one axis);
2. when the innermost axis is contiguous in both arrays and short (NZ's C0 block), move it as one
   wide unsigned integer instead of C0 small ones;
3. when the destination's innermost axis is still short, loop over it in Python so that numpy's inner
   loop runs along a long axis instead;
4. cut the work into cache-sized tasks along the outer axes and, for large copies on a machine with
   an idle core, hand them to a small thread pool (numpy releases the GIL while it copies).

It never allocates anything of the array's size. Set ``NPU_DEPLOY_FASTCOPY=0`` to disable it (every
copy is then a plain ``dst[...] = src``) and ``NPU_DEPLOY_THREADS=N`` to cap the threads.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

ENABLED = os.environ.get("NPU_DEPLOY_FASTCOPY", "1") not in ("0", "false", "no")
_SMALL = 1 << 19            # elements: below this a plain numpy copy is as fast (measured)
_TASK_BYTES = 1 << 20       # destination bytes per task (fits the L2 of current x86 cores)
_PARALLEL_BYTES = 4 << 20   # use threads above this many destination bytes
_SHORT = 64                 # an innermost axis shorter than this is looped over in Python

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> int:
    env = os.environ.get("NPU_DEPLOY_THREADS", "")
    if env.strip().isdigit():
        return max(1, int(env))
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def _spare_cores(n: int) -> bool:
    """True when the machine has an idle core for a second thread. On a busy machine a helper
    thread waits for a CPU and the copy ends when the slowest task does: measured slower than one
    thread (benchmarks/README-formats.md)."""
    if os.environ.get("NPU_DEPLOY_THREADS", "").strip().isdigit():
        return True  # the user asked for a thread count: honour it
    try:
        return os.getloadavg()[0] + 1.0 <= n
    except (AttributeError, OSError):
        return True


def _get_pool() -> ThreadPoolExecutor | None:
    global _pool
    n = _threads()
    if n <= 1 or not _spare_cores(n):
        return None
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="npu-deploy-copy")
        return _pool


def _simplify(dst: np.ndarray, src: np.ndarray):
    """(shape, dst strides, src strides) with length-1 axes dropped, ordered by destination stride
    (largest first) and contiguous axes merged."""
    axes = [i for i in range(dst.ndim) if dst.shape[i] != 1]
    axes.sort(key=lambda i: (abs(dst.strides[i]), abs(src.strides[i])), reverse=True)
    shape: list[int] = []
    ds: list[int] = []
    ss: list[int] = []
    for i in axes:
        n, d, s = dst.shape[i], dst.strides[i], src.strides[i]
        if shape and ds[-1] == d * n and ss[-1] == s * n:
            shape[-1] *= n
            ds[-1] = d
            ss[-1] = s
        else:
            shape.append(n)
            ds.append(d)
            ss.append(s)
    return shape, ds, ss


_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _widen(shape, ds, ss, item: int):
    """Move a short innermost run that is contiguous in both arrays as wider integers."""
    if len(shape) < 2 or ds[-1] != item or ss[-1] != item:
        return shape, ds, ss, item
    run = shape[-1] * item
    if run > 8 * _SHORT:
        return shape, ds, ss, item
    for width in (8, 4, 2):
        if run % width == 0 and width > item and all(x % width == 0 for x in ds[:-1] + ss[:-1]):
            lanes = run // width
            if lanes == 1:
                return shape[:-1], ds[:-1], ss[:-1], width
            return shape[:-1] + [lanes], ds[:-1] + [width], ss[:-1] + [width], width
    return shape, ds, ss, item


class _Interface:
    """Holds an ``__array_interface__`` (and the array it points into) for ``np.asarray``."""

    def __init__(self, interface: dict, keep: np.ndarray):
        self.__array_interface__ = interface
        self._keep = keep


def _reinterpret(a: np.ndarray, width: int | np.dtype, shape, strides) -> np.ndarray:
    """``a``'s memory seen as uint<width*8> elements (or the given dtype) with the given shape and
    byte strides, starting at ``a``'s first element."""
    dt = np.dtype(_UINTS[width]) if isinstance(width, int) else np.dtype(width)
    width = dt.itemsize
    if a.dtype.itemsize == width:
        base = a.view(dt) if a.dtype != dt else a
    else:
        # one element at a's first byte, re-typed; as_strided then lays the wanted view over it
        iface = {"data": a.__array_interface__["data"], "typestr": dt.str, "shape": (1,),
                 "strides": None, "version": 3}
        if dt.kind == "V":
            iface["descr"] = [("", dt.str)]
        base = np.asarray(_Interface(iface, a))
    return np.lib.stride_tricks.as_strided(base, tuple(shape), tuple(strides),
                                           writeable=a.flags.writeable)


def _tasks(shape, target_elems: int):
    """Split the outer axes into index tuples of about ``target_elems`` elements each."""
    total = math.prod(shape)
    n_tasks = max(1, total // max(target_elems, 1))
    if n_tasks <= 1 or not shape:
        return [()]
    out = []
    prefix_count = 1
    for axis, n in enumerate(shape):
        if prefix_count * n >= n_tasks or axis == len(shape) - 1:
            chunks = max(1, min(n, -(-n_tasks // prefix_count)))
            step = -(-n // chunks)
            for prefix in np.ndindex(*shape[:axis]):
                for start in range(0, n, step):
                    out.append(tuple(prefix) + (slice(start, min(n, start + step)),))
            return out
        prefix_count *= n
    return [()]


_TAKE_ROWS = 16             # destination rows per np.take call in the gather strategy
_TAKE_INDEX = 1 << 16       # entries per cached index tile


@lru_cache(maxsize=8)
def _take_index(rows: int, cols: int, row_step: int, col_step: int) -> np.ndarray:
    """idx[r, c] = r·row_step + c·col_step (read-only, cached: reused by every tile of a copy)."""
    idx = (np.arange(rows, dtype=np.intp)[:, None] * row_step
           + np.arange(cols, dtype=np.intp)[None, :] * col_step)
    idx.flags.writeable = False
    return idx


def _gather_units(dst: np.ndarray, src: np.ndarray, shape, ds, ss, unit: int) -> bool:
    """Move whole ``unit``-byte blocks (NZ's C0 rows) with ``np.take``: the copy is a 2-D transpose
    of blocks into a contiguous destination. Returns False when the layout does not allow it."""
    if len(shape) != 2 or unit < 16 or ds[1] != unit or ds[0] != unit * shape[1]:
        return False
    if any(x <= 0 or x % unit for x in ss):
        return False
    rows, cols = shape
    rs, cs = ss[0] // unit, ss[1] // unit
    void = np.dtype((np.void, unit))
    span = (rows - 1) * rs + (cols - 1) * cs + 1
    src_units = _reinterpret(src, void, (span,), (unit,))
    dst_units = _reinterpret(dst, void, (rows, cols), (unit * cols, unit))
    # index tiles of at most _TAKE_INDEX entries (512 KiB), cached and reused by every tile
    if cols <= _TAKE_INDEX:
        tile = max(1, min(rows, _TAKE_ROWS, _TAKE_INDEX // cols))
        idx = _take_index(tile, cols, rs, cs)
        for r0 in range(0, rows, tile):
            r1 = min(rows, r0 + tile)
            # every index is in range; "wrap" is the cheapest mode that skips numpy's bounds error path
            np.take(src_units[r0 * rs:], idx[: r1 - r0], out=dst_units[r0:r1], mode="wrap")
    else:
        idx = _take_index(1, _TAKE_INDEX, rs, cs)[0]
        for r in range(rows):
            for c0 in range(0, cols, _TAKE_INDEX):
                c1 = min(cols, c0 + _TAKE_INDEX)
                np.take(src_units[r * rs + c0 * cs:], idx[: c1 - c0], out=dst_units[r, c0:c1], mode="wrap")
    return True


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for same-shape arrays, faster for transposing copies.

    >>> a = np.arange(2 * 16 * 64 * 64, dtype=np.float16).reshape(2, 16, 64, 64)
    >>> b = np.empty((2, 64, 64, 16), np.float16)
    >>> copy(b.transpose(0, 3, 1, 2), a)
    >>> bool((b == a.transpose(0, 2, 3, 1)).all())
    True
    """
    if (not ENABLED or dst.size < _SMALL or dst.shape != src.shape or dst.dtype != src.dtype
            or dst.dtype.hasobject or np.may_share_memory(dst, src)):
        dst[...] = src
        return
    item = dst.dtype.itemsize
    shape, ds, ss = _simplify(dst, src)
    if len(shape) <= 1:
        dst[...] = src
        return
    run_bytes = shape[-1] * item if (ds[-1] == item and ss[-1] == item) else 0
    if run_bytes >= 16 and len(shape) == 3 and _gather_units(dst, src, shape[:2], ds[:2], ss[:2], run_bytes):
        return
    shape, ds, ss, width = _widen(shape, ds, ss, item)
    d = _reinterpret(dst, width, shape, ds)
    s = _reinterpret(src, width, shape, ss)
    # Loop over a short innermost axis in Python only when the axis numpy then runs along reads the
    # source (nearly) contiguously; otherwise every element would come from a different cache line.
    hoist = (len(shape) >= 2 and shape[-1] < _SHORT and abs(ss[-1]) != width
             and abs(ss[-2]) <= 4 * width and shape[-2] >= _SHORT)
    total_bytes = math.prod(shape) * width
    tasks = _tasks(shape[:-1] if hoist else shape, _TASK_BYTES // width // (shape[-1] if hoist else 1))

    def run(idx):
        dv, sv = d[idx], s[idx]
        if hoist:
            for k in range(shape[-1]):
                dv[..., k] = sv[..., k]
        else:
            dv[...] = sv

    pool = _get_pool() if total_bytes >= _PARALLEL_BYTES and len(tasks) > 1 else None
    if pool is None:
        for idx in tasks:
            run(idx)
    else:
        for _ in pool.map(run, tasks):
            pass
