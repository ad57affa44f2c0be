"""``InferenceSession``: one API for an offline bundle on the CPU emulator and an ``.om`` on a device.

The file is recognised by its content, never its name: a bundle (``converters.files.bundle.is_bundle``) runs on
the CPU emulator, an ``.om`` (``converters.files.om.is_om``) on an Ascend device through ACL. An ONNX file is
converted in memory (below).

The API follows onnxruntime's, so code written for ``onnxruntime.InferenceSession`` runs unchanged:

* ``InferenceSession("model.onnx")`` converts in memory (ATC when it and a device are present, else the
  built-in lowering for the CPU emulator; :attr:`InferenceSession.conversion` says which). A model whose
  inputs keep dynamic dims (symbolic, or an unbounded range) opens at once and lowers each new input shape
  on its first run, keeping the last ``shape_cache_size=`` (default 8; also
  ``sess_options.add_session_config_entry("npu_deploy.shape_cache_size", "N")``) shapes
  (:class:`ShapeCache`); a bounded range (``input_shapes={"x": "1~4,3,224,224"}``) is planned once by the
  built-in lowering when one plan serves it (else shape by shape, bounds checked); gears given at open
  time (``dynamic_batch=`` / ``dynamic_dims=``) are one conversion;
* ``providers=["CANNExecutionProvider" | "CPUExecutionProvider", ...]`` (first one that can run the
  model wins; ``("CANNExecutionProvider", {"device_id": 1})`` sets the device), ``sess_options=``
  (an ``onnxruntime.SessionOptions``: threads and the rest honoured by the emulator's onnxruntime;
  refused on a device where they cannot apply), ``get_providers()``, ``get_modelmeta()``,
  ``end_profiling()``;
* ``get_inputs()`` / ``get_outputs()``: :class:`NodeArg` with ``.name``, ``.shape`` (a dynamic dim is its
  name, a ``str``, or ``None`` when unnamed, as onnxruntime gives it) and ``.type`` (``"tensor(float)"``), and every
  :class:`~npu_deploy.runtime.backend.TensorMeta` field besides (``format``, ``device_format``,
  ``gears`` …; a named dynamic dim still compares equal to -1 for code written against TensorMeta);
* ``run(output_names | None, feeds, run_options=None)``; ``io_binding()`` + ``run_with_iobinding()``
  keep bound inputs in place between runs (on the CPU: copied once at bind time, like a device copy).

Feeds are host arrays in the model's host format; the session validates them (names, dtype with
lossless casts only, shape, gears), converts them to the device format on the way in and back on the way out.

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

# Imports inside functions here are lazy on purpose: the emulator backend loads onnxruntime, the ACL
# backend pyACL/acllite, convert the whole lowering; a session loads only the one its file needs.

import atexit
import collections
import contextlib
import dataclasses
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from npu_deploy.converters.files.onnx_model import DimRange, TensorInfo, declared_io, split_ranges
from npu_deploy.errors import DependencyError, InputError, ModelError
from npu_deploy.runtime.backend import ORT_TYPES, Backend, Gear, TensorMeta, Timing, check_ranges

BACKENDS = ("auto", "emulator", "acl")
# onnxruntime execution-provider names -> the backend that plays their part
PROVIDERS = {"CPUExecutionProvider": "emulator", "CANNExecutionProvider": "acl"}
BACKEND_PROVIDER = {v: k for k, v in PROVIDERS.items()}
_log = logging.getLogger("npu_deploy")

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
    from npu_deploy.converters.files.bundle import is_bundle

    if is_bundle(p):
        return "bundle"
    try:
        from npu_deploy.converters.files.om import is_om
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
                 profile: bool = False, profile_dir: str | os.PathLike | None = None, *,
                 sess_options: Any = None, providers: Sequence[Any] | None = None,
                 provider_options: Sequence[dict] | None = None,
                 input_shapes: Mapping[str, Sequence[Any]] | None = None,
                 dynamic_batch: Sequence[int] | None = None, dynamic_dims: Any = None,
                 shape_cache_size: int | None = None):
        if backend not in BACKENDS:
            raise InputError(f"unknown backend {backend!r}", hint=f"use one of {', '.join(BACKENDS)}")
        self.path = Path(path)
        self._backend: Backend | None = None
        self._tmpdir: str | None = None
        #: the profile folder written at close (``profile=True``), else None
        self.profile_path: Path | None = None
        #: how an ``.onnx`` path was made runnable ("" for a bundle or .om), e.g. "built-in lowering"
        self.conversion = ""
        self.source_model: Path | None = None
        self._declared: dict | None = None   # the source .onnx's dim names, read on first get_inputs()
        self._graph_dims: dict = {}          # (kind, name) -> the bundle graph's dim names, once each
        self._sess_options = sess_options
        self._shape_cache: ShapeCache | None = None
        kind = sniff_model(self.path)
        backend, device_id = _resolve_providers(providers, provider_options, backend, device_id, kind)
        self.device_id_hint = device_id
        if kind == "onnx":
            kind, backend = self._convert_onnx(backend, input_shapes, dynamic_batch, dynamic_dims,
                                               _cache_size(shape_cache_size, sess_options), profile)
        elif input_shapes is not None or dynamic_batch is not None or dynamic_dims is not None:
            raise InputError("input_shapes= / dynamic_batch= / dynamic_dims= are for an .onnx model converted "
                             "on the fly",
                             hint="a bundle or .om has its shapes; give concrete arrays to run()")
        if backend == "auto":
            backend = "emulator" if kind == "bundle" else "acl"
        if backend == "emulator" and kind not in ("bundle", "dynamic"):
            raise InputError(f"{self.path}: the emulator runs offline bundles, this is an .om",
                             hint="run it with the acl backend on an Ascend host, or convert the ONNX model with the "
                                  "built-in backend for the emulator")
        if backend == "acl" and kind not in ("om", "dynamic"):
            raise InputError(f"{self.path}: the acl backend runs .om files, this is an offline bundle",
                             hint="run it with the emulator backend (or auto)")
        if kind == "dynamic":
            if backend == "acl":
                _refuse_device_options(sess_options)
            be = self._shape_cache
        elif backend == "emulator":
            from npu_deploy.runtime.emulator import EmulatorBackend

            be: Backend = EmulatorBackend(self.path, profile=profile, profile_dir=profile_dir,
                                          session_options=_ort_options(sess_options))
        else:
            _refuse_device_options(sess_options)
            try:
                from npu_deploy.runtime.acl import AclBackend
            except ImportError as e:
                raise DependencyError(f"the ACL backend is not available ({e})",
                                      hint="run .om files on an Ascend host with CANN installed "
                                           "(pyACL from set_env.sh), or convert with --backend builtin "
                                           "and use the CPU emulator") from e
            if profile:
                raise InputError(f"{self.path}: profiling here is for the emulator; a device run is profiled "
                                 f"by msprof", hint="run under 'msprof --output=DIR python ...', then "
                                                    "'npu-deploy profile DIR'")
            be = AclBackend(self.path, device_id=device_id)
        self.backend_name = backend
        self.device_id = device_id
        try:
            be.activate()
        except BaseException:
            self._remove_tmpdir()
            raise
        self._backend = be
        #: ``{input: per-dim (low, high) or None}`` of a shape-range bundle (``convert --input-shape x:1~4,...``)
        #: or shape-range ``.om`` (:attr:`npu_deploy.runtime.acl.AclBackend.ranges`)
        self.ranges = _bundle_ranges(be) or dict(getattr(be, "ranges", None) or {})
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

    def _convert_onnx(self, backend: str, input_shapes, dynamic_batch, dynamic_dims, cache_size: int,
                      profile: bool) -> tuple[str, str]:
        """Make an ``.onnx`` runnable: ATC → ``.om`` when ATC is found and the ACL backend is wanted or
        importable, else the built-in lowering → a bundle for the emulator, in a private folder.

        A model whose inputs keep dynamic dimensions (symbolic dims not fixed by ``input_shapes``, or
        ranges such as ``"1~4"`` in them) and no gears is not converted here: each input shape is
        lowered on first use (:class:`ShapeCache`); the kind returned is then ``"dynamic"``."""
        from npu_deploy.converters.lowering.convert import convert

        use_atc = backend == "acl" or (backend == "auto" and _device_path_available())
        self._tmpdir = tempfile.mkdtemp(prefix="npu-deploy-session-")
        try:
            shapes, ranges = split_ranges(input_shapes)
            if dynamic_batch is None and dynamic_dims is None:
                inputs, outputs = declared_io(self.path)
                fixed = {i.name: tuple((shapes or {}).get(i.name, i.shape)) for i in inputs}
                ranged_only = all(d >= 0 or (n in ranges and ranges[n][k] is not None)
                                  for n, s in fixed.items() for k, d in enumerate(s))
                if ranges and ranged_only and not use_atc and self._convert_range(input_shapes):
                    return "bundle", "emulator"
                if ranges or any(d < 0 for s in fixed.values() for d in s):
                    if profile:
                        raise InputError(f"{self.path}: profile=True needs fixed input shapes",
                                         hint="give input_shapes= (or dynamic_batch= gears) when profiling")
                    self._shape_cache = ShapeCache(self.path, inputs, outputs, fixed, ranges, Path(self._tmpdir),
                                                   cache_size, use_atc=use_atc, device_id=self.device_id_hint,
                                                   session_options=self._sess_options)
                    self.source_model = self.path
                    self.conversion = ("ATC per input shape (.om, on the device)" if use_atc else
                                       "built-in lowering per input shape (bundles, CPU emulator)")
                    return "dynamic", ("acl" if use_atc else "emulator")
            out = Path(self._tmpdir) / (self.path.stem + (".om" if use_atc else ".bundle"))
            res = convert(self.path, out, backend="atc" if use_atc else "builtin",
                          input_shapes=dict(shapes) if shapes else None, dynamic_batch=dynamic_batch,
                          dynamic_dims=dynamic_dims)
        except BaseException as e:
            self._remove_tmpdir()
            if getattr(e, "dynamic_input", None):  # the CLI's --input-shape is input_shapes= here
                name, example = e.dynamic_input
                e.hint = (f"pass InferenceSession(..., input_shapes={{{name!r}: ({example})}}) with each ? "
                          f"replaced by a size")
            raise
        self.source_model, self.path = self.path, Path(res.output)
        self.conversion = "ATC (.om, on the device)" if use_atc else "built-in lowering (bundle, CPU emulator)"
        _log.info("%s: converted in memory with %s", self.source_model, self.conversion)
        return ("om", "acl") if use_atc else ("bundle", "emulator")

    def _convert_range(self, input_shapes) -> bool:
        """The built-in lowering planned for a range once (``converters.lowering.ranges``): True when
        it could; False when one plan cannot serve the range (then each shape is lowered on first use)."""
        from npu_deploy.converters.lowering.convert import convert

        out = Path(self._tmpdir) / (self.path.stem + ".bundle")
        try:
            res = convert(self.path, out, backend="builtin", input_shapes=dict(input_shapes))
        except InputError as e:
            if "one plan cannot serve" in e.message or "upper bound" in e.message:
                _log.info("%s: %s; lowering each input shape on first use instead", self.path, e.message)
                return False
            raise
        self.source_model, self.path = self.path, Path(res.output)
        self.conversion = "built-in lowering for the shape range (one bundle, CPU emulator)"
        return True

    def _remove_tmpdir(self) -> None:
        d, self._tmpdir = self._tmpdir, None
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------------ API
    def get_inputs(self) -> list["NodeArg"]:
        """The inputs, onnxruntime-style (:class:`NodeArg`), with every TensorMeta field besides."""
        return [NodeArg(m, self._dim_names("input", m)) for m in self.backend.get_inputs()]

    def get_outputs(self) -> list["NodeArg"]:
        return [NodeArg(m, self._dim_names("output", m)) for m in self.backend.get_outputs()]

    def _dim_names(self, kind: str, meta: TensorMeta) -> list[str | None]:
        """The name of each dim as onnxruntime would report it on the model the user gave: the
        ``dim_param`` of the source ``.onnx`` when the session converted one, else the bundle graph's
        (without the names the toolchain invents for unnamed dims), else None (``.om``: unnamed)."""
        if self.source_model is not None:
            if self._declared is None:
                self._declared = _ort_dims(self.source_model)
            names = self._declared[kind].get(meta.name)
            if names is not None and len(names) == len(meta.shape):
                return list(names)
        if isinstance(self._backend, ShapeCache):
            return self._backend.dim_names(kind, meta.name)
        graph = getattr(self._backend, "_graph", None)
        if graph is not None:
            if (kind, meta.name) not in self._graph_dims:
                self._graph_dims[kind, meta.name] = _graph_dim_names(graph.graph, kind, meta.name)
            names = self._graph_dims[kind, meta.name]
            if names is not None and len(names) == len(meta.shape):
                return list(names)
        return [None] * len(meta.shape)

    def get_providers(self) -> list[str]:
        """onnxruntime's name for what runs the model: ``CPUExecutionProvider`` (the emulator runs on
        onnxruntime's CPU provider) or ``CANNExecutionProvider`` (an Ascend device through ACL)."""
        return [BACKEND_PROVIDER[self.backend_name]]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        opts = {"device_id": str(self.device_id)} if self.backend_name == "acl" else {}
        return {BACKEND_PROVIDER[self.backend_name]: opts}

    def get_session_options(self) -> Any:
        """The ``sess_options`` given (None when none were)."""
        return self._sess_options

    def get_modelmeta(self) -> "ModelMetadata":
        """onnxruntime's model metadata: producer, graph name, domain, description, version, custom
        metadata (the model's own ``metadata_props``, plus ``npu_deploy.*`` keys: SoC, precision)."""
        return model_metadata(self.path, self.backend)

    def end_profiling(self) -> str:
        """Write the profile now and stop profiling (onnxruntime's contract); return its path, or ""
        when the session is not profiling (as onnxruntime does). The emulator's profile holds the cost
        model's estimated durations; a device run is profiled by msprof, outside the session."""
        be = self.backend
        if not getattr(be, "profile", False):
            return ""
        with be._lock:
            be.deactivate()  # writes the profile
            path = getattr(be, "profile_path", None)
            be.profile = False
            be.activate()
        self.profile_path = path
        return "" if path is None else str(path)

    def io_binding(self) -> "IOBinding":
        """An onnxruntime-style binding: bind inputs once, run many times (:meth:`run_with_iobinding`)."""
        return IOBinding(self)

    def run_with_iobinding(self, binding: "IOBinding", run_options: Any = None) -> None:
        """Run on the bound inputs; the outputs stay in ``binding`` (``copy_outputs_to_cpu()``)."""
        if binding.session is not self:
            raise InputError("this IOBinding belongs to another session", hint="use sess.io_binding()")
        names = binding._output_names or None
        outs = self.run(names, binding._inputs, run_options)
        binding._outputs = outs

    def gears(self) -> list[dict[str, tuple[int, ...]]]:
        """The model's input gears, ``[{input: shape}, ...]`` (empty for a static model)."""
        return self.backend.gears()

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        """Run once; ``output_names=None`` returns every output in model order. ``run_options`` (an
        ``onnxruntime.RunOptions``) is accepted for onnxruntime's signature; a run that asks to
        ``terminate`` is refused, the other fields do not apply here."""
        if run_options is not None and getattr(run_options, "terminate", False):
            raise InputError("run_options.terminate is set: the run was cancelled before it started")
        if self.ranges:
            check_ranges(self.ranges, self.backend.get_inputs(), feeds, "the model was converted for")
        return self.backend.run(output_names, feeds)

    def run_timed(self, output_names: Sequence[str] | None,
                  feeds: Mapping[str, Any]) -> tuple[list[np.ndarray], Timing]:
        """Like :meth:`run`, also returning the host→device / compute / device→host split."""
        if self.ranges:
            check_ranges(self.ranges, self.backend.get_inputs(), feeds, "the model was converted for")
        return self.backend.run_timed(output_names, feeds)

    def close(self) -> None:
        """Release the model (idempotent). Writes the profile, if one was requested."""
        be, self._backend = self._backend, None
        if be is not None:
            with _open_lock:
                _open_sessions.discard(self)
            try:
                be.deactivate()
                self.profile_path = getattr(be, "profile_path", None) or self.profile_path
            finally:
                self._remove_tmpdir()

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


