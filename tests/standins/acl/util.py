"""Stand-in ``acl.util``: host pointer helpers (``bytes_to_ptr`` is zero-copy, as documented)."""

from __future__ import annotations

import ctypes
import warnings

from acl._core import DEVICE_BASE, S, api

# numpy type numbers accepted by ptr_to_numpy (reference §3.3)
_NPY = {0: "bool", 1: "int8", 2: "uint8", 3: "int16", 4: "uint16", 5: "int32", 6: "uint32", 7: "int64",
        8: "uint64", 11: "float32", 12: "float64", 23: "float16"}


@api("acl.util.bytes_to_ptr", "y", ret="none")
def bytes_to_ptr(data: bytes) -> int:
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


@api("acl.util.ptr_to_bytes", "ii", ret="none")
def ptr_to_bytes(ptr: int, size: int) -> bytes:
    if ptr >= DEVICE_BASE:
        S.violate("acl.util.ptr_to_bytes on a device pointer")
        return b""
    return ctypes.string_at(ptr, size) if size else b""


@api("acl.util.numpy_to_ptr", "O", ret="none")
def numpy_to_ptr(arr) -> int:
    warnings.warn("acl.util.numpy_to_ptr will be deprecated", DeprecationWarning, stacklevel=2)
    return arr.__array_interface__["data"][0]


@api("acl.util.numpy_contiguous_to_ptr", "O", ret="none")
def numpy_contiguous_to_ptr(arr) -> int:
    warnings.warn("acl.util.numpy_contiguous_to_ptr will be deprecated", DeprecationWarning, stacklevel=2)
    return arr.__array_interface__["data"][0]


@api("acl.util.ptr_to_numpy", "iOi", ret="none")
def ptr_to_numpy(ptr: int, shape, npy_type: int):
    import numpy as np

    warnings.warn("acl.util.ptr_to_numpy will be deprecated", DeprecationWarning, stacklevel=2)
    if ptr >= DEVICE_BASE or npy_type not in _NPY:
        raise TypeError("acl.util.ptr_to_numpy args parse failed!")
    dt = np.dtype(_NPY[npy_type])
    n = int(np.prod(shape)) * dt.itemsize
    raw = (ctypes.c_char * n).from_address(ptr)
    return np.frombuffer(raw, dtype=dt).reshape(shape)
