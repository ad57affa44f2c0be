"""The CPU emulator backend: runs an offline bundle with onnxruntime, faithful to the device plan.

What it does, in order:

* **Load** — reads and validates the bundle (:func:`npu_deploy.converters.files.bundle.read_bundle`), unpacks
  every pre-packed weight from its device format back to the logical tensor (``Bundle.unpack``, i.e. the
  format core), and puts the weights back into the lowered graph.
* **Precision** — every float tensor the plan holds in float16/bfloat16 on the device (manifest
  ``tensor_dtypes``, and the outputs of nodes whose ``node_formats[node]["dtype"]`` is float16) is
  rounded through that dtype where it is produced (a ``Cast`` to float16 and back, which onnxruntime
  keeps: checked by ``tests/runtime/test_emulator.py``). Weights stored in float16 keep their float16
  values. So the accuracy loss users would see on the device shows up here first.
* **Transfers** — host arrays are compact in the user's format. When an input's device format differs
  (e.g. ``NC1HWC0``), the host→device phase packs it into the device layout (C padded to C0) and the
  device side unpacks it for onnxruntime; outputs go the other way. Same format on both sides: no copy.
  An input fed channels-last (``--input-format NHWC``; manifest ``graph_format`` ``NCHW``) is converted
  to the graph's layout during the host→device phase, through the format core
  (``formats.unpack(x, "NHWC", nchw_shape)``: one exact copy), or as a free view when the axis order
  does not change the bytes (C = 1, or H = W = 1). On the device this is the plan's first TransData.
* **Timing** — ``h2d`` is the packing, ``compute`` the onnxruntime run (plus the device-side layout
  work), ``d2h`` the unpacking. These are CPU times, not device times.
* **Profile** — with ``profile=True`` an msprof-style folder ``PROF_*/mindstudio_profiler_output/`` is
  written when the backend is deactivated: ``op_summary_<ts>.csv`` with one row per op per run (and the
  planned TransData ops with their formats and shapes) and ``op_statistic_<ts>.csv``. Every duration is
  the cost model's **estimate** (manifest ``cost``), as ``README.txt`` in that folder says. A backend
  that ran zero times writes no profile.

>>> from npu_deploy.runtime.emulator import EmulatorBackend             # doctest: +SKIP
>>> with EmulatorBackend("model.bundle", profile=True, profile_dir="prof") as b:   # doctest: +SKIP
...     y, = b.run(None, {"x": x})
>>> b.profile_path                                                     # doctest: +SKIP
PosixPath('prof/PROF_000001_20261129215012345_K3J9Q2ZL0AB1C2D3')
"""

from __future__ import annotations

import csv
import dataclasses
import os
import random
import shutil
import string
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.formats.graph import axis_perm
from npu_deploy.converters.lowering import cost as cost_model
from npu_deploy.converters.lowering import ops as optable
from npu_deploy.errors import BundleError, InputError, ModelError
from npu_deploy.runtime.backend import Backend, Gear, TensorMeta
from npu_deploy import _io
from npu_deploy.converters import formats
from npu_deploy.converters.files.bundle import read_bundle
from npu_deploy.converters.formats.graph import is_identity, same_format
from npu_deploy.runtime.executable import _fill_missing_optional_inputs
from npu_deploy.runtime.executable import build_plan_graph

_LOW_PRECISION = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
_FP16_MODES = optable.FP16_MODES
_PLAIN_4D = ("NCHW", "NHWC", "HWCN", "CHWN")
_PLAIN_5D = ("NCDHW", "NDHWC", "DHWCN")
_MAX_PROFILED_RUNS = 100_000
_VIEW_OPS = optable.VIEW_OPS

# msprof's data type spelling in op_summary (see reference/msprof.md §2/§3)
_MSPROF_DTYPE = {"float32": "FLOAT", "float16": "FLOAT16", "bfloat16": "DT_BF16", "float64": "DOUBLE",
                 "int8": "INT8", "uint8": "UINT8", "int16": "INT16", "uint16": "UINT16", "int32": "INT32",
                 "uint32": "UINT32", "int64": "INT64", "uint64": "UINT64", "bool": "BOOL"}

OP_SUMMARY_HEADER = ["Device_id", "Model ID", "Task ID", "Stream ID", "Op Name", "OP Type", "OP State",
                     "Task Type", "Task Start Time(us)", "Task Duration(us)", "Task Wait Time(us)",
                     "Block Num", "Mix Block Num", "HF32 Eligible", "Input Shapes", "Input Data Types",
                     "Input Formats", "Output Shapes", "Output Data Types", "Output Formats", "Context ID"]
