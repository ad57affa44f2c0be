"""``InferenceSession``: one API for an offline bundle on the CPU emulator and an ``.om`` on a device.

The file is recognised by its content, never its name: a bundle (``converters.bundle.is_bundle``) runs on
the CPU emulator, an ``.om`` (``converters.om.is_om``) on an Ascend device through ACL. An ONNX file is not
a runnable model here: convert it first (``npu-deploy convert model.onnx --backend builtin``).

The API follows onnxruntime's: ``get_inputs()``, ``get_outputs()`` (each a list of
:class:`~npu_deploy.runtime.backend.TensorMeta`) and ``run(output_names | None, feeds)``. Feeds are host
arrays in the model's host format; the session validates them (names, dtype with lossless casts only,
shape, gears), converts them to the device format on the way in and back on the way out.

Thread safety: a session may be shared between threads. Calls to ``run`` are serialised by a lock inside
the backend (one run at a time per session); use one session per thread for parallel runs.

Life cycle: the model is loaded when the session is created and released by ``close()``, at the end of a
``with`` block (also when the block raises), when the session is garbage-collected, and at interpreter
exit, whichever comes first.

>>> from npu_deploy import InferenceSession                             # doctest: +SKIP
>>> with InferenceSession("model.bundle") as sess:                      # doctest: +SKIP
...     x = np.zeros(sess.get_inputs()[0].shape, np.float32)
...     (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from npu_deploy.errors import DependencyError, InputError, ModelError
from npu_deploy.runtime.backend import Backend, TensorMeta, Timing

BACKENDS = ("auto", "emulator", "acl")

_open_sessions: "weakref.WeakSet[InferenceSession]" = weakref.WeakSet()
_open_lock = threading.Lock()


def _close_all_at_exit() -> None:
    with _open_lock:
        sessions = list(_open_sessions)
    for s in sessions:
        try:
            s.close()
        except Exception:  # at interpreter exit there is nobody left to tell
            pass


atexit.register(_close_all_at_exit)


def sniff_model(path: str | os.PathLike) -> str:
    """``"bundle"``, ``"om"`` or ``"onnx"`` by content; raises :class:`InputError` for anything else.

    >>> sniff_model(__file__)                                       # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    npu_deploy.errors.ModelError: ...
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"model file {p} does not exist", hint="check the path")
    if not p.is_file():
        raise InputError(f"model path {p} is not a file", hint="give a bundle or .om file")
    from npu_deploy.converters.bundle import is_bundle

    if is_bundle(p):
        return "bundle"
    try:
        from npu_deploy.converters.om import is_om
    except ImportError:  # the .om reader is optional here; without it no file is recognised as .om
        is_om = None
    if is_om is not None and is_om(p):
        return "om"
    with open(p, "rb") as f:
        head = f.read(2)
    # ONNX ModelProto starts with field 1 (ir_version, varint): tag byte 0x08
    if p.suffix.lower() == ".onnx" or head[:1] == b"\x08":
        return "onnx"
    raise ModelError(f"{p}: not an offline bundle or .om model (unrecognised content)",
                     hint="convert an ONNX model first: npu-deploy convert MODEL.onnx")