# ------------------------------------------------------------------ onnxruntime's shapes of things
class DimName(str):
    """A dynamic dimension by its name, as onnxruntime reports it (``"batch_size"``), that still
    compares as ``-1`` with numbers, so code written against TensorMeta's convention keeps working.

    >>> d = DimName("batch")
    >>> d, isinstance(d, str), d == -1, d < 0, int(d)
    ('batch', True, True, True, -1)
    """

    __slots__ = ()

    def __int__(self) -> int:
        return -1

    def _num(self, other):
        return isinstance(other, (int, float, np.integer)) and not isinstance(other, bool)

    def __eq__(self, other):
        return -1 == other if self._num(other) else str.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __lt__(self, other):
        return -1 < other if self._num(other) else str.__lt__(self, other)

    def __le__(self, other):
        return -1 <= other if self._num(other) else str.__le__(self, other)

    def __gt__(self, other):
        return -1 > other if self._num(other) else str.__gt__(self, other)

    def __ge__(self, other):
        return -1 >= other if self._num(other) else str.__ge__(self, other)

    __hash__ = str.__hash__


class NodeArg:
    """An input or output as onnxruntime describes it (``.name``, ``.shape``, ``.type``), carrying the
    :class:`~npu_deploy.runtime.backend.TensorMeta` fields (``dtype``, ``format``, ``device_format``,
    ``device_shape``, ``nbytes``, ``gears``, ``rank``, ``is_dynamic``, ``to_dict()``) besides.
    ``.shape`` is a list, as onnxruntime gives it: a dynamic dim is a :class:`DimName` when the model
    names it (``dim_param``) and ``None`` when it does not (neither ``dim_value`` nor ``dim_param``, or a
    dynamic dim of an ``.om``), exactly as onnxruntime reports it."""

    __slots__ = ("meta", "shape", "type")

    def __init__(self, meta: TensorMeta, names: Sequence[str | int | None] = ()):
        self.meta = meta
        names = list(names) + [None] * (len(meta.shape) - len(names))
        # a dynamic dim: its name, or the size onnxruntime's inference gives it (an int), or None
        self.shape = [d if d >= 0 else (names[k] if isinstance(names[k], int) else
                                        DimName(names[k]) if names[k] else None) for k, d in enumerate(meta.shape)]
        by_dtype = {v: k for k, v in ORT_TYPES.items()}
        self.type = by_dtype.get(np.dtype(meta.dtype).name, f"tensor({np.dtype(meta.dtype).name})")

    @property
    def name(self) -> str:
        return self.meta.name

    def __getattr__(self, key):
        if key == "meta":  # not set yet (copy/pickle protocols probe before __init__)
            raise AttributeError(key)
        return getattr(self.meta, key)

    def __eq__(self, other):
        if isinstance(other, NodeArg):
            return self.meta == other.meta
        return self.meta == other

    __hash__ = None

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={list(self.shape)!r})"


