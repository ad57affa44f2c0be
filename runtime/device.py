"""The one process-wide owner of ACL initialisation and device contexts.

pyACL allows ``acl.init`` once per process and nothing after ``acl.finalize`` (reference
``atc-acl-om.md`` §3.5), while several sessions may use the same device. So sessions never call
``acl.init``/``set_device``/``finalize`` themselves; they call :func:`acquire` and :func:`release`:

* the first :func:`acquire` imports pyACL (lazily) and calls ``acl.init`` (a ``100002`` "already
  initialised" from someone else is accepted, and then this module will not finalise). The
  initialisation is kept until the process ends;
* per device: ``acl.rt.set_device`` + ``acl.rt.create_context`` on the first acquire, reference counted;
  the last :func:`release` destroys that context and resets the device;
* :func:`shutdown` closes every session still open and releases every device, but keeps ACL
  initialised: a later :func:`acquire` sets the device up again without a second ``acl.init``;
* at interpreter exit (``atexit``) :func:`finalize` runs: :func:`shutdown` in the documented order
  (buffers, datasets, model, desc, stream; contexts; devices), then ``acl.finalize``. After it, ACL
  cannot be used again in this process (:func:`acquire` raises).

The caller's current context is left as it was. ACL has one current context per thread, and
``set_device`` / ``create_context`` / ``set_context`` change it; a library that changed it for good would
leave a thread that had its own context on ours, and on a destroyed one after the last release. So
:func:`acquire` and :func:`release` restore the calling thread's context, and work on the device is
done inside ``with device.using(device_id):``, which makes our context current for the block and puts
the thread's previous one back afterwards (when the thread had none, ours stays current: ACL cannot
unset a context).

All functions are thread safe.

>>> from npu_deploy.runtime import device            # doctest: +SKIP
>>> device.acquire(0)                                # doctest: +SKIP
>>> with device.using(0):                            # doctest: +SKIP
...     stream, ret = acl.rt.create_stream()
>>> device.release(0)                                # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import sys
import threading
from types import ModuleType
from typing import Any, Iterator, Protocol

from npu_deploy.errors import AclError, DependencyError, InternalError
from npu_deploy.runtime.acl_codes import ACL_ERROR_REPEAT_INITIALIZE, check, error_for

_lock = threading.RLock()
_acl: ModuleType | None = None
_initialized = False          # acl.init has succeeded (by us, or someone else before us)
_we_initialized = False       # ... and we own the matching acl.finalize
_finalized = False            # we called acl.finalize: ACL is over for this process
_atexit_registered = False
_devices: dict[int, list[int]] = {}           # device id -> [refcount, context]
_destroyed: set[int] = set()  # contexts we destroyed: a thread may still name one as its current
# strong references: an open backend that its user dropped must still be closed, in order, at exit
_owners: dict[int, "_Closable"] = {}


class _Closable(Protocol):
    def deactivate(self) -> None: ...


def load_acl() -> ModuleType:
    """Import pyACL (``acl``) or raise :class:`DependencyError` saying how to get it.

    >>> load_acl()                       # doctest: +SKIP
    <module 'acl' ...>
    """
    global _acl
    with _lock:
        if _acl is not None and sys.modules.get("acl") is _acl:
            return _acl
        try:
            mod = importlib.import_module("acl")
        except ImportError as e:
            raise DependencyError(
                "pyACL (the `acl` module) is not importable: it comes with CANN, not with pip",
                hint="on an Ascend host run `source /usr/local/Ascend/ascend-toolkit/set_env.sh` "
                     "(it puts CANN's python/site-packages on PYTHONPATH); elsewhere use an offline "
                     "bundle with the CPU emulator") from e
        if not (hasattr(mod, "rt") and hasattr(mod, "mdl") and hasattr(mod, "init")):
            where = getattr(mod, "__file__", "?")
            raise DependencyError(
                f"the `acl` module at {where} is not pyACL (the PyPI package named `acl` is unrelated)",
                hint="pip uninstall acl, then source CANN's set_env.sh")
        if _acl is not None and mod is not _acl:
            _forget()  # another runtime module was loaded in place of the first: its state is its own
        _acl = mod
        return mod


def _forget() -> None:
    """Drop what we know of the previous ``acl`` module (its devices, contexts, init and finalize)."""
    global _initialized, _we_initialized, _finalized
    _owners.clear()
    _devices.clear()
    _destroyed.clear()
    _initialized = _we_initialized = _finalized = False


def _init(acl: ModuleType, config_path: str | None = None) -> None:
    global _initialized, _we_initialized, _atexit_registered
    if _finalized:
        raise AclError("ACL was finalised in this process (npu_deploy.runtime.device.finalize) and pyACL "
                       "cannot be initialised again", call="acl.init",
                       hint="run device work in a new process")
    if _initialized:
        if config_path is not None:
            raise AclError("acl.json is read only at acl.init, and ACL is already initialised in this process",
                           call="acl.init", hint="start a new process to run with this acl.json (e.g. --dump)")
        return
    ret = acl.init(config_path) if config_path is not None else acl.init()
    if ret == ACL_ERROR_REPEAT_INITIALIZE:
        if config_path is not None:
            raise AclError("acl.json is read only at acl.init, and someone else already initialised ACL in this "
                           "process", call="acl.init", code=ret,
                           hint="start a new process to run with this acl.json (e.g. --dump)")
        _we_initialized = False
    else:
        check("acl.init", ret)
        _we_initialized = True
    _initialized = True
    if not _atexit_registered:
        atexit.register(_finalize_at_exit)
        _atexit_registered = True


def ensure_initialized(config_path: str | None = None) -> ModuleType:
    """Import pyACL and make sure ``acl.init`` has run in this process; return the module.
    ``config_path``: an ``acl.json`` (dump settings...) handed to ``acl.init``; pyACL reads it only
    there, so it is refused (``AclError``) once ACL is initialised."""
    with _lock:
        acl = load_acl()
        _init(acl, config_path)
        return acl


def acquire(device_id: int) -> int:
    """Make sure ACL is initialised and ``device_id`` has our context; return that context. The calling
    thread's current context is left as it was (do device work inside :func:`using`). Every call
    must be paired with :func:`release`."""
    with _lock:
        acl = load_acl()
        _init(acl)
        entry = _devices.get(device_id)
        if entry is None:
            saved = _current_context(acl)
            check("acl.rt.set_device", acl.rt.set_device(device_id), context=f"device {device_id}")
            ctx, ret = acl.rt.create_context(device_id)
            if ret != 0:
                err = error_for("acl.rt.create_context", ret, context=f"device {device_id}")
                acl.rt.reset_device(device_id)
                _restore(acl, saved)
                raise err
            _destroyed.discard(ctx)  # a handle may be reused once destroyed
            entry = _devices[device_id] = [0, ctx]
            _restore(acl, saved)
        entry[0] += 1
        return entry[1]


def _current_context(acl: ModuleType) -> int | None:
    """The calling thread's current context, or None (no context, or one of ours already destroyed)."""
    get = getattr(acl.rt, "get_context", None)
    if get is None:  # very old pyACL: nothing to save
        return None
    ctx, ret = get()
    if ret != 0 or not ctx or ctx in _destroyed:
        return None
    return ctx


