"""A faster strided copy for the format transforms (private).

:mod:`npu_deploy.converters.formats` interprets a format's pattern as rectangular pieces, each one a
copy between two strided views. ``dst[...] = src`` is correct but slow when the destination's
innermost axis is short (C0 = 16 elements): numpy then runs a 16-element inner loop millions of times.
:func:`copy` gives the same result (byte for byte) faster:

1. drop length-1 axes, order the axes by destination stride and merge axes that are contiguous in
   both arrays (``(m1 m0)`` becomes ``m``; a whole aligned NC1HWC0 block becomes one axis);
2. *wide units*: when the innermost axis is contiguous in both arrays (FRACTAL_NZ's C0 row, FRACTAL_Z
   from [K, N]), move it as one wide element -- ``uint16`` ... ``uint64``, ``complex128`` (16 bytes)
   or ``clongdouble`` (32 bytes where the platform has it); numpy copies those bit for bit;
3. *element-granular batched 2-D transposes* between two contiguous blocks (NC1HWC0 pack and unpack:
   per (n, c1) a ``C0 x HW`` <-> ``HW x C0`` transpose) go to onnxruntime's Transpose kernel (a
   package dependency; an exact copy of unsigned integers), through a cached single-threaded session
   per shape and ``io_binding`` on the caller's buffers: nothing is allocated;
4. *two-step* (FRACTAL_Z from NCHW: C0 goes innermost *and* N moves inside): per 2 MiB tile,
   onnxruntime transposes the ``C0 x HW`` blocks into a per-thread scratch and numpy moves the C0
   rows as wide units (the reverse for unpack);
5. *staged transpose* (FRACTAL_NZ unpack: the source is a page or more apart along the destination's
   inner axis): a 512 KiB tile is read with long contiguous runs into a per-thread scratch, then
   transposed in cache;
6. otherwise numpy, with the inner loop put along the axis whose strides are smallest on *both*
   sides (a short axis with a smaller destination stride is looped over in Python) and the work cut
   into ~1 MiB cache-sized tasks along that axis first.

0. first of all, when a C compiler is available: the *compiled kernel* (``_copykernel.c``, built at
   first use into ``$NPU_DEPLOY_CACHE/kernels`` or ``~/.cache/npu-deploy/kernels``, loaded with
   ctypes): the destination's and the source's innermost axes are copied in cache tiles (SSE2 8x8
   transposes of 2-byte elements on x86-64), the other axes looped over in C. A second entry point,
   ``npd_tile3``, serves copies between many small contiguous ``A x B`` blocks and long contiguous
   runs (FRACTAL_Z from NCHW and back: per n one ``C0 x H·W`` block, per h·w one run of ``N·C0``),
   recognised from the strides by :func:`_tile3_plan`, one in-cache transpose per block. Measured faster than
   or equal to paths 3-6 for every benchmark layout. Any failure to build or load it (no compiler,
   compile error, read-only cache) silently selects paths 1-6, once; :func:`kernel_info` tells why.
   ``NPU_DEPLOY_KERNEL=0`` disables it. The wrapper checks that every byte the kernel will touch
   lies inside both arrays before calling it.

The kernel moves 1-, 2- and 4-byte elements through SSE2 register transposes (16x16 and 8x8 bytes,
8x8 halves, 4x4 words); where the CPU reports AVX2 (runtime dispatch: the same shared object, built
without ``-march``, runs on any x86-64 host) FRACTAL_Z's ``C0 x H·W`` blocks (fp16, int8) and int8
NC1HWC0 pack go through AVX2 transposes of twice the width instead (``NPU_DEPLOY_KERNEL_ISA=sse2``
or :func:`set_isa` keeps the baseline; both write the same bytes, see ``test_copykernel_isa.py``);
contiguous runs of 2-64 bytes move as one unit (FRACTAL_NZ's C0 rows; 64 bytes
is wider than any numpy type), walks tiles 256 bytes deep along the destination's inner axis (8
lines: the source column of a FRACTAL_NZ tile then stays in one 8-way L1 set instead of thrashing
it), and for copies of at least ``_NT_BYTES`` writes with streaming stores where whole lines are
written at once (no read-for-ownership of the destination: a third less memory traffic).

:func:`kernel_tasks` returns the kernel calls of a copy without running them, so ``formats`` can
record a whole pack/unpack once and replay it on other buffers of the same shapes (:func:`run_tasks`).
:func:`task_variant` rewrites a recorded call with other streaming-store / tile / loop-order
settings (:data:`VARIANTS`), same bytes copied: ``formats`` times them per recipe on the host and
keeps the fastest, since the best setting depends on the host's caches and write-combining.

Copies of at least ``_PARALLEL_BYTES`` are split over ``min(len(sched_getaffinity), 8)`` threads
(numpy, onnxruntime and the kernel release the GIL while copying), or the caller's ``threads``: the
work is cut into a few chunks per thread which the calling thread and the helpers take from one
queue, so a helper waiting for a busy core delays nothing. The thread count depends on the size
only, never on the momentary machine load, so results are reproducible. It never allocates anything
of the array's size (the scratch tiles are at most 2 MiB per thread, kept between calls). ``NPU_DEPLOY_FASTCOPY=0``
disables it (every copy is then a plain ``dst[...] = src``), ``NPU_DEPLOY_FASTCOPY_ORT=0`` keeps it
numpy-only, ``NPU_DEPLOY_THREADS=N`` sets the thread count.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from npu_deploy import _cbuild

_OFF = ("0", "false", "no")
ENABLED = os.environ.get("NPU_DEPLOY_FASTCOPY", "1").strip().lower() not in _OFF
USE_ORT = os.environ.get("NPU_DEPLOY_FASTCOPY_ORT", "1").strip().lower() not in _OFF
_SMALL = 1 << 19            # elements: below this a plain numpy copy is as fast (measured)
_TASK_BYTES = 1 << 20       # destination bytes per task (fits the L2 of current x86 cores)
_PARALLEL_BYTES = 4 << 20   # use threads above this many destination bytes
_SHORT = 64                 # an axis shorter than this is not worth an inner loop
_MAX_HOIST = 512            # at most this many Python-level copies per task when hoisting short axes
_FAR = 4096                # bytes: an inner loop striding further touches a new page per element
_MIN_RUN = 256              # a task keeps at least this many elements along the inner-loop axis
_ORT_MIN_CALL = 1 << 16     # bytes per onnxruntime call: below, its per-call overhead dominates

_log = logging.getLogger(__name__)
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


@lru_cache(maxsize=None)
def _cores() -> int:
    """Usable cores, at most 8 (asked once: a system call, on the per-call path otherwise)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def _threads() -> int:
    env = os.environ.get("NPU_DEPLOY_THREADS", "")
    if env.strip().isdigit():
        return max(1, int(env))
    return _cores()


