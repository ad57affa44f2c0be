"""Weights streamed into the bundle: one weight packed and written in slices, never whole in memory.

A packed weight's storage array is produced slice by slice along its **leading storage axis**: for a
single-stage, non-diagonal, ungrouped layout, that axis is either the first batch axis or the outer
block of one logical axis (FRACTAL_Z of an FC weight ``(k1 k0) (n1 n0) -> k1 n1 n0 k0``: rows in steps
of ``k0``; FRACTAL_Z of a conv weight ``(n1 n0) (c1 c0) h w -> (c1 h w) n1 n0 c0``: input channels in
steps of ``c0``; FRACTAL_NZ ``(m1 m0) (n1 n0) -> n1 m1 m0 n0``: columns in steps of ``n0``). Packing a
slice of that logical axis that starts on a block boundary gives exactly the matching contiguous run of
the whole tensor's storage (padding included: only the last slice pads), so the slices' bytes, written
one after the other, are the bytes of ``formats.pack`` of the whole tensor. :func:`leading_split` reads
this from the format's own pattern (the registry's data), and answers ``None`` where it does not hold
(grouped FRACTAL_Z, multi-stage FRACTAL_Z_C04, diagonal C1HWNCoC0): those weights are packed whole.

Memory per weight: one source slice (memory-mapped pages, dropped after each slice), its dtype cast and
its packed form, each at most about :data:`CHUNK_BYTES`, instead of the source, the cast and the packed
tensor whole (``tests/converters/files/test_weight_stream.py`` checks the bytes for every packable
format and bounds the converter's peak with ``tracemalloc``).

>>> import numpy as np
>>> w = np.arange(40 * 20, dtype=np.float32).reshape(40, 20)
>>> leading_split("FRACTAL_Z", (40, 20), np.float16, c0=16, groups=1, origin="ND")
(0, 16)
>>> s = stream_packed(lambda: contextlib.nullcontext((w, lambda: None)), "FRACTAL_Z", (40, 20), np.float16,
...                   c0=16, origin="ND", chunk_bytes=1024)
>>> b"".join(c.tobytes() for c in s.chunks()) == formats.pack(w.astype(np.float16), "FRACTAL_Z", c0=16,
...                                                          origin="ND").tobytes()
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, ContextManager, Iterator

import numpy as np

from npu_deploy.converters import formats
from npu_deploy.converters.formats import _fastcopy
from npu_deploy.errors import InternalError

CHUNK_BYTES = 8 << 20
"""Target bytes of one slice (source slice and packed slice each); a slice holds at least one block."""

Source = Callable[[], ContextManager[tuple[np.ndarray, Callable[[], None]]]]
"""Opens a weight's source: a context manager yielding ``(array, release)`` (see
:meth:`~npu_deploy.converters.files.onnx_model.LoadedModel.constant_view`)."""


@dataclasses.dataclass
class StreamedWeight:
    """A packed weight the bundle writer streams: storage ``shape`` and ``dtype`` known up front,
    ``chunks()`` yields contiguous arrays whose bytes, concatenated, are the storage array's bytes."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: Callable[[], Iterator[np.ndarray]]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def leading_split(fmt: Any, shape: tuple[int, ...], dtype: Any, *, c0: int | None = None, groups: int = 1,
                  origin: str | None = None) -> tuple[int, int] | None:
    """``(axis, step)``: slices of logical ``axis`` starting at multiples of ``step`` pack into
    consecutive runs of the storage array (its leading axis), or ``None`` when the layout does not
    allow it (see the module text)."""
    if groups != 1 or not shape:
        return None
    p = formats._plan(fmt, tuple(shape), dtype, c0, groups, origin)  # the registry's resolved layout
    if len(p.stages) != 1 or p.layout.has_diagonal:
        return None
    sp = p.stages[0]
    if sp.batch:
        letter, step = 0, 1
    else:
        st = sp.stage
        if not st.rhs:
            return None
        lead = st.rhs[0][0]
        j = next((k for k, g in enumerate(st.lhs) if lead in g), None)
        if j is None:
            return None
        group = st.lhs[j]
        # the leading axis must be the group's outer part, every inner part a fixed block
        if group[0] != lead or any(a not in p.layout.blocks for a in group[1:]):
            return None
        letter, step = j, math.prod(sp.sizes[a] for a in group[1:])
    expanded_axis = p.perm[letter]
    if expanded_axis not in p.expand_pos:
        return None
    return p.expand_pos.index(expanded_axis), int(step)