def _restore(acl: ModuleType, saved: int | None) -> None:
    if saved is not None:
        check("acl.rt.set_context", acl.rt.set_context(saved), context="restoring the caller's context")


def use(device_id: int) -> int:
    """Make our context of ``device_id`` current in the calling thread, for good; return it. Prefer
    :func:`using`, which puts the thread's previous context back."""
    with _lock:
        entry = _devices.get(device_id)
        if entry is None or _acl is None:
            raise InternalError(f"device {device_id} used without acquire()")
        check("acl.rt.set_context", _acl.rt.set_context(entry[1]), context=f"device {device_id}")
        return entry[1]


@contextlib.contextmanager
def using(device_id: int) -> Iterator[int]:
    """``with using(device_id) as ctx:`` runs the block with our context of ``device_id`` current in
    the calling thread, then makes the thread's previous context current again (if it had one)."""
    with _lock:
        acl = _acl
        if acl is None or device_id not in _devices:
            raise InternalError(f"device {device_id} used without acquire()")
        saved = _current_context(acl)
        ctx = use(device_id)
    failed = False
    try:
        yield ctx
    except BaseException:
        failed = True
        raise
    finally:
        if saved is not None and saved != ctx:
            ret = acl.rt.set_context(saved)
            if ret != 0 and not failed:  # do not hide the block's own error behind this one
                check("acl.rt.set_context", ret, context="restoring the caller's context")


