"""The one process-wide owner of ACL initialisation and device contexts.

pyACL allows ``acl.init`` once per process and nothing after ``acl.finalize`` (reference
``atc-acl-om.md`` §3.5), while several sessions may use the same device. So sessions never call
``acl.init``/``set_device``/``finalize`` themselves; they call :func:`acquire` and :func:`release`:

* the first :func:`acquire` imports pyACL (lazily) and calls ``acl.init`` (a ``100002`` "already
  initialised" from someone else is accepted, and then this module will not finalise);
* per device: ``acl.rt.set_device`` + ``acl.rt.create_context`` on the first acquire, reference counted;
  the last :func:`release` destroys that context and resets the device;
* at interpreter exit (``atexit``) :func:`shutdown` runs in the documented order: every session still
  open is closed (its buffers, datasets, model, desc, stream), then every context is destroyed, every
  device reset, and finally ``acl.finalize``.

All functions are thread safe. A context is current only in the thread that made it current; callers
in another thread must :func:`use` it first (``acl.rt.set_context``).

>>> from npu_deploy.runtime import device            # doctest: +SKIP
>>> ctx = device.acquire(0)                          # doctest: +SKIP
>>> ...                                              # doctest: +SKIP
>>> device.release(0)                                # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import importlib
import sys
import threading
from types import ModuleType
from typing import Any, Protocol

from npu_deploy.errors import DependencyError
from npu_deploy.runtime.acl_codes import ACL_ERROR_REPEAT_INITIALIZE, check, error_for

_lock = threading.RLock()
_acl: ModuleType | None = None
_initialized = False          # acl.init has succeeded (by us, or someone else before us)
_we_initialized = False       # ... and we own the matching acl.finalize
_atexit_registered = False
_devices: dict[int, list[int]] = {}           # device id -> [refcount, context]
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
        _acl = mod
        return mod


def _init(acl: ModuleType) -> None:
    global _initialized, _we_initialized, _atexit_registered
    if _initialized:
        return
    ret = acl.init()
    if ret == ACL_ERROR_REPEAT_INITIALIZE:
        _we_initialized = False
    else:
        check("acl.init", ret)
        _we_initialized = True
    _initialized = True
    if not _atexit_registered:
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def ensure_initialized() -> ModuleType:
    """Import pyACL and make sure ``acl.init`` has run in this process; return the module."""
    with _lock:
        acl = load_acl()
        _init(acl)
        return acl


def acquire(device_id: int) -> int:
    """Make sure ACL is initialised and ``device_id`` has our context; return that context (current
    in the calling thread). Every call must be paired with :func:`release`."""
    with _lock:
        acl = load_acl()
        _init(acl)
        entry = _devices.get(device_id)
        if entry is None:
            check("acl.rt.set_device", acl.rt.set_device(device_id), context=f"device {device_id}")
            ctx, ret = acl.rt.create_context(device_id)
            if ret != 0:
                err = error_for("acl.rt.create_context", ret, context=f"device {device_id}")
                acl.rt.reset_device(device_id)
                raise err
            entry = _devices[device_id] = [0, ctx]
        else:
            check("acl.rt.set_context", acl.rt.set_context(entry[1]), context=f"device {device_id}")
        entry[0] += 1
        return entry[1]


def use(device_id: int) -> int:
    """Make our context of ``device_id`` current in the calling thread; return it."""
    with _lock:
        entry = _devices.get(device_id)
        if entry is None or _acl is None:
            from npu_deploy.errors import InternalError

            raise InternalError(f"device {device_id} used without acquire()")
        check("acl.rt.set_context", _acl.rt.set_context(entry[1]), context=f"device {device_id}")
        return entry[1]


def release(device_id: int) -> None:
    """Drop one reference; the last one destroys the context and resets the device."""
    with _lock:
        entry = _devices.get(device_id)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] > 0:
            return
        del _devices[device_id]
        _teardown_device(device_id, entry[1])


def _teardown_device(device_id: int, ctx: int) -> None:
    acl = _acl
    assert acl is not None
    ret_ctx = acl.rt.destroy_context(ctx)
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
    """Close every open session, destroy contexts, reset devices, then ``acl.finalize`` (if we
    initialised). Runs at interpreter exit; callable earlier (a later :func:`acquire` starts again).
    Returns the problems met (they are also written to stderr at exit)."""
    global _initialized, _we_initialized
    problems: list[str] = []
    with _lock:
        owners = list(_owners.values())
        _owners.clear()
    # not under _lock: a backend's deactivate takes its own lock and then ours (via use/release)
    for owner in owners:
        try:
            owner.deactivate()
        except Exception as e:  # keep going: the rest must still be released
            problems.append(f"closing {owner!r}: {e}")
    with _lock:
        for device_id, (_, ctx) in list(_devices.items()):
            del _devices[device_id]
            try:
                _teardown_device(device_id, ctx)
            except Exception as e:
                problems.append(str(e))
        if _initialized and _we_initialized and _acl is not None:
            ret = _acl.finalize()
            if ret != 0:
                problems.append(str(error_for("acl.finalize", ret)))
        _initialized = False
        _we_initialized = False
    return problems


def _shutdown_at_exit() -> None:  # pragma: no cover - exercised in a subprocess test
    for p in shutdown():
        print(f"npu-deploy: warning: at exit: {p}", file=sys.stderr)


def status() -> dict[str, Any]:
    """What this helper holds: ``{"initialized", "owns_finalize", "devices": {id: refcount}, "open": n}``."""
    with _lock:
        return {"initialized": _initialized, "owns_finalize": _we_initialized,
                "devices": {d: e[0] for d, e in _devices.items()}, "open": len(_owners)}
