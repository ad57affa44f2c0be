"""Outputs that are complete or absent, and reading of untrusted array files.

Writing
-------
:func:`atomic_path` / :func:`atomic_write` write to a temporary file in the destination folder, named
``.NAME.PID.XXXXXXXX.part`` (``PID`` the writer's process id), and rename it over the destination when
the block succeeds. On any error the temporary file is removed and the destination is untouched. Any
``OSError`` while writing (disk full, read-only file system) becomes one :class:`OutputError` (exit 3)
naming the output and the system's reason; this is the one place where that mapping happens.

:func:`outputs` groups the writes of one command run: if the run fails, every output it already
renamed into place is removed again (or, when it replaced an existing file, that file is put back).
Outside an :func:`outputs` block each write stands alone. A SIGINT/SIGTERM that arrives while a
temporary file is being created, or an output renamed and recorded, is raised right after that step
(:func:`defer_signal`), so that the clean-up always knows every file.

Temporary files left by a killed writer (SIGKILL, power loss) are removed at the next write into the
same folder. The rule, which only touches our own naming: a regular file matching exactly
``.NAME.PID.XXXXXXXX.part`` whose process ``PID`` no longer runs on this host; or an older-style
``.NAME.XXXXXXXX.part`` (no PID) last modified more than an hour ago. A live writer's files are never
removed (a reused PID only makes us keep a stale file longer).

Inputs compared with outputs go through :func:`refuse_overwriting`: an output that *is* one of the
command's inputs (same file, also through symlinks or hard links: same ``st_dev``/``st_ino``) is refused,
and so is an output anywhere inside a folder the command reads (a capture, a dump folder, an input folder):
there it could replace a file that is read, or be read itself by the next run. Every command lists the
files it discovers or reads as configuration among its inputs.

Reading
-------
:func:`load_npy` / :func:`load_npz` read ``.npy`` / ``.npz`` without pickle and check the sizes their
headers claim against the bytes the file holds *before* allocating anything.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import math
import os
import re
import tempfile
import threading
import time
import zipfile
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Iterable, Iterator

from npu_deploy.errors import InputError, Interrupted, OutputError

if TYPE_CHECKING:  # numpy is imported when an array is read: `npu-deploy --help` does not need it
    import numpy as np

# mkstemp's random part: 8 characters of this alphabet (tempfile._RandomNameSequence)
_PART = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[0-9]+)\.[a-z0-9_]{8}\.part$", re.S)
_LEGACY_PART = re.compile(r"^\..+\.[a-z0-9_]{8}\.part$", re.S)
_LEGACY_AGE_S = 3600.0
_cleaned: set[str] = set()


# ------------------------------------------------------------------------------------------ checks
def _parent(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def check_dest(path: str | os.PathLike) -> None:
    """Refuse (exit 2) an output path whose folder is missing or not writable, or that is a folder.
    Commands call it before long work, so that a bad ``--json`` path fails first, not last."""
    path = Path(path)
    parent = _parent(path)
    try:
        _check_dest_folder(path, parent)
    except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte
        reason = getattr(e, "strerror", None) or str(e)
        raise InputError(f"cannot write {path}: {reason}", hint="choose another output path") from None


def _check_dest_folder(path: Path, parent: Path) -> None:
    if not parent.is_dir():
        raise InputError(f"cannot write {path}: folder {parent} does not exist",
                         hint="create the folder or choose another output path")
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a folder", hint="give a file name")
    if not os.access(parent, os.W_OK):
        raise InputError(f"cannot write {path}: folder {parent} is not writable",
                         hint="choose another output path")




def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` name one file: same device and inode (symlinks and hard links
    included), or, when one does not exist yet, the same resolved path."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return os.path.realpath(a) == os.path.realpath(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _file_id(path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _inside_folder(path: str | os.PathLike, folder: object) -> bool:
    """True when ``folder`` is a folder and ``path`` lies somewhere below it: one of the folders that
    hold ``path`` (followed through symlinks) is ``folder`` by ``st_dev``/``st_ino``."""
    try:
        if not os.path.isdir(folder):  # type: ignore[arg-type]
            return False
        target = _file_id(folder)  # type: ignore[arg-type]
        here = Path(os.path.realpath(path)).parent
    except (OSError, ValueError, TypeError):
        return False
    if target is None:
        return False
    for anc in (here, *here.parents):
        if _file_id(anc) == target:
            return True
    return False


def refuse_overwriting(outputs: Iterable[tuple[str, object]], inputs: Iterable[tuple[str, object]]) -> None:
    """Raise ``InputError`` (exit 2) when an output names one of the inputs, or two outputs name one
    file: the write would destroy data the user still needs. ``outputs``/``inputs`` are
    ``(option or role, path or None)`` pairs.

    >>> refuse_overwriting([("--json", "a.bundle")], [("bundle", "a.bundle")])
    Traceback (most recent call last):
    ...
    npu_deploy.errors.InputError: --json a.bundle is the bundle itself: writing it would overwrite it (choose another --json path)
    """
    outs = [(o, p) for o, p in outputs if p is not None]
    ins = [(r, p) for r, p in inputs if p is not None]
    for opt, path in outs:
        for role, src in ins:
            if same_file(path, src):
                raise InputError(f"{opt} {path} is the {role} itself: writing it would overwrite it",
                                 hint=f"choose another {opt} path")
            if _inside_folder(path, src):
                raise InputError(f"{opt} {path} is inside the {role} {src}, which is being read: writing there "
                                 "could replace or add to what is read", hint=f"write the {opt} outside {src}")
    for i, (o1, p1) in enumerate(outs):
        for o2, p2 in outs[i + 1:]:
            if same_file(p1, p2):
                raise InputError(f"{o1} and {o2} both name {p1}: one would replace the other",
                                 hint="give each output its own path")


def output_error(path: str | os.PathLike, error: OSError) -> OutputError:
    """The one-line exit-3 error for an ``OSError`` met while writing ``path``."""
    reason = error.strerror or str(error) or type(error).__name__
    hint = "free some disk space or write elsewhere" if error.errno in (errno.ENOSPC, errno.EDQUOT) \
        else "check the folder's permissions and free space, or write elsewhere"
    return OutputError(f"cannot write {path}: {reason}", path=str(path), hint=hint)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_STEM_MAX_BYTES = 200  # room for a "_2" suffix, the extension and NAME_MAX (255 bytes)


def safe_file_stem(name: str) -> str:
    """A file name stem for a tensor name: the name with ``/`` and ``:`` as ``_`` when that is a safe
    file name, else a sanitised, shortened name with a hash of the original (``weird_name-1a2b3c4d``).

    >>> safe_file_stem("logits:0"), len(safe_file_stem("a" * 300)), safe_file_stem("x\\x00y")[:4]
    ('logits_0', 109, 'x_y-')
    """
    name = str(name)
    stem = name.replace("/", "_").replace(":", "_")
    if (stem and stem.isprintable() and not stem.startswith(".") and "\\" not in stem
            and len(stem.encode("utf-8", "surrogateescape")) <= _STEM_MAX_BYTES):
        return stem
    import hashlib

    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    short = _UNSAFE.sub("_", name)[:100].strip("._") or "tensor"
    return f"{short}-{digest}"


# ------------------------------------------------------------------------------- critical sections
class _Critical:
    depth = 0
    pending: int | None = None


def defer_signal(signum: int) -> bool:
    """For a signal handler: True when a file operation that must not be cut in two (create-and-record
    a temporary, rename-and-record an output) is running; the signal is then raised as
    :class:`Interrupted` when it ends. Signal handlers run in the main thread, as do the sections."""
    if _Critical.depth:
        _Critical.pending = signum
        return True
    return False


@contextlib.contextmanager
def _critical() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals are handled in the main thread only: nothing to defer here
        return
    _Critical.depth += 1
    try:
        yield
    finally:
        _Critical.depth -= 1
        if not _Critical.depth and _Critical.pending is not None:
            signum, _Critical.pending = _Critical.pending, None
            raise Interrupted(signum)


# ------------------------------------------------------------------------------------- output sets
class OutputSet:
    """The outputs one command run wrote. See :func:`outputs`."""

    def __init__(self):
        # (destination, backup of the file it replaced or None, whether a failed run removes it)
        self._done: list[tuple[Path, Path | None, bool]] = []

    def adopt(self, path: str | os.PathLike) -> None:
        """Count a file written by someone else (ATC's ``.om``), or a folder this run created, as an
        output of this run: the file is removed if the run fails, the folder when it is then empty."""
        self._done.append((Path(path), None, True))

    def _renamed(self, dest: Path, backup: Path | None, existed: bool) -> None:
        self._done.append((dest, backup, backup is not None or not existed))

    def _rollback(self) -> None:
        for dest, backup, undo in reversed(self._done):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, dest)
                elif undo:
                    if dest.is_dir() and not dest.is_symlink():
                        dest.rmdir()  # only when empty: a folder is never deleted with contents
                    else:
                        dest.unlink()
        self._done.clear()

    def _commit(self) -> None:
        for _, backup, _ in self._done:
            if backup is not None:
                with contextlib.suppress(OSError):
                    backup.unlink()
        self._done.clear()


_ACTIVE: contextvars.ContextVar[OutputSet | None] = contextvars.ContextVar("npu_deploy_outputs", default=None)


@contextlib.contextmanager
def outputs() -> Iterator[OutputSet]:
    """Group the writes of one run: when the block raises, every output written inside it is removed
    (an output that replaced an existing file puts that file back). Nested blocks join the outer one.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> try:
    ...     with outputs():
    ...         with atomic_write(d / "model.bundle") as f:
    ...             _ = f.write(b"bundle")
    ...         raise OSError("the report could not be written")
    ... except OSError:
    ...     pass
    >>> sorted(p.name for p in d.iterdir())
    []
    """
    current = _ACTIVE.get()
    if current is not None:
        yield current
        return
    out = OutputSet()
    token = _ACTIVE.set(out)
    try:
        yield out
    except BaseException:
        with _critical():
            out._rollback()
        raise
    else:
        out._commit()
    finally:
        _ACTIVE.reset(token)


def adopt(path: str | os.PathLike) -> None:
    """Register ``path`` with the current :func:`outputs` block, if any (see :meth:`OutputSet.adopt`)."""
    current = _ACTIVE.get()
    if current is not None:
        current.adopt(path)


def make_output_folder(path: str | os.PathLike) -> Path:
    """Create an output folder (and missing parents); a failed run removes those it created, if empty."""
    d = Path(path)
    missing = []
    for p in (d, *d.parents):
        if p.exists():
            if not p.is_dir():
                raise InputError(f"cannot create output folder {d}: {p} is a file",
                                 hint="choose another output folder")
            break
        missing.append(p)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(d, e) from e
    for p in reversed(missing):
        adopt(p)
    return d


def rollback_outputs() -> None:
    """Remove the outputs of the current :func:`outputs` block now (a run ending with a failure
    exit code rather than an exception)."""
    current = _ACTIVE.get()
    if current is not None:
        current._rollback()


# ---------------------------------------------------------------------------------- stale parts
def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we could have written: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def clean_stale_parts(folder: str | os.PathLike, *, now: float | None = None) -> list[Path]:
    """Remove temporary files of our naming left in ``folder`` by writers that are gone (the rule is
    in the module docstring); return what was removed."""
    folder = Path(folder)
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.endswith(".part") or not name.startswith("."):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            m = _PART.match(name)
            if m is not None:
                stale = not _pid_alive(int(m.group("pid")))
            elif _LEGACY_PART.match(name):
                stale = now - entry.stat(follow_symlinks=False).st_mtime > _LEGACY_AGE_S
            else:
                continue
            if stale:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except (OSError, ValueError):
            continue
    return removed


def clean_stale_parts_below(root: str | os.PathLike, *, depth: int = 6) -> list[Path]:
    """:func:`clean_stale_parts` in ``root`` and every folder below it (at most ``depth`` levels, symlinks
    not followed), then remove the folders that only such files held (up to, not including, ``root``).
    For trees where each run writes into a folder of its own (``run --dump``: ``DIR/{time}/...``), which
    a later run never writes into again: a run killed with SIGKILL leaves its parts there."""
    root = Path(root)
    removed: list[Path] = []
    if not root.is_dir() or root.is_symlink():
        return removed
    for here, dirs, _ in os.walk(root, topdown=False, followlinks=False):
        if len(Path(here).relative_to(root).parts) > depth or not os.path.isdir(here):  # removed below
            continue
        gone = clean_stale_parts(here)
        removed += gone
        d = Path(here)
        while gone and d != root and root in d.parents:
            try:
                d.rmdir()  # only when empty
            except OSError:
                break
            d = d.parent
    return removed


def clean_parts_once(folder: str | os.PathLike) -> None:
    """:func:`clean_stale_parts` of ``folder`` the first time this process writes there (as
    :func:`atomic_path` does before its first write); later calls do nothing."""
    key = os.path.realpath(folder)
    if key not in _cleaned:
        _cleaned.add(key)
        clean_stale_parts(folder)


# ---------------------------------------------------------------------------------- atomic writes
def _part_stem(name: str) -> str:
    # keep the temporary name within NAME_MAX (255 bytes) whatever the destination's length
    return name.encode("utf-8", "surrogateescape")[:96].decode("utf-8", "ignore") or "out"


def _temp_prefix(name: str) -> str:
    return f".{_part_stem(name)}.{os.getpid()}."


def _new_part(dest: Path, *, clean: bool = True) -> Path:
    """A new, empty temporary file next to ``dest`` named after it and this process (mode as any new file)."""
    check_dest(dest)
    parent = _parent(dest)
    if clean:
        clean_parts_once(parent)
    tmp = None
    try:
        with _critical():  # a signal cannot strike between creating the file and knowing its name
            try:
                fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(dest.name), suffix=".part", dir=parent)
            except OSError as e:
                raise output_error(dest, e) from e
            os.close(fd)
            tmp = Path(tmp_name)
        # mkstemp creates 0600; a finished output gets the mode any new file would (0666 less the umask)
        umask = os.umask(0)
        os.umask(umask)
        try:
            os.chmod(tmp, 0o666 & ~umask)
        except OSError as e:
            raise output_error(dest, e) from e
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
    return tmp


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
    tmp = _new_part(dest)
    try:
        try:
            yield tmp
        except OSError as e:
            raise output_error(dest, e) from e
        _install(tmp, dest)
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


def write_part(path: str | os.PathLike, write: Callable[[IO], None]) -> Path:
    """The first half of :func:`atomic_write`, for a file written in one process and put in place by
    another: ``write(f)`` into a temporary file next to ``path`` (flushed to disk), whose name is
    returned; :func:`install_part` renames it over ``path``. On any error nothing is left behind. A
    part whose writer dies is removed by the stale-part rule (its name carries the writer's pid), but not
    by this function: a writer never cleans the folder, since a finished part of a writer that died since
    may still be waiting for :func:`install_part`; the process that installs parts cleans the folder when
    it is done (:func:`clean_stale_parts`)."""
    dest = Path(path)
    tmp = _new_part(dest, clean=False)
    try:
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise output_error(dest, e) from e
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def install_part(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Rename a finished :func:`write_part` file over ``path``, as :func:`atomic_write` does at its end
    (inside an :func:`outputs` block, a failed run undoes it). The temporary file must be one of ours
    (``.NAME.PID.XXXXXXXX.part`` beside ``path``): anything else is refused."""
    tmp, dest = Path(tmp), Path(path)
    m = _PART.match(tmp.name)
    if (m is None or m.group("name") != _part_stem(dest.name)
            or os.path.realpath(_parent(tmp)) != os.path.realpath(_parent(dest))):
        raise OutputError(f"{tmp} is not a temporary file written for {dest}")
    _install(tmp, dest)


def _install(tmp: Path, dest: Path) -> None:
    """Rename ``tmp`` over ``dest``; inside an output set, keep what ``dest`` held until the run ends."""
    out = _ACTIVE.get()
    with _critical():  # rename and record as one step, so that a failed run can undo it
        existed = os.path.lexists(dest)
        backup = None
        if out is not None and existed:
            try:
                fd, name = tempfile.mkstemp(prefix=_temp_prefix(dest.name), suffix=".part", dir=_parent(dest))
                os.close(fd)
                os.unlink(name)
                os.link(dest, name, follow_symlinks=False)
                backup = Path(name)
            except (OSError, NotImplementedError):
                backup = None  # no hard links here: a failed run then leaves the new file in place
        try:
            os.replace(tmp, dest)
        except OSError as e:
            if backup is not None:
                with contextlib.suppress(OSError):
                    backup.unlink()
            raise output_error(dest, e) from e
        if out is not None:
            out._renamed(dest, backup, existed)


# ---------------------------------------------------------------------------------- safe reading
# deflate cannot expand data by more than about 1032:1; a larger claim in a zip header is a lie
_DEFLATE_MAX_RATIO = 1100
_NPY_MAX_HEADER = 10000  # numpy's own default limit (max_header_size)


def _npy_header(f, path, where: str):
    """(shape, dtype) of the .npy stream ``f``, left after the header; InputError on anything malformed."""
    import numpy as np

    try:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"unknown .npy format version {version[0]}.{version[1]}")
        # numpy reads as many header bytes as the length field says before checking it: check first
        width = 2 if version == (1, 0) else 4
        start = f.tell()
        length = int.from_bytes(f.read(width), "little")
        if length > _NPY_MAX_HEADER:
            raise ValueError(f"header length {length:,} bytes (at most {_NPY_MAX_HEADER:,})")
        f.seek(start)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:  # 2.0 and 3.0 share the layout (3.0 is utf-8; sizes do not depend on field names)
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except Exception as e:  # numpy parses the header as a Python literal: any failure means "not .npy"
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise InputError(f"cannot read {path}{where} as .npy: {first}",
                         hint="save arrays with numpy.save") from None
    if dtype.hasobject:
        raise InputError(f"cannot read {path}{where}: it holds Python objects, which are never loaded (no pickle)",
                         hint="save a numeric array with numpy.save")
    return shape, dtype


def _claimed_bytes(shape, dtype) -> int:
    return math.prod(int(d) for d in shape) * dtype.itemsize


def load_npy(path: str | os.PathLike) -> np.ndarray:
    """Read one ``.npy`` array: no pickle, and the size the header claims checked against the file
    before anything is allocated (a 200-byte file cannot make us allocate petabytes)."""
    import numpy as np

    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            if size == 0:
                raise InputError(f"{p} is empty (0 bytes), not a .npy array", hint="save arrays with numpy.save")
            shape, dtype = _npy_header(f, p, "")
            have = size - f.tell()
            need = _claimed_bytes(shape, dtype)
            if need > have:
                raise InputError(f"{p}: header says {tuple(shape)} {dtype} ({need:,} bytes) but the file holds "
                                 f"{have:,} bytes of data (truncated or corrupt)",
                                 hint="re-save the array with numpy.save")
            f.seek(0)
            return np.lib.format.read_array(f, allow_pickle=False)
    except InputError:
        raise
    except (OSError, ValueError, EOFError) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:200]
        raise InputError(f"cannot read {p} as .npy: {reason}", hint="check the path and the file") from None


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read every array of an ``.npz``: no pickle, members that are not arrays refused, and each
    member's claimed size checked against the archive (and deflate's limits) before reading it."""
    import numpy as np

    p = Path(path)
    hint = "give an .npz written by numpy.savez or --save-inputs"
    try:
        size = p.stat().st_size
        if size == 0:
            raise InputError(f"{p} is empty (0 bytes), not an .npz archive", hint=hint)
        arrays: dict[str, np.ndarray] = {}
        with zipfile.ZipFile(p) as z:
            for info in z.infolist():
                if info.filename.endswith("/"):  # a folder entry (zipfile's is_dir() fails on an empty name)
                    continue
                if not info.filename.endswith(".npy"):
                    raise InputError(f"{p}: member {info.filename!r} is not an array (.npy)", hint=hint)
                limit = info.compress_size * (_DEFLATE_MAX_RATIO if info.compress_type else 1) + 1024
                if info.compress_size > size or info.file_size > limit:
                    raise InputError(f"{p}: member {info.filename!r} claims {info.file_size:,} bytes from "
                                     f"{info.compress_size:,} stored (corrupt archive)", hint=hint)
                where = f" (member {info.filename!r})"
                with z.open(info) as m:
                    shape, dtype = _npy_header(m, p, where)
                    need = _claimed_bytes(shape, dtype)
                    have = info.file_size - m.tell()
                    if need > have:
                        raise InputError(f"{p}{where}: header says {tuple(shape)} {dtype} ({need:,} bytes) but "
                                         f"the member holds {have:,} (truncated or corrupt)", hint=hint)
                with z.open(info) as m:
                    arr = np.lib.format.read_array(m, allow_pickle=False)
                arrays[info.filename[:-4]] = arr
        return arrays
    except InputError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, KeyError,
            NotImplementedError, RuntimeError, zlib.error) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:200] or type(e).__name__
        raise InputError(f"{p}: not a readable .npz of arrays ({reason})", hint=hint) from None