def release(device_id: int) -> None:
    """Drop one reference; the last one destroys the context and resets the device. The calling
    thread's current context is restored unless it was the one destroyed."""
    with _lock:
        entry = _devices.get(device_id)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] > 0:
            return
        del _devices[device_id]
        assert _acl is not None
        saved = _current_context(_acl)
        try:
            _teardown_device(device_id, entry[1])
        finally:
            if saved != entry[1]:
                _restore(_acl, saved)


def _teardown_device(device_id: int, ctx: int) -> None:
    acl = _acl
    assert acl is not None
    ret_ctx = acl.rt.destroy_context(ctx)
    if ret_ctx == 0:
        _destroyed.add(ctx)
    ret_dev = acl.rt.reset_device(device_id)
    check("acl.rt.destroy_context", ret_ctx, context=f"device {device_id}")
    check("acl.rt.reset_device", ret_dev, context=f"device {device_id}")


def register(owner: _Closable) -> None:
    """Have ``owner.deactivate()`` called by :func:`shutdown` if it is still open at exit."""
    with _lock:
        _owners[id(owner)] = owner


def unregister(owner: _Closable) -> None:
    with _lock:
        _owners.pop(id(owner), None)


def shutdown() -> list[str]:
    """Close every open session, destroy our contexts and reset our devices; ACL stays initialised
    (pyACL allows one ``acl.init`` per process), so a later :func:`acquire` starts the device again.
    Returns the problems met."""
    problems: list[str] = []
    with _lock:
        owners = list(_owners.values())
        _owners.clear()
    # not under _lock: a backend's deactivate takes its own lock and then ours (via using/release)
    for owner in owners:
        try:
            owner.deactivate()
        except Exception as e:  # keep going: the rest must still be released
            problems.append(f"closing {owner!r}: {e}")
    with _lock:
        saved = _current_context(_acl) if _acl is not None and _devices else None
        ours = {ctx for _, ctx in _devices.values()}
        for device_id, (_, ctx) in list(_devices.items()):
            del _devices[device_id]
            try:
                _teardown_device(device_id, ctx)
            except Exception as e:
                problems.append(str(e))
        if saved is not None and saved not in ours:
            try:
                _restore(_acl, saved)
            except Exception as e:
                problems.append(str(e))
    return problems


def finalize() -> list[str]:
    """:func:`shutdown`, then ``acl.finalize`` if we initialised ACL. Runs at interpreter exit; after
    it, this process cannot use ACL again (:func:`acquire` raises :class:`AclError`). Returns the
    problems met (they are also written to stderr at exit)."""
    global _initialized, _we_initialized, _finalized
    problems = shutdown()
    with _lock:
        if _initialized and _we_initialized and _acl is not None:
            ret = _acl.finalize()
            if ret != 0:
                problems.append(str(error_for("acl.finalize", ret)))
            _finalized = True
            _initialized = _we_initialized = False
    return problems


def _finalize_at_exit() -> None:  # pragma: no cover - exercised in a subprocess test
    for p in finalize():
        print(f"npu-deploy: warning: at exit: {p}", file=sys.stderr)


def status() -> dict[str, Any]:
    """What this helper holds: ``{"initialized", "owns_finalize", "finalized", "devices": {id: refcount},
    "open": n}``."""
    with _lock:
        return {"initialized": _initialized, "owns_finalize": _we_initialized, "finalized": _finalized,
                "devices": {d: e[0] for d, e in _devices.items()}, "open": len(_owners)}