OP_STATISTIC_HEADER = ["Device_id", "OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)",
                       "Avg Time(us)", "Max Time(us)", "Ratio(%)"]


def _elem_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


class _Transfer:
    """How one input/output crosses the host/device boundary (layout only; dtype rounding is in the
    graph). ``None`` pack means same layout: no copy."""

    def __init__(self, entry: dict[str, Any], name: str):
        self.name = name
        self.host_format = str(entry.get("format") or "ND")
        self.device_format = str(entry.get("device_format") or self.host_format)
        self.c0 = entry.get("c0")
        # host/device boundary: a side declared ND takes the other side's plain bytes as they are
        self.identity = same_format(self.host_format, self.device_format, nd_matches_plain=True)
        self._buffers: dict[tuple, np.ndarray] = {}
        self.origin = self.host_format if self.host_format in _PLAIN_4D + _PLAIN_5D else None
        # the lowered graph's layout when it differs from the host's (channels-last host inputs)
        graph = str(entry.get("graph_format") or "").upper()
        self.graph_format: str | None = None
        self.perm: tuple[int, ...] = ()
        if graph and graph != self.host_format.upper() and self.host_format.upper() != "ND":
            host = self.host_format.upper()
            if graph not in _PLAIN_4D + _PLAIN_5D or sorted(graph) != sorted(host):
                raise BundleError(f"input {name!r}: host format {self.host_format} cannot be read as graph "
                                  f"format {graph}", hint="re-convert the model")
            self.graph_format = graph
            self.perm = axis_perm(host, graph)  # graph axis k is host axis perm[k]

    def _kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.c0:
            kw["c0"] = int(self.c0)
        if self.origin is not None:
            kw["origin"] = self.origin
        return kw

    def pack(self, x: np.ndarray, *, reuse: bool = False) -> np.ndarray:
        """The host array in the device layout. ``reuse``: write into this transfer's own buffer from
        the previous run of the same shape (the device buffer is consumed within the run)."""
        if not reuse:
            return formats.pack(x, self.device_format, **self._kw())
        key = (x.shape, x.dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = formats.pack(x, self.device_format, **self._kw())
            return buf
        return formats.pack(x, self.device_format, out=buf, **self._kw())

    def unpack(self, phys: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The device buffer as the lowered graph reads it; ``shape`` is the host array's shape."""
        if self.graph_format is None:
            return formats.unpack(phys, self.device_format, shape, **self._kw())
        kw = self._kw()
        kw["origin"] = self.graph_format
        return formats.unpack(phys, self.device_format, self.graph_shape(shape), **kw)

    def graph_shape(self, host_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(host_shape[j] for j in self.perm) if self.perm else tuple(host_shape)

    def to_graph(self, x: np.ndarray) -> np.ndarray:
        """Host layout -> the graph's layout for a same-format (identity) transfer. Exact."""
        view = x.transpose(self.perm)
        if view.flags.c_contiguous:  # C == 1 or H == W == 1: same bytes, no copy
            return view
        return formats.unpack(x, self.host_format, view.shape, origin=self.graph_format)


@dataclasses.dataclass
class ExecutedTensor:
    """One buffer an executed op read or wrote: the ONNX ``tensor`` it holds, how it lies on the device
    (``stored``: format, dtype, logical shape, C0) and its bytes (``data``, in storage shape)."""

    tensor: str
    stored: Any
    data: np.ndarray

    def logical(self) -> np.ndarray:
        """The buffer back in the tensor's logical layout (through the format core)."""

        st = self.stored
        if is_identity(st.format):  # a plain buffer in the tensor's own axis order is the tensor
            return self.data
        return formats.unpack(self.data, st.format, st.shape, **st._kw())


@dataclasses.dataclass
class ExecutedOp:
    """One executed device op (ONNX node or planned TransData) with its input and output buffers."""

    name: str
    op_type: str
    inputs: list[ExecutedTensor]
    outputs: list[ExecutedTensor]


class EmulatorBackend(Backend):
    """Run an offline bundle on the CPU (see the module docstring).

    ``record_device_buffers=True`` keeps the last run's device-side buffers in
    ``last_device_buffers`` (name → packed array), for tests and debugging.

    ``symbolic_io=True`` (default) hands onnxruntime the graph with symbolic input/output dims and no
    ``value_info``: with every shape fixed, onnxruntime picks other fusions (MatMul+Add → Reshape/Gemm
    chains) that ran up to ~15 % slower on MiniLM than the original model. Shapes are still enforced:
    the base class validates every feed against the bundle's metadata before the run. When
    onnxruntime refuses the symbolic graph (context-dependent function ops, Resize with empty
    ``sizes``…), the graph is used as converted.

    >>> b = EmulatorBackend("model.bundle")                              # doctest: +SKIP
    >>> b.activate(); [m.device_format for m in b.get_inputs()]          # doctest: +SKIP
    ['NC1HWC0']
    """

    name = "emulator"

    def __init__(self, path: str | os.PathLike, *, profile: bool = False,
                 profile_dir: str | os.PathLike | None = None, record_device_buffers: bool = False,
                 session_options: Any = None, symbolic_io: bool = True, execute_plan: bool = True,
                 literal: bool = False):
        super().__init__()
        self.execute_plan = bool(execute_plan)
        self.literal = bool(literal)
        self.path = Path(path)
        self.profile = bool(profile)
        self.profile_dir = Path(profile_dir) if profile_dir is not None else None
        self.profile_path: Path | None = None
        self.record_device_buffers = record_device_buffers
        self.last_device_buffers: dict[str, np.ndarray] = {}
        self._session_options = session_options
        self.symbolic_io = symbolic_io
        self._sess = None
        self._manifest: dict[str, Any] = {}
        self._inputs: list[TensorMeta] = []
        self._outputs: list[TensorMeta] = []
        self._in_transfers: dict[str, _Transfer] = {}
        self._out_transfers: dict[str, _Transfer] = {}
        self._model: onnx.ModelProto | None = None
        self._run_starts: list[float] = []
        self.rounded_tensors: list[str] = []
        # plan execution: the bundle's graph, the weights (logical) and one session per input shape set
        self._graph: onnx.ModelProto | None = None
        self._weights: dict[str, np.ndarray] = {}
        self._plan_sessions: dict[tuple, tuple[Any, Any]] = {}
        self.last_plan_graph: Any = None
        # metadata is available before activation (read once, cheaply) for get_inputs()
        self._load_metadata()

    # ------------------------------------------------------------------ metadata
    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest

    @property
    def precision_mode(self) -> str | None:
        return self._manifest.get("precision_mode")

    def _load_metadata(self) -> None:
        with read_bundle(self.path, verify=False) as b:
            self._manifest = b.manifest
        man = self._manifest
        gears = (man.get("dynamic") or {}).get("gears") or []

        def meta(e: dict, with_gears: bool) -> TensorMeta:
            try:
                name = str(e["name"])
                g = tuple(tuple(gear[name]) for gear in gears if name in gear) if with_gears else ()
                if with_gears and g and len(g) != len(gears):
                    raise BundleError(f"{self.path}: input {name!r} is missing from some gears")
                return TensorMeta(name=name, shape=tuple(e["shape"]), dtype=np.dtype(e["dtype"]),
                                  format=str(e.get("format") or "ND"),
                                  device_format=str(e.get("device_format") or e.get("format") or "ND"),
                                  device_shape=tuple(e.get("device_shape") or ()),
                                  nbytes=int(e.get("nbytes") or 0), gears=g)
            except (KeyError, TypeError, ValueError) as err:
                raise BundleError(f"{self.path}: malformed input/output entry in the manifest ({err})",
                                  hint="re-convert the model") from None

        self._inputs = [meta(e, True) for e in man.get("inputs") or []]
        self._outputs = [meta(e, False) for e in man.get("outputs") or []]
        if not self._outputs:
            raise BundleError(f"{self.path}: manifest lists no outputs", hint="re-convert the model")
        self._in_transfers = {e["name"]: _Transfer(e, e["name"]) for e in man.get("inputs") or []}
        self._out_transfers = {e["name"]: _Transfer(e, e["name"]) for e in man.get("outputs") or []}

    def get_inputs(self) -> list[TensorMeta]:
        return list(self._inputs)

    def get_outputs(self) -> list[TensorMeta]:
        return list(self._outputs)

    # ------------------------------------------------------------------ life cycle
    def _activate(self) -> None:
        with read_bundle(self.path, verify=True) as bundle:
            weights = bundle_weights(bundle)
            graph = onnx.ModelProto()
            graph.CopyFrom(bundle.graph)
        self._plan_sessions = {}
        if self.execute_plan:
            self._graph, self._weights = graph, weights
            self._model = build_runnable_model(graph, self._manifest, weights) if self.profile else None
            self._sess = None
        else:
            model = build_runnable_model(graph, self._manifest, weights)
            self.rounded_tensors = [n.output[0][: -len("__npu_fp16")] for n in model.graph.node
                                    if n.op_type == "Cast" and n.output[0].endswith("__npu_fp16")]
            self._sess = self._session(model, symbolic=self.symbolic_io)
            self._model = model if self.profile else None
        self._run_starts = []

    def _session(self, model: onnx.ModelProto, *, symbolic: bool) -> Any:
        import onnxruntime as ort

        opts = self._session_options
        if opts is None:
            opts = ort.SessionOptions()
            opts.log_severity_level = 4  # failures come back as exceptions, reported in one line
        if symbolic:
            try:
                return ort.InferenceSession(symbolic_io_model(model).SerializeToString(), opts,
                                            providers=["CPUExecutionProvider"])
            except Exception:  # e.g. context-dependent functions need the fixed shapes: use them
                pass
        try:
            return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's own exception types
            raise ModelError(f"{self.path}: onnxruntime cannot run the lowered graph "
                             f"({str(e).splitlines()[0][:300]})",
                             hint="re-convert the model; if it persists this is a converter bug") from e

    def plan_graph(self, shapes: dict[str, tuple[int, ...]], feeds: dict[str, np.ndarray] | None = None,
                   *, expose: bool = False) -> Any:
        """The plan-executing graph (:class:`~npu_deploy.runtime.executable.PlanGraph`) and its session
        for one set of logical input shapes (graph layout), built on first use."""
        key = (tuple(sorted((k, tuple(v)) for k, v in shapes.items())), expose)
        hit = self._plan_sessions.get(key)
        if hit is None:
            pg = build_plan_graph(self._graph, self._manifest, self._weights, shapes, literal=self.literal,
                                  feeds=feeds, expose=expose)
            hit = (pg, self._session(pg.model, symbolic=self.symbolic_io))
            self._plan_sessions[key] = hit
        return hit

    def _deactivate(self) -> None:
        self._sess = None
        self._plan_sessions = {}
        self._graph, self._weights = None, {}
        try:
            if self.profile and self._run_starts:
                self.profile_path = write_estimated_profile(
                    self.profile_dir if self.profile_dir is not None else Path.cwd(),
                    self._manifest, self._model, self._run_starts)
        finally:
            self._model = None
            self._run_starts = []

    # ------------------------------------------------------------------ running
    def _run_validated(self, output_names: list[str], feeds: dict[str, np.ndarray], *,
                       gear: Gear | None) -> list[np.ndarray]:
        if self.profile and len(self._run_starts) < _MAX_PROFILED_RUNS:
            self._run_starts.append(time.time())
        if not self.execute_plan:
            return self._run_original(output_names, feeds)
        device: dict[str, np.ndarray] = {}
        recording = getattr(self, "_recording", False)
        keep = self.record_device_buffers or recording  # buffers handed out: fresh ones every run
        with self._phase("h2d"):
            for name, x in feeds.items():
                t = self._in_transfers[name]
                device[name] = x if t.identity else t.pack(x, reuse=not keep)
        with self._phase("compute"):
            pg, sess = self.plan_graph({n: self._in_transfers[n].graph_shape(x.shape) for n, x in feeds.items()},
                                       {n: x for n, x in feeds.items() if self._in_transfers[n].identity
                                        and self._in_transfers[n].graph_format is None}, expose=recording)
            self.last_plan_graph = pg
            self.rounded_tensors = pg.rounded_tensors
            want = [pg.outputs[n] for n in output_names]
            extra = list(pg.exposed.values()) if recording else []
            try:
                outs = sess.run(want + extra, {pg.inputs[n]: d for n, d in device.items() if n in pg.inputs})
            except Exception as e:
                raise InputError(f"{self.path.name}: the emulator failed to run "
                                 f"({str(e).splitlines()[0][:300]})",
                                 hint="check the input values; re-run with --debug for details") from e
            if recording:
                by_name = dict(zip(extra, outs[len(want):]))
                values = {buf: by_name[name] for buf, name in pg.exposed.items()}
                values.update({pg.inputs[n]: d for n, d in device.items() if n in pg.inputs})
                self._recorded = (pg, values)
                outs = outs[: len(want)]
        with self._phase("d2h"):
            result = []
            for name, d in zip(output_names, outs):
                t = self._out_transfers[name]
                host = d if t.identity else t.unpack(d, pg.output_shapes[name])
                want = next(m.dtype for m in self._outputs if m.name == name)
                result.append(host if host.dtype == want else host.astype(want))
        if self.record_device_buffers:
            device.update({f"output:{n}": d for n, d in zip(output_names, outs)})
            self.last_device_buffers = device
        return result

    def run_recorded(self, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[ExecutedOp]]:
        """Run once with every device buffer kept: the outputs (as :meth:`run` returns them) and, in
        execution order, each op with the buffers it read and wrote, in their device format, storage
        shape and dtype (what an ACL operator dump holds). Planned TransData are ops of their own."""
        if not self.execute_plan:
            raise InputError("run_recorded needs the plan executed (execute_plan=True)")
        self._recording = True
        try:
            outs = self.run(None, feeds)
        finally:
            self._recording = False
        pg, values = self._recorded
        ops = [ExecutedOp(r.name, r.op_type,
                          [ExecutedTensor(t, pg.buffers[b], values[b]) for t, b in r.inputs if b in values],
                          [ExecutedTensor(t, pg.buffers[b], values[b]) for t, b in r.outputs if b in values])
               for r in pg.records]
        return outs, ops

    def _run_original(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Benchmarking mode (``execute_plan=False``): the original graph with fp16 rounding, layout
        conversions only at the transfers; the plan's TransData are not run."""
        record = self.record_device_buffers
        device: dict[str, np.ndarray] = {}
        ort_feeds: dict[str, np.ndarray] = {}
        with self._phase("h2d"):
            for name, x in feeds.items():
                t = self._in_transfers[name]
                device[name] = x if t.identity else t.pack(x)
                if t.identity and t.graph_format is not None:
                    ort_feeds[name] = t.to_graph(x)  # channels-last host input: the graph reads NCHW
        with self._phase("compute"):
            for name, d in device.items():
                t = self._in_transfers[name]
                if name not in ort_feeds:
                    ort_feeds[name] = d if t.identity else t.unpack(d, feeds[name].shape)
            try:
                outs = self._sess.run(output_names, ort_feeds)
            except Exception as e:
                raise InputError(f"{self.path.name}: the emulator failed to run "
                                 f"({str(e).splitlines()[0][:300]})",
                                 hint="check the input values; re-run with --debug for details") from e
            dev_outs = []
            for name, o in zip(output_names, outs):
                t = self._out_transfers[name]
                dev_outs.append(o if t.identity else t.pack(o))
        with self._phase("d2h"):
            result = []
            for name, o, d in zip(output_names, outs, dev_outs):
                t = self._out_transfers[name]
                result.append(d if t.identity else t.unpack(d, o.shape))
        if record:
            device.update({f"output:{n}": d for n, d in zip(output_names, dev_outs)})
            self.last_device_buffers = device
        return result


# ---------------------------------------------------------------------- graph reconstruction
def _graph_value_types(graph: onnx.GraphProto) -> dict[str, int]:
    types: dict[str, int] = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    return types


def bundle_weights(bundle: Any) -> dict[str, np.ndarray]:
    """Every weight of the blob as the graph reads it: unpacked from its device format to the logical
    tensor (the format core) and cast to the graph's type (a stored float16/bfloat16 weight keeps its
    float16 values). 0-d weights keep rank 0."""
    graph = bundle.graph.graph
    man = bundle.manifest
    declared = _graph_value_types(graph)
    fp16_mode = man.get("precision_mode") in _FP16_MODES
    present = {i.name for i in graph.initializer}
    out: dict[str, np.ndarray] = {}
    for name, info in bundle.weights.items():
        if name in present:
            continue
        arr = bundle.unpack(name)
        want = declared.get(name)
        if want is None and arr.dtype.name in _LOW_PRECISION:
            # packed weights (Conv/ConvTranspose/MatMul/Gemm) share the type of the data input
            want = next((declared.get(n.input[0]) for n in graph.node
                         if name in n.input[1:] and n.input[0] in declared), None)
        if want is not None:
            target = _elem_dtype(want)
        elif arr.dtype.name in _LOW_PRECISION and fp16_mode:
            target = np.dtype(np.float32)
        else:
            target = arr.dtype
        if arr.dtype != target:
            arr = arr.astype(target)
        out[name] = np.require(arr, requirements="C")  # (np.ascontiguousarray would make 0-d 1-d)
    return out


def build_runnable_model(graph: onnx.ModelProto, manifest: dict[str, Any],
                         weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The original graph with the weights put back and float16 rounding inserted where the plan holds
    float tensors in float16/bfloat16: the benchmarking mode (``execute_plan=False``) and the shapes
    of the estimated profile. The plan itself is executed by :mod:`npu_deploy.runtime.executable`."""
    model = onnx.ModelProto()
    model.CopyFrom(graph)
    if model.ir_version < 4:
        model.ir_version = 4
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in weights.items())
    _fill_missing_optional_inputs(model.graph, weights)
    _insert_rounding(model, manifest)
    return model


def symbolic_io_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs/outputs have symbolic dims and whose ``value_info`` is
    dropped (intermediate shapes are re-inferred by onnxruntime). Equal fixed sizes share one symbol
    (``s128``), which only states what is true: those dims are equal."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    for vi in list(out.graph.input) + list(out.graph.output):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for j, dim in enumerate(vi.type.tensor_type.shape.dim):
            param = f"s{dim.dim_value}" if dim.HasField("dim_value") else (dim.dim_param or f"{vi.name}_d{j}")
            dim.Clear()
            dim.dim_param = param
    return out


def _low_precision_tensors(man: dict[str, Any], graph: onnx.GraphProto) -> dict[str, str]:
    """tensor name -> low-precision device dtype ("float16" / "bfloat16") from the manifest."""
    out: dict[str, str] = {}
    for name, dt in (man.get("tensor_dtypes") or {}).items():
        if isinstance(dt, str) and dt in _LOW_PRECISION:
            out[str(name)] = dt
    node_formats = man.get("node_formats") or {}
    for node in graph.node:
        nf = node_formats.get(node.name)
        if isinstance(nf, dict) and nf.get("dtype") in _LOW_PRECISION:
            for o in node.output:
                if o and o not in out and (man.get("tensor_dtypes") or {}).get(o) is None:
                    out[o] = nf["dtype"]
    return out


def _insert_rounding(model: onnx.ModelProto, man: dict[str, Any]) -> None:
    graph = model.graph
    wanted = _low_precision_tensors(man, graph)
    if not wanted:
        return
    inits = {i.name: i for i in graph.initializer}
    types = _graph_value_types(graph)
    missing = [n for n in wanted if n not in types and n not in inits]
    if missing:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
            types.update(_graph_value_types(inferred.graph))
        except Exception:  # inference is best effort here: untyped tensors default to float32 below
            pass

    float_types = (TensorProto.FLOAT, TensorProto.DOUBLE)
    # initializers: round the stored values directly
    for name, init in inits.items():
        dt = wanted.get(name)
        if dt is None or init.data_type not in float_types:
            continue
        low = np.float16 if dt == "float16" else _bf16()
        arr = numpy_helper.to_array(init)
        init.CopyFrom(numpy_helper.from_array(arr.astype(low).astype(arr.dtype), name))

    produced = {o for n in graph.node for o in n.output if o}
    graph_inputs = {i.name for i in graph.input}
    targets = {}
    for name, dt in wanted.items():
        if name in inits:
            continue
        t = types.get(name, TensorProto.FLOAT)
        if t not in float_types:
            continue
        if name in produced or name in graph_inputs:
            targets[name] = (dt, t)
    if not targets:
        return

    def chain(src: str, dst: str, dt: str, t: int, tag: str) -> list[onnx.NodeProto]:
        mid = f"{dst}__npu_fp16"
        # one pair per tensor, named after it: node names must stay unique (a node may have several
        # rounded outputs, e.g. LSTM's Y, Y_h, Y_c)
        return [helper.make_node("Cast", [src], [mid], name=f"{tag}:{dst}/round_{dt}", to=_LOW_PRECISION[dt]),
                helper.make_node("Cast", [mid], [dst], name=f"{tag}:{dst}/round_back", to=t)]

    new_nodes: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}
    # graph inputs: consumers read the rounded copy
    for name in graph_inputs:
        if name in targets:
            dt, t = targets[name]
            rounded = f"{name}__npu_rounded"
            new_nodes.extend(chain(name, rounded, dt, t, name))
            rename[name] = rounded
    for node in graph.node:
        for i, x in enumerate(node.input):
            if x in rename:
                node.input[i] = rename[x]
        post = []
        for i, o in enumerate(node.output):
            if o in targets and o not in graph_inputs:
                dt, t = targets[o]
                raw = f"{o}__npu_raw"
                node.output[i] = raw
                post.extend(chain(raw, o, dt, t, node.name or o))
        new_nodes.append(node)
        new_nodes.extend(post)
    del graph.node[:]
    graph.node.extend(new_nodes)
    # subgraphs (If/Loop/Scan bodies) are left untouched: their tensors are not in the device plan


def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


# ---------------------------------------------------------------------- estimated profile
def _rand_suffix(n: int = 16) -> str:
    return "".join(random.choice(string.ascii_uppercase + string.digits) for _ in range(n))


def _fmt_shapes(shapes: list[tuple[int, ...] | None]) -> str:
    if not shapes:
        return "N/A"
    return '"' + ";".join("" if s is None else ",".join(str(d) for d in s) for s in shapes) + '"'


def _join(items: list[str]) -> str:
    return ";".join(items) if items else "N/A"


def _node_tensor_info(model: onnx.ModelProto | None) -> tuple[dict[str, tuple], dict[str, str]]:
    shapes: dict[str, tuple] = {}
    dtypes: dict[str, str] = {}
    if model is None:
        return shapes, dtypes
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # shapes are cosmetic in the estimated profile
        inferred = model
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        if tt.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        if tt.elem_type:
            dtypes[vi.name] = _elem_dtype(tt.elem_type).name
    for init in g.initializer:
        shapes[init.name] = tuple(init.dims)
        dtypes[init.name] = _elem_dtype(init.data_type).name
    return shapes, dtypes


def _storage_shape(fmt: str, shape: list[int], dtype: str, c0: Any) -> tuple[int, ...]:
    try:
        from npu_deploy.converters import formats

        kw = {"c0": int(c0)} if c0 else {}
        return tuple(formats.storage_shape(fmt, tuple(shape), np.dtype(dtype), **kw))
    except Exception:  # an unknown/irregular entry: show the logical shape
        return tuple(shape)


def _transdata_us(entry: dict[str, Any], soc: str) -> float:
    for key in ("est_us", "estimated_us", "cost_us"):
        if isinstance(entry.get(key), (int, float)):
            return float(entry[key])
    try:
        from npu_deploy.converters.lowering.cost import transdata_time_us

        return float(transdata_time_us(int(entry.get("bytes") or 0), str(entry.get("src_format")),
                                       str(entry.get("dst_format")), soc))
    except Exception:  # no estimate available: show the op with zero time rather than drop it
        return 0.0


def profile_rows(manifest: dict[str, Any], model: onnx.ModelProto | None) -> list[dict[str, Any]]:
    """One iteration's task rows in device execution order: every graph node that is a device task
    (not the emulator's rounding casts, ``Constant`` nodes, nodes the plan marks ``folded``, or pure
    views without an estimate) and every planned TransData, placed before its
    first consumer (the last of its ``onnx_nodes`` when the manifest names no consumers)."""
    soc = str(manifest.get("soc") or "Ascend310P3")
    cost = manifest.get("cost") or {}
    est = cost.get("est_us") or {}
    node_formats = manifest.get("node_formats") or {}
    tensor_dtypes = manifest.get("tensor_dtypes") or {}
    fused = set(manifest.get("fused_tensors") or [])
    shapes, dtypes = _node_tensor_info(model)
    nodes = [n for n in (model.graph.node if model is not None else [])
             if not n.name.endswith(("/round_float16", "/round_bfloat16", "/round_back"))]

    def clean(t: str) -> str:
        for suffix in ("__npu_raw", "__npu_rounded"):
            if t.endswith(suffix):
                return t[: -len(suffix)]
        return t

    order = {n.name: i for i, n in enumerate(nodes)}
    before: dict[int, list[dict]] = {}
    tail: list[dict] = []
    for td in manifest.get("transdata") or []:
        # on the device a conversion runs once its producer is done, before the first op that reads
        # its result: place it before the earliest consumer (older manifests: before the last node named)
        consumers = [order[n] for n in (td.get("consumers") or []) if n in order]
        idx = [min(consumers)] if consumers else [order[n] for n in (td.get("onnx_nodes") or []) if n in order]
        (before.setdefault(max(idx), []) if idx else tail).append(td)
    trans_type = "AI_VECTOR_CORE" if optable.soc_family(soc) == "Ascend910B" else "AI_CORE"

    def td_row(td: dict) -> dict:
        dt = str(td.get("dtype") or "float16")
        shape = list(td.get("shape") or [])
        src, dst = str(td.get("src_format")), str(td.get("dst_format"))
        return {"name": str(td.get("name") or "trans_TransData"), "type": "TransData", "task": trans_type,
                "us": _transdata_us(td, soc),
                "in_shapes": [_storage_shape(src, shape, dt, td.get("c0"))],
                "in_dtypes": [_MSPROF_DTYPE.get(dt, dt.upper())], "in_formats": [src],
                "out_shapes": [_storage_shape(dst, shape, dt, td.get("c0"))],
                "out_dtypes": [_MSPROF_DTYPE.get(dt, dt.upper())], "out_formats": [dst]}

    rows: list[dict] = []
    for i, n in enumerate(nodes):
        for td in before.get(i, []):
            rows.append(td_row(td))
        nf = node_formats.get(n.name) or {}
        # not device tasks: constants and folded subgraphs (computed at conversion), pure views
        if n.op_type == "Constant" or nf.get("folded") or (
                n.op_type in _VIEW_OPS and not float(est.get(n.name, 0.0) or 0.0)) or (
                n.name not in est and any(clean(t) in fused for t in n.input)):
            continue  # ... and elementwise ops fused into their producer's kernel
        engine = str(nf.get("engine") or "AI Core")
        ins = [clean(t) for t in n.input]
        outs = [clean(t) for t in n.output]

        def dts(ts: list[str]) -> list[str]:
            out = []
            for t in ts:
                d = tensor_dtypes.get(t) or dtypes.get(t) or ""
                out.append(_MSPROF_DTYPE.get(d, d.upper()) if d else "")
            return out

        rows.append({"name": n.name or f"{n.op_type}_{i}", "type": cost_model.cann_type(n.op_type),
                     "task": "AI_CPU" if "CPU" in engine.upper() else "AI_CORE",
                     "us": float(est.get(n.name, 0.0) or 0.0),
                     "in_shapes": [shapes.get(t) if t else None for t in ins], "in_dtypes": dts(ins),
                     "in_formats": [str(f) for f in (nf.get("input_formats") or ["ND"] * len(ins))],
                     "out_shapes": [shapes.get(t) for t in outs], "out_dtypes": dts(outs),
                     "out_formats": [str(f) for f in (nf.get("output_formats") or ["ND"] * len(outs))]})
    for td in tail:
        rows.append(td_row(td))
    return rows


def write_estimated_profile(root: str | os.PathLike, manifest: dict[str, Any], model: onnx.ModelProto | None,
                            run_starts: list[float], *, device_id: int = 0) -> Path:
    """Write ``root/PROF_<n>_<ts>_<id>/mindstudio_profiler_output/{op_summary,op_statistic}_<ts>.csv``
    and ``README.txt`` for the runs that started at ``run_starts`` (epoch seconds). Returns the
    ``PROF_*`` folder. The folder appears complete or not at all."""
    root = _io.make_output_folder(root)  # a failure to create it is exit 3, naming the folder
    rows = profile_rows(manifest, model)
    now = time.time()
    lt = time.localtime(now)
    ts14 = time.strftime("%Y%m%d%H%M%S", lt)
    ts17 = ts14 + f"{int((now % 1) * 1000):03d}"
    final = root / f"PROF_000001_{ts17}_{_rand_suffix()}"
    tmp = root / f".{final.name}.part"
    out = tmp / "mindstudio_profiler_output"
    try:
        out.mkdir(parents=True)
        stats: dict[tuple[str, str], list[float]] = {}
        with open(out / f"op_summary_{ts14}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(OP_SUMMARY_HEADER)
            task_id = 0
            prev_end = None
            for start in run_starts:
                t_us = start * 1e6
                for r in rows:
                    wait = 0.0 if prev_end is None else max(0.0, t_us - prev_end)
                    task_id += 1
                    w.writerow([device_id, 1, task_id % 65536, 2, r["name"], r["type"], "static", r["task"],
                                f"{t_us:.3f}\t", f"{r['us']:.3f}", f"{wait:.3f}", 1, 0, "N/A",
                                _fmt_shapes(r["in_shapes"]), _join(r["in_dtypes"]), _join(r["in_formats"]),
                                _fmt_shapes(r["out_shapes"]), _join(r["out_dtypes"]), _join(r["out_formats"]),
                                "N/A"])
                    stats.setdefault((r["type"], r["task"]), []).append(r["us"])
                    prev_end = t_us + r["us"]
                    t_us = prev_end
        total = sum(sum(v) for v in stats.values()) or 1.0
        with open(out / f"op_statistic_{ts14}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(OP_STATISTIC_HEADER)
            for (op_type, core), v in sorted(stats.items(), key=lambda kv: -sum(kv[1])):
                w.writerow([device_id, op_type, core, len(v), f"{sum(v):.3f}", f"{min(v):.3f}",
                            f"{sum(v) / len(v):.3f}", f"{max(v):.3f}", f"{100 * sum(v) / total:.3f}"])
        soc = manifest.get("soc") or "unknown SoC"
        (out / "README.txt").write_text(
            "Written by npu-deploy's CPU emulator (not by msprof, not on a device).\n"
            f"ESTIMATED: every duration in this folder is an estimate from npu-deploy's cost model for {soc}\n"
            "(manifest 'cost' section and the planned TransData list of the bundle), not a measurement.\n"
            "Task start times are the host wall-clock start of each emulator run plus the estimated\n"
            "durations laid end to end. TransData rows are the conversions the plan inserts.\n"
            f"Model: {manifest.get('source_model', 'unknown')}; precision mode: "
            f"{manifest.get('precision_mode', 'unknown')}; runs: {len(run_starts)}.\n", encoding="utf-8")
        os.replace(tmp, final)
    except OSError as e:  # disk full, read-only folder: one line, exit 3, nothing half-written left
        shutil.rmtree(tmp, ignore_errors=True)
        raise _io.output_error(final, e) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
