"""The ACL backend: run an ATC ``.om`` on an Ascend device through acllite or pyACL.

Verified against the documented pyACL / acllite contracts only (``reference/atc-acl-om.md`` §3–§4),
with the strict stand-ins in ``tests/standins/``; no real device was available to the authors.

What it does, in order (:meth:`AclBackend.activate`):

1. **Preflight, before touching a device**: the file is read with
   :func:`npu_deploy.converters.files.om.preflight_info` (SoC, dynamic mode, gears, I/O). A requested
   ``dynamic_batch`` / ``dynamic_dims`` the model was not built for is an error naming the model's gears.
2. pyACL is imported lazily (:func:`npu_deploy.runtime.device.load_acl`; missing → ``DependencyError``,
   exit 3), ACL is initialised once per process, and the device's SoC (``acl.get_soc_name``) is
   compared with the model's *before* ``load_from_file``; a mismatch names both.
3. The device and its context come from the process-wide helper :mod:`npu_deploy.runtime.device`
   (reference counted, torn down at exit); a stream, the model, its description, and one device buffer
   per input and output (sized by ``get_input_size_by_index`` — the largest gear) are made once and
   reused by every run.
4. :meth:`run` (validation by the base class, then): each host array is laid out in the model's device
   format (``formats.pack``, e.g. NCHW → NC1HWC0 with C0 read from the model's dims), copied H2D, the
   gear set at the ``ascend_mbatch_shape_data`` index, the model executed, each requested output
   copied D2H with its current dims and unpacked to the host format.
   Gear models: the base class picks the gear from the feeds; it is set with
   ``set_dynamic_batch_size`` / ``set_dynamic_hw_size`` / ``set_input_dynamic_dims`` (§3.6).
   Shape-range (dynamic shape, ``atc --input_shape "x:1~4,3,224,224"``) models, pyACL only (acllite has
   no API for them): the ranges come from ``acl.mdl.get_input_dims_range`` (aclmdlGetInputDimsRange;
   older pyACL without it: the ``shape_range`` the ``.om`` records, see
   :data:`npu_deploy.converters.files.om.SHAPE_RANGE_ATTR`) and are :attr:`AclBackend.ranges`; a feed
   outside them is refused (``InputError``, exit 2, naming the input and the range). Input buffers
   are sized for the largest shape of the range (an unbounded dim: for the largest feed so far, grown
   with ``acl.update_data_buffer``), output buffers by ``get_output_size_by_index`` or, when that is 0
   as for a dynamic output, by the output's recorded range (else ``output_bytes=``, ais_bench's
   ``custom_sizes``). Each run creates one tensor desc per input (``acl.create_tensor_desc`` with its
   dtype, actual dims and format), sets it with ``acl.mdl.set_dataset_tensor_desc``, executes, destroys
   the descs, and reads each output's actual dims from ``acl.mdl.get_dataset_tensor_desc`` of the
   output dataset (``get_tensor_desc_num_dims`` / ``get_tensor_desc_dim_v2``; that desc belongs to the
   dataset). pyACL's "Dynamic Shape Input (Setting the Shape Range)" guide, reference §3.6.

Every non-zero return code raises :class:`~npu_deploy.errors.AclError` naming the call, the code and
its meaning (:mod:`npu_deploy.runtime.acl_codes`). Resources are released in the documented order —
buffers, datasets, model, desc, stream, then (last user of the device) context and device, and at
interpreter exit ``acl.finalize`` — on :meth:`deactivate`, when activation fails half-way, and at exit.
ACL stays initialised between sessions (pyACL allows one init/finalize per process).

acllite: with ``api="auto"`` the backend uses ``acllite_model.AclLiteModel`` for loading and executing
when the acllite folder is importable (flat modules on ``PYTHONPATH``) and the model is static or
dynamic-batch (acllite has no API for the other gears), else pyACL directly. Device
initialisation always goes through :mod:`~npu_deploy.runtime.device` (acllite's ``AclLiteResource``
would call ``acl.init`` a second time and tear down at garbage collection); input buffers are ours,
passed to acllite as ``{"data": ptr, "size": n}`` so they are freed (acllite leaks its own).

Thread safety: a backend may be shared between threads; runs are serialised by the base class's lock
and each run makes the device context current in the calling thread for the run only
(:func:`npu_deploy.runtime.device.using`): a thread that had its own ACL context is on it again
afterwards, also after the last :meth:`deactivate`. For parallel runs use one backend (session) per
thread.

>>> from npu_deploy.runtime.acl import AclBackend            # doctest: +SKIP
>>> with AclBackend("resnet50.om", device_id=0) as b:        # doctest: +SKIP
...     (prob,) = b.run(None, {"x": np.zeros((1, 3, 224, 224), np.float32)})
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from npu_deploy.errors import AclError, DependencyError, InputError, InternalError, OmError
from npu_deploy.runtime import device
from npu_deploy.runtime.acl_codes import check, error_for
from npu_deploy.runtime.backend import Backend, Gear, TensorMeta, check_ranges
from npu_deploy._io import atomic_write, make_output_folder
from npu_deploy.converters import formats
from npu_deploy.converters.files.om import preflight_info
from npu_deploy.converters.formats import dtype_to_acl, get_format

MBATCH_NAME = "ascend_mbatch_shape_data"
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_DEVICE = 0      # aclrtRunMode: the app runs on the device's own CPU (e.g. Atlas 200 DK)
APIS = ("auto", "pyacl", "acllite")


@dataclasses.dataclass
class _Tensor:
    """One model input/output as loaded: the user's view (``meta``) and the device's."""

    meta: TensorMeta
    index: int                      # index in the model (acl.mdl)
    device_dims: tuple[int, ...]    # as acl.mdl.get_*_dims reports (-1 on dynamic axes)
    size: int                       # device buffer bytes (largest gear)
    dtype: np.dtype
    pack_format: str | None         # blocked device format to pack/unpack, None = copy as is
    c0: int | None = None
    ptr: int = 0                    # device pointer (ours)
    buf: int = 0                    # acl data buffer handle
    acl_dtype: int = 0              # aclDataType and aclFormat, for the tensor desc of a shape-range run
    acl_format: int = 2
    range: tuple[tuple[int, int], ...] | None = None   # shape-range models: per dim (low, high), high -1 open


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join("?" if d < 0 else str(d) for d in shape) + ")"


def _logical_from_storage(fmt: str, dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """Best logical shape from storage dims when the model does not record its origin shape: the
    channel (NC1HWC0) or the two matrix axes (FRACTAL_NZ) are taken padded to whole blocks."""
    if fmt in ("NC1HWC0", "NC1HWC0_C04") and len(dims) == 5:
        n, c1, h, w, c0 = dims
        return (n, c1 * c0 if c1 >= 0 else -1, h, w)
    if fmt.startswith("FRACTAL_NZ") and len(dims) >= 4:
        *batch, n1, m1, m0, n0 = dims
        return (*batch, m1 * m0, n1 * n0)
    return None


def _acllite_error(call: str, e: Exception) -> AclError:
    """acllite raises ``Exception("<api> failed ret_int=<n>")``; recover the call and code."""
    m = re.search(r"(\S+)\s+failed\s+ret_int=(-?\d+)", str(e))
    if m:
        return error_for(m.group(1), int(m.group(2)), context=f"via acllite {call}")
    return AclError(f"acllite {call} failed: {e}", call=call, hint="see the acllite log and the CANN plog")


class AclBackend(Backend):
    """Run an ``.om`` on device ``device_id`` (see the module docstring).

    ``dynamic_batch`` / ``dynamic_dims``: the batch size / dims gear the caller intends to use; checked
    against the model before loading. ``api``: ``"auto"`` (acllite when importable, else pyACL),
    ``"pyacl"`` or ``"acllite"``. ``output_bytes``: device bytes to reserve per output of a shape-range
    model whose output size neither ACL nor the ``.om`` gives (ais_bench's ``custom_sizes``).

    >>> b = AclBackend("yolov3_dynamic_batch.om", dynamic_batch=4)   # doctest: +SKIP
    >>> b.activate()                                                  # doctest: +SKIP
    """

    name = "acl"

    def __init__(self, path: str | os.PathLike, device_id: int = 0, *, dynamic_batch: int | None = None,
                 dynamic_dims: Sequence[int] | None = None, api: str | None = None,
                 output_bytes: Mapping[str, int] | None = None):
        super().__init__()
        api = api or "auto"
        if api not in APIS:
            raise InputError(f"unknown ACL api {api!r}", hint=f"use one of {', '.join(APIS)}")
        self.path = Path(path)
        self.device_id = int(device_id)
        self.dynamic_batch = dynamic_batch
        self.dynamic_dims = list(dynamic_dims) if dynamic_dims is not None else None
        self.api = api
        self.output_bytes = {str(k): int(v) for k, v in (output_bytes or {}).items()}
        #: shape-range models: ``{input: per-dim (low, high) or None for a fixed dim}`` (high -1: unbounded)
        self.ranges: dict[str, tuple] = {}
        self.api_used: str | None = None
        self.preflight: Any = None
        self.soc_name: str | None = None
        self._acl: Any = None
        self._acquired = False
        self._stream = 0
        self._model_id: int | None = None
        self._desc = 0
        self._in_ds = 0
        self._out_ds = 0
        self._inputs: list[_Tensor] = []
        self._outputs: list[_Tensor] = []
        self._mbatch: _Tensor | None = None
        self._dynamic: str | None = None
        self._lite: Any = None
        self._h2d, self._d2h = ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST

    def __repr__(self) -> str:
        return f"AclBackend({str(self.path)!r}, device_id={self.device_id})"

    # ------------------------------------------------------------------ metadata
    def get_inputs(self) -> list[TensorMeta]:
        return [t.meta for t in self._inputs]

    def get_outputs(self) -> list[TensorMeta]:
        return [t.meta for t in self._outputs]

    # ------------------------------------------------------------------ preflight
    def _preflight(self) -> None:
        if not self.path.is_file():
            raise InputError(f"model file {self.path} does not exist", hint="check the path")

        pf = preflight_info(self.path)
        self.preflight = pf
        if pf.encrypted:
            raise OmError(f"{self.path}: encrypted .om models are not supported",
                          hint="convert the model without encryption")
        mode = pf.dynamic_mode
        if self.dynamic_batch is not None:
            if mode != "batch":
                raise InputError(
                    f"{self.path} was built without dynamic batch (dynamic mode: {mode or 'static'}), so "
                    f"batch {self.dynamic_batch} cannot be set",
                    hint="rebuild with atc --input_shape=...-1... --dynamic_batch_size=\"1,2,4,8\"")
            if self.dynamic_batch not in pf.batch_gears:
                raise InputError(f"batch {self.dynamic_batch} is not a gear of {self.path}; its batch gears "
                                 f"are {pf.batch_gears}",
                                 hint="use one of those, or rebuild with the batch sizes you need")
        if self.dynamic_dims is not None:
            if mode != "dims":
                raise InputError(
                    f"{self.path} was built without dynamic dims (dynamic mode: {mode or 'static'}), so "
                    f"dims {self.dynamic_dims} cannot be set",
                    hint="rebuild with atc --input_format=ND --dynamic_dims=\"...\"")
            if self.dynamic_dims not in [list(g) for g in pf.dims_gears]:
                raise InputError(f"dims {self.dynamic_dims} are not a gear of {self.path}; its dims gears "
                                 f"are {pf.dims_gears}",
                                 hint="use one of those, or rebuild with the dims you need")

    def _check_soc(self, acl: Any) -> None:
        want = self.preflight.soc_version
        get = getattr(acl, "get_soc_name", None)       # absent from very old pyACL: then no check
        have = get() if get is not None else None
        self.soc_name = have
        if want and have and want.lower() != have.lower():
            raise OmError(f"{self.path} was built for {want} but device {self.device_id} is {have}",
                          hint=f"rebuild it: atc ... --soc_version={have}")

    # ------------------------------------------------------------------ life cycle
    def _activate(self) -> None:
        self._inputs, self._outputs, self._mbatch, self.ranges = [], [], None, {}
        self._preflight()
        acl = device.load_acl()
        self._acl = acl
        device.ensure_initialized()
        self._check_soc(acl)
        device.acquire(self.device_id)
        self._acquired = True
        device.register(self)
        with device.using(self.device_id):
            self._activate_on_device(acl)

    def _activate_on_device(self, acl: Any) -> None:
        stream, ret = acl.rt.create_stream()
        check("acl.rt.create_stream", ret)
        self._stream = stream
        run_mode, ret = acl.rt.get_run_mode()
        check("acl.rt.get_run_mode", ret)
        # in ACL_DEVICE run mode the app's own memory is device memory: copies are device to device
        self._h2d, self._d2h = ((ACL_MEMCPY_DEVICE_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_DEVICE) if run_mode == ACL_DEVICE
                                else (ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST))
        lite = None
        if self.api == "acllite" and self.preflight.dynamic_mode not in (None, "batch"):
            raise InputError(f"{self.path}: acllite has no API for dynamic {self.preflight.dynamic_mode} models",
                             hint="use api='pyacl' (or 'auto')")
        if self.api in ("auto", "acllite") and self.preflight.dynamic_mode in (None, "batch"):
            lite = self._acllite_module()
        if lite is not None:
            self._load_acllite(lite)
        else:
            self._load_pyacl()
        self._alloc_inputs()

    def _acllite_module(self) -> Any:
        try:
            return importlib.import_module("acllite_model")
        except ImportError as e:
            if self.api == "acllite":
                raise DependencyError(
                    f"acllite is not importable ({e})",
                    hint="copy Ascend/samples python/common/acllite and put that folder itself on "
                         "PYTHONPATH, or use api='pyacl'") from e
            return None

    def _deactivate(self) -> None:
        acl = self._acl
        if acl is None:
            return
        errors: list[Exception] = []

        def step(call: str, ret: Any) -> None:
            if ret != 0:
                errors.append(error_for(call, ret, context=str(self.path)))

        try:
            with contextlib.ExitStack() as stack:
                if self._acquired:
                    try:
                        stack.enter_context(device.using(self.device_id))
                    except Exception as e:
                        errors.append(e)
                self._release_on_device(step, errors)
        except Exception as e:  # putting the caller's context back failed: still release the device
            errors.append(e)
        device.unregister(self)
        if self._acquired:
            self._acquired = False
            try:
                device.release(self.device_id)
            except Exception as e:
                errors.append(e)
        self._mbatch = None
        if errors:
            raise errors[0]

    def _release_on_device(self, step, errors: list[Exception]) -> None:
        """Free buffers, datasets, the model, its desc and the stream (our context is current)."""
        acl = self._acl
        for ds_attr, tensors in (("_in_ds", self._inputs + ([self._mbatch] if self._mbatch else [])),
                                 ("_out_ds", self._outputs)):
            for t in tensors:
                if t.ptr:
                    step("acl.rt.free", acl.rt.free(t.ptr))
                    t.ptr = 0
                if t.buf:
                    step("acl.destroy_data_buffer", acl.destroy_data_buffer(t.buf))
                    t.buf = 0
            ds = getattr(self, ds_attr)
            if ds:
                step("acl.mdl.destroy_dataset", acl.mdl.destroy_dataset(ds))
                setattr(self, ds_attr, 0)
        if self._lite is not None:
            try:
                self._lite.destroy()
            except Exception as e:
                errors.append(_acllite_error("AclLiteModel.destroy", e))
            self._lite = None
        if self._model_id is not None:
            step("acl.mdl.unload", acl.mdl.unload(self._model_id))
            self._model_id = None
        if self._desc:
            step("acl.mdl.destroy_desc", acl.mdl.destroy_desc(self._desc))
            self._desc = 0
        if self._stream:
            step("acl.rt.destroy_stream", acl.rt.destroy_stream(self._stream))
            self._stream = 0

    # ------------------------------------------------------------------ loading: pyACL
    def _load_pyacl(self) -> None:
        acl = self._acl
        self.api_used = "pyacl"
        model_id, ret = acl.mdl.load_from_file(str(self.path))
        check("acl.mdl.load_from_file", ret, context=str(self.path))
        self._model_id = model_id
        desc = acl.mdl.create_desc()
        if not desc:
            raise AclError("acl.mdl.create_desc returned NULL", call="acl.mdl.create_desc")
        self._desc = desc
        check("acl.mdl.get_desc", acl.mdl.get_desc(desc, model_id), context=str(self.path))
        n_in, n_out = acl.mdl.get_num_inputs(desc), acl.mdl.get_num_outputs(desc)
        mbatch_index = None
        if self.preflight.dynamic_mode is not None:
            idx, ret = acl.mdl.get_input_index_by_name(desc, MBATCH_NAME)
            if ret == 0:
                mbatch_index = idx
        origin = {t.name: t for t in self.preflight.inputs}
        for i in range(n_in):
            name = acl.mdl.get_input_name_by_index(desc, i)
            dims, ret = acl.mdl.get_input_dims(desc, i)
            check("acl.mdl.get_input_dims", ret, context=f"{self.path} input {i}")
            t = self._describe(name, i, tuple(dims["dims"]), acl.mdl.get_input_data_type(desc, i),
                               acl.mdl.get_input_format(desc, i), acl.mdl.get_input_size_by_index(desc, i),
                               origin.get(name), is_input=True)
            if i == mbatch_index or name == MBATCH_NAME:
                self._mbatch = t
            else:
                self._inputs.append(t)
        origin = {t.name: t for t in self.preflight.outputs}
        for j in range(n_out):
            name = acl.mdl.get_output_name_by_index(desc, j)
            dims, ret = acl.mdl.get_output_dims(desc, j)
            check("acl.mdl.get_output_dims", ret, context=f"{self.path} output {j}")
            self._outputs.append(self._describe(
                name, j, tuple(dims["dims"]), acl.mdl.get_output_data_type(desc, j),
                acl.mdl.get_output_format(desc, j), acl.mdl.get_output_size_by_index(desc, j),
                origin.get(name), is_input=False))
        if self.preflight.dynamic_mode == "shape":
            self._setup_ranges(desc)
        else:
            self._setup_dynamic()
            self._check_sizes()
        # output buffers: allocated once, reused by every run
        self._out_ds = self._new_dataset()
        for t in self._outputs:
            self._alloc(t, self._out_ds)

    def _setup_ranges(self, desc: int) -> None:
        """A shape-range model: each input's per-dim range and buffer size, each output's buffer size."""
        acl, pf = self._acl, self.preflight
        self._dynamic = "shape"
        recorded = {t.name: t for t in pf.inputs}
        get_range = getattr(acl.mdl, "get_input_dims_range", None)  # aclmdlGetInputDimsRange: newer pyACL only
        for t in self._inputs:
            rank = len(t.device_dims)
            rng = None
            if get_range is not None:
                d, ret = get_range(desc, t.index)
                check("acl.mdl.get_input_dims_range", ret, context=f"{self.path} input {t.meta.name!r}")
                rows = d.get("range") if isinstance(d, dict) else None
                # rangeCount 0: not supported for this model ("rank data configured"): use the .om's
                if isinstance(rows, list) and len(rows) == rank and d.get("rangeCount") == rank and all(
                        isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(v, int) for v in r)
                        and 0 <= r[0] and (r[1] == -1 or r[0] <= r[1]) for r in rows):
                    rng = tuple((int(lo), int(hi)) for lo, hi in rows)
            if rng is None:
                om_t = recorded.get(t.meta.name)
                if om_t is not None and om_t.shape_range and len(om_t.shape_range) == rank:
                    rng = tuple(om_t.shape_range)
            if rng is None:       # -1 and no range recorded anywhere: unbounded, as ATC reads a bare -1
                rng = tuple((d, d) if d >= 0 else (1, -1) for d in t.device_dims)
            t.range = rng
            if any(lo != hi for lo, hi in rng) and t.pack_format is None:
                self.ranges[t.meta.name] = tuple(None if lo == hi else (lo, hi) for lo, hi in rng)
            if all(hi >= 0 for _, hi in rng):
                t.size = max(t.size, self._device_nbytes(t, [hi for _, hi in rng]))
            t.meta = dataclasses.replace(t.meta, nbytes=t.size)
        om_out = {o.name: o for o in pf.outputs}
        for t in self._outputs:
            need = 0
            if not any(d < 0 for d in t.device_dims):
                need = self._device_nbytes(t, t.device_dims)
            else:
                o = om_out.get(t.meta.name)
                r = o.shape_range if o is not None else None
                if r and len(r) == len(t.device_dims) and all(hi >= 0 for _, hi in r):
                    need = self._device_nbytes(t, [hi for _, hi in r])
            need = max(need, self.output_bytes.get(t.meta.name, 0))
            if t.size <= 0 and need <= 0:
                raise OmError(f"{self.path}: output {t.meta.name!r} {_fmt_shape(t.device_dims)} has dynamic dims and "
                              f"neither ACL (get_output_size_by_index is 0) nor the .om gives its largest size",
                              hint=f"pass AclBackend(..., output_bytes={{{t.meta.name!r}: N}}) with N device bytes "
                                   f"(ais_bench's custom_sizes)")
            t.size = max(t.size, need)
            t.meta = dataclasses.replace(t.meta, nbytes=t.size)

    def _check_ranges(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Refuse a feed outside a shape-range model's range, naming the input and the range (exit 2)."""
        check_ranges(self.ranges, self.get_inputs(), feeds, "the model was converted for")

    # ------------------------------------------------------------------ loading: acllite
    def _load_acllite(self, lite: Any) -> None:
        self.api_used = "acllite"
        try:
            self._lite = lite.AclLiteModel(str(self.path))
        except Exception as e:
            raise _acllite_error("AclLiteModel", e) from e

        pf = self.preflight

        def from_om(t: Any, k: int, is_input: bool) -> _Tensor:
            dt = t.np_dtype
            if dt is None:
                raise OmError(f"{self.path}: {t.name!r} has dtype {t.dtype}, which numpy cannot hold")
            try:
                acl_fmt = get_format(t.format.split("[")[0]).acl
            except Exception:
                acl_fmt = None
            dims = tuple(t.shape)
            return self._describe(t.name, k, dims, dtype_to_acl(dt), acl_fmt, t.size, t, is_input=is_input)

        for k, t in enumerate(pf.inputs):
            tensor = from_om(t, k, True)
            if t.name == MBATCH_NAME:
                self._mbatch = tensor
            else:
                self._inputs.append(tensor)
        self._outputs = [from_om(t, k, False) for k, t in enumerate(pf.outputs)]
        self._setup_dynamic()
        self._check_sizes()

    # ------------------------------------------------------------------ description
    def _describe(self, name: str, index: int, dims: tuple[int, ...], acl_dtype: int, acl_format: int | None,
                  size: int, om_tensor: Any, *, is_input: bool) -> _Tensor:
        what = f"{self.path}: {'input' if is_input else 'output'} {name!r}"
        try:
            dtype = formats.acl_to_dtype(acl_dtype)
        except Exception as e:
            raise OmError(f"{what} has ACL data type {acl_dtype}, which has no numpy equivalent",
                          hint="rebuild with atc --output_type / a supported input dtype") from e
        try:
            fmt = formats.get_format(acl_format).name if acl_format is not None and acl_format >= 0 else "ND"
        except Exception:
            fmt = "ND"
        pack_format = None
        host_format = fmt
        shape = dims
        c0 = None
        f = formats.get_format(fmt)
        if f.blocked and name != MBATCH_NAME:
            pack_format = fmt
            c0 = dims[-1] if dims and dims[-1] > 0 else None
            origin_fmt = getattr(om_tensor, "origin_format", None) if om_tensor is not None else None
            host_format = formats.origin_of(fmt, origin_fmt if origin_fmt in ("NCHW", "NHWC", "ND",
                                                                             "NCDHW", "NDHWC") else None)
            oshape = getattr(om_tensor, "origin_shape", None) if om_tensor is not None else None
            if oshape:
                shape = tuple(oshape)
                if dims and dims[0] < 0 and shape and shape[0] > 0:
                    shape = (-1, *shape[1:])
            else:
                derived = _logical_from_storage(fmt, dims)
                if derived is None:
                    # not a layout we can convert without the origin shape: hand over the device layout
                    pack_format, host_format = None, fmt
                else:
                    shape = derived
        t = _Tensor(TensorMeta(name, shape, dtype, format=host_format, device_format=fmt,
                               device_shape=dims, nbytes=size), index, dims, size, dtype, pack_format, c0,
                    acl_dtype=int(acl_dtype), acl_format=int(acl_format) if acl_format is not None and acl_format >= 0
                    else 2)
        return t

    def _device_nbytes(self, t: _Tensor, dims: Sequence[int]) -> int:
        return math.prod(dims) * t.dtype.itemsize

    def _check_sizes(self) -> None:
        for kind, tensors in (("input", self._inputs), ("output", self._outputs)):
            for t in tensors:
                self._check_size(t, f"{self.path}: {kind} {t.meta.name!r}", kind)

    def _check_size(self, t: _Tensor, what: str, kind: str) -> None:
        gear_max = self._max_dims(t)
        need = self._device_nbytes(t, gear_max)
        if t.size < need:
            raise OmError(
                f"{what}: the model reports a {t.size}-byte device buffer (acl.mdl.get_{kind}_size_by_index) "
                f"but "
                f"{t.meta.device_format} {_fmt_shape(gear_max)} {t.dtype.name} needs {need} bytes",
                hint="the .om description is inconsistent; rebuild it with ATC")

    def _device_dims(self, t: _Tensor, logical: Sequence[int]) -> tuple[int, ...]:
        """Device dims of ``t`` for a concrete logical shape."""
        if t.pack_format is None:
            return tuple(logical)

        return formats.storage_shape(t.pack_format, logical, t.dtype, c0=t.c0, origin=t.meta.format)

    def _max_dims(self, t: _Tensor) -> tuple[int, ...]:
        """Device dims at the largest gear (what the device buffer must hold)."""
        if t.meta.gears:
            return max((self._device_dims(t, g) for g in t.meta.gears), key=math.prod)
        if any(d < 0 for d in t.device_dims):
            pf = self.preflight
            if pf.dynamic_mode == "batch" and pf.batch_gears and t.device_dims[0] < 0:
                return (max(pf.batch_gears), *[max(d, 1) for d in t.device_dims[1:]])
            return tuple(max(d, 1) for d in t.device_dims)
        return t.device_dims

    def _current_logical(self, t: _Tensor, dims: Sequence[int]) -> tuple[int, ...]:
        """The logical (host) shape of an output whose device dims are ``dims``."""
        shape = t.meta.shape
        if not any(d < 0 for d in shape):
            return shape
        if t.pack_format is None:
            return tuple(dims)
        if t.pack_format in ("NC1HWC0", "NC1HWC0_C04") and len(dims) == 5:
            where = {"N": 0, "H": 2, "W": 3}
            return tuple(dims[where[a]] if d < 0 and a in where else d for a, d in zip(t.meta.format, shape))
        return tuple(dims[k] if d < 0 else d for k, d in enumerate(shape))   # leading batch axes

    def _setup_dynamic(self) -> None:
        pf = self.preflight
        mode = pf.dynamic_mode
        self._dynamic = mode
        if mode is None:
            return
        if mode not in ("batch", "hw", "dims"):
            raise OmError(f"{self.path}: dynamic mode {mode!r} is not supported by the ACL backend",
                          hint="rebuild with atc --dynamic_batch_size, --dynamic_image_size or --dynamic_dims")
        if self._mbatch is None:
            raise OmError(f"{self.path}: a dynamic ({mode}) model without the {MBATCH_NAME} input",
                          hint="rebuild the model with ATC")
        if mode == "batch":
            values = [[b] for b in pf.batch_gears]
        elif mode == "hw":
            values = [list(g) for g in pf.hw_gears]
        else:
            values = [list(g) for g in pf.dims_gears]
        if not values:
            raise OmError(f"{self.path}: a dynamic ({mode}) model whose gear list was not found",
                          hint="rebuild the model with ATC")
        per_input: dict[str, list[tuple[int, ...]]] = {}
        for g in values:
            pos = 0
            for t in self._inputs:
                if not any(d < 0 for d in t.meta.shape):
                    continue
                dims, k = [], 0
                for d in t.meta.shape:
                    if d >= 0:
                        dims.append(d)
                    elif mode == "batch":
                        dims.append(g[0])
                    elif mode == "hw":
                        dims.append(g[min(k, 1)])
                        k += 1
                    else:
                        if pos >= len(g):
                            raise OmError(f"{self.path}: dims gear {g} has fewer values than the inputs' "
                                          f"dynamic dimensions", hint="rebuild the model with ATC")
                        dims.append(g[pos])
                        pos += 1
                per_input.setdefault(t.meta.name, []).append(tuple(dims))
        for t in self._inputs:
            if t.meta.name in per_input:
                t.meta = dataclasses.replace(t.meta, gears=tuple(per_input[t.meta.name]))
        om_out = {o.name: o for o in pf.outputs}
        for t in self._outputs:
            if mode == "batch":
                # get_output_dims reports the largest gear; an output whose axis 0 is that batch follows it
                if t.meta.shape and t.device_dims and t.device_dims[0] in (-1, max(pf.batch_gears)):
                    t.meta = dataclasses.replace(t.meta, shape=(-1, *t.meta.shape[1:]))
                continue
            o = om_out.get(t.meta.name)
            recorded = (o.origin_shape if t.pack_format is not None else o.shape) if o is not None else None
            if recorded and len(recorded) == len(t.meta.shape) and any(d < 0 for d in recorded):
                t.meta = dataclasses.replace(t.meta, shape=tuple(recorded))

    # ------------------------------------------------------------------ buffers
    def _new_dataset(self) -> int:
        ds = self._acl.mdl.create_dataset()
        if not ds:
            raise AclError("acl.mdl.create_dataset returned NULL", call="acl.mdl.create_dataset")
        return ds

    def _alloc(self, t: _Tensor, ds: int) -> None:
        acl = self._acl
        size = max(t.size, 1)
        ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
        check("acl.rt.malloc", ret, context=f"{size} bytes for {t.meta.name!r}")
        t.ptr = ptr
        if ds:
            buf = acl.create_data_buffer(ptr, t.size)
            if not buf:
                raise AclError("acl.create_data_buffer returned NULL", call="acl.create_data_buffer")
            t.buf = buf
            _, ret = acl.mdl.add_dataset_buffer(ds, buf)
            check("acl.mdl.add_dataset_buffer", ret)

    def _alloc_inputs(self) -> None:
        # the pyACL path needs a dataset in model input order (with the gear input last); acllite builds
        # its own dataset from our {"data", "size"} dicts and appends the gear input itself
        if self.api_used == "pyacl":
            self._in_ds = self._new_dataset()
            ordered = sorted(self._inputs + ([self._mbatch] if self._mbatch else []), key=lambda t: t.index)
            for t in ordered:
                self._alloc(t, self._in_ds)
        else:
            for t in self._inputs:
                self._alloc(t, 0)

    # ------------------------------------------------------------------ running
    def _run_validated(self, output_names: list[str], feeds: dict[str, np.ndarray], *,
                       gear: Gear | None) -> list[np.ndarray]:
        if self._dynamic == "shape":
            self._check_ranges(feeds)
        with device.using(self.device_id):
            return self._run_on_device(output_names, feeds, gear)

    def _run_on_device(self, output_names: list[str], feeds: dict[str, np.ndarray],
                       gear: Gear | None) -> list[np.ndarray]:
        acl = self._acl

        keep: list[np.ndarray] = []
        with self._phase("h2d"):
            for t in self._inputs:
                host = feeds[t.meta.name]
                if t.pack_format is not None:
                    dev = formats.pack(host, t.pack_format, c0=t.c0, origin=t.meta.format)
                else:
                    dev = host
                dev = np.ascontiguousarray(dev, dtype=t.dtype)
                if dev.nbytes > t.size and t.range is not None and any(hi == -1 for _, hi in t.range):
                    self._grow(t, dev.nbytes)    # an unbounded range: the buffer follows the largest feed
                if dev.nbytes > t.size:
                    raise InputError(
                        f"input {t.meta.name!r}: {dev.nbytes} bytes on the device ({t.meta.device_format} "
                        f"{_fmt_shape(dev.shape)}) exceed the model's {t.size}-byte buffer "
                        f"(acl.mdl.get_input_size_by_index)",
                        hint="feed a shape the model was built for")
                keep.append(dev)
                if dev.nbytes:
                    check("acl.rt.memcpy", acl.rt.memcpy(t.ptr, t.size, dev.__array_interface__["data"][0],
                                                         dev.nbytes, self._h2d),
                          context=f"H2D input {t.meta.name!r}")
        with self._phase("compute"):
            batch = gear.batch if gear is not None and self._dynamic == "batch" else None
            if self.api_used == "pyacl":
                if gear is not None:
                    self._set_gear(gear)
                descs = self._set_input_descs(keep) if self._dynamic == "shape" else []
                try:
                    check("acl.mdl.execute", acl.mdl.execute(self._model_id, self._in_ds, self._out_ds),
                          context=str(self.path))
                finally:
                    for td in descs:      # the dataset keeps its own copy (aclmdlSetDatasetTensorDesc)
                        acl.destroy_tensor_desc(td)
                lite_out = None
            else:
                lite_out = self._execute_acllite(batch)
        del keep
        by_name = {t.meta.name: t for t in self._outputs}
        results = []
        with self._phase("d2h"):
            for name in output_names:
                t = by_name[name]
                results.append(self._fetch(t, batch, lite_out))
        return results

    def _grow(self, t: _Tensor, nbytes: int) -> None:
        """Give input ``t`` a larger device buffer (an unbounded range dim), keeping its data buffer handle."""
        acl = self._acl
        ptr, ret = acl.rt.malloc(nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
        check("acl.rt.malloc", ret, context=f"{nbytes} bytes for {t.meta.name!r}")
        ret = acl.update_data_buffer(t.buf, ptr, nbytes)
        if ret != 0:
            acl.rt.free(ptr)
            check("acl.update_data_buffer", ret, context=f"input {t.meta.name!r}")
        old, t.ptr, t.size = t.ptr, ptr, nbytes
        if old:
            check("acl.rt.free", acl.rt.free(old))

    def _set_input_descs(self, devs: Sequence[np.ndarray]) -> list[int]:
        """One tensor desc per input with the shape of this run, set on the input dataset; returns the
        descs (the caller destroys them after execute, also when it fails)."""
        acl = self._acl
        made: list[int] = []
        try:
            for t, dev in zip(self._inputs, devs):
                dims = [int(d) for d in dev.shape]
                td = acl.create_tensor_desc(t.acl_dtype, dims, t.acl_format)
                if not td:
                    raise AclError(f"acl.create_tensor_desc returned NULL for input {t.meta.name!r} {dims}",
                                   call="acl.create_tensor_desc")
                made.append(td)
                _, ret = acl.mdl.set_dataset_tensor_desc(self._in_ds, td, t.index)
                check("acl.mdl.set_dataset_tensor_desc", ret, context=f"input {t.meta.name!r} {dims}")
        except BaseException:
            for td in made:
                acl.destroy_tensor_desc(td)
            raise
        return made

    def _set_gear(self, gear: Gear) -> None:
        acl, mb = self._acl, self._mbatch
        assert mb is not None
        if self._dynamic == "batch":
            check("acl.mdl.set_dynamic_batch_size",
                  acl.mdl.set_dynamic_batch_size(self._model_id, self._in_ds, mb.index, gear.batch),
                  context=f"batch {gear.batch}")
        elif self._dynamic == "hw":
            t = next(t for t in self._inputs if t.meta.name in gear.shapes)
            h, w = [v for v, d in zip(gear.shapes[t.meta.name], t.meta.shape) if d < 0][:2]
            check("acl.mdl.set_dynamic_hw_size",
                  acl.mdl.set_dynamic_hw_size(self._model_id, self._in_ds, mb.index, h, w),
                  context=f"h={h}, w={w}")
        elif self._dynamic == "dims":
            # every real input's dims, concatenated in model input order (reference §3.6)
            flat = [int(d) for t in sorted(self._inputs, key=lambda t: t.index)
                    for d in gear.shapes.get(t.meta.name, t.meta.shape)]
            check("acl.mdl.set_input_dynamic_dims",
                  acl.mdl.set_input_dynamic_dims(self._model_id, self._in_ds, mb.index,
                                                 {"dimCount": len(flat), "name": "", "dims": flat}),
                  context=f"dims {flat}")

    def _execute_acllite(self, batch: int | None) -> list[np.ndarray]:
        items = [{"data": t.ptr, "size": t.size} for t in self._inputs]
        try:
            if batch is not None:
                out = self._lite._execute_with_dynamic_batch_size(items, batch)
            else:
                out = self._lite.execute(items)
        except Exception as e:
            raise _acllite_error("AclLiteModel.execute", e) from e
        if out is None:
            raise AclError(f"acllite AclLiteModel.execute failed on {self.path} (acllite only logs the code)",
                           call="AclLiteModel.execute",
                           hint="see the acllite log and the CANN plog; api='pyacl' reports the return code")
        return list(out)

    def _current_dims(self, t: _Tensor, batch: int | None) -> tuple[int, ...]:
        if self._dynamic == "shape":
            return self._ran_dims(t)
        if self.api_used == "pyacl" and self._dynamic is not None:
            dims, ret = self._acl.mdl.get_cur_output_dims(self._desc, t.index)
            check("acl.mdl.get_cur_output_dims", ret, context=f"output {t.meta.name!r}")
            return tuple(dims["dims"])
        dims = list(self._max_dims(t))
        if batch is not None and dims and t.meta.shape[:1] == (-1,):
            dims[0] = batch      # acllite reports static (largest-gear) dims; axis 0 follows the batch
        return tuple(dims)

    def _ran_dims(self, t: _Tensor) -> tuple[int, ...]:
        """The dims output ``t`` got in the run just made: the output dataset's tensor desc (the
        dataset's own; not destroyed here)."""
        acl = self._acl
        td = acl.mdl.get_dataset_tensor_desc(self._out_ds, t.index)
        if not td:
            raise AclError(f"acl.mdl.get_dataset_tensor_desc gave no desc for output {t.meta.name!r} of a "
                           f"shape-range model", call="acl.mdl.get_dataset_tensor_desc",
                           hint="see the CANN plog; the model did not report its output shape")
        n = acl.get_tensor_desc_num_dims(td)
        if not isinstance(n, int) or not 0 <= n <= 128:
            raise AclError(f"output {t.meta.name!r}: acl.get_tensor_desc_num_dims gave {n!r}",
                           call="acl.get_tensor_desc_num_dims")
        dims = []
        for k in range(n):
            d, ret = acl.get_tensor_desc_dim_v2(td, k)
            check("acl.get_tensor_desc_dim_v2", ret, context=f"output {t.meta.name!r} dim {k}")
            if d < 0:
                raise AclError(f"output {t.meta.name!r}: dim {k} is {d} after execute",
                               call="acl.get_tensor_desc_dim_v2")
            dims.append(int(d))
        return tuple(dims)

    def _fetch(self, t: _Tensor, batch: int | None, lite_out: list[np.ndarray] | None) -> np.ndarray:
        dims = self._current_dims(t, batch)
        nbytes = self._device_nbytes(t, dims)
        if nbytes > t.size:
            raise InternalError(f"output {t.meta.name!r}: current dims {dims} need {nbytes} bytes, more than "
                                f"the {t.size}-byte device buffer")
        if lite_out is not None:
            raw = np.ascontiguousarray(lite_out[t.index]).view(np.uint8).reshape(-1)
            if raw.size < nbytes:
                raise AclError(f"acllite returned {raw.size} bytes for output {t.meta.name!r}, expected {nbytes}",
                               call="AclLiteModel.execute")
            host = raw[:nbytes].view(t.dtype).reshape(dims).copy()
        else:
            host = np.empty(dims, dtype=t.dtype)
            if nbytes:
                check("acl.rt.memcpy", self._acl.rt.memcpy(host.__array_interface__["data"][0], nbytes, t.ptr,
                                                           nbytes, self._d2h),
                      context=f"D2H output {t.meta.name!r}")
        if t.pack_format is None:
            return host
        return formats.unpack(host, t.pack_format, self._current_logical(t, dims), origin=t.meta.format)


# ------------------------------------------------------------------------------------ operator dumps
DUMP_MODES = ("all", "input", "output")
ACL_JSON = "acl.json"


def dump_config(dump_path: str | os.PathLike, model_name: str, *, mode: str = "all") -> dict:
    """The ``acl.json`` content that switches operator dumps on for ``model_name``
    (``../shared/reference/accuracy-debug.md`` §3). ACL writes the files under
    ``{dump_path}/{time}/{device_id}/{model_name}/{model_id}/{iteration}/``.

    >>> dump_config("/tmp/d", "resnet50")["dump"]["dump_list"]
    [{'model_name': 'resnet50'}]
    """
    if mode not in DUMP_MODES:
        raise InputError(f"dump mode {mode!r}", hint=f"use one of {', '.join(DUMP_MODES)}")
    return {"dump": {"dump_list": [{"model_name": str(model_name)}],
                     "dump_path": str(Path(dump_path).resolve()), "dump_mode": mode, "dump_op_switch": "off"}}


def enable_dump(dump_path: str | os.PathLike, om_path: str | os.PathLike, *, mode: str = "all") -> Path:
    """Switch operator dumps on for the ``.om`` at ``om_path``: write ``{dump_path}/acl.json`` and
    initialise ACL with it (pyACL reads the config at ``acl.init`` only, once per process, so this must
    come before any other ACL use). Returns the ``acl.json`` path. Verified against the pyACL stand-in
    only (``tests/standins/acl``), not on a device.
    """
    import json


    model_name = preflight_info(om_path).model_name or Path(om_path).stem
    folder = make_output_folder(dump_path)
    cfg = folder / ACL_JSON
    with atomic_write(cfg, "w", encoding="utf-8") as f:
        json.dump(dump_config(folder, model_name, mode=mode), f, indent=2)
        f.write("\n")
    device.ensure_initialized(config_path=str(cfg))
    return cfg