def stream_packed(source: Source, fmt: str, logical_shape: tuple[int, ...], dtype: Any, *,
                  c0: int | None = None, groups: int = 1, origin: str | None = None,
                  chunk_bytes: int | None = None) -> StreamedWeight:
    """The weight ``source`` opens, cast to ``dtype`` and packed in ``fmt``, as a :class:`StreamedWeight`
    (``fmt`` ``"ND"``: cast only). The source is opened when ``chunks()`` is iterated and closed after.
    ``chunk_bytes``: the slice budget (default :data:`CHUNK_BYTES`, read at the call)."""
    dt = np.dtype(dtype)
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else int(chunk_bytes)
    logical_shape = tuple(int(d) for d in logical_shape)
    plain_nd = str(fmt) == "ND"
    kw: dict[str, Any] = {"groups": groups, "origin": origin}
    if c0 is not None:
        kw["c0"] = c0
    storage = logical_shape if plain_nd else tuple(formats.storage_shape(fmt, logical_shape, dt, **kw))

    def pack(part: np.ndarray) -> np.ndarray:
        return part if plain_nd else formats.pack(part, fmt, **kw)

    def chunks() -> Iterator[np.ndarray]:
        with contextlib.ExitStack() as stack:
            src, release = stack.enter_context(source())
            src = src.reshape(logical_shape)
            split = None
            if src.size:
                split = (0, 1) if plain_nd else leading_split(fmt, logical_shape, dt, c0=c0, groups=groups,
                                                              origin=origin)
            if split is None:
                whole = _fastcopy.cast(src, dt)
                del src
                release()
                yield pack(whole)
                return
            axis, step = split
            n = logical_shape[axis]
            units = -(-n // step)
            per_unit = max(math.prod(storage) * dt.itemsize, src.nbytes) / units
            take = max(1, int(chunk_bytes // max(per_unit, 1)))
            index = [slice(None)] * len(logical_shape)
            # a slice along a later axis is strided: copied a block of leading rows at a time, so the
            # pages touched (the kernel maps up to 64 KiB around each fault) stay within the budget
            rows = max(1, int(chunk_bytes // max(src.strides[0], 1))) if axis else logical_shape[0]
            for u in range(0, units, take):
                index[axis] = slice(u * step, min((u + take) * step, n))
                if axis == 0:
                    part = _fastcopy.cast(src[tuple(index)], dt)  # a contiguous copy: the source pages can go now
                    release()
                else:
                    view = src[tuple(index)]
                    part = np.empty(view.shape, dt)
                    for r in range(0, logical_shape[0], rows):
                        part[r:r + rows] = view[r:r + rows]  # the cast astype does (unsafe casting)
                        release()
                    del view
                yield pack(part)
                del part
            del src

    return StreamedWeight(storage, dt, chunks)


def write_chunks(f, weight: StreamedWeight, update: Callable[[memoryview], None]) -> int:
    """Write ``weight``'s chunks to file ``f``, each passed to ``update`` (the blob's checksum) first;
    the bytes written, checked against the storage shape (a mismatch is our bug, not the input's)."""
    written = 0
    for chunk in weight.chunks():
        chunk = np.ascontiguousarray(chunk)
        if chunk.dtype != weight.dtype:
            raise InternalError(f"streamed weight: a chunk of {chunk.dtype} in a {weight.dtype} weight")
        mv = memoryview(chunk.reshape(-1).view(np.uint8))
        update(mv)
        f.write(mv)
        written += chunk.nbytes
        del chunk, mv
    if written != weight.nbytes:
        raise InternalError(f"streamed weight: {written} bytes written for a storage of {weight.nbytes} "
                            f"bytes {list(weight.shape)}")
    return written