def _threads_for(nbytes: int, threads: int | None = None) -> int:
    """Threads for a copy of ``nbytes``: a size threshold only (reproducible), never the load.
    ``threads`` (the caller's ``threads=``) replaces the default count."""
    if nbytes < _PARALLEL_BYTES:
        return 1
    return max(1, int(threads)) if threads is not None else _threads()


def _get_pool(n: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < n:  # noqa: SLF001 - grow when asked for more
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="npu-deploy-copy")
        return _pool


def _run_tasks(fn, tasks: list, n_threads: int) -> None:
    """Run ``fn`` on every task, on ``n_threads`` threads: the calling thread and ``n_threads - 1``
    helpers take tasks from one shared queue, so a helper that waits for a busy core costs nothing
    (the others take its share) instead of holding the whole call back."""
    if n_threads <= 1 or len(tasks) <= 1:
        for t in tasks:
            fn(t)
        return
    it = iter(tasks)
    lock = threading.Lock()
    end = object()

    def work() -> None:
        while True:
            with lock:
                t = next(it, end)
            if t is end:
                return
            fn(t)

    pool = _get_pool(n_threads - 1)
    helpers = [pool.submit(work) for _ in range(min(n_threads, len(tasks)) - 1)]
    try:
        work()
    finally:
        for h in helpers:
            h.result()


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


# Dtypes numpy copies bit for bit, by size: the "wide units" a contiguous run is moved as.
_UNITS: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                               8: np.dtype(np.uint64), 16: np.dtype(np.complex128)}
if np.dtype(np.clongdouble).itemsize == 32:  # x86-64 / aarch64 Linux; not MSVC (16 bytes there)
    _UNITS[32] = np.dtype(np.clongdouble)
_LONG_RUN = 512             # bytes: a contiguous run this long is already copied at memcpy speed


def _widen(shape, ds, ss, item: int):
    """Move a short innermost run that is contiguous in both arrays as wider units."""
    if ds[-1] != item or ss[-1] != item:
        return shape, ds, ss, item
    run = shape[-1] * item
    if run > _LONG_RUN:
        return shape, ds, ss, item
    for width in sorted(_UNITS, reverse=True):
        if width <= item:
            break
        if run % width == 0:
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


def _reinterpret(a: np.ndarray, dt: np.dtype, shape, strides) -> np.ndarray:
    """``a``'s memory seen as ``dt`` elements with the given shape and byte strides, starting at
    ``a``'s first element."""
    dt = np.dtype(dt)
    if a.dtype == dt:
        base = a
    elif a.dtype.itemsize == dt.itemsize:
        base = a.view(dt)
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


# ------------------------------------------------------------------------------ onnxruntime path
_ORT_TYPES = {1: 2, 2: 4, 4: 12, 8: 13}   # onnx TensorProto UINT8, UINT16, UINT32, UINT64