@dataclasses.dataclass(frozen=True)
class ModelMetadata:
    """onnxruntime's ``ModelMetadata`` fields."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict = dataclasses.field(default_factory=dict)


def model_metadata(path: Path, backend: Backend) -> ModelMetadata:
    """The metadata of a bundle (its source model's, kept in the lowered graph) or an ``.om``."""
    custom = {}
    soc = getattr(backend, "soc", None) or getattr(backend, "soc_version", None)
    manifest = getattr(backend, "_manifest", None)
    if isinstance(manifest, dict):
        soc = soc or manifest.get("soc")
        custom["npu_deploy.precision_mode"] = str(manifest.get("precision_mode", ""))
        src = manifest.get("source_model") or {}
        if src.get("name"):
            custom["npu_deploy.source_model"] = str(src["name"])
    if soc:
        custom["npu_deploy.soc"] = str(soc)
    graph = getattr(backend, "_graph", None)
    if graph is not None:
        custom = {**{p.key: p.value for p in graph.metadata_props}, **custom}
        return ModelMetadata(producer_name=graph.producer_name, graph_name=graph.graph.name,
                             domain=graph.domain, description=graph.doc_string,
                             graph_description=graph.graph.doc_string, version=int(graph.model_version),
                             custom_metadata_map=custom)
    try:
        from npu_deploy.converters.files.om import preflight_info

        info = preflight_info(path)
        name = info.model_name
        if info.atc_version:
            custom["npu_deploy.atc_version"] = str(info.atc_version)
        custom.setdefault("npu_deploy.soc", str(info.soc_version or ""))
    except Exception:  # not an .om, or one whose header says little: the fields stay empty
        name = ""
    return ModelMetadata(producer_name="ATC" if name else "", graph_name=name, custom_metadata_map=custom)


class IOBinding:
    """onnxruntime's ``IOBinding`` for this session: ``bind_cpu_input(name, array)``,
    ``bind_output(name)``, ``sess.run_with_iobinding(b)``, ``copy_outputs_to_cpu()``.

    A bound input stays in place between runs: it is copied once, at bind time, as a device copy
    would be, so changing the numpy array afterwards changes nothing until it is bound again. Binding
    to device memory by pointer (``bind_input(..., buffer_ptr)``) and OrtValues are not offered."""

    def __init__(self, session: InferenceSession):
        self.session = session
        self._inputs: dict[str, np.ndarray] = {}
        self._output_names: list[str] = []
        self._outputs: list[np.ndarray] | None = None
        self._in_names = [m.name for m in session.get_inputs()]
        self._out_names = [m.name for m in session.get_outputs()]

    def bind_cpu_input(self, name: str, arr: Any) -> None:
        if name not in self._in_names:
            raise InputError(f"the model has no input {name!r}", hint=f"inputs are {', '.join(self._in_names)}")
        self._inputs[name] = np.array(arr, copy=True, order="C")

    def bind_input(self, name, device_type=None, device_id=None, element_type=None, shape=None,
                   buffer_ptr=None) -> None:
        raise InputError("binding device memory by pointer is not supported",
                         hint="use bind_cpu_input(name, array): the array is copied once and kept")

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type=None,
                    shape=None, buffer_ptr=None) -> None:
        if name not in self._out_names:
            raise InputError(f"the model has no output {name!r}", hint=f"outputs are {', '.join(self._out_names)}")
        if buffer_ptr is not None:
            raise InputError("binding an output to memory by pointer is not supported",
                             hint="bind_output(name) and read copy_outputs_to_cpu()")
        if name not in self._output_names:
            self._output_names.append(name)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        if self._outputs is None:
            raise InputError("no outputs yet", hint="call sess.run_with_iobinding(binding) first")
        return [np.array(o, copy=True) for o in self._outputs]

    get_outputs = copy_outputs_to_cpu

    def clear_binding_inputs(self) -> None:
        self._inputs = {}

    def clear_binding_outputs(self) -> None:
        self._output_names, self._outputs = [], None

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: bound inputs are copied at bind time."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: runs are synchronous."""


