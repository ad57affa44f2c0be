"""Shared memory carrying the samples the driver sends to actors on its own node."""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

#: shared memory for samples in flight is used only when /dev/shm keeps at least this many times its size free
RING_SHM_MARGIN = 4
#: and when it is at most this large (beyond, the samples go through Ray's object store)
RING_MAX_BYTES = 1 << 30
_ALIGN = 64


class _Ring:
    """Shared memory where the driver puts the samples it sends to actors on its own node: a chunk then
    carries only offsets, and no Ray object is created per chunk (on 2 cores, Ray's object store cost
    the driver and the raylet about 10 % of PP-OCR cls's throughput). One slot per sample in flight
    (the window), sized by the first sample; a slot is reused once the chunk holding it came back, so
    that Ray's retry of a chunk on a restarted actor reads the same bytes. A sample that does not fit
    (larger, non-numeric) goes through Ray as before."""

    def __init__(self, slots: int, slot_bytes: int):
        from multiprocessing import shared_memory

        self.slot_bytes = slot_bytes
        self.shm = shared_memory.SharedMemory(create=True, size=max(1, slots * slot_bytes))
        self.name = self.shm.name
        self.free = list(range(slots - 1, -1, -1))

    @classmethod
    def for_samples(cls, slots: int, sample_bytes: int) -> "_Ring | None":
        slot = -(-max(1, sample_bytes) // _ALIGN) * _ALIGN + _ALIGN * 4  # room for a few inputs' alignment
        size = slots * slot
        if size > RING_MAX_BYTES or not os.path.isdir("/dev/shm"):
            return None
        try:
            st = os.statvfs("/dev/shm")
            if st.f_bavail * st.f_frsize < RING_SHM_MARGIN * size:  # a container's small /dev/shm
                return None
            return cls(slots, slot)
        except (OSError, ValueError):
            return None

    def put(self, feeds: dict) -> tuple[int, dict] | None:
        """(slot, {input: (offset, shape, dtype)}) with the arrays copied in, or None (no room, not numeric)."""
        if not self.free:
            return None
        places, at = {}, 0
        for name, a in feeds.items():
            if not (isinstance(a, np.ndarray) and a.dtype.kind in "biufc?" and not a.dtype.hasobject):
                return None
            places[name] = (at, a.shape, a.dtype.str)
            at += -(-a.nbytes // _ALIGN) * _ALIGN
        if at > self.slot_bytes:
            return None
        slot = self.free.pop()
        base = slot * self.slot_bytes
        for name, a in feeds.items():
            off, shape, dtype = places[name]
            view = np.ndarray(shape, a.dtype, buffer=self.shm.buf, offset=base + off)
            view[...] = a
            places[name] = (base + off, shape, dtype)
        return slot, places

    def get(self, places: dict) -> dict:
        """Copies of the arrays :meth:`put` placed."""
        return {name: np.ndarray(shape, np.dtype(dtype), buffer=self.shm.buf, offset=off).copy()
                for name, (off, shape, dtype) in places.items()}

    def release_all(self, slots: list[int]) -> None:
        self.free.extend(slots)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.shm.close()
        with contextlib.suppress(Exception):
            self.shm.unlink()


def attach_shared_memory(name: str):
    """A shared memory segment another process created, attached without Python's resource tracker
    adopting it (before 3.13 an attaching process's tracker unlinks the segment when it exits)."""
    from multiprocessing import shared_memory

    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    shm = shared_memory.SharedMemory(name=name)
    from multiprocessing import resource_tracker

    with contextlib.suppress(Exception):
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 (the documented work-around)
    return shm
