"""Shared pieces of the fuzz tests: byte-level mutations of a file's bytes."""

from __future__ import annotations

from hypothesis import strategies as st


def byte_edits(max_pos: int = 1 << 20, max_size: int = 3):
    """A list of (kind, position, value) edits: flip a bit, truncate, insert a byte."""
    edit = st.tuples(st.sampled_from(["flip", "truncate", "insert"]), st.integers(0, max_pos), st.integers(0, 255))
    return st.lists(edit, min_size=1, max_size=max_size)


def mutate(data: bytes, edits) -> bytes:
    """``data`` with ``edits`` applied in order (positions wrap around the current length)."""
    buf = bytearray(data)
    for kind, pos, val in edits:
        i = pos % (len(buf) + 1)
        if kind == "flip" and i < len(buf):
            buf[i] ^= 1 << (val % 8)
        elif kind == "truncate":
            del buf[i:]
        elif kind == "insert":
            buf[i:i] = bytes([val])
    return bytes(buf)