@lru_cache(maxsize=32)
def _ort_session(b: int, rows: int, cols: int, unit: int):
    """A single-threaded session transposing uint[b, rows, cols] -> [b, cols, rows]; None when
    onnxruntime is unusable here (then numpy does the copy)."""
    try:
        import onnxruntime as ort
        from onnx import helper

        t = _ORT_TYPES[unit]
        graph = helper.make_graph(
            [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], "fastcopy",
            [helper.make_tensor_value_info("x", t, [b, rows, cols])],
            [helper.make_tensor_value_info("y", t, [b, cols, rows])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1          # our own pool splits the batch; no idle ORT threads
        so.inter_op_num_threads = 1
        so.enable_cpu_mem_arena = False
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any failure means "use numpy"
        return None


def _ort_transpose(dst: np.ndarray, src: np.ndarray, shape, ds, ss, unit: int, n_threads: int) -> bool:
    """Batched 2-D transpose of contiguous blocks (src [.., C, R] -> dst [.., R, C]) with
    onnxruntime, writing straight into ``dst``. Returns False when the layout does not fit."""
    if len(shape) < 2 or unit not in _ORT_TYPES:
        return False
    r, c = shape[-2], shape[-1]
    if not (ds[-1] == unit and ds[-2] == c * unit and ss[-2] == unit and ss[-1] == r * unit):
        return False
    block = r * c * unit
    n_outer = len(shape) - 2
    b = 1
    if n_outer and ds[-3] == block and ss[-3] == block:
        b, n_outer = shape[-3], n_outer - 1
    if b * block < _ORT_MIN_CALL:
        return False
    # split the batch so that every thread gets work (and a task stays around a few MiB)
    n_chunks = max(n_threads if n_threads > 1 else 1, -(-b * block // (16 * _TASK_BYTES)))
    step = -(-b // min(b, n_chunks))
    sizes = {min(step, b - s) for s in range(0, b, step)}
    sessions = {k: _ort_session(k, c, r, unit) for k in sizes}
    if any(v is None for v in sessions.values()):
        return False
    dt = _UNITS[unit].type
    d0 = dst.__array_interface__["data"][0]
    s0 = src.__array_interface__["data"][0]
    tasks = []
    for idx in np.ndindex(*shape[:n_outer]):
        doff = d0 + sum(i * x for i, x in zip(idx, ds))
        soff = s0 + sum(i * x for i, x in zip(idx, ss))
        for start in range(0, b, step):
            tasks.append((doff + start * block, soff + start * block, min(step, b - start)))

    def run(task):
        dptr, sptr, k = task
        sess = sessions[k]
        io = sess.io_binding()
        io.bind_input("x", "cpu", 0, dt, [k, c, r], sptr)
        io.bind_output("y", "cpu", 0, dt, [k, r, c], dptr)
        sess.run_with_iobinding(io)

    _run_tasks(run, tasks, n_threads)
    return True


_SCRATCH_BYTES = 2 << 20   # tile scratch of the two-step copy (per thread; far below the output size)


_local = threading.local()


def _scratch(nbytes: int, name: str = "scratch") -> np.ndarray:
    """This thread's tile scratch (kept between calls: a fresh one would page-fault every time)."""
    buf = getattr(_local, name, None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(nbytes, np.uint8)
        setattr(_local, name, buf)
    return buf[:nbytes]


def _c_order(shape, strides, unit: int) -> list[int] | None:
    """Axes from outermost to innermost if ``strides`` lay ``shape`` out C-contiguously, else None."""
    order = sorted(range(len(shape)), key=lambda i: abs(strides[i]), reverse=True)
    expect = unit
    for i in reversed(order):
        if strides[i] != expect:
            return None
        expect *= shape[i]
    return order


def _merged_copy(d: np.ndarray, s: np.ndarray, unit: int) -> None:
    """Single-threaded ``d[...] = s`` through :func:`_numpy_copy`, axes merged first."""
    shape, ds, ss = _simplify(d, s)
    if len(shape) <= 1:
        d[...] = s
        return
    _numpy_copy(np.lib.stride_tricks.as_strided(d, shape, ds), np.lib.stride_tricks.as_strided(s, shape, ss),
                shape, ds, ss, unit, 1, staged=False)   # measured: staging does not pay here


def _two_step(dst: np.ndarray, src: np.ndarray, shape, ds, ss, unit: int, n_threads: int) -> bool:
    """An element-granular transpose fused with a block move (FRACTAL_Z from NCHW: the C0 axis is
    innermost in the destination while the source's contiguous axis is H·W), done tile by tile
    through a scratch buffer of ``_SCRATCH_BYTES``: onnxruntime transposes each ``A x B`` block
    (A = C0, B = H·W) between the contiguous side and the scratch, and numpy moves whole ``A``-element
    rows as one wide unit between the scratch and the strided side. Returns False when it does not
    apply."""
    nd = len(shape)
    if nd < 3 or unit not in _ORT_TYPES:
        return False
    inner_s = [i for i in range(nd) if ss[i] == unit]
    if ds[-1] != unit or len(inner_s) != 1 or inner_s[0] == nd - 1:
        return False
    # pack: a (C0) is the destination's inner axis, b (H·W) the source's; the source is one block.
    # unpack: the other way round; the destination is one contiguous block.
    for pack, a, b, contig in ((True, nd - 1, inner_s[0], ss), (False, inner_s[0], nd - 1, ds)):
        order = _c_order(shape, contig, unit)
        if order is not None and order[-2:] == [a, b]:
            break
    else:
        return False
    big_u = shape[a] * unit
    if big_u not in _UNITS or big_u == unit or shape[b] < 2:
        return False
    A, B = shape[a], shape[b]
    o0 = order[0]
    row = math.prod(shape[i] for i in range(nd) if i != o0) * unit   # bytes per step of axis o0
    if row > _SCRATCH_BYTES:
        return False                                   # the scratch stays tile-sized
    t0 = max(1, min(shape[o0], _SCRATCH_BYTES // row))
    if t0 * row < _ORT_MIN_CALL:
        return False
    tiles = [(s0, min(shape[o0], s0 + t0)) for s0 in range(0, shape[o0], t0)]
    sessions = {}
    for s0, s1 in tiles:
        nb = (s1 - s0) * row // (A * B * unit)
        key = (nb, A, B) if pack else (nb, B, A)
        if key not in sessions:
            sessions[key] = _ort_session(key[0], key[1], key[2], unit)
            if sessions[key] is None:
                return False
    red = [i for i in range(nd) if i != a]
    udt = _UNITS[big_u]
    red_shape = [shape[i] for i in red]
    # the strided side, in wide units
    wide = _reinterpret(src if not pack else dst, udt, red_shape, [(ss if not pack else ds)[i] for i in red])
    scr_strides = [big_u if i == b else contig[i] for i in red]
    k0 = red.index(o0)
    dt = _UNITS[unit].type
    cbase = (src if pack else dst).__array_interface__["data"][0]

    def run_group(group):
        scratch = _scratch(t0 * row)
        sptr = scratch.__array_interface__["data"][0]
        for s0, s1 in group:
            tshape = list(red_shape)
            tshape[k0] = s1 - s0
            sc = _reinterpret(scratch, udt, tshape, scr_strides)
            idx = [slice(None)] * len(red)
            idx[k0] = slice(s0, s1)
            wv = wide[tuple(idx)]
            nb = (s1 - s0) * row // (A * B * unit)
            cptr = cbase + s0 * contig[o0]
            if pack:
                sess = sessions[(nb, A, B)]
                io = sess.io_binding()
                io.bind_input("x", "cpu", 0, dt, [nb, A, B], cptr)
                io.bind_output("y", "cpu", 0, dt, [nb, B, A], sptr)
                sess.run_with_iobinding(io)
                _merged_copy(wv, sc, big_u)
            else:
                _merged_copy(sc, wv, big_u)
                sess = sessions[(nb, B, A)]
                io = sess.io_binding()
                io.bind_input("x", "cpu", 0, dt, [nb, B, A], sptr)
                io.bind_output("y", "cpu", 0, dt, [nb, A, B], cptr)
                sess.run_with_iobinding(io)

    n = max(1, min(n_threads, len(tiles)))
    groups = [tiles[i::n] for i in range(n)]
    _run_tasks(run_group, groups, n)
    return True


# ------------------------------------------------------------------------------ numpy path
_STAGE_BYTES = 512 << 10    # in-cache tile of the staged transpose


def _staged_transpose(d: np.ndarray, s: np.ndarray, shape, ds, ss, unit: int, n_threads: int) -> bool:
    """2-D transpose whose source is contiguous along the destination's *outer* axis but a page or
    more apart along its inner one (FRACTAL_NZ unpack: ``[N1, M] -> [M, N1]`` of C0 rows). Read an
    ``rows x C`` source tile with long contiguous runs into an L2-sized scratch, then transpose it
    in cache into the destination rows."""
    if len(shape) != 2 or ss[0] != unit or ds[1] != unit or abs(ss[1]) <= _FAR:
        return False
    r, c = shape
    row = c * unit
    if 16 * row > _STAGE_BYTES or r < 32:
        return False
    mt = max(16, min(r, _STAGE_BYTES // row))
    tiles = [(r0, min(r, r0 + mt)) for r0 in range(0, r, mt)]

    def run_group(group):
        sc = _reinterpret(_scratch(mt * row, "stage"), d.dtype, (c, mt), (mt * unit, unit))
        for r0, r1 in group:
            part = sc[:, : r1 - r0]
            part[...] = s[r0:r1].T
            d[r0:r1] = part.T

    n = max(1, min(n_threads, len(tiles)))
    _run_tasks(run_group, [tiles[i::n] for i in range(n)], n)
    return True


def _numpy_copy(d: np.ndarray, s: np.ndarray, shape, ds, ss, unit: int, n_threads: int,
                staged: bool = True) -> None:
    nd = len(shape)
    if staged and _staged_transpose(d, s, shape, ds, ss, unit, n_threads):
        return
    # numpy's inner loop runs along the destination's smallest-stride axis. Put it instead along
    # the (long) axis whose strides are small on both sides; loop over the short axes with a smaller
    # destination stride in Python.
    cand = [i for i in range(nd) if shape[i] >= _SHORT and max(abs(ds[i]), abs(ss[i])) <= _FAR]
    k = min(cand, key=lambda i: (max(abs(ds[i]), abs(ss[i])), -shape[i])) if cand else nd - 1
    hoist = [i for i in range(nd) if i != k and abs(ds[i]) < abs(ds[k])]
    if math.prod(shape[i] for i in hoist) > _MAX_HOIST:
        k, hoist = nd - 1, []
    outer = [i for i in range(nd) if i != k and i not in hoist]
    others = math.prod(shape[i] for i in range(nd) if i != k)
    n_k = shape[k]
    ck = n_k if n_k * others * unit <= _TASK_BYTES else min(n_k, max(_MIN_RUN, _TASK_BYTES // (unit * others)))
    k_chunks = [slice(a, min(n_k, a + ck)) for a in range(0, n_k, ck)]
    per_task = ck * others * unit
    outer_tasks = [()]
    if outer and per_task > 2 * _TASK_BYTES:
        hoisted = math.prod(shape[i] for i in hoist)
        outer_tasks = _tasks([shape[i] for i in outer], max(1, _TASK_BYTES // (unit * ck * hoisted)))
    tasks = []
    for ot in outer_tasks:
        for kc in k_chunks:
            idx: list = [slice(None)] * nd
            for pos, v in zip(outer, ot):
                idx[pos] = v
            idx[k] = kc
            tasks.append(idx)
    hoist_idx = list(np.ndindex(*[shape[i] for i in hoist])) if hoist else None

    def run(idx):
        if hoist_idx is None:
            t = tuple(idx)
            d[t] = s[t]
            return
        full = list(idx)
        for combo in hoist_idx:
            for pos, v in zip(hoist, combo):
                full[pos] = v
            t = tuple(full)
            d[t] = s[t]

    _run_tasks(run, tasks, n_threads)


# ------------------------------------------------------------------------------ compiled kernel
KERNEL_ENABLED = os.environ.get("NPU_DEPLOY_KERNEL", "1").strip().lower() not in _OFF
_KERNEL_SOURCE = "_copykernel.c"
_KERNEL_FLAGS = ["-O3", "-shared", "-fPIC", "-std=c99"]
_KTILE_A_BYTES = 256        # kernel transpose tile: bytes along the destination's inner axis (8 units of 32 B:
                            # FRACTAL_NZ's source column stays in one 8-way L1 set; 1024 thrashed it)
_KTILE_B_BYTES = 4096       # ... and along the source's inner axis (measured on the NZ and 5HD cases)
_KTILE_MAX = 256 << 10      # ... and at most this many bytes per tile
_NT_BYTES = 8 << 20         # copies at least this large write with streaming stores (measured: 16 MiB gains)
_CHUNKS_PER_THREAD = 4      # kernel work per thread, in chunks (dynamic balance on a shared machine)
_kernel_lock = threading.Lock()
# status: "not loaded" (first use pending), "loaded", "failed" or "disabled"; reason says why
_kernel: dict = {"status": "not loaded", "reason": "", "path": None, "compile_seconds": None, "fn": None,
                 "fn3": None, "f16": None, "isa_fn": None, "isa": None}
# Instruction sets of the kernel's block transposes (``npd_set_isa``): "auto" takes AVX2 where the CPU
# reports it (runtime dispatch: one shared object for every x86-64 host), "sse2" keeps the baseline
# code; NPU_DEPLOY_KERNEL_ISA sets it for the process, :func:`set_isa` at run time (tests, benchmarks).
_ISA_LEVELS = {"auto": -1, "sse2": 1, "avx2": 2}
_ISA_NAMES = {1: "sse2", 2: "avx2"}


def _isa_env() -> str:
    """NPU_DEPLOY_KERNEL_ISA (auto / sse2 / avx2); anything else means auto."""
    v = os.environ.get("NPU_DEPLOY_KERNEL_ISA", "auto").strip().lower()
    return v if v in _ISA_LEVELS else "auto"


def _isa_fn(lib):
    fn = lib.npd_set_isa
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def set_isa(name: str) -> str:
    """Use ``name`` ("auto", "sse2" or "avx2") for the kernel's block transposes from now on and return
    the one in use ("avx2" asked on a CPU without it gives "sse2"); loads the kernel first. Every choice
    writes the same bytes. Raises ValueError on another name, RuntimeError when the kernel is
    unavailable."""
    if name not in _ISA_LEVELS:
        raise ValueError(f"unknown kernel instruction set {name!r}: use one of {', '.join(_ISA_LEVELS)}")
    if _kernel_fn() is None:
        raise RuntimeError(f"the compiled copy kernel is not available: {kernel_info()['reason']}")
    _kernel["isa"] = _ISA_NAMES[_kernel["isa_fn"](_ISA_LEVELS[name])]
    return _kernel["isa"]


def _kernel_cache_dir() -> Path:
    return _cbuild.cache_dir()


def _find_cc() -> str | None:
    return _cbuild.find_cc()


def _build_kernel() -> tuple[str, float | None]:
    """Path of the compiled kernel (compiled now if not cached) and the compile time (None: cached).
    Raises on any failure (the shared builder, :mod:`npu_deploy._cbuild`)."""
    return _cbuild.build(Path(__file__).resolve().parent / _KERNEL_SOURCE, "copykernel", _KERNEL_FLAGS)


def _kernel_fn():
    """The ctypes kernel function, or None (disabled / unavailable: the numpy paths are used). The
    first call compiles or loads it; a failure is remembered (and logged at debug level) once."""
    if not KERNEL_ENABLED:
        return None
    if _kernel["status"] == "loaded":
        return _kernel["fn"]
    if _kernel["status"] != "not loaded":
        return None
    with _kernel_lock:
        if _kernel["status"] == "not loaded":
            try:
                path, seconds = _build_kernel()
                lib = ctypes.CDLL(path)
                fn = lib.npd_copy
                p64 = ctypes.POINTER(ctypes.c_int64)
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, p64, p64, p64, ctypes.c_int64,
                               ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
                fn.restype = ctypes.c_int
                fn3 = lib.npd_tile3
                fn3.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, p64, p64, p64, ctypes.c_int64,
                                ctypes.c_int]
                fn3.restype = ctypes.c_int
                f16 = lib.npd_f32_to_f16
                f16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
                f16.restype = ctypes.c_int
                isa_fn = _isa_fn(lib)
                _kernel.update(status="loaded", reason="", path=path, compile_seconds=seconds, fn=fn, fn3=fn3,
                               f16=f16,
                               isa_fn=isa_fn, isa=_ISA_NAMES[isa_fn(_ISA_LEVELS[_isa_env()])])
            except Exception as exc:  # noqa: BLE001 - any failure means "use the numpy paths"
                _kernel.update(status="failed", reason=f"{type(exc).__name__}: {exc}", fn=None, fn3=None,
                               f16=None)
                _log.debug("npu-deploy copy kernel unavailable, using numpy: %s", _kernel["reason"])
    return _kernel["fn"]


_CAST_MIN = 4096        # elements: below this numpy's cast costs less than the call


def cast(src: np.ndarray, dtype: Any) -> np.ndarray:
    """``src.astype(dtype)``, bit for bit. A C-contiguous float32 array cast to float16 goes through
    the compiled kernel's F16C loop where the CPU has it (npd_f32_to_f16: 7 GB/s of input here, CPU
    time, against numpy's 1.5-1.8); anything else, and any host without it, is numpy's own cast."""
    dt = np.dtype(dtype)
    if (dt == np.float16 and src.dtype == np.float32 and src.size >= _CAST_MIN and src.flags.c_contiguous
            and ENABLED and KERNEL_ENABLED and _kernel_fn() is not None):
        fn = _kernel.get("f16")
        if fn is not None:
            out = np.empty(src.shape, dt)
            if fn(out.ctypes.data, src.ctypes.data, src.size) == 0:
                return out
    return src.astype(dt)


def kernel_info() -> dict:
    """Status of the compiled copy kernel: ``status`` ("loaded", "failed", "disabled" or "not
    loaded"), ``reason`` (why it is not used), ``path`` and ``compile_seconds`` (None when the
    shared object came from the cache). Does not trigger loading."""
    info = {k: v for k, v in _kernel.items() if k not in ("fn", "fn3", "f16", "isa_fn")}
    if not KERNEL_ENABLED:
        info.update(status="disabled", reason="NPU_DEPLOY_KERNEL=0")
    return info


def _reset_kernel() -> None:
    """Forget the loaded kernel (tests): the next use compiles or loads it again."""
    with _kernel_lock:
        _kernel.update(status="not loaded", reason="", path=None, compile_seconds=None, fn=None, fn3=None,
                       f16=None, isa_fn=None, isa=None)


try:
    _byte_bounds = np.lib.array_utils.byte_bounds     # numpy >= 2.0
except AttributeError:  # pragma: no cover - numpy 1.x
    _byte_bounds = np.byte_bounds


def _extent(ptr: int, shape, strides, unit: int) -> tuple[int, int]:
    lo = ptr + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    hi = ptr + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + unit
    return lo, hi


def _kernel_plan(shape, ds, ss):
    """Axis order for the kernel: (order, mode). Mode 1 tiles the destination's inner axis (last)
    with the source's inner axis (second to last); the outer axes go from the largest to the
    smallest stride (the larger of both sides), so the innermost outer loop touches nearby memory."""
    nd = len(shape)
    a = nd - 1
    rest = [i for i in range(nd) if i != a]
    b = min(rest, key=lambda i: abs(ss[i]), default=None)
    mode = 0
    if b is not None and abs(ss[b]) < abs(ss[a]):
        mode = 1
        rest.remove(b)
    rest.sort(key=lambda i: max(abs(ds[i]), abs(ss[i])), reverse=True)
    return rest + ([b, a] if mode else [a]), mode


_TILE3_MAX_BLOCK = 8192     # bytes: npd_tile3 only for small blocks (FRACTAL_Z: C0 x H·W, H·W small)


def _tiles(shape, unit: int, a_bytes: int) -> tuple[int, int]:
    """Mode-1 tile (tile_a, tile_b): ~``a_bytes`` x _KTILE_B_BYTES, at most _KTILE_MAX bytes (L2-sized)."""
    tile_a = max(1, min(shape[-1], max(8, a_bytes // unit)))
    tile_b = max(1, min(shape[-2], max(8, _KTILE_B_BYTES // unit)))
    while tile_a * tile_b * unit > _KTILE_MAX and max(tile_a, tile_b) > 8:
        if tile_a >= tile_b:
            tile_a = max(8, tile_a // 2)
        else:
            tile_b = max(8, tile_b // 2)
    return tile_a, tile_b


# Kernel variants tried per recipe (formats' recipes time them on the first call's buffers and keep
# the fastest, see :func:`task_variant`): (streaming stores, mode-1 tile depth in bytes along the
# destination's inner axis, npd_tile3 r-chunk: 0 = r innermost, -1 = one 64-byte line of the run
# side, else that many r). Which wins depends on the host (write-combining buffers, cache sizes,
# prefetchers), not only on the layout: on one x86-64 host NC1HWC0 fp16 unpack runs at 0.16-0.3 of
# a copy with streaming stores and 1.0-1.4 without, NC1HWC0 fp16 pack the other way round.
VARIANTS: tuple[tuple[bool, int, int, int], ...] = (
    (False, 256, 0, False), (False, 2048, 0, False), (True, 256, 0, False), (True, 2048, 0, False),
    (False, 256, -1, False), (True, 256, -1, False), (False, 256, 8, False), (True, 256, 8, False),
    # r-chunks of 128 / 255 blocks: at 256 MiB FRACTAL_Z's source rows (one per n, a page or more
    # each) outnumber the TLB's entries in one pass over n; chunked, a pass touches at most 255 of them
    # (C harness, [4096, 3584, 3, 3] fp16 pack: 0.21 of a copy -> 0.44-0.54)
    (False, 256, 128, False), (False, 256, 255, False),
    # npd_tile3's staged walk (tiles of r through an L1 buffer, whole runs streamed out): on the
    # same pack 0.23 -> 0.6-0.7 of a copy with 4-8 r per tile, the unpack 0.37 -> 0.42-0.47 with 32
    (True, 256, 4, True), (True, 256, 8, True), (True, 256, 32, True),
    # staged = 2: the pack stages a tile's r for the whole innermost outer axis before writing, so
    # each source row is read through in one go (npd_t3_whole; unpacks take the staged walk). AMD EPYC
    # (Zen 3: one core reads 9 GB/s, 5 GB/s in 288-byte strips of rows 64 KB apart), FRACTAL_Z
    # [4096, 3584, 3, 3] at 256 MiB, side by side, loaded host: fp16 pack 0.33-0.41 of a copy (best
    # of the others) -> 0.35-0.58, int8 0.41-0.44 -> 0.47-0.48, fp32 0.28-0.47 -> 0.33-0.50
    (True, 256, 8, 2), (True, 256, 16, 2), (True, 256, 32, 2))


def task_variant(fn, args: tuple, nt: bool, a_bytes: int, rc: int = 0, staged: int = False) -> tuple:
    """``args`` of a kernel task (from :func:`kernel_tasks`) with streaming stores ``nt`` (where the
    task's mode allows them), tile depth ``a_bytes`` (npd_copy), r-chunk ``rc`` and the staged walk
    (npd_tile3; ``staged`` needs ``rc`` > 0); the box copied, hence the result, is the same whatever
    the variant."""
    if fn is _kernel.get("fn3"):
        nd, c_shape, c_ds, c_ss, unit, d = args
        if rc < 0:
            rc = max(1, 64 // max(1, c_shape[nd - 2] * unit))
        flags = (d & 3) | (4 if nt else 0) | (8 if staged and rc > 0 else 0) | (16 if staged == 2 and rc > 0 else 0)
        return (nd, c_shape, c_ds, c_ss, unit, flags | (min(rc, 255) << 8))
    nd, c_shape, c_ds, c_ss, unit, mode, tile_a, tile_b = args
    if mode & ~4 != 1:
        return args                                 # rows mode: no tiles, no streaming stores
    tile_a, tile_b = _tiles(list(c_shape), unit, a_bytes)
    return (nd, c_shape, c_ds, c_ss, unit, 1 | (4 if nt else 0), tile_a, tile_b)


def _tile3_plan(shape, ds, ss, unit: int):
    """(order, dir) for ``npd_tile3`` when the copy moves many small contiguous blocks into long
    runs or back, else None. In the kernel's axis order (..., r, a, b): the *block* side (the source
    when dir is 0, the destination when 1) has b contiguous and a with stride B·unit, i.e. one
    contiguous A x B block per r; the *run* side has a contiguous and r with stride A·unit, i.e. one
    contiguous run of R·A per b. Detected from the strides only (no format names)."""
    nd = len(shape)
    if nd < 3:
        return None
    for direction, bs, rs in ((0, ss, ds), (1, ds, ss)):
        for b in range(nd):
            if bs[b] != unit or shape[b] < 2:
                continue
            for a in range(nd):
                if a == b or rs[a] != unit or bs[a] != shape[b] * unit or shape[a] < 2:
                    continue
                if shape[a] * shape[b] * unit > _TILE3_MAX_BLOCK:
                    continue
                for r in range(nd):
                    if r in (a, b) or rs[r] != shape[a] * unit:
                        continue
                    rest = [i for i in range(nd) if i not in (r, a, b)]
                    rest.sort(key=lambda i: max(abs(ds[i]), abs(ss[i])), reverse=True)
                    return rest + [r, a, b], direction
    return None


def _kernel_tasks(dst: np.ndarray, src: np.ndarray, shape, ds, ss, unit: int, n_threads: int):
    """The compiled-kernel calls performing one copy, as ``[(fn, dst_ptr, src_ptr, args)]`` (run them in
    parallel, each as ``fn(dst_ptr, src_ptr, *args)``), every byte they touch checked to lie inside
    both arrays; None when the kernel is unavailable or does not apply."""
    if not shape:                                   # a single (wide) element
        shape, ds, ss = [1], [unit], [unit]
    if len(shape) > 1 and ds[-1] == ss[-1] == unit and shape[-1] * unit == 64:
        # the kernel also moves 64-byte units (FRACTAL_NZ fp32 rows), beyond numpy's widest type
        shape, ds, ss, unit = shape[:-1], ds[:-1], ss[:-1], 64
    nd = len(shape)
    if nd > 8 or not dst.flags.writeable:
        return None
    fn = _kernel_fn()
    if fn is None:
        return None
    if 0 in shape:
        return []                                   # nothing to copy
    fn3 = _kernel.get("fn3")
    plan3 = _tile3_plan(shape, ds, ss, unit) if fn3 is not None else None
    if plan3 is not None:
        order, mode = plan3[0], 2
    else:
        order, mode = _kernel_plan(shape, ds, ss)
    shape = [shape[i] for i in order]
    ds = [ds[i] for i in order]
    ss = [ss[i] for i in order]
    d0 = dst.__array_interface__["data"][0]
    s0 = src.__array_interface__["data"][0]
    tile_a = tile_b = 1
    if mode == 1:
        tile_a, tile_b = _tiles(shape, unit, _KTILE_A_BYTES)
    # threads: split the longest of the outer axes (or of the tile axes) into equal chunks
    ax = 0
    if n_threads > 1 and mode == 2:                 # tile3: split an outer axis or r, never a or b
        ax = max(range(nd - 2), key=lambda i: (shape[i] >= n_threads, shape[i]))
    elif n_threads > 1:
        ax = max(range(nd), key=lambda i: (shape[i] >= n_threads, i < nd - (2 if mode else 1), shape[i]))
    # several chunks per thread: threads take them from a shared queue (see _run_tasks)
    chunks = min(shape[ax], _CHUNKS_PER_THREAD * n_threads) if n_threads > 1 and shape[ax] >= n_threads else 1
    step = -(-shape[ax] // chunks)
    c_ds = (ctypes.c_int64 * nd)(*ds)
    c_ss = (ctypes.c_int64 * nd)(*ss)
    nt = 4 if mode in (1, 2) and math.prod(shape) * unit >= _NT_BYTES else 0    # streaming stores
    # bounds: every byte the kernel touches (each task's box) must lie inside both arrays' memory
    dlo, dhi = _byte_bounds(dst)
    slo, shi = _byte_bounds(src)
    tasks = []
    for start in range(0, shape[ax], step):
        sub = list(shape)
        sub[ax] = min(step, shape[ax] - start)
        dp, sp = d0 + start * ds[ax], s0 + start * ss[ax]
        for ptr, st, blo, bhi in ((dp, ds, dlo, dhi), (sp, ss, slo, shi)):
            lo, hi = _extent(ptr, sub, st, unit)
            if lo < blo or hi > bhi:
                raise AssertionError(f"fast copy: kernel extent [{lo}, {hi}) outside [{blo}, {bhi})")
        c_shape = (ctypes.c_int64 * nd)(*sub)
        if mode == 2:
            tasks.append((fn3, dp, sp, (nd, c_shape, c_ds, c_ss, unit, plan3[1] | nt)))
        else:
            tasks.append((fn, dp, sp, (nd, c_shape, c_ds, c_ss, unit, mode | nt, tile_a, tile_b)))
    return tasks


def _call(task) -> None:
    fn, dp, sp, args = task
    if fn(dp, sp, *args) != 0:
        raise RuntimeError("fast copy: the kernel rejected its arguments")


def run_tasks(tasks: list, n_threads: int) -> None:
    """Run kernel tasks (from :func:`kernel_tasks`) on up to ``n_threads`` threads."""
    if len(tasks) == 1:
        _call(tasks[0])
    else:
        _run_tasks(_call, tasks, n_threads)


def _kernel_copy(dst: np.ndarray, src: np.ndarray, shape, ds, ss, unit: int, n_threads: int) -> bool:
    """The copy through the compiled kernel; False when it is unavailable or does not apply."""
    tasks = _kernel_tasks(dst, src, shape, ds, ss, unit, n_threads)
    if tasks is None:
        return False
    _run_tasks(_call, tasks, n_threads)
    return True


_ZEROS = np.zeros(64, np.uint8)     # the source of kernel "copies" that clear padding (stride 0)


def kernel_tasks(dst: np.ndarray, src: np.ndarray | None, threads: int | None = None):
    """The kernel calls that perform ``dst[...] = src`` (``src`` None: ``dst[...] = 0``, bit-exact
    zero bytes), whatever the size, for recording into a reusable program; None when the kernel is
    off or unavailable or the copy does not fit it. The pointers are those of ``dst`` and ``src``."""
    if not (ENABLED and KERNEL_ENABLED) or dst.dtype.hasobject:
        return None
    item = dst.dtype.itemsize
    if src is None:
        if item > _ZEROS.size:
            return None
        base = _ZEROS[:item].view(dst.dtype) if item > 1 or dst.dtype != np.uint8 else _ZEROS[:1]
        src = np.lib.stride_tricks.as_strided(base, dst.shape, (0,) * dst.ndim, writeable=False)
    elif dst.shape != src.shape or dst.dtype != src.dtype or np.may_share_memory(dst, src):
        return None
    shape, ds, ss = _simplify(dst, src)
    if not shape:                                   # one element
        return _kernel_tasks(dst, src, [], [], [], item, 1)
    shape, ds, ss, unit = _widen(shape, ds, ss, item)
    return _kernel_tasks(dst, src, shape, ds, ss, unit, _threads_for(math.prod(shape) * unit, threads))


def copy(dst: np.ndarray, src: np.ndarray, threads: int | None = None) -> None:
    """``dst[...] = src`` for same-shape arrays, faster for transposing copies. ``threads``: the
    thread count for a copy of at least ``_PARALLEL_BYTES`` (default :func:`_threads`).

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
    shape, ds, ss, unit = _widen(shape, ds, ss, item)
    n_threads = _threads_for(math.prod(shape) * unit, threads)
    if KERNEL_ENABLED and _kernel_copy(dst, src, shape, ds, ss, unit, n_threads):
        return
    if USE_ORT and (_ort_transpose(dst, src, shape, ds, ss, unit, n_threads)
                    or _two_step(dst, src, shape, ds, ss, unit, n_threads)):
        return
    dt = _UNITS.get(unit) or np.dtype((np.void, unit))   # always a raw byte copy
    d = _reinterpret(dst, dt, shape, ds)
    s = _reinterpret(src, dt, shape, ss)
    _numpy_copy(d, s, shape, ds, ss, unit, n_threads)