# ------------------------------------------------------------------ dynamic shapes: one model per input shape
DEFAULT_SHAPE_CACHE = 8
#: the ``sess_options.add_session_config_entry`` key that sets the shape cache size
SHAPE_CACHE_KEY = "npu_deploy.shape_cache_size"


def _cache_size(size: int | None, sess_options: Any) -> int:
    """The shape cache size: the keyword, else ``sess_options``' config entry :data:`SHAPE_CACHE_KEY`,
    else :data:`DEFAULT_SHAPE_CACHE`."""
    where = "shape_cache_size="
    if size is None and sess_options is not None and hasattr(sess_options, "get_session_config_entry"):
        try:
            entry = sess_options.get_session_config_entry(SHAPE_CACHE_KEY)
        except Exception:  # onnxruntime raises when the key was never set
            entry = ""
        if entry:
            size, where = entry, f"sess_options entry {SHAPE_CACHE_KEY}="
    if size is None:
        return DEFAULT_SHAPE_CACHE
    try:
        n = int(size)
    except (TypeError, ValueError):
        n = 0
    if isinstance(size, bool) or n < 1:
        raise InputError(f"{where}{size!r} must be a whole number >= 1 (input shapes kept converted)")
    return n


class ShapeCache(Backend):
    """An ``.onnx`` with dynamic input dimensions, run as onnxruntime runs it: each new set of input
    shapes is lowered on first use (built-in lowering → bundle on the emulator, or ATC → ``.om``)
    and kept; at most ``size`` shapes stay converted, the least recently used is released first.

    ``ranges`` (``{input: per-dim (low, high) or None}``) bound the dimensions given as ranges at open
    time: a shape outside is refused, naming the input and the range. The first run of a shape says
    once that it converted, and how long it took, on stderr when that is a terminal (and in the
    ``npu_deploy`` log always). :attr:`conversions` counts the conversions made."""

    name = "shape-cache"

    def __init__(self, source: Path, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo],
                 shapes: Mapping[str, tuple[int, ...]], ranges: Mapping[str, Sequence[DimRange | None]],
                 workdir: Path, size: int, *, use_atc: bool = False, device_id: int = 0,
                 session_options: Any = None):
        super().__init__()
        self.source, self.workdir, self.size = Path(source), Path(workdir), int(size)
        self.use_atc, self.device_id, self._sess_options = use_atc, device_id, session_options
        self.ranges = {n: tuple(r) for n, r in ranges.items()}
        unknown = [n for n in shapes if n not in {i.name for i in inputs}]
        if unknown:
            raise InputError(f"input_shapes names {', '.join(map(repr, unknown))}, not inputs of {self.source.name}",
                             hint=f"its inputs are {', '.join(i.name for i in inputs)}")
        self._names = {"input": {i.name: i.dim_names for i in inputs},
                       "output": {o.name: o.dim_names for o in outputs}}
        self._inputs = [TensorMeta(i.name, shapes[i.name], i.dtype, _plain_format(len(shapes[i.name])))
                        for i in inputs]
        self._outputs = [TensorMeta(o.name, o.shape, o.dtype, _plain_format(len(o.shape))) for o in outputs]
        self._cache: "collections.OrderedDict[tuple, Backend]" = collections.OrderedDict()
        self.conversions = 0

    def get_inputs(self) -> list[TensorMeta]:
        return list(self._inputs)

    def get_outputs(self) -> list[TensorMeta]:
        return list(self._outputs)

    def dim_names(self, kind: str, name: str) -> list[str | None]:
        return list(self._names[kind].get(name, ()))

    def cached_shapes(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes converted and kept, least recently used first."""
        return [dict(k) for k in self._cache]

    def _deactivate(self) -> None:
        while self._cache:
            _, be = self._cache.popitem(last=False)
            with contextlib.suppress(Exception):
                be.deactivate()

    def _backend_for(self, key: tuple) -> Backend:
        be = self._cache.get(key)
        if be is not None:
            self._cache.move_to_end(key)
            return be
        shapes = dict(key)
        be = self._convert(shapes)
        self._cache[key] = be
        while len(self._cache) > self.size:
            _, old = self._cache.popitem(last=False)
            old.deactivate()
            for f in getattr(old, "_files", ()):
                with contextlib.suppress(OSError):
                    os.unlink(f)
        return be

    def _convert(self, shapes: dict[str, tuple[int, ...]]) -> Backend:
        from npu_deploy.converters.lowering.convert import convert

        self.conversions += 1
        tag = "_".join("x".join(map(str, s)) for s in shapes.values())
        out = self.workdir / f"{self.source.stem}-{self.conversions}-{tag}{'.om' if self.use_atc else '.bundle'}"
        t0 = time.perf_counter()
        res = convert(self.source, out, backend="atc" if self.use_atc else "builtin", input_shapes=shapes)
        seconds = time.perf_counter() - t0
        if self.use_atc:
            from npu_deploy.runtime.acl import AclBackend  # vendor-backed: imported only where ACL runs

            be: Backend = AclBackend(res.output, device_id=self.device_id)
        else:
            from npu_deploy.runtime.emulator import EmulatorBackend  # heavy (onnxruntime): on first use

            be = EmulatorBackend(res.output, session_options=_ort_options(self._sess_options))
        be._files = (res.output,)
        be.activate()
        shown = "; ".join(f"{n}:{','.join(map(str, s))}" for n, s in shapes.items())
        line = (f"npu-deploy: {self.source.name}: new input shape {shown}: converted in {seconds:.1f} s "
                f"(kept; up to {self.size} shapes)")
        _log.info("%s", line)
        if getattr(sys.stderr, "isatty", lambda: False)():
            print(line, file=sys.stderr, flush=True)
        return be

    def _run_validated(self, output_names: list[str], feeds: dict[str, np.ndarray], *,
                       gear: Gear | None) -> list[np.ndarray]:
        check_ranges(self.ranges, self._inputs, feeds, "the session was opened with")
        key = tuple((m.name, tuple(feeds[m.name].shape)) for m in self._inputs)
        be = self._backend_for(key)
        outs, t = be.run_timed(output_names, feeds)
        for phase in ("h2d", "compute", "d2h"):
            self._report_phase(phase, getattr(t, phase))
        return outs


def _bundle_ranges(backend: Backend) -> dict[str, tuple]:
    manifest = getattr(backend, "_manifest", None)
    dynamic = manifest.get("dynamic") if isinstance(manifest, dict) else None
    ranges = dynamic.get("ranges") if isinstance(dynamic, dict) and dynamic.get("mode") == "range" else None
    if not isinstance(ranges, dict):
        return {}
    return {str(n): tuple(tuple(int(v) for v in r) if isinstance(r, list) else None for r in rng)
            for n, rng in ranges.items() if isinstance(rng, list)}


_UNK_DIM = re.compile(r"unk__\d+")
MAX_RANK = 32     # the axes whose lowering-made names (<input>_dim<axis>) are recognised


def _invented_dim_name(name: str) -> bool:
    """True for no name, or onnx shape inference's ``unk__<n>`` for a dim it could not name. (A bundle
    also carries the lowering's ``<input>_dim<axis>`` for a dim the model left unnamed,
    ``onnx_model._set_shape``; :meth:`InferenceSession._dim_names` drops those too.) onnxruntime reports
    such a dim of the original model as None."""
    return not name or _UNK_DIM.fullmatch(name) is not None


def _graph_dim_names(graph, kind: str, name: str) -> list[str | None] | None:
    """The dim names of graph input/output ``name`` without the ones the toolchain invents (None: not
    a tensor of the graph)."""
    for vi in (graph.input if kind == "input" else graph.output):
        if vi.name == name and vi.type.HasField("tensor_type"):
            invented = {f"{i.name}_dim{k}" for i in graph.input for k in range(MAX_RANK)}
            return [None if _invented_dim_name(d.dim_param) or d.dim_param in invented else d.dim_param
                    for d in vi.type.tensor_type.shape.dim]
    return None


def _ort_dims(path: str | os.PathLike) -> dict[str, dict[str, list]]:
    """Per graph input / output of the ``.onnx`` at ``path``, what onnxruntime's ``NodeArg.shape``
    holds on each dynamic dim: inputs as declared (``dim_param`` or None); outputs as onnxruntime merges
    the declaration with its type inference: an inferred size wins, else the declared ``dim_param``,
    else an inferred name (not ``unk__<n>``), else None."""
    import onnx  # vendor import, lazy as the module's others

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:   # the model was readable when the session opened; nothing to add now
        return {"input": {}, "output": {}}
    inits = {t.name for t in model.graph.initializer}

    def declared(vi) -> list:
        dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else []
        return [None if d.HasField("dim_value") else (d.dim_param or None) for d in dims]

    out: dict[str, dict[str, list]] = {
        "input": {vi.name: declared(vi) for vi in model.graph.input if vi.name not in inits},
        "output": {vi.name: declared(vi) for vi in model.graph.output}}
    dynamic = [vi.name for vi in model.graph.output if vi.type.tensor_type.HasField("shape") and any(
        not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)]
    if not dynamic:
        return out
    for vi in model.graph.output:        # infer the outputs from the graph alone, not the declaration
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
    for t in model.graph.initializer:    # inference reads shapes, and the values of small (shape) tensors
        if t.HasField("raw_data") and len(t.raw_data) > 4096:
            t.ClearField("raw_data")
    try:
        inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.output}
    except Exception:  # onnx cannot infer this graph: the declaration alone
        return out
    for name in dynamic:
        vi, names = inferred.get(name), out["output"][name]
        if vi is None or not vi.type.tensor_type.HasField("shape") or len(vi.type.tensor_type.shape.dim) != len(names):
            continue
        out["output"][name] = [
            int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0
            else n if n else (None if _invented_dim_name(d.dim_param) else d.dim_param)
            for d, n in zip(vi.type.tensor_type.shape.dim, names)]
    return out


def _plain_format(rank: int) -> str:
    return {4: "NCHW", 5: "NCDHW"}.get(rank, "ND")


# ------------------------------------------------------------------ providers and options
def _resolve_providers(providers, provider_options, backend: str, device_id: int, kind: str) -> tuple[str, int]:
    """The backend (and device) onnxruntime-style ``providers`` ask for: the first one that can run
    ``kind``; an unknown name, or a list none of whose entries can, is refused."""
    if providers is None:
        if provider_options is not None:
            raise InputError("provider_options= needs providers=", hint="give both, one options dict per provider")
        return backend, device_id
    entries = []
    for k, p in enumerate(providers):
        name, opts = (p[0], dict(p[1] or {})) if isinstance(p, (tuple, list)) else (str(p), {})
        if provider_options is not None and k < len(provider_options):
            opts.update(provider_options[k] or {})
        if name not in PROVIDERS:
            raise InputError(f"execution provider {name!r} is not available here",
                             hint=f"use {' or '.join(PROVIDERS)} (CPU: the emulator; CANN: an Ascend device)")
        entries.append((name, opts))
    runs = {"bundle": ("emulator",), "om": ("acl",), "onnx": ("emulator", "acl")}[kind]
    if kind == "onnx" and not _device_path_available():  # as onnxruntime skips a provider it lacks
        runs = ("emulator",)
    for name, opts in entries:
        be = PROVIDERS[name]
        if be not in runs:
            continue
        if backend not in ("auto", be):
            raise InputError(f"providers=[{name!r}, ...] asks for the {be} backend, backend={backend!r} for another",
                             hint="give one of the two")
        if "device_id" in opts:
            try:
                device_id = int(opts["device_id"])
            except (TypeError, ValueError):
                raise InputError(f"{name} option device_id={opts['device_id']!r} is not a device number") from None
        return be, device_id
    asked = ", ".join(n for n, _ in entries) or "none"
    raise InputError(f"none of the execution providers asked for ({asked}) can run this {kind} model",
                     hint="a bundle runs on CPUExecutionProvider (the emulator), an .om on CANNExecutionProvider")


def _ort_options(sess_options):
    """``sess_options`` for the emulator's onnxruntime: an ``onnxruntime.SessionOptions`` as it is;
    any other object's ``intra_op_num_threads`` / ``inter_op_num_threads`` copied into a new one."""
    if sess_options is None:
        return None
    import onnxruntime as ort

    if isinstance(sess_options, ort.SessionOptions):
        return sess_options
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    known = ("intra_op_num_threads", "inter_op_num_threads")
    for k in known:
        v = getattr(sess_options, k, None)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InputError(f"sess_options.{k}={v!r} must be a whole number >= 0 (0: onnxruntime's default)")
            setattr(opts, k, v)
    return opts


def _refuse_device_options(sess_options) -> None:
    if sess_options is None:
        return
    for k in ("intra_op_num_threads", "inter_op_num_threads"):
        if getattr(sess_options, k, 0):
            raise InputError(f"sess_options.{k} sets CPU threads, which do not apply to a model running on "
                             f"an Ascend device", hint="drop it, or run a bundle on the CPU emulator")
    if getattr(sess_options, "enable_profiling", False):
        raise InputError("sess_options.enable_profiling: a device run is profiled by msprof",
                         hint="run under 'msprof --output=DIR python ...', then 'npu-deploy profile DIR'")


def _device_path_available() -> bool:
    """ATC to compile and pyACL / acllite to run: what an ``.onnx`` needs to go to a device."""
    import importlib.util

    from npu_deploy.converters.lowering.atc import find_atc

    return find_atc() is not None and any(importlib.util.find_spec(m) is not None for m in ("acl", "acllite"))
