"""A real full file system for tests of disk-full handling."""

import contextlib
import os
import shutil
import subprocess

import pytest


@pytest.fixture
def full_fs(tmp_path):
    """A real, full file system: a 64 KiB tmpfs filled up (needs root and mount; else skipped)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode(errors='replace').strip()}")
    try:
        with contextlib.suppress(OSError):  # the write, or the close, meets ENOSPC
            with open(mnt / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
