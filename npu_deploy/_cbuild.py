"""Build the project's small C helpers at first use and cache them per user (private).

The format copy kernel (``converters/formats/_copykernel.c``) and the CSV field extractor
(``profiling/_csvscan.c``) are plain C99 files with no Python headers, compiled with the system's
``cc`` into a shared object and loaded with ctypes by their callers. :func:`build` compiles one source
into ``$NPU_DEPLOY_CACHE/kernels`` (or ``~/.cache/npu-deploy/kernels``) under a name keyed by the
source bytes, the compiler's version, the flags and the platform, so that a changed source or
compiler builds anew and an unchanged one is loaded from the cache.

Safety: the cache folder is created private (0700), and a cached object or its folder that another
user owns or that is group/world-writable is refused (:func:`check_owned`), since loading it would run
its code. The object is compiled to a temporary name in the cache folder and renamed into place, so
concurrent first uses each install a complete file; a failed build leaves nothing behind.

Every failure (no compiler, compile error, unwritable cache) raises; callers catch it and use their
pure-Python or numpy path instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def cache_dir() -> Path:
    """Where built objects are kept: ``$NPU_DEPLOY_CACHE/kernels`` or ``~/.cache/npu-deploy/kernels``."""
    root = os.environ.get("NPU_DEPLOY_CACHE", "").strip()
    base = Path(root) if root else Path.home() / ".cache" / "npu-deploy"
    return base / "kernels"


def find_cc() -> str | None:
    """The C compiler on PATH (``cc``, then ``gcc``), or None."""
    for name in ("cc", "gcc"):
        path = shutil.which(name)
        if path:
            return path
    return None


def check_owned(path: Path) -> None:
    """Refuse to load a cached shared object another user could have written (e.g. a cache
    directory under /tmp)."""
    if not hasattr(os, "getuid"):
        return
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise RuntimeError(f"{p} is not owned by this user or is group/world-writable")


def build(source: Path, name: str, flags: list[str]) -> tuple[str, float | None]:
    """Path of the shared object built from ``source`` (compiled now if not cached, as
    ``NAME-KEY.so``) and the compile time in seconds (None: loaded from the cache). Raises on any
    failure."""
    text = Path(source).read_bytes()
    cc = find_cc()
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    ver = subprocess.run([cc, "--version"], capture_output=True, timeout=60, check=True).stdout
    key = hashlib.sha256(b"\0".join([text, ver, " ".join(flags).encode(),
                                      platform.machine().encode(), sys.platform.encode(),
                                      platform.libc_ver()[0].encode()])).hexdigest()[:24]
    suffix = ".dll" if sys.platform == "win32" else ".dylib" if sys.platform == "darwin" else ".so"
    cache = cache_dir()
    target = cache / f"{name}-{key}{suffix}"
    if target.is_file():
        check_owned(target)
        return str(target), None
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.mkdir(mode=0o700, exist_ok=True)       # private: check_owned refuses shared directories
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=suffix, dir=cache)
    os.close(fd)
    try:
        csrc = cache / f".{name}-{key}-{os.getpid()}-{threading.get_ident()}.c"
        csrc.write_bytes(text)
        try:
            t0 = time.perf_counter()
            r = subprocess.run([cc, *flags, "-o", tmp, str(csrc)], capture_output=True, timeout=300)
            seconds = time.perf_counter() - t0
        finally:
            csrc.unlink(missing_ok=True)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed ({r.returncode}): {r.stderr.decode(errors='replace')[-500:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)     # atomic: concurrent first uses each install a complete file
        check_owned(target)         # the folder may have existed before, shared (NPU_DEPLOY_CACHE=/tmp/x)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return str(target), seconds
