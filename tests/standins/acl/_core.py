"""State and rules of the stand-in ``acl`` module (the test oracle of the pyACL contract).

Written from ``reference/atc-acl-om.md`` §3 only, independent of ``npu_deploy``: it must not import
anything from the package under test. One process-wide :data:`S` holds what a real runtime would:
initialisation, devices set (reference counted), contexts (current one per thread), streams, device and
pinned-host allocations with their sizes (device memory is a ``bytearray`` behind a fake address far
above any real host address, so a device pointer can never be dereferenced by mistake), data buffers,
datasets, model descriptions and loaded models.

Rules enforced (each returns the documented error code and, when it is a contract breach rather than
a runtime condition, is also recorded in :attr:`State.violations`):

* nothing before ``acl.init`` (100001); a second init is 100002; finalize twice is 100037; ``acl.init``
  after ``acl.finalize`` is a violation (one init/finalize per process) and nothing works after it;
* runtime calls need a current context in *this thread* (107002); a thread whose current context was
  destroyed (by another thread, or by ``reset_device``) keeps naming it (``get_context`` returns the
  stale handle, as the runtime's thread-local slot does) and any use of it is a violation; destroying
  the calling thread's own current context leaves that thread without one;
* memcpy: ``count <= destMax``, the ranges lie inside live allocations, the kind matches the pointers
  (H2D: device destination, host source; D2H the reverse; D2D; H2H; DEFAULT inferred);
* free / destroy of an unknown or already released handle (double free);
* execute: model loaded (100011), the datasets have one buffer per model input / output (100017 /
  100018), every buffer is a live device range at least as large as the model's size for it;
* dynamic batch / hw / dims: only on a model with that kind of gears (100019), at the
  ``ascend_mbatch_shape_data`` index, with one of its gears (145013 for a batch, 100000 otherwise);
* shape-range models (``ModelSpec.ranges``; reference §3.6 and the pyACL "Dynamic Shape Input (Setting
  the Shape Range)" guide): ``get_input_dims`` gives -1 on the ranged dims, ``get_input_dims_range`` the
  ranges, ``get_*_size_by_index`` 0 for a tensor with a -1 dim; ``execute`` needs a tensor desc set with
  ``acl.mdl.set_dataset_tensor_desc`` for every input, of the model's dtype and rank and inside its
  range, and buffers large enough for that shape and for the outputs it gives: otherwise 100000
  (ACL_ERROR_INVALID_PARAM: no finer code is documented for this case) and a violation. The output
  dataset then holds a desc per output with the shape that ran (``get_dataset_tensor_desc``; owned by
  the dataset, not to be destroyed by the caller). Tensor descs made with ``acl.create_tensor_desc`` and
  not destroyed are leaks, and a violation at ``acl.finalize``;
* teardown order (reference §3.5): data buffers and datasets before unload, unload before destroying
  the desc, streams / models / allocations before their context, contexts before reset_device, every
  device reset before finalize.

``leaks()`` lists what is still alive; ``assert_clean()`` raises when anything leaked or any
violation was recorded.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import threading
from typing import Any, Callable

DEVICE_BASE = 1 << 60          # fake device address space: never a valid host address
MBATCH_NAME = "ascend_mbatch_shape_data"

# aclDataType -> element size in bytes (reference formats.md §1.3)
DTYPE_SIZE = {0: 4, 1: 2, 2: 1, 3: 4, 4: 1, 6: 2, 7: 2, 8: 4, 9: 8, 10: 8, 11: 8, 12: 1, 27: 2}
KIND_H2H, KIND_H2D, KIND_D2H, KIND_D2D, KIND_DEFAULT = 0, 1, 2, 3, 4


@dataclasses.dataclass
class TensorSpec:
    """One model input/output as ``acl.mdl`` reports it. ``dims`` is what ``get_input_dims`` returns
    (``-1`` on the dynamic axes of gear models); ``dtype`` an aclDataType, ``format`` an aclFormat."""

    name: str
    dims: tuple
    dtype: int = 0
    format: int = 2
    size: int | None = None      # what get_*_size_by_index reports, when not the product of the dims

    def nbytes_of(self, dims) -> int:
        n = DTYPE_SIZE[self.dtype]
        for d in dims:
            n *= d
        return n


def default_compute(spec: "ModelSpec", inputs: dict[str, bytes], gear) -> list[bytes]:
    """Deterministic outputs from the input bytes: with ``s = sum(all input bytes) % 251``, byte ``k``
    of output ``j`` is ``(7*k + s + j) % 127``."""
    s = sum(sum(b) for b in inputs.values()) % 251
    g = spec.gear_tuple(gear)
    return [bytes((7 * k + s + j) % 127 for k in range(t.nbytes_of(d)))
            for j, (t, d) in enumerate(zip(spec.outputs, spec.output_dims(g)))]


@dataclasses.dataclass
class ModelSpec:
    """What a loaded ``.om`` looks like to the stand-in.

    Gears (at most one kind): ``batch_gears`` (every ``-1`` takes the batch), ``hw_gears`` (the two
    ``-1`` of a tensor take ``h, w``), ``dims_gears`` (the ``-1`` of all inputs in order take the gear's
    values; outputs take them from the start). A gear model has an extra last input
    ``ascend_mbatch_shape_data``; without a set gear the largest one runs. ``compute(spec, inputs, gear)``
    gets the device bytes of each real input (sized for the gear) and returns each output's device
    bytes; ``gear`` is the batch (int) for batch models, a tuple for hw/dims models, None if static."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    soc_version: str | None = None
    batch_gears: tuple = ()
    compute: Callable[["ModelSpec", dict[str, bytes], Any], list[bytes]] | None = None
    hw_gears: tuple = ()
    dims_gears: tuple = ()
    #: shape-range model: one per-dim ``(low, high)`` tuple per input (``high == -1`` unbounded); the
    #: "gear" of a run is then the tuple of the inputs' actual values at their -1 dims, in input order,
    #: and the outputs' -1 dims take those values from the start (as for dims gears)
    ranges: tuple = ()

    @property
    def kind(self) -> str | None:
        if self.ranges:
            return "shape"
        return "batch" if self.batch_gears else "hw" if self.hw_gears else "dims" if self.dims_gears else None

    @property
    def gears(self) -> list[tuple]:
        if self.batch_gears:
            return [(int(b),) for b in self.batch_gears]
        return [tuple(int(v) for v in g) for g in (self.hw_gears or self.dims_gears)]

    @property
    def all_inputs(self) -> list[TensorSpec]:
        if self.kind == "shape":
            return list(self.inputs)
        if self.kind == "batch":
            return self.inputs + [TensorSpec(MBATCH_NAME, (1,), 3, 2)]   # int32 [1], as GE adds it
        if self.kind == "hw":
            return self.inputs + [TensorSpec(MBATCH_NAME, (2,), 3, 2)]
        if self.kind == "dims":
            return self.inputs + [TensorSpec(MBATCH_NAME, (len(self.gears[0]),), 3, 2)]
        return list(self.inputs)

    def gear_tuple(self, gear) -> tuple | None:
        if gear is None:
            return None
        return (gear,) if isinstance(gear, int) else tuple(gear)

    def _fill(self, tensors: list[TensorSpec], gear: tuple | None, shared: bool) -> list[list[int]]:
        out, pos = [], 0
        for t in tensors:
            dims, k = [], 0
            for d in t.dims:
                if d >= 0 or gear is None:
                    dims.append(d)
                elif self.kind == "batch":
                    dims.append(gear[0])
                elif self.kind == "hw":
                    dims.append(gear[min(k, 1)])
                    k += 1
                else:
                    dims.append(gear[pos % len(gear)])
                    pos += 1
            if not shared:
                pos = 0
            out.append(dims)
        return out

    def input_dims(self, gear: tuple | None) -> list[list[int]]:
        return self._fill(self.inputs, gear, shared=True)

    def output_dims(self, gear: tuple | None) -> list[list[int]]:
        return self._fill(self.outputs, gear, shared=False)

    def shape_gear(self, dims_per_input: list[list[int]]) -> tuple:
        """The "gear" of a shape-range run: the actual values at every input's -1 dims, in order."""
        return tuple(v for t, dims in zip(self.inputs, dims_per_input) for d, v in zip(t.dims, dims) if d < 0)

    @property
    def max_gear(self) -> tuple | None:
        """The gear that needs the most input bytes (what runs when none is set)."""
        if not self.kind or self.kind == "shape":
            return None
        return max(self.gears, key=lambda g: sum(t.nbytes_of(d) for t, d in zip(self.inputs, self.input_dims(g))))

    def reported_size(self, k: int, outputs: bool) -> int:
        ts = self.outputs if outputs else self.all_inputs
        t = ts[k]
        if t.size is not None:
            return t.size
        if self.kind == "shape":
            return 0 if any(d < 0 for d in t.dims) else t.nbytes_of(t.dims)   # "0: the shape is dynamic"
        if t.name == MBATCH_NAME and not outputs:
            return t.nbytes_of(t.dims)
        fill = self.output_dims if outputs else self.input_dims
        gears = self.gears or [None]
        return max(t.nbytes_of(fill(g)[k]) for g in gears)

    def user_gear(self, gear: tuple | None):
        """What ``compute`` receives for a gear: int batch, tuple, or None."""
        if gear is None:
            return None
        return gear[0] if self.kind == "batch" else gear


