"""Atomic output: no command leaves a partial file behind.

Write to a temporary file in the destination folder, then rename over the destination. On any error
the temporary file is removed and the destination is untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from npu_deploy.errors import InputError


def _check_dest(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {path}: folder {parent} does not exist",
                         hint="create the folder or choose another output path")
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a folder", hint="give a file name")
    if not os.access(parent, os.W_OK):
        raise InputError(f"cannot write {path}: folder {parent} is not writable",
                         hint="choose another output path")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it to ``path`` when the block succeeds.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_path(d / "out.txt") as tmp:
    ...     _ = tmp.write_text("hello")
    >>> (d / "out.txt").read_text()
    'hello'
    """
    dest = Path(path)
    _check_dest(dest)
    parent = dest.parent if str(dest.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=parent)
    except OSError as e:
        raise InputError(f"cannot write {dest}: {e.strerror}", hint="choose another output path") from e
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates 0600; a finished output gets the mode any new file would (0666 less the umask)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", **kwargs) -> Iterator[IO]:
    """Open a temporary file next to ``path`` for writing; rename it to ``path`` on success."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
