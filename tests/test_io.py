"""Atomic outputs: complete or absent, and with the mode any new file would get."""

import os
import stat

import pytest

from npu_deploy._io import atomic_path, atomic_write


def test_output_mode_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644


def test_failure_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