@dataclasses.dataclass
class Alloc:
    size: int
    device: int | None          # None: pinned host memory
    ctx: int | None
    data: Any                   # bytearray (device) or ctypes array (host)


@dataclasses.dataclass
class TensorDesc:
    """An aclTensorDesc: ``owner`` is None for one the caller made (``acl.create_tensor_desc``), else the
    dataset that holds it (``get_dataset_tensor_desc`` of an output dataset)."""

    dtype: int
    dims: tuple
    format: int
    owner: int | None = None


@dataclasses.dataclass
class Dataset:
    buffers: list[int] = dataclasses.field(default_factory=list)
    gear: tuple | None = None
    models: set = dataclasses.field(default_factory=set)
    #: index -> tensor desc handle the dataset owns: a copy of the one given to set_dataset_tensor_desc
    #: (input datasets), or the shape an output got in the last execute (output datasets)
    descs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Model:
    spec: ModelSpec
    path: str
    ctx: int
    device: int
    last_gear: tuple | None = None


@dataclasses.dataclass
class Execution:
    model_id: int
    batch: int | None           # the batch of a batch-gear model
    inputs: dict[str, bytes]
    outputs: list[bytes]
    thread: str
    gear: tuple | None = None   # the gear that ran (batch models: (batch,))


class AclStandinError(AssertionError):
    """Raised by :meth:`State.assert_clean`."""