class InferenceSession:
    """Run a converted model: a bundle on the CPU emulator or an ``.om`` on an Ascend device.

    ``backend``: ``"auto"`` (bundle → emulator, ``.om`` → acl), ``"emulator"`` or ``"acl"``.
    ``profile=True`` writes an msprof-style folder under ``profile_dir`` (default: the current folder)
    when the session closes; on the emulator its durations are the cost model's estimates.

    >>> sess = InferenceSession("resnet.bundle")                        # doctest: +SKIP
    >>> [i.name for i in sess.get_inputs()]                             # doctest: +SKIP
    ['x']
    >>> y, = sess.run(None, {"x": np.zeros((1, 3, 224, 224), np.float32)})   # doctest: +SKIP
    >>> sess.close()                                                    # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike, device_id: int = 0, backend: str = "auto",
                 profile: bool = False, profile_dir: str | os.PathLike | None = None):
        if backend not in BACKENDS:
            raise InputError(f"unknown backend {backend!r}", hint=f"use one of {', '.join(BACKENDS)}")
        self.path = Path(path)
        self._backend: Backend | None = None
        #: the profile folder written at close (``profile=True``), else None
        self.profile_path: Path | None = None
        kind = sniff_model(self.path)
        if kind == "onnx":
            raise ModelError(f"{self.path}: is an ONNX model, which InferenceSession does not run",
                             hint=f"convert it first: npu-deploy convert {self.path} --backend builtin")
        if backend == "auto":
            backend = "emulator" if kind == "bundle" else "acl"
        if backend == "emulator" and kind != "bundle":
            raise InputError(f"{self.path}: the emulator runs offline bundles, this is an .om",
                             hint="use backend='acl' on an Ascend host, or convert with --backend builtin")
        if backend == "acl" and kind != "om":
            raise InputError(f"{self.path}: the acl backend runs .om files, this is an offline bundle",
                             hint="use backend='emulator' (or 'auto')")
        if backend == "emulator":
            from npu_deploy.runtime.emulator import EmulatorBackend

            be: Backend = EmulatorBackend(self.path, profile=profile, profile_dir=profile_dir)
        else:
            try:
                from npu_deploy.runtime.acl import AclBackend
            except ImportError as e:
                raise DependencyError(f"the ACL backend is not available ({e})",
                                      hint="run .om files on an Ascend host with CANN installed "
                                           "(pyACL from set_env.sh), or convert with --backend builtin "
                                           "and use the CPU emulator") from e
            if profile:
                raise InputError(f"{self.path}: profile=True is for the emulator; a device run is profiled "
                                 f"by msprof", hint="run under 'msprof --output=DIR python ...', then "
                                                    "'npu-deploy profile DIR'")
            be = AclBackend(self.path, device_id=device_id)
        self.backend_name = backend
        self.device_id = device_id
        be.activate()
        self._backend = be
        with _open_lock:
            _open_sessions.add(self)

    # ------------------------------------------------------------------ properties
    @property
    def backend(self) -> Backend:
        """The active backend (raises after ``close``)."""
        if self._backend is None:
            raise InputError(f"session for {self.path} is closed", hint="create a new InferenceSession")
        return self._backend

    @property
    def precision_mode(self) -> str | None:
        """The precision mode the model was converted with, when the model says so."""
        return getattr(self._backend, "precision_mode", None)

    @property
    def closed(self) -> bool:
        return self._backend is None

    # ------------------------------------------------------------------ API
    def get_inputs(self) -> list[TensorMeta]:
        return self.backend.get_inputs()

    def get_outputs(self) -> list[TensorMeta]:
        return self.backend.get_outputs()

    def gears(self) -> list[dict[str, tuple[int, ...]]]:
        """The model's input gears, ``[{input: shape}, ...]`` (empty for a static model)."""
        return self.backend.gears()

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Run once; ``output_names=None`` returns every output in model order."""
        return self.backend.run(output_names, feeds)

    def run_timed(self, output_names: Sequence[str] | None,
                  feeds: Mapping[str, Any]) -> tuple[list[np.ndarray], Timing]:
        """Like :meth:`run`, also returning the host→device / compute / device→host split."""
        return self.backend.run_timed(output_names, feeds)

    def close(self) -> None:
        """Release the model (idempotent). Writes the profile, if one was requested."""
        be, self._backend = self._backend, None
        if be is not None:
            with _open_lock:
                _open_sessions.discard(self)
            be.deactivate()
            self.profile_path = getattr(be, "profile_path", None)

    def __enter__(self) -> "InferenceSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._backend is None else self.backend_name
        return f"InferenceSession({str(self.path)!r}, {state})"
