"""Shared pieces of the fuzz tests: byte-level mutations of a file's bytes."""

from __future__ import annotations

import os

from hypothesis import strategies as st


def examples(n: int) -> int:
    """How many examples a fuzz test draws: ``n`` by default.

    ``FUZZ_SCALE=K`` multiplies every fuzz test's count by K (a long fuzz run: ``FUZZ_SCALE=40 pytest
    tests -k fuzz``); ``FUZZ_EXAMPLES=N`` sets it to N for every fuzz test.
    """
    if os.environ.get("FUZZ_EXAMPLES"):
        return max(1, int(os.environ["FUZZ_EXAMPLES"]))
    return max(1, round(n * float(os.environ.get("FUZZ_SCALE", "1"))))


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