class State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.registry: dict[str, ModelSpec] = {}
        self.computes: dict[str, Callable] = {}
        self.reset()

    def reset(self, *, soc_name: str = "Ascend310P3", device_count: int = 1, run_mode: int = 1) -> None:
        with self.lock:
            self.soc_name = soc_name
            self.run_mode = run_mode      # 1 ACL_HOST; 0 ACL_DEVICE (the app runs on the device's CPU)
            self.device_count = device_count
            self.initialized = False
            self.finalized = False
            self.init_calls = 0
            self.init_config: str | None = None     # the acl.json path given to acl.init
            self.finalize_calls = 0
            self.devices: dict[int, int] = {}
            self.default_ctx: dict[int, int] = {}
            self.contexts: dict[int, int] = {}          # ctx -> device
            self.destroyed: set[int] = set()            # contexts destroyed (a thread may still name one)
            self.tls = threading.local()
            self.streams: dict[int, int] = {}           # stream -> ctx
            self.mem: dict[int, Alloc] = {}             # device allocations
            self.host: dict[int, Alloc] = {}            # pinned host allocations
            self.buffers: dict[int, list] = {}          # data buffer -> [ptr, size]
            self.datasets: dict[int, Dataset] = {}
            self.tensor_descs: dict[int, TensorDesc] = {}
            self.descs: dict[int, int | None] = {}      # desc -> model id (after get_desc)
            self.models: dict[int, Model] = {}
            self.injected: dict[str, list[int]] = {}
            self.calls: list[tuple[str, int | None, str]] = []
            self.violations: list[str] = []
            self.executions: list[Execution] = []
            self.recent_err = ""
            self._next = {"ctx": 0x1000, "stream": 0x2000, "buf": 0x3000, "ds": 0x4000, "desc": 0x5000,
                          "tdesc": 0x6000,
                          "model": 1, "dev": DEVICE_BASE}

    # ------------------------------------------------------------------ helpers
    def new(self, kind: str, step: int = 1) -> int:
        v = self._next[kind]
        self._next[kind] += step
        return v

    def violate(self, text: str) -> None:
        self.violations.append(text)

    def record(self, name: str, ret: int | None) -> None:
        self.calls.append((name, ret, threading.current_thread().name))
        if ret:
            self.recent_err = f"EH9999: {name} failed with {ret}"

    def take_injected(self, name: str) -> int | None:
        queue = self.injected.get(name)
        if queue:
            return queue.pop(0) or None
        return None

    @property
    def current_ctx(self) -> int | None:
        return getattr(self.tls, "ctx", None)

    @current_ctx.setter
    def current_ctx(self, ctx: int | None) -> None:
        self.tls.ctx = ctx

    def need_init(self) -> int:
        return 0 if self.initialized else 100001

    def need_ctx(self, name: str) -> int:
        if not self.initialized:
            return 100001
        ctx = self.current_ctx
        if ctx is not None and ctx not in self.contexts:
            self.violate(f"{name} called in thread {threading.current_thread().name!r} whose current context "
                         f"{hex(ctx)} was destroyed")
            return 107002
        if ctx is None:
            self.violate(f"{name} called in thread {threading.current_thread().name!r} without a current "
                         f"context (acl.rt.set_context first)")
            return 107002
        return 0

    def device_region(self, ptr: int, n: int) -> tuple[Alloc, int] | str | None:
        """The live device allocation holding ``[ptr, ptr+n)``; an error text if ``ptr`` is device space
        but not valid; ``None`` if ``ptr`` is not a device address at all."""
        if ptr < DEVICE_BASE:
            return None
        for base, a in self.mem.items():
            if base <= ptr < base + max(a.size, 1):
                off = ptr - base
                if off + n > a.size:
                    return (f"{n} bytes at offset {off} overflow the {a.size}-byte device allocation "
                            f"{hex(base)}")
                return a, off
        return f"device address {hex(ptr)} is not allocated (freed already?)"

    # ------------------------------------------------------------------ reports
    def leaks(self) -> list[str]:
        with self.lock:
            out = []
            out += [f"device memory {hex(p)} ({a.size} bytes) not freed" for p, a in self.mem.items()]
            out += [f"host memory {hex(p)} ({a.size} bytes) not freed" for p, a in self.host.items()]
            out += [f"data buffer {hex(h)} not destroyed" for h in self.buffers]
            out += [f"dataset {hex(h)} not destroyed" for h in self.datasets]
            out += [f"tensor desc {hex(h)} {list(td.dims)} not destroyed (acl.destroy_tensor_desc)"
                    for h, td in self.tensor_descs.items() if td.owner is None]
            out += [f"model {m} ({self.models[m].path}) not unloaded" for m in self.models]
            out += [f"model desc {hex(d)} not destroyed" for d in self.descs]
            out += [f"stream {hex(s)} not destroyed" for s in self.streams]
            out += [f"context {hex(c)} not destroyed" for c in self.contexts
                    if c not in self.default_ctx.values()]
            out += [f"device {d} not reset" for d in self.devices]
            return out

    def report(self) -> dict:
        with self.lock:
            return {"initialized": self.initialized, "finalized": self.finalized,
                    "init_calls": self.init_calls, "finalize_calls": self.finalize_calls,
                    "leaks": self.leaks(), "violations": list(self.violations),
                    "calls": [c[0] for c in self.calls]}

    def assert_clean(self, *, finalized: bool = True) -> None:
        """Raise :class:`AclStandinError` unless everything was released in the documented order (and,
        with ``finalized``, ``acl.finalize`` was the last word)."""
        problems = self.leaks() + [f"order/contract: {v}" for v in self.violations]
        if finalized and not self.finalized:
            problems.append("acl.finalize was not called")
        if problems:
            raise AclStandinError("stand-in acl is not clean:\n  " + "\n  ".join(problems))

    def write_log(self, event: str) -> None:
        path = os.environ.get("NPU_STANDIN_ACL_LOG")
        if not path:
            return
        rec = {"event": event, **self.report()}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


S = State()


# ---------------------------------------------------------------------- argument parsing
def _as_int(v: Any) -> int:
    if isinstance(v, (float, str, bytes)) or v is None:
        raise TypeError
    import operator

    return operator.index(v)


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "i": _as_int,
    "s": lambda v: v if isinstance(v, str) else (_ for _ in ()).throw(TypeError),
    "y": lambda v: v if isinstance(v, bytes) else (_ for _ in ()).throw(TypeError),
    "d": lambda v: v if isinstance(v, dict) else (_ for _ in ()).throw(TypeError),
    "O": lambda v: v,
}


_FAIL = {"int": lambda c: c, "pair": lambda c: (0, c), "dict": lambda c: ({}, c),
         "triple": lambda c: (0, 0, c), "none": None}


def api(name: str, spec: str, ret: str = "int"):
    """Wrap a stand-in function: strict positional-argument parsing like the C wrappers (``TypeError
    "<name> args parse failed!"``), injected failures, the call log. ``spec``: ``i`` int, ``s`` str, ``y``
    bytes, ``d`` dict, ``O`` anything; after ``|`` optional. ``ret`` is the return shape: ``int`` (bare
    code), ``pair`` ``(value, ret)``, ``dict`` ``({...}, ret)``, ``triple``, ``none`` (no return code;
    failures cannot be injected)."""
    required, _, optional = spec.partition("|")
    fail = _FAIL[ret]

    def deco(fn):
        def wrapper(*args, **kwargs):
            if kwargs or not (len(required) <= len(args) <= len(required) + len(optional)):
                raise TypeError(f"{name} args parse failed!")
            vals = []
            for code, v in zip(required + optional, args):
                try:
                    vals.append(_PARSERS[code](v))
                except (TypeError, ValueError):
                    raise TypeError(f"{name} args parse failed!") from None
            with S.lock:
                code = S.take_injected(name) if fail is not None else None
                if code is not None:
                    S.record(name, code)
                    return fail(code)
                result = fn(*vals)
                rc = result if ret == "int" else (result[-1] if ret != "none" else None)
                S.record(name, rc)
                return result

        wrapper.__name__ = fn.__name__
        wrapper.__qualname__ = fn.__qualname__
        wrapper.__doc__ = fn.__doc__
        return wrapper

    return deco


def host_read(ptr: int, n: int) -> bytes:
    return ctypes.string_at(ptr, n) if n else b""


def host_write(ptr: int, data: bytes) -> None:
    if data:
        ctypes.memmove(ptr, data, len(data))
